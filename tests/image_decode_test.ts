import assert from "node:assert";
import { join } from "node:path";
import { DEFAULT_MAX_PIXELS, ImageDecoder, resizeBilinear, sniffImageType } from "../decode/mod.ts";
import { wasmOutputCopies, wasmResizeAvailable } from "../decode/_simd.ts";
import { rememberMemory } from "../internal/wasm_memory.ts";
import { TurboJpeg } from "../decode/turbojpeg.ts";
import { decodePngTs } from "../decode/png.ts";
import { PngFast } from "../decode/png_fast.ts";
import { Spng } from "../decode/spng.ts";
import { ImageDecodeError } from "../decode/types.ts";
import { deflateSync } from "node:zlib";
import { diff, djpeg, fixtures, have, manifest } from "./_image_fixtures.ts";

const dirP = fixtures();
const noFixtures = dirP === undefined;
if (noFixtures) {
  console.error("image_decode_test: no Python with Pillow: decoder comparisons ignored");
}
const native = (() => {
  try {
    return new ImageDecoder({ backend: "native" });
  } catch (e) {
    console.error(`image_decode_test: ${(e as Error).message}: native decoder tests ignored`);
    return undefined;
  }
})();
const ts = new ImageDecoder({ backend: "typescript" });

Deno.test({
  name: "decoders give Pillow's pixels bit for bit on every generated file (tolerance 0)",
  ignore: noFixtures || native === undefined,
  fn: async () => {
    const dir = await dirP!;
    const files = manifest(dir);
    assert.ok(files.length >= 20);
    for (const f of files) {
      const bytes = Deno.readFileSync(join(dir, f.file));
      const ref = Deno.readFileSync(join(dir, f.file + ".rgb"));
      for (const d of [native!, ts]) {
        const img = d.decode(bytes);
        assert.deepStrictEqual(
          [img.height, img.width, img.channels],
          [f.height, f.width, 3],
          f.file,
        );
        assert.deepStrictEqual(
          diff(img.data, ref),
          { count: 0, max: 0 },
          `${f.file} (${d.jpeg}, ${d.png})`,
        );
      }
    }
  },
});

Deno.test({
  name: "libspng and the TypeScript PNG decoder agree for 1, 3 and 4 channels (alpha, tRNS)",
  ignore: noFixtures || native === undefined,
  fn: async () => {
    const dir = await dirP!;
    for (const f of manifest(dir).filter((f) => f.file.endsWith(".png"))) {
      const bytes = Deno.readFileSync(join(dir, f.file));
      for (const channels of [1, 3, 4] as const) {
        const a = new ImageDecoder({ channels, backend: "native" }).decode(bytes);
        const b = new ImageDecoder({ channels, backend: "typescript" }).decode(bytes);
        assert.strictEqual(a.data.length, f.width * f.height * channels);
        assert.deepStrictEqual(
          diff(a.data, b.data),
          { count: 0, max: 0 },
          `${f.file} x${channels}`,
        );
      }
    }
    // Transparency reaches RGBA: the palette file's entry 3 and the RGBA file's alpha ramp.
    const rgba = new ImageDecoder({ channels: 4 }).decode(Deno.readFileSync(join(dir, "rgba.png")));
    assert.deepStrictEqual([rgba.data[3], rgba.data[7], rgba.data[11]], [0, 7, 14]);
  },
});

Deno.test({
  name: "JPEG matches djpeg (integer IDCT, fancy upsampling) at scales 1, 1/2, 1/4, 1/8, greyscale",
  ignore: noFixtures || native === undefined || !have("djpeg"),
  fn: async () => {
    const dir = await dirP!;
    const jpegs = manifest(dir).filter((f) => f.kind === "jpeg" || f.kind === "jpeg-grey");
    for (const f of jpegs) {
      const path = join(dir, f.file);
      const bytes = Deno.readFileSync(path);
      for (const denom of [1, 2, 4, 8]) {
        const ref = djpeg(path, ["-dct", "int", "-scale", `1/${denom}`, "-pnm"]);
        // Asking for exactly djpeg's scaled size decodes at that scale with no resize.
        const img = native!.decode(bytes, { size: [ref.height, ref.width] });
        assert.deepStrictEqual(
          [img.height, img.width],
          [ref.height, ref.width],
          `${f.file} 1/${denom}`,
        );
        const want = ref.channels === 3
          ? ref.data
          : Uint8Array.from(Array.from(ref.data).flatMap((v) => [v, v, v]));
        assert.deepStrictEqual(diff(img.data, want), { count: 0, max: 0 }, `${f.file} 1/${denom}`);
      }
      // Grey output of a colour JPEG is its luma plane, as djpeg -grayscale.
      const grey = djpeg(path, ["-dct", "int", "-grayscale", "-pnm"]);
      const g = new ImageDecoder({ channels: 1, backend: "native" }).decode(bytes);
      assert.deepStrictEqual(diff(g.data, grey.data), { count: 0, max: 0 }, `${f.file} grey`);
    }
  },
});

Deno.test({
  name: "CMYK JPEG matches djpeg's CMYK-to-RGB bit for bit",
  ignore: noFixtures || native === undefined || !have("djpeg"),
  fn: async () => {
    const dir = await dirP!;
    const path = join(dir, "cmyk.jpg");
    const ref = djpeg(path, ["-dct", "int", "-pnm"]);
    const img = native!.decode(Deno.readFileSync(path));
    assert.strictEqual(ref.channels, 3);
    assert.deepStrictEqual(diff(img.data, ref.data), { count: 0, max: 0 });
  },
});

Deno.test({
  name:
    "a fixed size takes the largest DCT reduction that covers it, then Pillow's bilinear resize",
  ignore: noFixtures || native === undefined,
  fn: async () => {
    const dir = await dirP!;
    assert.deepStrictEqual(TurboJpeg.scaledSize(375, 500, 100, 100), {
      height: 188,
      width: 250,
      denom: 2,
    });
    assert.deepStrictEqual(TurboJpeg.scaledSize(375, 500, 40, 60), {
      height: 47,
      width: 63,
      denom: 8,
    });
    assert.deepStrictEqual(TurboJpeg.scaledSize(375, 500, 224, 224), {
      height: 375,
      width: 500,
      denom: 1,
    });
    const bytes = Deno.readFileSync(join(dir, "rgb_500x375_s2_q90.jpg"));
    const half = native!.decode(bytes, { size: [188, 250] });
    // A result is the caller's: the next decode leaves it alone.
    const copy = half.data.slice();
    native!.decode(Deno.readFileSync(join(dir, "progressive.jpg")), { size: [188, 250] });
    assert.deepStrictEqual(diff(half.data, copy), { count: 0, max: 0 });
    const out = new Uint8Array(100 * 120 * 3 + 5);
    const img = native!.decode(bytes, { size: [100, 120], out });
    assert.strictEqual(img.data.buffer, out.buffer);
    assert.deepStrictEqual(diff(img.data, resizeBilinear(half, 100, 120).data), {
      count: 0,
      max: 0,
    });
    // Pillow's resize of the full decode, bit for bit.
    for (const r of JSON.parse(Deno.readTextFileSync(join(dir, "resized.json")))) {
      const full = native!.decode(Deno.readFileSync(join(dir, r.file)));
      for (const engine of ["auto", "javascript"] as const) {
        const got = resizeBilinear(full, r.height, r.width, true, undefined, undefined, engine);
        assert.deepStrictEqual(diff(got.data, Deno.readFileSync(join(dir, r.ref))), {
          count: 0,
          max: 0,
        }, `${r.ref} (${engine})`);
      }
    }
  },
});

Deno.test({
  name: "EXIF orientation is applied (JPEG and PNG) and can be turned off",
  ignore: noFixtures || native === undefined,
  fn: async () => {
    const dir = await dirP!;
    const bytes = Deno.readFileSync(join(dir, "exif6.jpg"));
    const up = native!.decode(bytes);
    assert.deepStrictEqual([up.height, up.width], [90, 50]);
    const raw = new ImageDecoder({ exifOrientation: false }).decode(bytes);
    assert.deepStrictEqual([raw.height, raw.width], [50, 90]);
    // Rotated 90 degrees clockwise: the upright top-left pixel is the stored bottom-left.
    assert.deepStrictEqual([...up.data.subarray(0, 3)], [
      ...raw.data.subarray(49 * 90 * 3, 49 * 90 * 3 + 3),
    ]);
    // A size asked is the upright image's.
    const s = native!.decode(bytes, { size: [30, 20] });
    assert.deepStrictEqual([s.height, s.width], [30, 20]);
    const png = ts.decode(Deno.readFileSync(join(dir, "exif6.png")));
    assert.deepStrictEqual([png.height, png.width], [45, 31]);
  },
});

Deno.test("the type comes from the magic bytes; other types and empty files are refused by name", () => {
  assert.strictEqual(sniffImageType(new Uint8Array([0x47, 0x49, 0x46, 0x38, 0x39, 0x61])), "gif");
  assert.throws(() => ts.decode(new Uint8Array()), /the file is empty \(0 bytes\)/);
  assert.throws(() => ts.decode(new TextEncoder().encode("hello world")), /not a JPEG or PNG file/);
  assert.throws(
    () => ts.decode(new Uint8Array([0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 0, 0])),
    /GIF files are not decoded \(only JPEG and PNG\)/,
  );
  assert.throws(
    () => ts.decode(new Uint8Array([0xff, 0xd8, 0xff, 0xe0, 0, 0])),
    /JPEG header is corrupt \(a segment length of 0\)/,
  );
  assert.match(ts.description, /JPEG TypeScript fallback \(backend "typescript" asked\)/);
  assert.strictEqual(DEFAULT_MAX_PIXELS, 178956970);
});

Deno.test({
  name:
    "truncated, corrupt and too large files are refused with the reason, by both decoders of each type",
  ignore: noFixtures || native === undefined,
  fn: async () => {
    const dir = await dirP!;
    const jpeg = Deno.readFileSync(join(dir, "rgb_500x375_s2_q90.jpg"));
    for (const d of [native!, ts]) {
      assert.throws(() => d.decode(jpeg.subarray(0, jpeg.length >> 1)), /JPEG data is truncated/);
      assert.throws(
        () => d.decode(jpeg.subarray(0, 100)),
        /JPEG (header|data) is (corrupt|truncated)/,
      );
    }
    for (const backend of ["native", "typescript"] as const) {
      assert.throws(
        () => new ImageDecoder({ maxPixels: 1000, backend }).decode(jpeg),
        /image of 500x375 = 187500 pixels exceeds the limit of 1000 \(maxPixels\)/,
      );
    }
    const png = Deno.readFileSync(join(dir, "rgb.png"));
    for (const d of [native!, ts]) {
      assert.throws(() => d.decode(png.subarray(0, png.length - 40)), /PNG/, d.png);
      const bad = png.slice();
      bad[60] ^= 0xff;
      assert.throws(() => d.decode(bad), /PNG/, d.png);
    }
    assert.throws(() => decodePngTs(png, 3, 100), /45x31 = 1395 pixels exceeds the limit of 100/);
    assert.throws(
      () => new ImageDecoder({ maxPixels: 100 }).decode(png),
      /exceeds the limit of 100/,
    );
  },
});

Deno.test("the WebAssembly resize gives the JavaScript loops' bytes on every box, size and channel count", () => {
  assert.ok(wasmResizeAvailable(), "WebAssembly SIMD is missing: the resize runs in JavaScript");
  const ring = rememberMemory(
    new WebAssembly.Memory({ initial: 2, maximum: 2, shared: true }),
  ) as SharedArrayBuffer;
  let seed = 7;
  const rand = (n: number) => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return Math.floor((seed / 2147483648) * n);
  };
  for (let t = 0; t < 1500; t++) {
    const c = ([1, 3, 4] as const)[rand(3)];
    const h = 1 + rand(90), w = 1 + rand(90);
    const data = Uint8Array.from({ length: h * w * c }, () => rand(256));
    const top = rand(h), left = rand(w);
    const box = rand(3) === 0
      ? undefined
      : { top, left, height: 1 + rand(h - top), width: 1 + rand(w - left) };
    // Shrinking and enlarging, either side kept or changed, with and without antialias.
    const oh = rand(4) === 0 ? (box?.height ?? h) : 1 + rand(120);
    const ow = rand(4) === 0 ? (box?.width ?? w) : 1 + rand(120);
    const antialias = rand(2) === 0;
    const img = { data, height: h, width: w, channels: c };
    const js = resizeBilinear(img, oh, ow, antialias, undefined, box, "javascript");
    // Into an offset view of a larger buffer, and into a ring slot (a remembered shared
    // memory, written by the last pass itself with no copy): the bytes around it stay.
    const what = JSON.stringify({ c, h, w, box, oh, ow, antialias });
    for (const buffer of [new ArrayBuffer(oh * ow * c + 32), ring]) {
      const slot = new Uint8Array(buffer, 0, oh * ow * c + 32).fill(0xa5);
      const copies = wasmOutputCopies();
      const wasm = resizeBilinear(img, oh, ow, antialias, slot.subarray(16), box);
      // (An unchanged size is a crop, copied by rows: no pass runs.)
      const resampled = oh !== (box?.height ?? h) || ow !== (box?.width ?? w);
      assert.strictEqual(wasmOutputCopies() - copies, resampled && buffer !== ring ? 1 : 0, what);
      assert.deepStrictEqual(diff(wasm.data, js.data), { count: 0, max: 0 }, what);
      assert.ok(slot.subarray(0, 16).every((b) => b === 0xa5), what);
      assert.ok(slot.subarray(16 + oh * ow * c).every((b) => b === 0xa5), what);
    }
  }
});

Deno.test({
  name: "a crop decoded into the resize's memory equals the same crop of a separate decode",
  ignore: noFixtures || native === undefined,
  fn: async () => {
    const dir = await dirP!;
    const bytes = Deno.readFileSync(join(dir, "rgb_500x375_s2_q90.jpg"));
    const full = native!.decode(bytes);
    // Less than twice the size asked: decoded at full scale (no DCT reduction).
    const box = { top: 31, left: 77, height: 150, width: 200 };
    const out = new Uint8Array(96 * 128 * 3);
    // Decoded into the WebAssembly memory, then resized there, output copied into `out`.
    const got = native!.decode(bytes, { size: [96, 128], out, crop: () => box });
    const want = resizeBilinear(full, 96, 128, true, undefined, box, "javascript");
    assert.strictEqual(got.data.buffer, out.buffer);
    assert.deepStrictEqual(diff(got.data, want.data), { count: 0, max: 0 });
  },
});

/** A PNG of `rows` (8-bit samples, `spp` a pixel), each row filtered with its own type. */
function pngOf(
  rows: Uint8Array[],
  width: number,
  colorType: number,
  spp: number,
  filters: number[],
): Uint8Array {
  const rowBytes = width * spp;
  const raw = new Uint8Array(rows.length * (rowBytes + 1));
  const zero = new Uint8Array(rowBytes);
  rows.forEach((row, y) => {
    const prev = y > 0 ? rows[y - 1] : zero, f = filters[y % filters.length];
    raw[y * (rowBytes + 1)] = f;
    for (let i = 0; i < rowBytes; i++) {
      const a = i >= spp ? row[i - spp] : 0, b = prev[i], c = i >= spp ? prev[i - spp] : 0;
      const p = a + b - c, pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c);
      const pred = [0, a, b, (a + b) >> 1, pa <= pb && pa <= pc ? a : pb <= pc ? b : c][f];
      raw[y * (rowBytes + 1) + 1 + i] = (row[i] - pred) & 0xff;
    }
  });
  const table = Array.from({ length: 256 }, (_, n) => {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    return c >>> 0;
  });
  const chunk = (type: string, data: Uint8Array) => {
    const out = new Uint8Array(12 + data.length), v = new DataView(out.buffer);
    v.setUint32(0, data.length);
    out.set(new TextEncoder().encode(type), 4);
    out.set(data, 8);
    let c = 0xffffffff;
    for (const x of out.subarray(4, 8 + data.length)) c = table[(c ^ x) & 255] ^ (c >>> 8);
    v.setUint32(8 + data.length, (c ^ 0xffffffff) >>> 0);
    return out;
  };
  const ihdr = new Uint8Array(13), v = new DataView(ihdr.buffer);
  v.setUint32(0, width);
  v.setUint32(4, rows.length);
  ihdr.set([8, colorType, 0, 0, 0], 8);
  const z = deflateSync(raw);
  // The image data split over several IDAT chunks, as encoders write it.
  const third = Math.ceil(z.length / 3);
  const parts = [0, 1, 2].map((k) => chunk("IDAT", z.subarray(k * third, (k + 1) * third)));
  const all = [
    new Uint8Array([137, 80, 78, 71, 13, 10, 26, 10]),
    chunk("IHDR", ihdr),
    ...parts.filter((c) => c.length > 12),
    chunk("IEND", new Uint8Array(0)),
  ];
  const png = new Uint8Array(all.reduce((s, c) => s + c.length, 0));
  let o = 0;
  for (const c of all) png.set(c, o), o += c.length;
  return png;
}

Deno.test({
  name:
    "PNGs through libdeflate give libspng's and the TypeScript decoder's pixels for every filter",
  ignore: native === undefined || !native.description.includes("libdeflate"),
  fn: () => {
    const spng = new Spng();
    const ts = new ImageDecoder({ backend: "typescript" });
    let seed = 11;
    const rand = () => (seed = (seed * 1103515245 + 12345) % 2147483648) >> 16 & 0xff;
    try {
      for (const [colorType, spp] of [[0, 1], [2, 3], [6, 4]] as const) {
        for (const width of [1, 2, 5, 16, 17, 33, 100]) {
          for (const filters of [[0], [1], [2], [3], [4], [0, 1, 2, 3, 4], [4, 2, 3, 1, 0]]) {
            const height = 1 + (width % 7);
            // Smooth rows with noise, so every predictor has something to predict.
            const rows = Array.from({ length: height }, (_, y) =>
              Uint8Array.from(
                { length: width * spp },
                (_, i) => (y * 13 + i * 7 + (rand() & 15)) & 0xff,
              ));
            const png = pngOf(rows, width, colorType, spp, filters);
            const what = JSON.stringify({ colorType, width, height, filters });
            const fast = new PngFast().decode(png, spp, Infinity);
            assert.ok(fast !== undefined, `the fast path refused ${what}`);
            const want = rows.flatMap((r) => [...r]);
            assert.deepStrictEqual([...fast.data], want, what);
            assert.deepStrictEqual([...native!.decode(png).data], [...ts.decode(png).data], what);
            if (spp !== 1) {
              assert.deepStrictEqual([...spng.decode(png, spp, Infinity).data], want, what);
            }
          }
        }
      }
    } finally {
      spng.dispose();
    }
  },
});

Deno.test({
  name: "the libdeflate path leaves what it does not decode, and every damaged file, to libspng",
  ignore: native === undefined || !native.description.includes("libdeflate"),
  fn: () => {
    const rows = Array.from(
      { length: 4 },
      (_, y) => Uint8Array.from({ length: 24 }, (_, i) => y * i),
    );
    const rgb = pngOf(rows, 8, 2, 3, [0, 1, 2, 4]);
    const fast = new PngFast();
    try {
      assert.ok(fast.decode(rgb, 3, Infinity) !== undefined);
      // Another channel count than the file's, a size over the limit.
      assert.strictEqual(fast.decode(rgb, 4, Infinity), undefined);
      assert.strictEqual(fast.decode(rgb, 3, 31), undefined);
      // A palette image, 16-bit samples, interlacing: other header fields.
      for (const [at, value] of [[25, 3], [24, 16], [28, 1]]) {
        const other = rgb.slice();
        other[at] = value;
        assert.strictEqual(fast.decode(other, 3, Infinity), undefined, `byte ${at} = ${value}`);
      }
      // A damaged chunk (CRC), a damaged stream, an unknown filter type: libspng's reason.
      const flipped = rgb.slice();
      flipped[rgb.length - 20] ^= 0x40;
      assert.strictEqual(fast.decode(flipped, 3, Infinity), undefined);
      assert.throws(() => native!.decode(flipped), ImageDecodeError);
      const badFilter = pngOf(rows, 8, 2, 3, [5]);
      assert.strictEqual(fast.decode(badFilter, 3, Infinity), undefined);
      assert.throws(() => native!.decode(badFilter), ImageDecodeError);
      // Cut before IEND.
      assert.strictEqual(fast.decode(rgb.subarray(0, rgb.length - 12), 3, Infinity), undefined);
    } finally {
      fast.dispose();
    }
  },
});
