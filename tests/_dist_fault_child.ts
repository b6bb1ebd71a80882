/**
 * One rank of tests/dist_fault_test.ts: a few all-reduces, with a fault on the last rank.
 *
 *     --fault hang      the last rank stops issuing collectives (it sleeps)
 *     --fault die       the last rank exits with status 7 before its third collective
 *     --fault mismatch  the last rank broadcasts where the others all-reduce (debug mode)
 *     --fault none      idles in barriers until killed, printing `ready <pid>` once
 *     --device cuda     the all-reduces on a CUDA tensor, over the nccl backend
 *
 * @module
 */

import { parseArgs } from "node:util";
import { Device, ProcessGroup, Tensor } from "../mod.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    fault: { type: "string", default: "none" },
    timeout: { type: "string", default: "3000" },
    device: { type: "string", default: "cpu" },
  },
});
const fault = values.fault;
using device = values.device === "cuda" ? Device.open("cuda") : null;
using group = ProcessGroup.init({
  timeoutMs: Number(values.timeout),
  debug: fault === "mismatch",
  ...(device ? { backend: "nccl", device } : {}),
});
const faulty = group.rank === group.size - 1;
const ones = new Float32Array(10).fill(1);
const x = device ? Tensor.fromHost(device, ones, [10]) : ones;

if (fault === "none") {
  console.log(`ready ${Deno.pid}`);
  for (;;) {
    await group.barrierAsync().wait();
    await new Promise((r) => setTimeout(r, 50));
  }
}

for (let i = 0; i < 5; i++) {
  if (faulty && i === 2) {
    if (fault === "hang") {
      // Stuck in user code: no collective, no return to the event loop.
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0);
    }
    if (fault === "die") Deno.exit(7);
    if (fault === "mismatch") {
      group.broadcast(x);
      continue;
    }
  }
  group.allReduce(x);
}
console.log(`ok ${group.rank}`);
