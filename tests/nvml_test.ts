// GPU utilisation from NVML (ffi/nvml.ts) against the emulator's stand-in library
// (kernels/emu/nvml_stand_in.c: one GPU, fixed values), and without any NVML: the doctor and
// the training summary show the sampled values, or one line saying why there are none.

import assert from "node:assert";
import { gpuLine, GpuSampler, Nvml, openNvml } from "../ffi/nvml.ts";
import { summaryText } from "../train/fit.ts";
import { nvmlStandIn } from "./_nvml_stand_in.ts";

const LIB = nvmlStandIn();
if (LIB === undefined) console.warn("nvml_test: no C compiler, the NVML stand-in is skipped");
const MISSING = "/nonexistent/libnvidia-ml.so.1";

Deno.test({
  name: "Nvml reads the stand-in's GPU: utilisation, memory, temperature, name",
  ignore: LIB === undefined,
  fn() {
    using nvml = Nvml.open({ library: LIB });
    assert.strictEqual(nvml.deviceCount, 1);
    assert.deepStrictEqual(nvml.sample(0), {
      index: 0,
      name: "NVML stand-in GPU",
      smUtilization: 87,
      memoryUtilization: 41,
      memoryUsedBytes: 3 * 2 ** 30,
      memoryTotalBytes: 80 * 2 ** 30,
      temperatureC: 64,
    });
    assert.throws(() => nvml.sample(1), /Cannot read GPU 1 through NVML: Invalid Argument/);
    nvml.dispose();
    nvml.dispose(); // idempotent
    assert.throws(() => nvml.sample(0), /NVML is shut down/);
  },
});

Deno.test({
  name: "GpuSampler samples on a timer and summarizes; gpuLine says it in one line",
  ignore: LIB === undefined,
  async fn() {
    using nvml = Nvml.open({ library: LIB });
    const sampler = new GpuSampler(nvml, { intervalMs: 10 });
    await new Promise((r) => setTimeout(r, 80));
    const s = sampler.stop();
    assert.ok(s.samples >= 3, `${s.samples} samples`);
    assert.deepStrictEqual(s.smUtilization, { mean: 87, max: 87 });
    assert.strictEqual(s.temperatureC.max, 64);
    assert.strictEqual(s.error, undefined);
    assert.strictEqual(
      gpuLine(s),
      `GPU 0 (NVML stand-in GPU): SM 87% (max 87%), memory 41%, 3.0 of 80.0 GiB used, ` +
        `64 C (max 64 C), ${s.samples} samples`,
    );
    // A GPU that cannot be read ends the sampling with its error; nothing is thrown.
    const bad = new GpuSampler(nvml, { index: 3 }).stop();
    assert.strictEqual(bad.samples, 0);
    assert.match(gpuLine(bad), /^GPU 3: no NVML sample \(Cannot read GPU 3 .*Invalid Argument/);
    assert.throws(
      () => new GpuSampler(nvml, { intervalMS: 5 } as never),
      /unknown option "intervalMS" \(did you mean "intervalMs"\?\)/,
    );
  },
});

Deno.test("without NVML: one line saying so, never an error", () => {
  const r = openNvml({ library: MISSING });
  assert.strictEqual(typeof r, "string");
  assert.match(r as string, /^NVML not available: \/nonexistent\/libnvidia-ml\.so\.1 could not/);
  assert.ok(!(r as string).includes("\n"));
  assert.throws(() => Nvml.open({ library: MISSING }), /^Error: Cannot open NVML/);
  assert.throws(() => openNvml({ libary: "x" } as never), /did you mean "library"/);
});

const REPORT = {
  epoch: 1,
  trainLoss: 1,
  trainAcc: 0.5,
  testLoss: 1,
  testAcc: 0.5,
  samplesPerSecond: 10,
  inputWaitShare: 0,
  seconds: 1,
  lossScale: 1,
};

Deno.test("the training summary has a gpu line: the sampled values, or why there are none", () => {
  assert.match(
    summaryText([REPORT], { device: "cuda", gpu: "NVML not available: no driver" }),
    /\n {2}gpu {13}NVML not available: no driver/,
  );
  assert.doesNotMatch(summaryText([REPORT], { device: "cpu" }), /gpu/);
});

async function run(script: string, args: string[], env: Record<string, string>) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", new URL(`../${script}`, import.meta.url).pathname, ...args],
    env,
    stdin: "null",
  }).output();
  return {
    code: out.code,
    text: new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr),
  };
}

Deno.test({
  name: "deno task doctor shows the stand-in's figures, or one line without NVML",
  ignore: LIB === undefined,
  async fn() {
    const dir = await Deno.makeTempDir();
    try {
      const args = [
        "--device=cpu",
        "--example=fashion",
        "--steps=2",
        "--workers=0",
        "--batch-size=32",
        `--out=${dir}`,
      ];
      const withLib = await run("examples/doctor.ts", args, { PINSTREAM_NVML_LIB: LIB! });
      assert.strictEqual(withLib.code, 0, withLib.text);
      assert.match(withLib.text, /\ngpu: GPU 0 \(NVML stand-in GPU\): SM 87% .*64 C/);
      const without = await run("examples/doctor.ts", args, { PINSTREAM_NVML_LIB: MISSING });
      assert.strictEqual(without.code, 0, without.text);
      const lines = without.text.split("\n").filter((l) => l.includes("NVML"));
      assert.deepStrictEqual(lines.length, 1, without.text);
      assert.match(lines[0], /^gpu: NVML not available: /);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
