// One step of a resumed run for the interrupted-save test in nn_checkpoint_test.ts: loads the
// checkpoint at Deno.args[0] when there is one, then saves epoch Deno.args[1] (every value of
// save e is e), and dies at the point Deno.args[2] of the save protocol like a SIGKILL would:
// no cleanup runs. Points: "weights-write" (half the weights' temporary file written),
// "state-write" (half the state's), "weights-rename" and "state-rename" (just before that
// rename), "settle" (just before the rename that finishes an earlier interrupted commit; the
// save completes when there is none), "none" (the save completes).
import { Device } from "../ffi/device.ts";
import { Linear, loadCheckpoint, saveCheckpoint, SGD, statePathFor } from "../nn/mod.ts";

const [path, epochArg, killAt] = Deno.args;
const e = Number(epochArg);
const targets: Record<string, string> = {
  "weights-write": `${path}.tmp`,
  "state-write": `${statePathFor(path)}.tmp`,
};
const die = () => Deno.exit(9);

const open = Deno.open;
// deno-lint-ignore no-explicit-any
(Deno as any).open = async (p: string, options: Deno.OpenOptions) => {
  const file = await open(p, options);
  if (targets[killAt] !== p) return file;
  return {
    async write(bytes: Uint8Array) {
      await file.write(bytes.subarray(0, bytes.length >> 1));
      die();
    },
    sync: () => file.sync(),
    close: () => file.close(),
    [Symbol.dispose]: () => file.close(),
  };
};
const rename = Deno.rename;
// deno-lint-ignore no-explicit-any
(Deno as any).rename = async (from: string, to: string) => {
  const state = to === statePathFor(path);
  if (killAt === "weights-rename" && to === path) die();
  if (killAt === "state-rename" && state && weightsRenamed) die();
  if (killAt === "settle" && state && !weightsRenamed) die();
  await rename(from, to);
  if (to === path) weightsRenamed = true;
};
let weightsRenamed = false;

using device = Device.open("cpu");
using model = new Linear(8, 8).to(device);
using optimizer = new SGD(model.parameters(), { lr: 0.1, momentum: 0.9 });
try {
  await Deno.stat(path);
  const p = await loadCheckpoint(path, { model, optimizer });
  console.log(`resumed ${p.epoch}`);
} catch (err) {
  if (!(err instanceof Deno.errors.NotFound)) throw err;
}
const hyper = { lr: 0.1, momentum: 0.9, dampening: 0, nesterov: false, weightDecay: 0 };
const buffers = model.parameters().map((p) => new Float32Array(p.numel).fill(e));
for (const [i, p] of model.parameters().entries()) p.write(buffers[i]);
optimizer.loadStateDict({ hyper, stepsDone: e, momentumBuffers: buffers });
await saveCheckpoint(path, { model, optimizer }, { epoch: e, step: e });
