// The TypeScript JPEG decoder (decode/jpeg.ts), the fallback where libjpeg-turbo cannot be
// loaded: bit for bit against djpeg and the TurboJPEG path on files written by Pillow, cjpeg
// and TurboJPEG (tests/_make_jpegs.py), the refusals, the pixel limit, and many truncated and
// corrupted files. Tests needing Pillow, djpeg or libturbojpeg are ignored, saying why,
// where they are missing. `deno test -A tests/image_jpeg_test.ts -- --fuzz-rounds=5000` runs
// more corrupted files than the 400 per file of the suite.

import assert from "node:assert";
import { join } from "node:path";
import { decodeJpegTs, jpegInfo } from "../decode/jpeg.ts";
import { ImageDecodeError, ImageDecoder } from "../decode/mod.ts";
import { diff, djpeg, have, pythonWithPillow } from "./_image_fixtures.ts";

const py = pythonWithPillow();
if (py === undefined) console.error("image_jpeg_test: no Python with Pillow: comparisons ignored");
const hasDjpeg = have("djpeg");
if (!hasDjpeg) {
  console.error("image_jpeg_test: no djpeg (libjpeg-turbo-progs): djpeg comparisons ignored");
}
const native = (() => {
  try {
    return new ImageDecoder({ backend: "native", exifOrientation: false });
  } catch (e) {
    console.error(`image_jpeg_test: ${(e as Error).message}: TurboJPEG comparisons ignored`);
    return undefined;
  }
})();
const ts = new ImageDecoder({ backend: "typescript", exifOrientation: false });

let made: Promise<string> | undefined;

/** The folder written by tests/_make_jpegs.py (once per test module). */
function files(): Promise<string> {
  made ??= (async () => {
    const dir = await Deno.makeTempDir({ prefix: "pinstream-jpegs-" });
    const script = new URL("./_make_jpegs.py", import.meta.url).pathname;
    const r = await new Deno.Command(py!, { args: [script, dir], stdout: "null" }).output();
    if (!r.success) {
      throw new Error(`Cannot make the test JPEGs: ${new TextDecoder().decode(r.stderr)}`);
    }
    globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));
    return dir;
  })();
  return made;
}

function names(dir: string): string[] {
  return Deno.readTextFileSync(join(dir, "names.txt")).split("\n").filter((s) => s);
}

const grey3 = (g: Uint8Array) => Uint8Array.from(Array.from(g).flatMap((v) => [v, v, v]));

Deno.test({
  name:
    "TypeScript JPEG decoder equals djpeg -dct int bit for bit at scales 1, 1/2, 1/4, 1/8 and -grayscale",
  ignore: py === undefined || !hasDjpeg,
  fn: async () => {
    const dir = await files();
    const all = names(dir);
    // Every sampling factor, baseline and progressive, restarts, odd sizes, quality 10-100.
    for (const part of ["_s0_", "_s1_", "_s2_", "_1x2_", "_2x2_", "_4x1_", "_2x1_1x2_1x1_"]) {
      assert.ok(all.some((f) => f.includes(part) && f.endsWith("_p.jpg")), part);
      assert.ok(all.some((f) => f.includes(part) && !f.endsWith("_p.jpg")), part);
    }
    let compared = 0;
    for (const f of all) {
      const path = join(dir, f);
      const bytes = Deno.readFileSync(path);
      for (const scale of [1, 2, 4, 8] as const) {
        const ref = djpeg(path, ["-dct", "int", "-scale", `1/${scale}`, "-pnm"]);
        const img = decodeJpegTs(bytes, 3, { scale });
        assert.deepStrictEqual([img.height, img.width], [ref.height, ref.width], `${f} 1/${scale}`);
        const want = ref.channels === 3 ? ref.data : grey3(ref.data);
        assert.deepStrictEqual(diff(img.data, want), { count: 0, max: 0 }, `${f} 1/${scale}`);
        compared++;
      }
      if (/cmyk|ycck/.test(f)) continue; // djpeg has no grey output of CMYK
      const grey = djpeg(path, ["-dct", "int", "-grayscale", "-pnm"]);
      const g = decodeJpegTs(bytes, 1);
      assert.deepStrictEqual(diff(g.data, grey.data), { count: 0, max: 0 }, `${f} grey`);
      compared++;
    }
    assert.ok(compared > 1500, `${compared} decodes compared`);
  },
});

Deno.test({
  name:
    "TypeScript JPEG decoder equals the TurboJPEG path for 1, 3 and 4 channels, DCT-scaled sizes and crops",
  ignore: py === undefined || native === undefined,
  fn: async () => {
    const dir = await files();
    let compared = 0, refused = 0;
    for (const f of names(dir)) {
      const bytes = Deno.readFileSync(join(dir, f));
      const { height: h, width: w } = jpegInfo(bytes);
      try {
        native!.decode(bytes);
      } catch (e) {
        // TurboJPEG's header refuses samplings it has no name for (1x4, 4x2, mixed ones);
        // djpeg decodes them (the test above), and "auto" hands them to the TypeScript decoder.
        assert.match((e as Error).message, /Could not determine subsampling type/, f);
        const auto = new ImageDecoder({ exifOrientation: false }).decode(bytes);
        assert.deepStrictEqual(diff(auto.data, decodeJpegTs(bytes, 3).data), { count: 0, max: 0 });
        refused++;
        continue;
      }
      compared++;
      for (const channels of [1, 3, 4] as const) {
        const a = new ImageDecoder({ channels, backend: "native" });
        const b = new ImageDecoder({ channels, backend: "typescript" });
        const targets = [
          {},
          { size: [Math.ceil(h / 2), Math.ceil(w / 2)] as const },
          { size: [Math.ceil(h / 8), Math.ceil(w / 8)] as const },
          { size: [7, 5] as const },
          {
            size: [6, 6] as const,
            crop: (hh: number, ww: number) => ({
              top: hh >> 2,
              left: ww >> 3,
              height: Math.max(1, hh >> 1),
              width: Math.max(1, ww >> 1),
            }),
          },
        ];
        for (const t of targets) {
          const x = a.decode(bytes, t), y = b.decode(bytes, t);
          const what = `${f} x${channels} ${JSON.stringify(t.size ?? "full")}`;
          assert.deepStrictEqual(
            [y.height, y.width, y.channels],
            [x.height, x.width, channels],
            what,
          );
          assert.deepStrictEqual(diff(x.data, y.data), { count: 0, max: 0 }, what);
        }
      }
    }
    assert.ok(compared > 250 && refused > 10, `${compared} files compared, ${refused} refused`);
  },
});

/** A copy of `bytes` with the frame header's fields changed. */
function patchSof(bytes: Uint8Array, patch: (b: Uint8Array, at: number) => void): Uint8Array {
  const b = bytes.slice();
  for (let i = 2; i < b.length - 1; i++) {
    if (b[i] === 0xff && (b[i + 1] === 0xc0 || b[i + 1] === 0xc2)) {
      patch(b, i);
      return b;
    }
  }
  throw new Error("no frame header");
}

Deno.test({
  name:
    "arithmetic-coded, 12-bit, lossless and hierarchical JPEGs and a height left to DNL are refused by name",
  ignore: py === undefined,
  fn: async () => {
    const dir = await files();
    const base = Deno.readFileSync(join(dir, "pil_17x9_s2_q90_b.jpg"));
    const cases: [Uint8Array | undefined, RegExp][] = [
      [
        have("cjpeg") ? Deno.readFileSync(join(dir, "arithmetic.jpg")) : undefined,
        /arithmetic-coded JPEG \(SOF9\) is not decoded by the TypeScript fallback \(libjpeg-turbo decodes it: apt-get install libturbojpeg0, and --allow-ffi\)$/,
      ],
      [
        patchSof(base, (b, at) => b[at + 4] = 12),
        /12-bit JPEG is not decoded \(8-bit samples only\)$/,
      ],
      [patchSof(base, (b, at) => b[at + 1] = 0xc3), /lossless JPEG \(SOF3\) is not decoded$/],
      [patchSof(base, (b, at) => b[at + 1] = 0xc5), /hierarchical JPEG \(SOF5\) is not decoded$/],
      [
        patchSof(base, (b, at) => b[at + 5] = b[at + 6] = 0),
        /JPEG DNL marker \(height after the scan\) is not supported$/,
      ],
    ];
    for (const [bytes, reason] of cases) {
      if (bytes === undefined) continue;
      assert.throws(() => decodeJpegTs(bytes, 3), (e) => e instanceof ImageDecodeError);
      assert.throws(() => ts.decode(bytes), reason);
    }
  },
});

Deno.test("the pixel limit is checked from the frame header, before anything is allocated", () => {
  // A frame header of 65535 x 65535 pixels and nothing after it: 4.3 billion pixels.
  const sof = [0xff, 0xc0, 0, 17, 8, 0xff, 0xff, 0xff, 0xff, 3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1];
  const bytes = new Uint8Array([0xff, 0xd8, ...sof]);
  assert.deepStrictEqual(jpegInfo(bytes), {
    width: 65535,
    height: 65535,
    colorspace: "ycbcr",
    progressive: false,
  });
  const limit =
    /image of 65535x65535 = 4294836225 pixels exceeds the limit of 178956970 \(maxPixels\)$/;
  assert.throws(() => ts.decode(bytes), limit);
  assert.throws(
    () => decodeJpegTs(bytes, 3, { maxPixels: 1000 }),
    /exceeds the limit of 1000 \(maxPixels\)/,
  );
  // Within the limit, the missing scans are the error.
  const small = bytes.slice();
  small.set([0, 16, 0, 16], 7);
  assert.throws(() => decodeJpegTs(small, 3, { maxPixels: 1000 }), /JPEG data is truncated/);
});

const roundsArg = Deno.args.findLast((a) => a.startsWith("--fuzz-rounds="))?.slice(14);
const ROUNDS = roundsArg === undefined ? 400 : Number(roundsArg);
if (!(Number.isInteger(ROUNDS) && ROUNDS > 0)) {
  throw new RangeError(`Cannot fuzz: --fuzz-rounds should be a positive integer, got ${roundsArg}`);
}

Deno.test({
  name:
    "truncated and corrupted JPEGs: every truncation refused, byte flips refused or decoded whole, no other error",
  ignore: py === undefined,
  fn: async () => {
    const dir = await files();
    let seed = 12345;
    const rnd = () => (seed = (Math.imul(seed, 1103515245) + 12345) & 0x7fffffff) / 0x80000000;
    const tally = { refused: 0, decoded: 0, agree: 0, both: 0 };
    for (
      const f of [
        "pil_33x31_s2_q90_b.jpg",
        "pil_33x31_s1_q50_p.jpg",
        "pil_17x9_grey_p.jpg",
        "pil_9x17_cmyk.jpg",
        ...(have("cjpeg") ? ["cj_33x31_2x2_r3p.jpg", "cj_17x9_2x1_r1.jpg"] : []),
      ]
    ) {
      const orig = Deno.readFileSync(join(dir, f));
      const info = jpegInfo(orig);
      // Every truncation: the file lacks its end, and both decoders say so.
      for (let n = 0; n < orig.length; n++) {
        const cut = orig.subarray(0, n);
        assert.throws(
          () => decodeJpegTs(cut, 3),
          (e) => e instanceof ImageDecodeError,
          `${f}[:${n}]`,
        );
        if (native !== undefined && n > 2) {
          assert.throws(() => native.decode(cut), /JPEG (header|data) is (truncated|corrupt)/);
        }
      }
      for (let round = 0; round < ROUNDS; round++) {
        const b = orig.slice();
        for (let k = 0; k <= round % 4; k++) {
          const i = 2 + Math.floor(rnd() * (b.length - 2));
          b[i] = round % 2 ? b[i] ^ (1 << Math.floor(rnd() * 8)) : Math.floor(rnd() * 256);
        }
        let mine: Uint8Array | undefined;
        try {
          const img = decodeJpegTs(b, 3, { maxPixels: 1 << 20 });
          assert.strictEqual(img.data.length, img.width * img.height * 3);
          assert.ok(img.width * img.height <= 1 << 20);
          mine = img.data;
          tally.decoded++;
        } catch (e) {
          if (!(e instanceof ImageDecodeError)) {
            throw new Error(`${f} round ${round}`, { cause: e });
          }
          assert.match(
            e.message,
            /^(JPEG (header|data) is (corrupt|truncated) \(|image of \d+x\d+ = \d+ pixels exceeds|\S+ JPEG|JPEG of \d+ components|JPEG sampling|JPEG DNL marker)/,
          );
          tally.refused++;
        }
        if (mine !== undefined && native !== undefined) {
          try {
            const theirs = native.decode(b).data;
            tally.both++;
            if (theirs.length === mine.length && diff(theirs, mine).count === 0) tally.agree++;
          } catch {
            // Refused by libjpeg-turbo only: counted out of `both`.
          }
        }
      }
      // The original still decodes after all that (no state kept from bad files).
      assert.deepStrictEqual([decodeJpegTs(orig, 3).width, info.width], [info.width, info.width]);
    }
    assert.ok(tally.refused > 0 && tally.decoded > 0, JSON.stringify(tally));
  },
});

Deno.test({
  name:
    "the TurboJPEG path decodes good files after a corrupt header and refuses a scan cut by a marker",
  ignore: py === undefined || native === undefined,
  fn: async () => {
    const dir = await files();
    const good = Deno.readFileSync(join(dir, "pil_33x31_s2_q90_b.jpg"));
    const want = native!.decode(good).data.slice();
    // Cut inside a Huffman table: the decompressor fails within the header.
    assert.throws(() => native!.decode(good.subarray(0, 220)), /JPEG header is corrupt/);
    assert.deepStrictEqual(diff(native!.decode(good).data, want), { count: 0, max: 0 });
    // A stuffed 0xFF00 in the scan turned into marker 0xFF7F: libjpeg warns that the data ends
    // early, then fails on the unknown marker, which TurboJPEG reports as a warning.
    const sos = good.findIndex((v, i) => v === 0xff && good[i + 1] === 0xda);
    const at = good.findIndex((v, i) => i > sos + 14 && v === 0xff && good[i + 1] === 0);
    assert.ok(at > 0);
    const cut = good.slice();
    cut[at + 1] = 0x7f;
    assert.throws(
      () => native!.decode(cut),
      /JPEG data is truncated \(Corrupt JPEG data: premature end/,
    );
    assert.throws(
      () => ts.decode(cut),
      /JPEG data is corrupt \(premature end of data segment at marker 0xFF7F\)/,
    );
  },
});

Deno.test({
  name:
    "progressive scans that stop before the last bit: within 12 levels of djpeg (libjpeg smooths those blocks)",
  ignore: !hasDjpeg || !have("cjpeg"),
  fn: async () => {
    const dir = await Deno.makeTempDir({ prefix: "pinstream-jpeg-partial-" });
    try {
      const ppm = join(dir, "noise.ppm"), scans = join(dir, "scans.txt");
      const jpeg = join(dir, "partial.jpg");
      // 120 x 80 RGB: gradients under seeded noise.
      let seed = 7;
      const px = Uint8Array.from({ length: 120 * 80 * 3 }, (_, i) => {
        seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
        return ((i % 360) / 2 + (seed >>> 26) * 2 + ((i / 360) | 0)) & 255;
      });
      Deno.writeFileSync(
        ppm,
        new Uint8Array([...new TextEncoder().encode("P6 120 80 255\n"), ...px]),
      );
      // DC in full, then AC bands whose last bits (Al 1 and 2) are never refined.
      await Deno.writeTextFile(
        scans,
        "0,1,2: 0-0, 0, 1;\n0: 1-5, 0, 2;\n2: 1-63, 0, 1;\n1: 1-63, 0, 1;\n0: 6-63, 0, 2;\n",
      );
      const c = new Deno.Command("cjpeg", { args: ["-scans", scans, "-outfile", jpeg, ppm] })
        .outputSync();
      assert.ok(c.success, new TextDecoder().decode(c.stderr));
      const ref = djpeg(jpeg, ["-dct", "int", "-pnm"]);
      const d = diff(decodeJpegTs(Deno.readFileSync(jpeg), 3).data, ref.data);
      // Measured: 18,081 of 28,800 bytes differ, by at most 11.
      assert.ok(d.count > 0 && d.max <= 12, JSON.stringify(d));
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
