/**
 * `deno task charts`: draws the SVG chart of each benchmark result (train/_chart.ts) beside its
 * JSON, and with `--check` looks at every chart in a real browser: headless Chromium renders
 * the SVG to a PNG screenshot, which must decode and show a drawing (enough non-white pixels in
 * several colours), not an empty page or an error.
 *
 *     deno task charts                          # bench/results/*.json -> *.svg
 *     deno task charts bench/out/loader.json    # one result
 *     deno task charts --check                  # and check them in Chromium
 *
 * The screenshots go to a temporary folder (`--keep DIR` keeps them there). Chromium:
 * `apt-get install chromium` on Debian, or `CHROMIUM=/path/to/chrome`.
 *
 * @module
 */

import { writeChart } from "../train/_chart.ts";

const USAGE = `usage: deno task charts [--check] [--keep DIR] [RESULT.json ...]

Draws the SVG chart of each benchmark result beside its JSON (default: bench/results/*.json).
  --check      render every chart in headless Chromium and check the screenshot
  --keep DIR   keep the screenshots in DIR
  --help       this text`;

/** The decoded pixels of a PNG screenshot. */
export interface Image {
  /** Width in pixels. */
  width: number;
  /** Height in pixels. */
  height: number;
  /** RGBA, 4 bytes per pixel, row after row. */
  rgba: Uint8Array;
}

async function inflate(data: Uint8Array): Promise<Uint8Array> {
  const stream = new Blob([new Uint8Array(data)]).stream().pipeThrough(
    new DecompressionStream("deflate"),
  );
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

/**
 * Decodes an 8-bit, non-interlaced RGB or RGBA PNG (what Chromium's screenshots are).
 *
 * @param png The file's bytes.
 * @returns The pixels as RGBA.
 * @throws {Error} When the file is not such a PNG.
 */
export async function decodePng(png: Uint8Array): Promise<Image> {
  const sig = [137, 80, 78, 71, 13, 10, 26, 10];
  if (png.length < 8 || sig.some((b, i) => png[i] !== b)) throw new Error("not a PNG file");
  const view = new DataView(png.buffer, png.byteOffset, png.byteLength);
  let width = 0, height = 0, channels = 0;
  const idat: Uint8Array[] = [];
  for (let at = 8; at + 8 <= png.length;) {
    const len = view.getUint32(at);
    const type = String.fromCharCode(...png.subarray(at + 4, at + 8));
    const body = png.subarray(at + 8, at + 8 + len);
    if (type === "IHDR") {
      width = view.getUint32(at + 8);
      height = view.getUint32(at + 12);
      const depth = body[8], color = body[9], interlace = body[12];
      if (depth !== 8 || (color !== 2 && color !== 6) || interlace !== 0) {
        throw new Error(
          `unsupported PNG: depth ${depth}, colour type ${color}, interlace ${interlace}`,
        );
      }
      channels = color === 6 ? 4 : 3;
    } else if (type === "IDAT") {
      idat.push(body);
    }
    at += 12 + len;
  }
  if (channels === 0) throw new Error("PNG without IHDR");
  const joined = new Uint8Array(idat.reduce((n, c) => n + c.length, 0));
  idat.reduce((off, c) => (joined.set(c, off), off + c.length), 0);
  const raw = await inflate(joined);
  const stride = width * channels;
  if (raw.length < height * (stride + 1)) throw new Error("PNG data is truncated");
  const px = new Uint8Array(height * stride);
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)];
    const src = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    const row = px.subarray(y * stride, (y + 1) * stride);
    const up = y > 0 ? px.subarray((y - 1) * stride, y * stride) : new Uint8Array(stride);
    for (let i = 0; i < stride; i++) {
      const a = i >= channels ? row[i - channels] : 0, b = up[i];
      const c = i >= channels ? up[i - channels] : 0;
      let v = src[i];
      if (filter === 1) v += a;
      else if (filter === 2) v += b;
      else if (filter === 3) v += (a + b) >> 1;
      else if (filter === 4) {
        const p = a + b - c, pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c);
        v += pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      } else if (filter !== 0) throw new Error(`bad PNG row filter ${filter}`);
      row[i] = v & 0xff;
    }
  }
  const rgba = new Uint8Array(width * height * 4);
  for (let p = 0; p < width * height; p++) {
    for (let k = 0; k < 3; k++) rgba[p * 4 + k] = px[p * channels + k];
    rgba[p * 4 + 3] = channels === 4 ? px[p * channels + 3] : 255;
  }
  return { width, height, rgba };
}

/**
 * What a screenshot shows: the share of pixels that are not near-white, and how many distinct
 * colours (quantized to 4 bits per channel) cover at least 0.05% of it each.
 *
 * @param img The screenshot.
 * @returns The ink share (0 to 1) and the number of colours.
 */
export function inkAndColours(img: Image): { ink: number; colours: number } {
  const n = img.width * img.height;
  let ink = 0;
  const counts = new Map<number, number>();
  for (let p = 0; p < n; p++) {
    const r = img.rgba[p * 4], g = img.rgba[p * 4 + 1], b = img.rgba[p * 4 + 2];
    if (r < 235 || g < 235 || b < 235) ink++;
    const key = (r >> 4) << 8 | (g >> 4) << 4 | (b >> 4);
    counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  let colours = 0;
  for (const c of counts.values()) if (c >= n * 0.0005) colours++;
  return { ink: ink / n, colours };
}

function chromium(): string {
  const env = Deno.env.get("CHROMIUM");
  if (env) return env;
  for (const p of ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"]) {
    try {
      Deno.statSync(p);
      return p;
    } catch { /* next */ }
  }
  throw new Error(
    "Cannot check the charts: no Chromium found (apt-get install chromium, or set CHROMIUM)",
  );
}

/**
 * Renders an SVG in headless Chromium and checks the screenshot shows a chart.
 *
 * @param svgPath The chart.
 * @param dir Where the screenshot goes.
 * @returns The screenshot's path and what it shows.
 * @throws {Error} When Chromium fails or the screenshot looks empty.
 */
export async function checkInBrowser(
  svgPath: string,
  dir: string,
): Promise<{ png: string; ink: number; colours: number }> {
  const svg = await Deno.readTextFile(svgPath);
  const w = Number(/<svg[^>]*\swidth="([\d.]+)"/.exec(svg)?.[1] ?? 800);
  const h = Number(/<svg[^>]*\sheight="([\d.]+)"/.exec(svg)?.[1] ?? 600);
  const png = `${dir}/${svgPath.replace(/^.*\//, "").replace(/\.svg$/, ".png")}`;
  const out = await new Deno.Command(chromium(), {
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--hide-scrollbars",
      `--screenshot=${png}`,
      `--window-size=${Math.ceil(w) + 16},${Math.ceil(h) + 16}`,
      `file://${await Deno.realPath(svgPath)}`,
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(`Chromium failed on ${svgPath}: ${new TextDecoder().decode(out.stderr)}`);
  }
  const seen = inkAndColours(await decodePng(await Deno.readFile(png)));
  if (seen.ink < 0.02 || seen.colours < 3) {
    throw new Error(
      `${svgPath}: the browser shows no chart (${(seen.ink * 100).toFixed(1)}% ink, ` +
        `${seen.colours} colours; screenshot ${png})`,
    );
  }
  return { png, ...seen };
}

async function main(args: string[]): Promise<number> {
  let check = false, keep: string | undefined;
  const files: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const a = args[i];
    if (a === "--help" || a === "-h") {
      console.log(USAGE);
      return 0;
    } else if (a === "--check") check = true;
    else if (a === "--keep") keep = args[++i];
    else if (a.startsWith("--")) {
      console.error(`charts: unknown option ${a}; see --help`);
      return 2;
    } else files.push(a);
  }
  if (files.length === 0) {
    const dir = new URL("./results/", import.meta.url).pathname;
    for (const e of Deno.readDirSync(dir)) {
      if (e.isFile && e.name.endsWith(".json")) files.push(`${dir}${e.name}`);
    }
    files.sort();
  }
  const shots = keep ?? await Deno.makeTempDir({ prefix: "pinstream-charts-" });
  if (keep) await Deno.mkdir(keep, { recursive: true });
  try {
    for (const f of files) {
      const svg = await writeChart(f);
      if (svg === undefined) continue;
      if (!check) {
        console.log(`chart: ${svg}`);
        continue;
      }
      const seen = await checkInBrowser(svg, shots);
      console.log(
        `chart: ${svg} (in Chromium: ${(seen.ink * 100).toFixed(1)}% ink, ${seen.colours} colours)`,
      );
    }
  } catch (err) {
    console.error(`charts: ${(err as Error).message}`);
    return 1;
  } finally {
    if (!keep) await Deno.remove(shots, { recursive: true });
  }
  return 0;
}

if (import.meta.main) Deno.exit(await main(Deno.args));
