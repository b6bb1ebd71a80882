// The README's main commands on a machine that has never reached a package registry: an empty
// DENO_DIR inside a network namespace with no interfaces (`unshare -n`, which needs root). The
// training runs; only the curves, whose chart package cannot be fetched, are skipped in one line.
import assert from "node:assert";

const ROOT = new URL("..", import.meta.url).pathname;

/** Whether this process may make a network namespace (root with util-linux's unshare). */
async function canUnshare(): Promise<boolean> {
  try {
    const out = await new Deno.Command("unshare", { args: ["-n", "true"], stderr: "null" })
      .output();
    return out.success;
  } catch {
    return false;
  }
}

const offline = await canUnshare();
if (!offline) console.log("offline_test: skipped (needs root and unshare for a network namespace)");

for (
  const [task, extra] of [
    ["cifar", ["--limit", "256"]],
    ["fashion", ["--model", "mlp", "--limit", "512", "--workers", "0"]],
  ] as const
) {
  Deno.test({
    name: `deno task ${task} runs offline with an empty DENO_DIR and skips only the curves`,
    ignore: !offline,
    async fn() {
      const dir = await Deno.makeTempDir();
      const out = await new Deno.Command("unshare", {
        args: [
          "-n",
          Deno.execPath(),
          "task",
          task,
          "--epochs",
          "1",
          "--quiet",
          "--device",
          "cpu",
          "--checkpoint",
          `${dir}/m.safetensors`,
          ...extra,
        ],
        cwd: ROOT,
        env: { DENO_DIR: `${dir}/deno`, NO_COLOR: "1" },
        stdout: "piped",
        stderr: "piped",
      }).output();
      const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
      assert.ok(out.success, `deno task ${task} failed offline:\n${text}`);
      assert.match(text, /test accuracy/);
      assert.match(
        text,
        /no curves drawn: the chart package npm:vega-lite is not in the Deno cache/,
      );
      assert.doesNotMatch(text, /Stack backtrace|panicked/);
      await Deno.remove(dir, { recursive: true });
    },
  });
}
