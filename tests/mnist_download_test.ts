// MNIST and Fashion-MNIST downloads (loader/datasets/mnist.ts, download: true) against a local
// HTTP server on the loopback serving generated gzip IDX files: a file with the expected MD5
// loads; a corrupted byte is refused naming the file and both digests, and leaves nothing in
// the data directory; so does a connection cut mid-file; a file already there is not fetched
// again.

import assert from "node:assert";
import { join } from "node:path";
import { FASHION_MNIST_MD5, FashionMNIST, MNIST, MNIST_MD5 } from "../loader/datasets/mnist.ts";
import { md5Hex } from "../loader/datasets/_files.ts";
import { gzip, idxBytes } from "./loader_fixtures.ts";

/** A test split of n images (first byte i) and labels (i * 3 % 10), as gzip IDX files. */
async function split(n: number): Promise<Record<string, Uint8Array>> {
  const images = new Uint8Array(n * 784);
  const labels = new Uint8Array(n);
  for (let i = 0; i < n; i++) {
    images[i * 784] = i;
    images[i * 784 + 783] = 255 - i;
    labels[i] = (i * 3) % 10;
  }
  return {
    "t10k-images-idx3-ubyte.gz": await gzip(idxBytes([n, 28, 28], images)),
    "t10k-labels-idx1-ubyte.gz": await gzip(idxBytes([n], labels)),
  };
}

/** Serves `files` by name on 127.0.0.1 (port 0), counting requests per name. */
function serve(files: Record<string, Uint8Array>) {
  const hits: Record<string, number> = {};
  const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen: () => {} }, (req) => {
    const name = new URL(req.url).pathname.split("/").pop()!;
    hits[name] = (hits[name] ?? 0) + 1;
    const body = files[name];
    if (body === undefined) return new Response("not found", { status: 404 });
    return new Response(body as Uint8Array<ArrayBuffer>, {
      headers: { "content-length": String(body.length) },
    });
  });
  return { server, hits, url: `http://127.0.0.1:${server.addr.port}/mnist/` };
}

function digests(files: Record<string, Uint8Array>): Record<string, string> {
  return Object.fromEntries(Object.entries(files).map(([k, v]) => [k, md5Hex(v)]));
}

function listing(dir: string): string[] {
  try {
    return [...Deno.readDirSync(dir)].map((e) => e.name).sort();
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return [];
    throw e;
  }
}

Deno.test("MNIST and FashionMNIST download the split, check the MD5s and load it", async () => {
  const files = await split(12);
  const { server, hits, url } = serve(files);
  const root = await Deno.makeTempDir();
  try {
    const opts = { train: false, download: true, url, md5: digests(files), progress: false };
    const ds = await MNIST.load({ root: join(root, "digits"), ...opts });
    assert.strictEqual(ds.length, 12);
    assert.strictEqual(ds.get(5).label, 5);
    assert.strictEqual(ds.images[5 * 784], 5);
    assert.strictEqual(ds.images[5 * 784 + 783], 250);
    assert.deepStrictEqual(listing(join(root, "digits")), Object.keys(files).sort());
    // Present files are not fetched again.
    await MNIST.load({ root: join(root, "digits"), ...opts });
    assert.deepStrictEqual(hits, {
      "t10k-images-idx3-ubyte.gz": 1,
      "t10k-labels-idx1-ubyte.gz": 1,
    });
    const fashion = await FashionMNIST.load({ root: join(root, "clothes"), ...opts });
    assert.strictEqual(fashion.get(7).label, 1);
  } finally {
    await server.shutdown();
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("a corrupted byte is refused naming the file and both digests, and nothing is kept", async () => {
  const files = await split(12);
  const expected = digests(files);
  const bad = { ...files, "t10k-labels-idx1-ubyte.gz": files["t10k-labels-idx1-ubyte.gz"].slice() };
  bad["t10k-labels-idx1-ubyte.gz"][20] ^= 0x40;
  const actual = md5Hex(bad["t10k-labels-idx1-ubyte.gz"]);
  const { server, url } = serve(bad);
  const root = await Deno.makeTempDir();
  try {
    await assert.rejects(
      MNIST.load({ root, train: false, download: true, url, md5: expected, progress: false }),
      (e: Error) => {
        assert.match(e.message, /^Cannot verify MNIST t10k-labels-idx1-ubyte\.gz from http:/);
        assert.ok(
          e.message.includes(
            `MD5 ${actual} does not match the expected ` +
              expected["t10k-labels-idx1-ubyte.gz"],
          ),
          e.message,
        );
        return true;
      },
    );
    // The images were complete and verified; of the labels, not even a temporary file.
    assert.deepStrictEqual(listing(root), ["t10k-images-idx3-ubyte.gz"]);
  } finally {
    await server.shutdown();
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("the published digests guard the default download: other bytes are refused", async () => {
  // The server's files are not the published ones, so the default MD5s must refuse them.
  const files = await split(3);
  const { server, url } = serve(files);
  const root = await Deno.makeTempDir();
  try {
    await assert.rejects(
      FashionMNIST.load({ root, train: false, download: true, url, progress: false }),
      new RegExp(`does not match the expected ${FASHION_MNIST_MD5["t10k-images-idx3-ubyte.gz"]}`),
    );
    assert.deepStrictEqual(listing(root), []);
    assert.strictEqual(Object.keys(MNIST_MD5).length, 4);
  } finally {
    await server.shutdown();
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("a missing file on the mirror (HTTP 404) is an error naming the URL; typos are refused", async () => {
  const { server, url } = serve({});
  const root = await Deno.makeTempDir();
  try {
    await assert.rejects(
      MNIST.load({ root, train: false, download: true, url, md5: MNIST_MD5, progress: false }),
      /Cannot download MNIST t10k-images-idx3-ubyte\.gz from http:\/\/127\.0\.0\.1:\d+\/mnist\/t10k-images-idx3-ubyte\.gz: HTTP 404/,
    );
    assert.deepStrictEqual(listing(root), []);
    await assert.rejects(
      MNIST.load({ root, downlaod: true } as never),
      /unknown option "downlaod" \(did you mean "download"\?\)/,
    );
    await assert.rejects(
      FashionMNIST.load({ download: true }),
      /download needs root/,
    );
  } finally {
    await server.shutdown();
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("a connection cut mid-file leaves nothing behind", async () => {
  const files = await split(40);
  const images = files["t10k-images-idx3-ubyte.gz"];
  const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen: () => {} }, () => {
    // Half the bytes, then the body fails: the client sees the connection end early.
    const body = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(images.slice(0, images.length >> 1));
        c.error(new Error("cut"));
      },
    });
    return new Response(body, { headers: { "content-length": String(images.length) } });
  });
  const root = await Deno.makeTempDir();
  try {
    await assert.rejects(
      MNIST.load({
        root,
        train: false,
        download: true,
        url: `http://127.0.0.1:${server.addr.port}/`,
        md5: digests(files),
        progress: false,
      }),
      /Cannot download MNIST t10k-images-idx3-ubyte\.gz/,
    );
    assert.deepStrictEqual(listing(root), []);
  } finally {
    await server.shutdown();
    await Deno.remove(root, { recursive: true });
  }
});
