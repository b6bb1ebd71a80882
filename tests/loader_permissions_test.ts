// What the loader's workers ask of a user who granted only what the data needs.
import assert from "node:assert";

const CHILD = new URL("./_loader_no_env_child.ts", import.meta.url).pathname;

/** Whether util-linux's `script` is here to give the child a terminal (prompts need one). */
async function haveScript(): Promise<boolean> {
  try {
    return (await new Deno.Command("script", { args: ["-V"], stdout: "null" }).output()).success;
  } catch {
    return false;
  }
}

const tty = await haveScript();
if (!tty) {
  console.log("loader_permissions_test: skipped (needs util-linux's script for a terminal)");
}

Deno.test({
  name: "DataLoader workers start without asking for env permission when it is not granted",
  ignore: !tty,
  async fn() {
    // On a terminal, an env access without permission is a prompt; node's worker_threads copy
    // process.env into every worker unless told otherwise, which asked once per worker.
    const cmd = `${Deno.execPath()} run --allow-read ${CHILD}`;
    const out = await new Deno.Command("script", {
      args: ["-qec", cmd, "/dev/null"],
      stdin: "null",
      // A prompt waits for an answer that never comes: end it and let the asserts say why.
      signal: AbortSignal.timeout(30_000),
      stdout: "piped",
      stderr: "piped",
      env: { NO_COLOR: "1" },
    }).output();
    const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
    assert.doesNotMatch(text, /requests env access/, text);
    assert.match(text, /batches 8/, text);
  },
});
