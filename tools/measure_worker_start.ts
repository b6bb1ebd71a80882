// Measures what starting DataLoader workers costs a user of the package: modules fetched,
// time to the first batch and permission prompts, with the package imported three ways:
// - jsr: `jsr:@pinstream/pinstream@0.1.0` from a registry on loopback that answers as JSR
//   does (JSR_URL points Deno at it: meta.json, the version's manifest, the files "publish"
//   includes), since jsr.io is out of reach here;
// - http: `http://127.0.0.1:PORT/mod.ts` from the same server;
// - file: the checkout's mod.ts;
// each with an empty module cache (cold) and again with the same cache (warm). No std: the
// server is written here.
//
//   deno run -A tools/measure_worker_start.ts [--runs=3] [--json=out.json] [--prompts=0]
//   deno run -A --no-lock tools/measure_worker_start.ts --variant=bundle
//
// --variant=bundle measures the alternative of issue 11 item 9 without touching the
// checkout: a copy of the published files in which esbuild (npm) has bundled loader/worker.ts
// and its imports into loader/_worker.bundle.js, and the workers start from that bundle from
// file: and remote URLs alike. worker_info.ts stays outside the bundle: getWorkerInfo() reads
// a variable that the worker sets, and a dataset imports it from the package's own module.
// On Deno 2.9.6 the bundle did not earn its place (the README says why): a worker fetches
// only its entry module, since the rest of its graph is in the cache the main thread filled.
//
// Counting:
// - GETs: every request the server answers; "worker GETs" are those after the child script
//   fetched /__mark, which it does right before `new DataLoader` (its own graph is static
//   and already loaded by then).
// - first batch: ms from `new DataLoader` to the first batch of a 2-worker loader over a
//   TensorDataset (the workers' start dominates it); epoch: ms to the end of the epoch.
// - prompts: the child runs in a pseudo-terminal (python3's pty) with nothing granted but
//   --allow-import for the loopback server (as jsr.io is allowed by default); every
//   "Allow?" prompt is answered "y" (one grant per prompt, never "A"; after a 0.3 s pause, since Deno flushes
//   the terminal's input when it prompts) and counted by kind.
// - checks: permission checks logged by DENO_AUDIT_PERMISSIONS in the timed run (all
//   granted), by kind: what a narrower grant would have prompted for.

import { fileURLToPath, pathToFileURL } from "node:url";

const CHECKOUT = fileURLToPath(new URL("../", import.meta.url));
const args = Object.fromEntries(
  Deno.args.map((a) => a.replace(/^--/, "").split("=") as [string, string]),
);
const RUNS = Number(args.runs ?? 3);
const VARIANT = args.variant ?? "sources";
/** --prompts=0 skips the prompted runs (timings only). */
const PROMPTS = args.prompts !== "0";

/** The files deno.json "publish" includes, relative to `root`. */
function publishedFiles(root: string): string[] {
  const config = JSON.parse(Deno.readTextFileSync(root + "deno.json"));
  const files: string[] = [];
  const walk = (rel: string) => {
    const info = Deno.statSync(root + rel);
    if (info.isFile) {
      if (!rel.endsWith("_test.ts")) files.push(rel);
      return;
    }
    for (const e of Deno.readDirSync(root + rel)) walk(`${rel.replace(/\/$/, "")}/${e.name}`);
  };
  for (const inc of config.publish.include as string[]) walk(inc);
  return files;
}

/** A copy of the published files whose workers start from an esbuild bundle. */
async function bundledCopy(): Promise<string> {
  const root = (await Deno.makeTempDir({ prefix: "pinstream_bundled_" })) + "/";
  for (const f of publishedFiles(CHECKOUT)) {
    await Deno.mkdir(root + f.replace(/[^/]*$/, ""), { recursive: true });
    await Deno.copyFile(CHECKOUT + f, root + f);
  }
  // Only this measurement uses esbuild, and only with --variant=bundle: a specifier that
  // deno check does not follow keeps it out of deno.json, the package's import map and the
  // lock file (run with --no-lock).
  const ESBUILD = "npm:esbuild@0.28.2";
  const esbuild = await import(ESBUILD);
  try {
    await esbuild.build({
      absWorkingDir: root,
      entryPoints: ["loader/worker.ts"],
      outfile: "loader/_worker.bundle.js",
      bundle: true,
      format: "esm",
      platform: "neutral",
      target: "esnext",
      external: ["node:*", "./worker_info.ts"],
      logLevel: "silent",
    });
  } finally {
    await esbuild.stop();
  }
  const transport = root + "loader/_transport_workers.ts";
  const from = `new URL("./worker.ts", import.meta.url)`;
  const text = await Deno.readTextFile(transport);
  if (!text.includes(from)) throw new Error(`Cannot start workers from the bundle: no ${from}`);
  await Deno.writeTextFile(
    transport,
    text.replace(from, `new URL("./_worker.bundle.js", import.meta.url)`),
  );
  const bytes = (await Deno.stat(root + "loader/_worker.bundle.js")).size;
  console.log(`bundle: loader/_worker.bundle.js, ${bytes} bytes, esbuild ${esbuild.version}`);
  return root;
}

const ROOT = VARIANT === "bundle" ? await bundledCopy() : CHECKOUT;

interface Served {
  server: Deno.HttpServer;
  base: string;
  log: string[];
}

// A registry that answers as JSR does (JSR_URL points Deno at it): the package's meta, the
// version's manifest (every file "publish" includes, with its sha256) and the files.
const PKG = "/@pinstream/pinstream";
let manifest: Record<string, { size: number; checksum: string }> | undefined;
async function buildManifest() {
  const files = publishedFiles(ROOT);
  manifest = {};
  for (const f of files) {
    const bytes = await Deno.readFile(ROOT + f);
    const hex = Array.from(new Uint8Array(await crypto.subtle.digest("SHA-256", bytes)))
      .map((b) => b.toString(16).padStart(2, "0")).join("");
    manifest["/" + f] = { size: bytes.length, checksum: `sha256-${hex}` };
  }
}
async function jsrRoute(path: string): Promise<Response> {
  const json = (v: unknown) =>
    new Response(JSON.stringify(v), { headers: { "content-type": "application/json" } });
  if (path === `${PKG}/meta.json`) {
    return json({
      scope: "pinstream",
      name: "pinstream",
      latest: "0.1.0",
      versions: { "0.1.0": {} },
    });
  }
  if (path === `${PKG}/0.1.0_meta.json`) return json({ manifest, exports: { ".": "./mod.ts" } });
  const prefix = `${PKG}/0.1.0/`;
  if (!path.startsWith(prefix) || !manifest?.["/" + path.slice(prefix.length)]) {
    return new Response("not found", { status: 404 });
  }
  const body = await Deno.readFile(ROOT + path.slice(prefix.length));
  return new Response(body, { headers: { "content-type": "text/plain" } });
}

function serve(): Served {
  const log: string[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (req) => {
    const path = decodeURIComponent(new URL(req.url).pathname);
    log.push(path);
    if (path === "/__mark") return new Response("ok");
    if (path.startsWith("/jsr/")) return jsrRoute(path.slice(4));
    if (path.includes("..")) return new Response("bad path", { status: 400 });
    try {
      const body = await Deno.readFile(ROOT + path.slice(1));
      const type = /\.(ts)$/.test(path)
        ? "application/typescript"
        : /\.js$/.test(path)
        ? "application/javascript"
        : "text/plain";
      return new Response(body, { headers: { "content-type": type } });
    } catch {
      return new Response("not found", { status: 404 });
    }
  });
  return { server, base: `http://127.0.0.1:${server.addr.port}/`, log };
}

function childScript(modUrl: string, markUrl: string | null): string {
  return `
import { DataLoader, TensorDataset } from ${JSON.stringify(modUrl)};
${markUrl ? `await (await fetch(${JSON.stringify(markUrl)})).text();` : ""}
const n = 256;
const images = new Uint8Array(new SharedArrayBuffer(n * 3 * 8 * 8));
const labels = new Int32Array(new SharedArrayBuffer(n * 4));
for (let i = 0; i < n; i++) labels[i] = i;
const dataset = new TensorDataset({ image: { data: images, shape: [3, 8, 8] }, label: labels });
const t0 = performance.now();
let first = -1;
let batches = 0;
{
  await using loader = new DataLoader(dataset, { batchSize: 32, numWorkers: 2, seed: 1 });
  for await (const _b of loader) {
    if (first < 0) first = performance.now() - t0;
    batches++;
  }
}
const epoch = performance.now() - t0;
console.log("RESULT " + JSON.stringify({ first, epoch, batches }));
`;
}

// Runs `cmd` in a pseudo-terminal, answering each permission prompt "y"; prints the kinds.
const PTY_DRIVER = `
import os, pty, sys, re, json, select, time
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
buf = b""; kinds = []; seen = 0
deadline = time.time() + 300
while time.time() < deadline:
    try:
        r, _, _ = select.select([fd], [], [], 20)
        if not r: break
        data = os.read(fd, 4096)
    except OSError:
        break
    if not data: break
    buf += data
    text = re.sub(r"\\x1b\\[[0-9;?]*[A-Za-z]", "", buf.decode("utf-8", "replace"))
    prompts = [k + " " + v for k, v in re.findall(r'Deno requests (\\w+) access(?: to "([^"]*)")?', text)]
    nallow = text.count("Allow?")
    while seen < nallow:
        kinds.append(prompts[seen] if seen < len(prompts) else "?"); seen += 1
        time.sleep(0.3); os.write(fd, b"y\\r")
try: os.kill(pid, 9)
except: pass
os.waitpid(pid, 0)
print("PROMPTS " + json.dumps(kinds))
print("CHILD_OK" if b"RESULT " in buf else "CHILD_FAILED " + buf[-3000:].decode("utf-8", "replace"))
`;

interface RunResult {
  first: number;
  epoch: number;
  gets: number;
  workerGets: number;
  workerPaths: string[];
  checks: Record<string, number>;
  stderr: string;
}

async function timedRun(
  script: string,
  denoDir: string,
  extra: string[],
  served: Served | null,
): Promise<RunResult> {
  const audit = `${denoDir}.audit.${crypto.randomUUID()}.jsonl`;
  if (served) served.log.length = 0;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--no-config", "--no-lock", ...extra, script],
    env: { NO_COLOR: "1", DENO_DIR: denoDir, DENO_AUDIT_PERMISSIONS: audit, JSR_URL },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stdout = new TextDecoder().decode(out.stdout);
  const stderr = new TextDecoder().decode(out.stderr);
  const line = stdout.split("\n").find((l) => l.startsWith("RESULT "));
  if (!out.success || !line) throw new Error(`child failed:\n${stdout}\n${stderr}`);
  const r = JSON.parse(line.slice(7));
  const checks: Record<string, number> = {};
  try {
    for (const l of (await Deno.readTextFile(audit)).split("\n")) {
      if (!l) continue;
      const e = JSON.parse(l);
      checks[e.permission] = (checks[e.permission] ?? 0) + 1;
    }
    await Deno.remove(audit);
  } catch { /* no audit log: nothing checked */ }
  const log = served?.log ?? [];
  const mark = log.indexOf("/__mark");
  return {
    first: r.first,
    epoch: r.epoch,
    gets: log.filter((p) => p !== "/__mark").length,
    workerGets: mark < 0 ? 0 : log.length - mark - 1,
    workerPaths: mark < 0 ? [] : log.slice(mark + 1),
    checks,
    stderr,
  };
}

const promptLog: string[] = [];

async function promptRun(
  script: string,
  denoDir: string,
  extra: string[],
): Promise<Record<string, number>> {
  const out = await new Deno.Command("python3", {
    args: ["-c", PTY_DRIVER, Deno.execPath(), "run", "--no-config", "--no-lock", ...extra, script],
    env: { NO_COLOR: "1", DENO_DIR: denoDir, JSR_URL },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout);
  const line = text.split("\n").find((l) => l.startsWith("PROMPTS "));
  if (!line || !text.includes("CHILD_OK")) {
    throw new Error(`prompted child failed:\n${text}\n${new TextDecoder().decode(out.stderr)}`);
  }
  const counts: Record<string, number> = {};
  const asked: string[] = JSON.parse(line.slice(8));
  for (const k of asked) counts[k.split(" ")[0]] = (counts[k.split(" ")[0]] ?? 0) + 1;
  promptLog.push(...asked);
  return counts;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

const fmtCounts = (c: Record<string, number>) =>
  Object.entries(c).sort().map(([k, v]) => `${k} ${v}`).join(", ") || "none";

const tmp = await Deno.makeTempDir({ prefix: "pinstream_wstart_" });
const rows: Record<string, unknown>[] = [];
const served = serve();
const JSR_URL = `${served.base}jsr/`;
try {
  await buildManifest();
  for (const mode of ["jsr", "http", "file"] as const) {
    const modUrl = mode === "jsr"
      ? "jsr:@pinstream/pinstream@0.1.0"
      : mode === "http"
      ? `${served.base}mod.ts`
      : pathToFileURL(ROOT + "mod.ts").href;
    const markUrl = mode === "file" ? null : `${served.base}__mark`;
    const script = `${tmp}/main_${mode}.ts`;
    await Deno.writeTextFile(script, childScript(modUrl, markUrl));
    // The prompted runs fetch no mark, so that nothing but the import is allowed.
    const quiet = `${tmp}/quiet_${mode}.ts`;
    await Deno.writeTextFile(quiet, childScript(modUrl, null));
    const host = served.base.slice(7, -1);
    const extra = mode !== "file" ? [`--allow-import=${host}`] : [];
    const cold: RunResult[] = [];
    const warm: RunResult[] = [];
    for (let i = 0; i < RUNS; i++) {
      const dir = `${tmp}/deno_${mode}_${i}`;
      cold.push(await timedRun(script, dir, [], mode === "file" ? null : served));
      warm.push(await timedRun(script, dir, [], mode === "file" ? null : served));
    }
    promptLog.length = 0;
    const promptsCold = PROMPTS ? await promptRun(quiet, `${tmp}/deno_${mode}_p`, extra) : {};
    const asked = [...promptLog];
    const promptsWarm = PROMPTS ? await promptRun(quiet, `${tmp}/deno_${mode}_p`, extra) : {};
    for (
      const [label, rs, prompts] of [["cold", cold, promptsCold], [
        "warm",
        warm,
        promptsWarm,
      ]] as const
    ) {
      rows.push({
        mode,
        cache: label,
        gets: rs[0].gets,
        workerGets: rs[0].workerGets,
        workerPaths: rs[0].workerPaths,
        firstBatchMs: Math.round(median(rs.map((r) => r.first))),
        epochMs: Math.round(median(rs.map((r) => r.epoch))),
        firstBatchAllMs: rs.map((r) => Math.round(r.first)),
        prompts: fmtCounts(prompts),
        promptCount: Object.values(prompts).reduce((a, b) => a + b, 0),
        checks: fmtCounts(rs[0].checks),
        asked: label === "cold" ? asked : promptLog.slice(asked.length),
      });
    }
  }
} finally {
  await served.server.shutdown();
  await Deno.remove(tmp, { recursive: true });
  if (ROOT !== CHECKOUT) await Deno.remove(ROOT, { recursive: true });
}

console.log(`variant: ${VARIANT}, ${RUNS} runs each, Deno ${Deno.version.deno}`);
console.log(
  "| from | cache | GETs (workers) | first batch ms (median; runs) | epoch ms | prompts | permission checks |",
);
console.log("|---|---|---|---|---|---|---|");
for (const r of rows) {
  console.log(
    `| ${r.mode} | ${r.cache} | ${r.gets} (${r.workerGets}) | ${r.firstBatchMs} (${
      (r.firstBatchAllMs as number[]).join(", ")
    }) | ${r.epochMs} | ${PROMPTS ? `${r.promptCount}: ${r.prompts}` : "not run"} | ${r.checks} |`,
  );
}
if (args.json) {
  const git = await new Deno.Command("git", { args: ["rev-parse", "HEAD"], cwd: CHECKOUT })
    .output().catch(() => null);
  const record = {
    date: new Date().toISOString(),
    deno: Deno.version.deno,
    cpus: navigator.hardwareConcurrency,
    loadavg: Deno.loadavg(),
    commit: git?.success ? new TextDecoder().decode(git.stdout).trim() : "unknown",
    variant: VARIANT,
    runs: RUNS,
    rows,
  };
  await Deno.writeTextFile(args.json, JSON.stringify(record, null, 2) + "\n");
}
