// The README's commands are real: every `deno task NAME` it shows is a task of deno.json, every
// script it runs exists, every file and chart it links is in the repository. (The test suite
// runs its TypeScript blocks: `deno test --doc README.md`.)

import assert from "node:assert";

const ROOT = new URL("../", import.meta.url);
const README = await Deno.readTextFile(new URL("README.md", ROOT));

Deno.test("every deno task the README shows exists", async () => {
  const tasks = Object.keys(JSON.parse(await Deno.readTextFile(new URL("deno.json", ROOT))).tasks);
  const shown = new Set([...README.matchAll(/deno task ([\w:-]+)/g)].map((m) => m[1]));
  assert.ok(shown.has("cifar") && shown.has("test"), "the two commands of the quick start");
  for (const t of shown) assert.ok(tasks.includes(t), `deno task ${t} is not a task of deno.json`);
});

Deno.test("every script, file and chart the README names exists", async () => {
  const paths = new Set<string>();
  for (const m of README.matchAll(/deno run [^`\n]*?((?:examples|bench|tests)\/[\w./-]+\.ts)/g)) {
    paths.add(m[1]);
  }
  for (const m of README.matchAll(/\]\(((?:bench|examples|kernels|tests)\/[\w./-]+)\)/g)) {
    paths.add(m[1]);
  }
  for (
    const m of README.matchAll(
      /`((?:kernels|tests|bench|examples|loader|pipeline|nn|ffi)\/[\w./-]+\.(?:ts|h|cu|cuh|c|sh|md|svg|json))`/g,
    )
  ) {
    paths.add(m[1]);
  }
  assert.ok(paths.size > 10, `only ${paths.size} paths found`);
  for (const p of paths) {
    if (p.startsWith("bench/out/")) continue; // what a run writes, not part of the repository
    const stat = await Deno.stat(new URL(p, ROOT)).catch(() => undefined);
    assert.ok(stat?.isFile, `the README names ${p}, which does not exist`);
  }
});
