/**
 * The package imported over HTTP, as users import it from JSR: the module graph, the kernel
 * sources the first-use build fetches next to `import.meta.url`, and the loader's workers all
 * come from a remote URL. The checkout is served on the loopback interface and a child Deno
 * with an empty module cache and an empty build cache runs the whole path from there.
 */

import assert from "node:assert";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../", import.meta.url));

/** Serves the files under ROOT on 127.0.0.1 (an ephemeral port) and counts the requests. */
function serveCheckout(): { server: Deno.HttpServer; base: string; requested: string[] } {
  const requested: string[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (req) => {
    const path = decodeURIComponent(new URL(req.url).pathname);
    requested.push(path);
    if (path.includes("..")) return new Response("bad path", { status: 400 });
    try {
      const body = await Deno.readFile(ROOT + path.slice(1));
      const type = /\.(ts|js)$/.test(path) ? "application/typescript" : "text/plain";
      return new Response(body, { headers: { "content-type": type } });
    } catch {
      return new Response("not found", { status: 404 });
    }
  });
  return { server, base: `http://127.0.0.1:${server.addr.port}/`, requested };
}

Deno.test("imported over HTTP, the package builds its kernels from fetched sources and its workers load remotely", async () => {
  const { server, base, requested } = serveCheckout();
  const tmp = await Deno.makeTempDir();
  try {
    const script = `
      import { DataLoader, Device, DevicePrefetcher, TensorDataset } from "${base}mod.ts";
      const n = 40;
      const images = new Uint8Array(new SharedArrayBuffer(n * 3 * 4 * 4));
      const labels = new Int32Array(new SharedArrayBuffer(n * 4));
      for (let i = 0; i < n; i++) { labels[i] = i; images.fill(i, i * 48, (i + 1) * 48); }
      const dataset = new TensorDataset({ image: { data: images, shape: [3, 4, 4] }, label: labels });
      using device = Device.open("cpu");
      await using loader = new DataLoader(dataset, {
        batchSize: 16, numWorkers: 1, seed: 3, autoRelease: false,
      });
      const feed = new DevicePrefetcher(loader, device, { mean: [0, 0, 0], std: [1, 1, 1], dtype: "f32" });
      const seen = [];
      for await (const b of feed) {
        const x = await b.images.toHost();
        const y = await b.labels.toHost();
        // Every pixel of sample i is i / 255 (to f32 rounding) after scaling with mean 0, std 1.
        for (let j = 0; j < y.length; j++) {
          if (Math.abs(x[j * 48] - y[j] / 255) > 1e-6) throw new Error("pixel of sample " + y[j]);
        }
        seen.push(...y);
      }
      await feed[Symbol.asyncDispose]();
      console.log(JSON.stringify({ seen }));
    `;
    await Deno.writeTextFile(`${tmp}/main.ts`, script);
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "--no-config", "--no-lock", `${tmp}/main.ts`],
      env: {
        NO_COLOR: "1",
        DENO_DIR: `${tmp}/deno`,
        PINSTREAM_CACHE: `${tmp}/cache`,
        PINSTREAM_LIB: "",
        PINSTREAM_LIB_CPU: "",
      },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(out.stderr);
    assert.ok(out.success, stderr);
    const { seen } = JSON.parse(new TextDecoder().decode(out.stdout));
    assert.deepStrictEqual(seen, Array.from({ length: 40 }, (_, i) => i));
    // The library was built from sources fetched over HTTP, into the empty cache.
    assert.ok(requested.includes("/kernels/cpu/core.c"), requested.join(" "));
    assert.ok(requested.includes("/kernels/pinstream.h"), requested.join(" "));
    assert.ok(requested.includes("/loader/worker.ts"), requested.join(" "));
    const built = [...Deno.readDirSync(`${tmp}/cache`)].filter((e) => !e.name.startsWith("."));
    assert.strictEqual(built.length, 1, built.map((e) => e.name).join(", "));
    assert.match(stderr, /pinstream: building the cpu backend/);
  } finally {
    await server.shutdown();
    await Deno.remove(tmp, { recursive: true });
  }
});
