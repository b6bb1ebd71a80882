// The benchmark charts (train/_chart.ts, bench/charts.ts): every committed result draws a
// chart, and the chart shows in a real browser (headless Chromium renders the SVG; the decoded
// screenshot must show a drawing, not an empty page). Without Chromium the browser case is
// ignored, visibly; CI installs it.

import assert from "node:assert";
import { type BenchResult, chartSvg } from "../train/_chart.ts";
import { checkInBrowser, decodePng, inkAndColours } from "../bench/charts.ts";

const RESULTS = new URL("../bench/results/", import.meta.url);
const NAMES = ["kernels", "loader", "pipeline", "train", "transfer"];

function haveChromium(): boolean {
  for (const p of [Deno.env.get("CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"]) {
    if (!p) continue;
    try {
      Deno.statSync(p);
      return true;
    } catch { /* next */ }
  }
  return false;
}

Deno.test("every committed benchmark result draws a chart that names what it measures", async () => {
  for (const name of NAMES) {
    const result = JSON.parse(await Deno.readTextFile(new URL(`${name}.json`, RESULTS)));
    const svg = await chartSvg(result, name);
    assert.ok(svg !== undefined, `${name}: no chart`);
    assert.match(svg, /^<svg[^>]* width="\d+(\.\d+)?" height="\d+(\.\d+)?"/, name);
    assert.ok(
      svg.includes("samples/s") || svg.includes("GB/s") || svg.includes("GFLOP/s") ||
        svg.includes("seconds"),
      `${name}: no axis title`,
    );
  }
});

Deno.test("a result without a chart, or of an unknown benchmark, draws nothing", async () => {
  assert.strictEqual(await chartSvg({ rows: [] }, "nonexistent"), undefined);
  assert.strictEqual(await chartSvg({ rows: [] }), undefined);
});

Deno.test("decodePng reads an RGB PNG with every row filter, and inkAndColours counts what it shows", async () => {
  // A 5x5 RGB image, one row per filter type 0..4, compressed with CompressionStream.
  const w = 5, h = 5, rgb = new Uint8Array(w * h * 3);
  for (let i = 0; i < rgb.length; i++) rgb[i] = (i * 37 + (i >> 3) * 11) & 0xff;
  const raw = new Uint8Array(h * (w * 3 + 1));
  for (let y = 0; y < h; y++) {
    const f = y, row = rgb.subarray(y * w * 3, (y + 1) * w * 3);
    const up = y > 0 ? rgb.subarray((y - 1) * w * 3, y * w * 3) : new Uint8Array(w * 3);
    raw[y * (w * 3 + 1)] = f;
    for (let i = 0; i < w * 3; i++) {
      const a = i >= 3 ? row[i - 3] : 0, b = up[i], c = i >= 3 ? up[i - 3] : 0;
      const p = a + b - c, pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c);
      const pred = [0, a, b, (a + b) >> 1, pa <= pb && pa <= pc ? a : pb <= pc ? b : c][f];
      raw[y * (w * 3 + 1) + 1 + i] = (row[i] - pred) & 0xff;
    }
  }
  const z = new Uint8Array(
    await new Response(new Blob([raw]).stream().pipeThrough(new CompressionStream("deflate")))
      .arrayBuffer(),
  );
  const chunk = (type: string, body: Uint8Array) => {
    const out = new Uint8Array(12 + body.length);
    new DataView(out.buffer).setUint32(0, body.length);
    out.set(new TextEncoder().encode(type), 4);
    out.set(body, 8);
    return out; // the CRC is not checked by the decoder
  };
  const ihdr = new Uint8Array(13);
  new DataView(ihdr.buffer).setUint32(0, w);
  new DataView(ihdr.buffer).setUint32(4, h);
  ihdr.set([8, 2, 0, 0, 0], 8);
  const parts = [
    new Uint8Array([137, 80, 78, 71, 13, 10, 26, 10]),
    chunk("IHDR", ihdr),
    chunk("IDAT", z),
    chunk("IEND", new Uint8Array()),
  ];
  const png = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  parts.reduce((o, p) => (png.set(p, o), o + p.length), 0);
  const img = await decodePng(png);
  assert.deepStrictEqual([img.width, img.height], [w, h]);
  for (let p = 0; p < w * h; p++) {
    assert.deepStrictEqual([...img.rgba.subarray(p * 4, p * 4 + 4)], [
      ...rgb.subarray(p * 3, p * 3 + 3),
      255,
    ]);
  }
  const white = { width: 2, height: 2, rgba: new Uint8Array(16).fill(255) };
  assert.deepStrictEqual(inkAndColours(white), { ink: 0, colours: 1 });
  await assert.rejects(() => decodePng(new Uint8Array([1, 2, 3])), /not a PNG/);
});

Deno.test({
  name: "the charts show in headless Chromium",
  ignore: !haveChromium(),
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "pinstream-chart-test-" });
    try {
      for (const name of NAMES) {
        const result = JSON.parse(await Deno.readTextFile(new URL(`${name}.json`, RESULTS)));
        const svg = `${dir}/${name}.svg`;
        await Deno.writeTextFile(svg, (await chartSvg(result, name))!);
        const seen = await checkInBrowser(svg, dir);
        assert.ok(seen.ink > 0.02 && seen.colours >= 3, `${name}: ${JSON.stringify(seen)}`);
      }
      // And an empty page is not taken for a chart.
      await Deno.writeTextFile(
        `${dir}/blank.svg`,
        '<svg xmlns="http://www.w3.org/2000/svg" width="300" height="200"></svg>',
      );
      await assert.rejects(() => checkInBrowser(`${dir}/blank.svg`, dir), /shows no chart/);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test("a doctor report draws its own chart: each run against the device-resident batch", async () => {
  const run = (name: string, samplesPerSecond: number) => ({ name, samplesPerSecond });
  const report = {
    date: "2026-11-25T00:00:00Z",
    data: "Fashion-MNIST",
    synthetic: run("device-resident batch", 5000),
    sweep: [run("numWorkers 0", 4900), run("numWorkers 2", 4100)],
    depth1: run("numWorkers 0, depth 1", 4800),
    pageable: run("numWorkers 0, pin none", 4700),
    resident: run("resident", 4950),
  };
  const svg = await chartSvg(report as unknown as BenchResult, "doctor");
  assert.ok(svg !== undefined);
  for (
    const text of [
      "Does training wait for data?",
      "numWorkers 2",
      "data resident on the device",
      "fed by the loader",
      "no input",
    ]
  ) assert.ok(svg.includes(text), `${text} missing from the doctor chart`);
});
