// The kernel seam stays where it is: nothing above ops/ reaches a `ps_*` symbol or the
// dlopen table, and ops/ stands on ffi/, internal/ and augment/ only, so a backend put under
// ops/ (ops/backend.ts) serves everything above it.

import assert from "node:assert";

const ROOT = new URL("../", import.meta.url);

/** The TypeScript files under `dir`, relative to the repository. */
function sources(dir: string): string[] {
  const out: string[] = [];
  const walk = (rel: string) => {
    for (const e of Deno.readDirSync(new URL(rel, ROOT))) {
      const path = `${rel}/${e.name}`;
      if (e.isDirectory) walk(path);
      else if (e.name.endsWith(".ts")) out.push(path);
    }
  };
  walk(dir);
  return out;
}

/** The folders above ops/ that ship, and the ones that use them. */
const ABOVE = ["nn", "pipeline", "train", "loader", "examples"];

/** The modules a file imports or re-exports (its doc examples' imports are not its own). */
function imports(text: string): string[] {
  const re = /^(?:import|export)\b[^"';]*?from\s+["']([^"']+)["']/gm;
  return [...text.matchAll(re)].map((m) => m[1]);
}

Deno.test("no file above ops/ calls a ps_* symbol or imports the symbol table", () => {
  const found: string[] = [];
  for (const dir of ABOVE) {
    for (const path of sources(dir)) {
      const text = Deno.readTextFileSync(new URL(path, ROOT));
      if (/\.symbols\.ps_|\blib\.symbols\b/.test(text)) found.push(`${path}: calls lib.symbols`);
      for (const spec of imports(text)) {
        if (/ffi\/(symbols|native_backend|library)\.ts$/.test(spec)) found.push(`${path}: ${spec}`);
      }
    }
  }
  assert.deepStrictEqual(found, []);
});

Deno.test("ops/ imports only ffi/, internal/, augment/ and itself", () => {
  const found: string[] = [];
  for (const path of sources("ops")) {
    for (const spec of imports(Deno.readTextFileSync(new URL(path, ROOT)))) {
      if (spec.startsWith("node:")) continue;
      if (!/^\.\/|^\.\.\/(ffi|internal|augment)\//.test(spec)) found.push(`${path}: ${spec}`);
    }
  }
  assert.deepStrictEqual(found, []);
});

Deno.test("ffi/ and internal/ import nothing from ops/", () => {
  const found: string[] = [];
  for (const path of [...sources("ffi"), ...sources("internal")]) {
    for (const spec of imports(Deno.readTextFileSync(new URL(path, ROOT)))) {
      if (spec.includes("/ops/")) found.push(`${path}: ${spec}`);
    }
  }
  assert.deepStrictEqual(found, []);
});
