/**
 * `deno task test` with arguments (tests/run.ts): deno test's own output reaches the terminal,
 * and its exit status is the runner's.
 */

import assert from "node:assert";

const RUNNER = new URL("./run.ts", import.meta.url).pathname;

async function runner(file: string): Promise<{ code: number; out: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", RUNNER, "--no-check", file],
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, out: dec.decode(out.stdout) + dec.decode(out.stderr) };
}

Deno.test("deno task test with arguments shows deno test's report and returns its status", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const pass = `${dir}/pass_test.ts`;
    const fail = `${dir}/fail_test.ts`;
    await Deno.writeTextFile(pass, `Deno.test("a case that passes", () => {});\n`);
    await Deno.writeTextFile(
      fail,
      `Deno.test("a case that fails", () => { throw new Error("boom"); });\n`,
    );
    const ok = await runner(pass);
    assert.strictEqual(ok.code, 0, ok.out);
    assert.match(ok.out, /a case that passes \.\.\. ok/);
    assert.match(ok.out, /ok \| 1 passed \| 0 failed/);
    const bad = await runner(fail);
    assert.notStrictEqual(bad.code, 0, bad.out);
    assert.match(bad.out, /a case that fails \.\.\. FAILED/);
    assert.match(bad.out, /boom/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
