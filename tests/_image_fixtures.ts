// Test images: tests/_make_images.py writes them with Pillow (JPEG sizes and subsamplings,
// progressive, grey, CMYK, EXIF-rotated; PNG RGB, RGBA, grey, palette with transparency,
// 4-bit palette, 1-bit, 16-bit, interlaced) with Pillow's own decode of each. Tests that need
// them are ignored, saying why, where no Python with Pillow is installed.

import { join } from "node:path";

/** One generated file and the size Pillow decodes it to. */
export interface Fixture {
  file: string;
  kind: string;
  width: number;
  height: number;
}

/** A Python with Pillow, or undefined. */
export function pythonWithPillow(): string | undefined {
  for (const py of ["/usr/bin/python3", "python3"]) {
    try {
      const r = new Deno.Command(py, { args: ["-c", "import PIL"], stderr: "null", stdout: "null" })
        .outputSync();
      if (r.success) return py;
    } catch {
      // Not installed here: try the next.
    }
  }
  return undefined;
}

/** Whether a program runs. */
export function have(program: string): boolean {
  try {
    new Deno.Command(program, { args: ["-h"], stderr: "null", stdout: "null" }).outputSync();
    return true;
  } catch {
    return false;
  }
}

let made: Promise<string> | undefined;

/** The folder of generated images (made once per test module), or undefined without Pillow. */
export function fixtures(): Promise<string> | undefined {
  const py = pythonWithPillow();
  if (py === undefined) return undefined;
  made ??= (async () => {
    const dir = await Deno.makeTempDir({ prefix: "pinstream-images-" });
    const script = new URL("./_make_images.py", import.meta.url).pathname;
    const r = await new Deno.Command(py, { args: [script, dir], stdout: "null" }).output();
    if (!r.success) {
      throw new Error(`Cannot make the test images: ${new TextDecoder().decode(r.stderr)}`);
    }
    globalThis.addEventListener("unload", () => {
      try {
        Deno.removeSync(dir, { recursive: true });
      } catch {
        // Already gone.
      }
    });
    return dir;
  })();
  return made;
}

/** The manifest of a fixture folder. */
export function manifest(dir: string): Fixture[] {
  return JSON.parse(Deno.readTextFileSync(join(dir, "manifest.json")));
}

/** Parses a binary PGM (P5) or PPM (P6) as djpeg writes it. */
export function parsePnm(
  b: Uint8Array,
): { width: number; height: number; channels: 1 | 3; data: Uint8Array } {
  const fields: string[] = [];
  let at = 0;
  while (fields.length < 4) {
    while (b[at] === 0x20 || b[at] === 0x0a || b[at] === 0x0d || b[at] === 0x09) at++;
    if (b[at] === 0x23) {
      while (b[at] !== 0x0a) at++;
      continue;
    }
    let s = "";
    while (!(b[at] === 0x20 || b[at] === 0x0a || b[at] === 0x0d || b[at] === 0x09)) {
      s += String.fromCharCode(b[at++]);
    }
    fields.push(s);
  }
  at++;
  const [magic, w, h] = fields;
  const channels = magic === "P6" ? 3 : 1;
  const width = Number(w), height = Number(h);
  return { width, height, channels, data: b.subarray(at, at + width * height * channels) };
}

/** djpeg's output for a file and arguments. */
export function djpeg(path: string, args: string[]): ReturnType<typeof parsePnm> {
  const r = new Deno.Command("djpeg", { args: [...args, path] }).outputSync();
  if (!r.success) throw new Error(`djpeg failed: ${new TextDecoder().decode(r.stderr)}`);
  return parsePnm(r.stdout);
}

/** Count and largest size of the differences between two byte arrays. */
export function diff(a: Uint8Array, b: Uint8Array): { count: number; max: number } {
  let count = 0, max = 0;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i] - b[i]);
    if (d) count++, max = Math.max(max, d);
  }
  return { count, max };
}
