// augment/ and loader/ stand on the floors the layout gives them: augment/ on internal/ alone
// (the loader draws with it and the pipeline applies it, so it can import neither), loader/ on
// augment/ and internal/ (pure TypeScript: no FFI, no pipeline).

import assert from "node:assert";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");

/** The top-level folders that the modules under `folder` import from (itself left out). */
async function floorsImportedBy(folder: string): Promise<Map<string, string[]>> {
  const found = new Map<string, string[]>();
  const walk = async (dir: string): Promise<void> => {
    for await (const e of Deno.readDir(dir)) {
      const path = join(dir, e.name);
      if (e.isDirectory) await walk(path);
      else if (e.name.endsWith(".ts")) {
        const text = await Deno.readTextFile(path);
        // Static imports and re-exports, and dynamic imports of a literal path.
        const specs = text.matchAll(/(?:from|import)\s*\(?\s*"(\.{1,2}\/[^"]+)"/g);
        for (const [, spec] of specs) {
          const top = relative(ROOT, resolve(dirname(path), spec)).split("/")[0];
          if (top === folder) continue;
          found.set(top, [...(found.get(top) ?? []), relative(ROOT, path)]);
        }
      }
    }
  };
  await walk(join(ROOT, folder));
  return found;
}

Deno.test("augment/ imports nothing but internal/", async () => {
  const floors = await floorsImportedBy("augment");
  assert.deepStrictEqual(
    [...floors.keys()].filter((f) => f !== "internal"),
    [],
    String([...floors]),
  );
  assert.ok(floors.has("internal"), "the scan finds augment/'s imports of internal/");
});

Deno.test("loader/ imports only augment/ and internal/ (no ffi/, no pipeline/)", async () => {
  const floors = await floorsImportedBy("loader");
  const above = [...floors.keys()].filter((f) => f !== "augment" && f !== "internal");
  assert.deepStrictEqual(above, [], String(above.map((f) => `${f}: ${floors.get(f)}`)));
  assert.ok(floors.has("augment") && floors.has("internal"));
});
