import assert from "node:assert";
import { Device, ProcessGroup, Tensor } from "../mod.ts";
import { assertAllOk, freePort, MPIS, runRanks, runTorchrunStyle } from "./_dist.ts";
import { CUDA } from "./_backends.ts";
import { emulatedNccl } from "./_nccl_stand_in.ts";

const LIB = emulatedNccl();

for (const mpi of ["openmpi", "mpich"] as const) {
  for (const n of [2, 4]) {
    Deno.test({
      name:
        `nccl backend: collectives on CUDA tensors match the reference (${mpi}, ${n} ranks) [cuda]`,
      ignore: !MPIS.includes(mpi) || LIB === undefined,
      async fn() {
        const r = await runRanks(mpi, n, ["_dist_nccl_child.ts"], {
          env: { PINSTREAM_NCCL_LIB: LIB! },
          limitMs: 600_000,
        });
        assertAllOk(r, n);
      },
    });
  }
}

for (const n of [2, 4]) {
  Deno.test({
    name: `nccl backend without MPI: a torchrun-style launch of ${n} ranks, the id over TCP, ` +
      `host memory over NCCL [cuda]`,
    ignore: LIB === undefined,
    async fn() {
      const r = await runTorchrunStyle(n, ["_dist_nccl_child.ts"], {
        env: { PINSTREAM_NCCL_LIB: LIB! },
        limitMs: 600_000,
      });
      assertAllOk(r, n);
    },
  });
}

Deno.test({
  name: "nccl backend without MPI: a rank that cannot reach rank 0 names the address [cuda]",
  ignore: LIB === undefined,
  fn() {
    const saved = Deno.env.get("PINSTREAM_NCCL_LIB");
    Deno.env.set("PINSTREAM_NCCL_LIB", LIB!);
    try {
      using device = Device.open("cuda");
      const port = String(freePort());
      const vars: Record<string, string> = {
        RANK: "1",
        WORLD_SIZE: "2",
        MASTER_ADDR: "127.0.0.1",
        MASTER_PORT: port,
      };
      const env = (k: string) => vars[k];
      assert.throws(
        () => ProcessGroup.init({ backend: "nccl", env, device, timeoutMs: 500 }),
        new RegExp(
          `^Error: Cannot join the nccl group through 127.0.0.1:${port} \\(MASTER_ADDR, ` +
            `MASTER_PORT\\) as rank 1 of 2: rank 0 did not answer within 500 ms`,
        ),
      );
      assert.throws(
        () => ProcessGroup.init({ backend: "nccl", env }),
        /a torchrun-style launch of the nccl backend needs \{ device \}/,
      );
      assert.throws(
        () =>
          ProcessGroup.init({
            backend: "nccl",
            env: (k) => ({ ...vars, MASTER_PORT: undefined })[k],
            device,
          }),
        /MASTER_ADDR and MASTER_PORT, where the ranks meet, are not set/,
      );
    } finally {
      if (saved === undefined) Deno.env.delete("PINSTREAM_NCCL_LIB");
      else Deno.env.set("PINSTREAM_NCCL_LIB", saved);
    }
  },
});

Deno.test({
  name: "nccl backend: one rank without a launcher, and its refusals [cuda]",
  ignore: LIB === undefined,
  async fn() {
    const saved = Deno.env.get("PINSTREAM_NCCL_LIB");
    Deno.env.set("PINSTREAM_NCCL_LIB", LIB!);
    try {
      using device = Device.open("cuda");
      using group = ProcessGroup.init({ backend: "nccl", env: () => undefined });
      assert.strictEqual(group.backend, "nccl");
      using x = Tensor.fromHost(device, new Float32Array([1.5, -2]), [2]);
      group.allReduce(x, { op: "avg" });
      assert.deepStrictEqual([...await x.toHost()], [1.5, -2]);
      using i = Tensor.fromHost(device, new Int32Array([3]), [1]);
      assert.throws(() => group.allReduce(i, { op: "avg" }), /avg of i32/);
      using o = Tensor.empty(device, [3], "f32");
      assert.throws(() => group.allGather(x, o), /must hold 1 x 2 f32/);
      // Host memory still goes over the group's host path.
      const h = new Float32Array([4]);
      group.allReduce(h);
      assert.deepStrictEqual([...h], [4]);
    } finally {
      if (saved === undefined) Deno.env.delete("PINSTREAM_NCCL_LIB");
      else Deno.env.set("PINSTREAM_NCCL_LIB", saved);
    }
  },
});

Deno.test({
  name: "the mpi backend refuses CUDA tensors and names the nccl backend [cuda]",
  ignore: CUDA.ignore,
  fn() {
    using device = Device.open("cuda");
    using group = ProcessGroup.init({ env: () => undefined });
    using x = Tensor.fromHost(device, new Float32Array([1]), [1]);
    assert.throws(() => group.allReduce(x), /create the group with \{ backend: "nccl" \}/);
  },
});

Deno.test({
  name: "bench/nccl_smoke.ts, bench/gpu_run.sh's NCCL step, passes on the stand-in [cuda]",
  ignore: LIB === undefined,
  async fn() {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", new URL("../bench/nccl_smoke.ts", import.meta.url).pathname],
      env: { PINSTREAM_NCCL_LIB: LIB!, NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(out.stdout);
    assert.strictEqual(out.code, 0, text + new TextDecoder().decode(out.stderr));
    assert.match(text, /the CUDA emulator's stand-in\)\n/);
    assert.match(text, /nccl smoke: ok 23 checks/);
  },
});
