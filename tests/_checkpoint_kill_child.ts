// Saves a checkpoint to Deno.args[0] in a loop until it is killed, for the kill test in
// nn_checkpoint_test.ts. Save e holds e everywhere a value can go (weights, momentum buffers,
// completed steps, epoch), so the loader can tell which save each file came from.
import { Device } from "../ffi/device.ts";
import { Linear, saveCheckpoint, SGD } from "../nn/mod.ts";

const path = Deno.args[0];
using device = Device.open("cpu");
// Large enough that a save takes a few milliseconds, so random kills land inside saves.
using model = new Linear(256, 256).to(device);
using optimizer = new SGD(model.parameters(), { lr: 0.1, momentum: 0.9 });
const hyper = { lr: 0.1, momentum: 0.9, dampening: 0, nesterov: false, weightDecay: 0 };
for (let e = 1;; e++) {
  const buffers = model.parameters().map((p) => new Float32Array(p.numel).fill(e));
  for (const [i, p] of model.parameters().entries()) p.write(buffers[i]);
  optimizer.loadStateDict({ hyper, stepsDone: e, momentumBuffers: buffers });
  await saveCheckpoint(path, { model, optimizer }, { epoch: e, step: e });
  if (e === 1) await Deno.stdout.write(new TextEncoder().encode("saved\n"));
}
