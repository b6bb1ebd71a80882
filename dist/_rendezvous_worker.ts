/**
 * The TCP rendezvous of a torchrun-style launch of the nccl backend (see _rendezvous.ts): rank 0
 * listens on `MASTER_PORT` and hands NCCL's unique id to every rank that connects and names
 * itself; the others connect to `MASTER_ADDR:MASTER_PORT`, retrying until rank 0 listens.
 *
 * @module
 */

/// <reference lib="deno.worker" />

import { MAGIC, type RendezvousJob } from "./_rendezvous.ts";

async function readFull(conn: Deno.Conn, buf: Uint8Array): Promise<void> {
  for (let got = 0; got < buf.length;) {
    const n = await conn.read(buf.subarray(got));
    if (n === null) throw new Error(`the connection closed after ${got} of ${buf.length} bytes`);
    got += n;
  }
}

async function writeFull(conn: Deno.Conn, buf: Uint8Array): Promise<void> {
  for (let sent = 0; sent < buf.length;) sent += await conn.write(buf.subarray(sent));
}

async function serve(job: RendezvousJob, id: Uint8Array): Promise<void> {
  const listener = Deno.listen({ hostname: "0.0.0.0", port: job.port });
  const timer = setTimeout(() => listener.close(), job.timeoutMs);
  const seen = new Set<number>();
  try {
    while (seen.size < job.size - 1) {
      const conn = await listener.accept();
      try {
        const hello = new Int32Array(2);
        await readFull(conn, new Uint8Array(hello.buffer));
        if (hello[0] !== MAGIC || hello[1] <= 0 || hello[1] >= job.size) continue;
        await writeFull(conn, id);
        seen.add(hello[1]);
      } catch {
        // A stray connection (a port scan, a rank of another job): not one of ours.
      } finally {
        conn.close();
      }
    }
  } catch (err) {
    const missing = [...Array(job.size).keys()].filter((r) => r > 0 && !seen.has(r));
    throw new Error(
      `rank ${missing.join(", ")} did not connect within ${job.timeoutMs} ms ` +
        `(${(err as Error).message})`,
    );
  } finally {
    clearTimeout(timer);
    try {
      listener.close();
    } catch { /* closed by the timer */ }
  }
}

async function fetchId(job: RendezvousJob, out: Uint8Array): Promise<void> {
  const deadline = Date.now() + job.timeoutMs;
  let last = "";
  while (Date.now() < deadline) {
    let conn: Deno.Conn;
    try {
      conn = await Deno.connect({ hostname: job.addr, port: job.port });
    } catch (err) {
      last = (err as Error).message;
      await new Promise((r) => setTimeout(r, 100));
      continue;
    }
    try {
      await writeFull(conn, new Uint8Array(new Int32Array([MAGIC, job.rank]).buffer));
      await readFull(conn, out);
      return;
    } catch (err) {
      last = (err as Error).message;
    } finally {
      conn.close();
    }
  }
  throw new Error(`rank 0 did not answer within ${job.timeoutMs} ms (${last})`);
}

self.onmessage = async (e: MessageEvent<RendezvousJob>) => {
  const job = e.data;
  const state = new Int32Array(job.state);
  const id = new Uint8Array(job.id);
  let code = 1;
  try {
    if (job.rank === 0) {
      // The id is ready before anyone can connect; rank 0's main thread goes on to
      // ncclCommInitRank while this thread still serves the others.
      Atomics.store(state, 0, 1);
      Atomics.notify(state, 0);
      await serve(job, id);
      return;
    }
    await fetchId(job, id);
  } catch (err) {
    code = -1;
    new TextEncoder().encodeInto((err as Error).message, new Uint8Array(job.message));
  }
  Atomics.store(state, 0, code);
  Atomics.notify(state, 0);
};
