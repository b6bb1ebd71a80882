import assert from "node:assert";
import { JobRing, RING_JOBS } from "../dist/_ring.ts";
import type { CommJob } from "../dist/_protocol.ts";

function job(seq: number): CommJob {
  return {
    seq,
    op: (["allReduce", "broadcast", "allGather", "reduceScatter", "barrier"] as const)[seq % 5],
    send: BigInt(seq) * 0x1_0000_0001n,
    // Addresses past 2^63 come back unsigned.
    recv: 0xffff_8000_0000_0000n + BigInt(seq),
    inPlace: seq % 2 === 0,
    count: seq * 1000 + 7,
    dtype: (["f32", "i32", "byte"] as const)[seq % 3],
    redop: (["sum", "max", "min"] as const)[seq % 3],
    root: seq % 4,
    userDtype: seq % 3,
    async: seq % 3 === 1,
  };
}

Deno.test("JobRing hands every field of every job across, in order, past its wrap-around", () => {
  const main = new JobRing();
  const thread = new JobRing(main.memory);
  for (let seq = 0; seq < RING_JOBS * 3 + 5; seq++) {
    assert.ok(main.push(job(seq), 1000));
    assert.deepStrictEqual(thread.take(0, 1), job(seq));
  }
  assert.strictEqual(thread.take(0, 1), "idle");
});

Deno.test("JobRing refuses to overwrite jobs not taken: a full ring times out the issuer", () => {
  const main = new JobRing();
  const thread = new JobRing(main.memory);
  for (let seq = 0; seq < RING_JOBS; seq++) assert.ok(main.push(job(seq), 1000));
  assert.strictEqual(main.push(job(RING_JOBS), 20), false);
  assert.deepStrictEqual(thread.take(0, 1), job(0));
  assert.ok(main.push(job(RING_JOBS), 20));
  for (let seq = 1; seq <= RING_JOBS; seq++) assert.deepStrictEqual(thread.take(0, 1), job(seq));
});

Deno.test("JobRing's stop ends the thread's take once the waiting jobs were taken", () => {
  const main = new JobRing();
  const thread = new JobRing(main.memory);
  main.push(job(0), 1000);
  main.stop();
  assert.deepStrictEqual(thread.take(0, 1), job(0));
  assert.strictEqual(thread.take(0, 1), null);
});

Deno.test("JobRing wakes a thread asleep in take from another thread", async () => {
  const main = new JobRing();
  const code = `
    import { JobRing } from ${JSON.stringify(new URL("../dist/_ring.ts", import.meta.url).href)};
    self.onmessage = (e) => {
      const ring = new JobRing(e.data);
      const seqs = [];
      for (;;) {
        const j = ring.take(0, 10_000);
        if (j === null) break;
        if (j !== "idle") seqs.push(j.seq);
      }
      self.postMessage(seqs);
    };`;
  const w = new Worker(`data:application/javascript,${encodeURIComponent(code)}`, {
    type: "module",
  });
  const done = new Promise<number[]>((r) => (w.onmessage = (e) => r(e.data)));
  w.postMessage(main.memory);
  for (let seq = 0; seq < 50; seq++) {
    main.push(job(seq), 5000);
    if (seq % 10 === 0) await new Promise((r) => setTimeout(r, 5));
  }
  main.stop();
  assert.deepStrictEqual(await done, Array.from({ length: 50 }, (_, k) => k));
  w.terminate();
});
