// The house as its imports draw it matches the README's Layout: each folder of the package
// imports only from the floors below it (train/ on top; nn/ and pipeline/ side by side; ops/ and
// loader/ below; then ffi/ and augment/; internal/ at the bottom), and the README's picture
// names every folder there is.

import assert from "node:assert";

const ROOT = new URL("../", import.meta.url);

/** What each folder may import from, outside itself. */
const FLOORS: Record<string, readonly string[]> = {
  internal: [],
  augment: ["internal"],
  ffi: ["internal"],
  decode: ["internal"],
  loader: ["internal", "augment"],
  ops: ["internal", "ffi", "augment"],
  nn: ["internal", "ffi", "ops"],
  pipeline: ["internal", "ffi", "augment", "loader", "ops"],
  // dist/ stands beside train/: the fit loop runs data-parallel through it, dist/ never imports
  // train/.
  train: ["internal", "ffi", "augment", "loader", "ops", "nn", "pipeline", "dist"],
  dist: ["internal", "ffi", "augment", "loader", "ops", "nn", "pipeline"],
};

/**
 * What a folder may load on demand only, by a dynamic import: the loader's image datasets load
 * the decoders (and their native bindings) in the workers that decode, never in the loader's
 * core.
 */
const ON_DEMAND: Record<string, readonly string[]> = { loader: ["decode"] };

function* sources(dir: URL): Generator<URL> {
  for (const entry of Deno.readDirSync(dir)) {
    if (entry.isDirectory) yield* sources(new URL(`${entry.name}/`, dir));
    else if (entry.name.endsWith(".ts")) yield new URL(entry.name, dir);
  }
}

/**
 * The folders (first path segment under the root) that `file` imports by relative path, each
 * with the specifier and whether every import of it is dynamic. Type-only imports load nothing
 * and are left out.
 */
function importedFolders(file: URL): Map<string, { spec: string; dynamic: boolean }> {
  const found = new Map<string, { spec: string; dynamic: boolean }>();
  const text = Deno.readTextFileSync(file);
  const add = (spec: string, dynamic: boolean) => {
    const target = new URL(spec, file);
    if (!target.href.startsWith(ROOT.href)) return;
    const folder = target.href.slice(ROOT.href.length).split("/")[0];
    found.set(folder, { spec, dynamic: dynamic && (found.get(folder)?.dynamic ?? true) });
  };
  // Static imports and re-exports (a statement runs to its semicolon), then dynamic imports.
  const statements = /^(?:import|export)(\s+type\b)?[^;]*?from\s*["'](\.{1,2}\/[^"']+)["']/gm;
  for (const m of text.matchAll(statements)) if (m[1] === undefined) add(m[2], false);
  for (const m of text.matchAll(/^import\s+["'](\.{1,2}\/[^"']+)["']/gm)) add(m[1], false);
  for (const m of text.matchAll(/\bimport\(\s*["'](\.{1,2}\/[^"']+)["']/g)) add(m[1], true);
  return found;
}

for (const [folder, allowed] of Object.entries(FLOORS)) {
  Deno.test(`${folder}/ imports only from ${allowed.join(", ") || "nothing outside it"}`, () => {
    const dir = new URL(`${folder}/`, ROOT);
    try {
      Deno.statSync(dir);
    } catch {
      return; // a floor the picture names that has no code yet
    }
    let files = 0;
    for (const file of sources(dir)) {
      files++;
      for (const [target, { spec, dynamic }] of importedFolders(file)) {
        if (target === folder) continue;
        assert.ok(
          allowed.includes(target) || (dynamic && (ON_DEMAND[folder] ?? []).includes(target)),
          `${
            file.href.slice(ROOT.href.length)
          } imports ${spec}: ${folder}/ may not import ${target}/`,
        );
      }
    }
    assert.ok(files > 0, `${folder}/ holds no TypeScript`);
  });
}

Deno.test("the README's Layout names every folder of the package", () => {
  const readme = Deno.readTextFileSync(new URL("README.md", ROOT));
  const layout = readme.slice(
    readme.indexOf("## Layout"),
    readme.indexOf("\n## ", readme.indexOf("## Layout") + 1),
  );
  for (const entry of Deno.readDirSync(ROOT)) {
    if (!entry.isDirectory || entry.name.startsWith(".")) continue;
    assert.match(
      layout,
      new RegExp(`\\b${entry.name}/`),
      `the README's Layout lacks ${entry.name}/`,
    );
  }
});
