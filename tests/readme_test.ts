// The README and the guides in docs/ are real: every `deno task NAME` they show is a task of
// deno.json, every script they run exists, every file, chart and guide they link is in the
// repository, and the README's Status figures are those of the committed benchmark results.
// (The test suite runs their TypeScript blocks: `deno test --doc README.md docs/`.)

import assert from "node:assert";
import { normalized, statusLines, statusOf } from "../bench/status.ts";

const ROOT = new URL("../", import.meta.url);
const README = await Deno.readTextFile(new URL("README.md", ROOT));
const DOCS = [...Deno.readDirSync(new URL("docs/", ROOT))]
  .filter((e) => e.isFile && e.name.endsWith(".md"))
  .map((e) => `docs/${e.name}`);
const PAGES = new Map<string, string>([["README.md", README]]);
for (const d of DOCS) PAGES.set(d, await Deno.readTextFile(new URL(d, ROOT)));

Deno.test("every deno task the README and the guides show exists", async () => {
  const tasks = Object.keys(JSON.parse(await Deno.readTextFile(new URL("deno.json", ROOT))).tasks);
  const quickStart = new Set([...README.matchAll(/deno task ([\w:-]+)/g)].map((m) => m[1]));
  assert.ok(
    quickStart.has("cifar") && quickStart.has("test"),
    "the two commands of the quick start",
  );
  for (const [page, text] of PAGES) {
    for (const m of text.matchAll(/deno task ([\w:-]+)/g)) {
      assert.ok(tasks.includes(m[1]), `${page} shows deno task ${m[1]}, not a task of deno.json`);
    }
  }
});

Deno.test("every script, file, chart and guide the README and the guides name exists", async () => {
  const folders = "examples|bench|tests|kernels|loader|pipeline|nn|ffi|train|internal|docs";
  let count = 0;
  for (const [page, text] of PAGES) {
    const paths = new Set<string>();
    for (
      const m of text.matchAll(/deno run [^`\n]*?((?:examples|bench|tests|tools)\/[\w./-]+\.ts)/g)
    ) {
      paths.add(m[1]);
    }
    for (const m of text.matchAll(new RegExp(`\\]\\(((?:${folders})\\/[\\w./-]+)\\)`, "g"))) {
      paths.add(m[1]);
    }
    const named = new RegExp(
      `\`((?:${folders})\\/[\\w./-]+\\.(?:ts|h|cu|cuh|c|sh|md|svg|json|py))\``,
      "g",
    );
    for (const m of text.matchAll(named)) paths.add(m[1]);
    for (const p of paths) {
      if (p.startsWith("bench/out/")) continue; // what a run writes, not part of the repository
      const stat = await Deno.stat(new URL(p, ROOT)).catch(() => undefined);
      assert.ok(stat?.isFile, `${page} names ${p}, which does not exist`);
    }
    count += paths.size;
  }
  assert.ok(count > 20, `only ${count} paths found`);
});

Deno.test("the README links every guide in docs/", () => {
  for (const d of DOCS) assert.ok(README.includes(`](${d})`), `the README does not link ${d}`);
});

Deno.test("the README's Status figures are those of bench/results (deno task status)", async () => {
  assert.strictEqual(statusOf(README), normalized((await statusLines()).join("\n")));
});
