/**
 * Assembles decode/_simd.wat (WebAssembly text) and writes the module, in base64, into
 * decode/_simd.ts between its `BEGIN MODULE` and `END MODULE` lines. Run it after
 * editing the .wat file; `--check` only reports whether the embedded module is current.
 *
 *     deno run -A tools/assemble_wasm.ts [--check]
 *
 * Uses npm's wabt (WABT's wat2wasm, built for WebAssembly) with the SIMD, multi-memory and
 * threads (shared memory) features.
 *
 * @module
 */

const ROOT = new URL("../", import.meta.url);
const WAT = new URL("decode/_simd.wat", ROOT);
const TS = new URL("decode/_simd.ts", ROOT);

/** `source` as `deno fmt` writes it (the project's settings), so the check survives a format. */
async function formatted(source: string): Promise<string> {
  const fmt = new Deno.Command(Deno.execPath(), {
    args: ["fmt", "--ext", "ts", "-"],
    cwd: ROOT.pathname,
    stdin: "piped",
    stdout: "piped",
  }).spawn();
  const writer = fmt.stdin.getWriter();
  await writer.write(new TextEncoder().encode(source));
  await writer.close();
  const r = await fmt.output();
  if (!r.success) throw new Error("deno fmt failed on the generated module");
  return new TextDecoder().decode(r.stdout);
}

// Only this tool needs WABT: a specifier deno check does not follow keeps it out of the
// project's checks, its import map and the lock file (so they need no network).
const WABT = "npm:wabt@1.0.37";
// deno-lint-ignore no-explicit-any
const w: any = await (await import(WABT)).default();
const FEATURES = { simd: true, multi_memory: true, threads: true };
const parsed = w.parseWat("_simd.wat", Deno.readTextFileSync(WAT), FEATURES);
parsed.resolveNames();
parsed.validate(FEATURES);
const { buffer } = parsed.toBinary({ log: false, write_debug_names: false });
parsed.destroy();
const b64 = btoa(String.fromCharCode(...buffer));
const lines: string[] = [];
for (let i = 0; i < b64.length; i += 88) lines.push(`  "${b64.slice(i, i + 88)}" +`);
lines[lines.length - 1] = lines[lines.length - 1].slice(0, -2) + ",";
const text = Deno.readTextFileSync(TS);
const begin = text.indexOf("// BEGIN MODULE\n"), end = text.indexOf("  // END MODULE");
if (begin < 0 || end < 0) throw new Error(`${TS.pathname}: no BEGIN MODULE / END MODULE lines`);
const next = await formatted(text.slice(0, begin + 16) + lines.join("\n") + "\n" + text.slice(end));
if (Deno.args.includes("--check")) {
  if (next !== text) {
    console.error(`${TS.pathname} is stale: run deno run -A tools/assemble_wasm.ts`);
    Deno.exit(1);
  }
  console.log(`${TS.pathname} holds the module assembled from ${WAT.pathname}`);
} else {
  Deno.writeTextFileSync(TS, next);
  console.log(`wrote ${buffer.length} bytes of WebAssembly into ${TS.pathname}`);
}
