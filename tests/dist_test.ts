import assert from "node:assert";
import { ProcessGroup } from "../mod.ts";
import { assertAllOk, MPIS, runRanks } from "./_dist.ts";

for (const mpi of ["openmpi", "mpich"] as const) {
  for (const n of [2, 4]) {
    Deno.test({
      name: `ProcessGroup's collectives match the reference on every element (${mpi}, ${n} ranks)`,
      ignore: !MPIS.includes(mpi),
      async fn() {
        assertAllOk(await runRanks(mpi, n, ["_dist_collectives_child.ts"]), n);
      },
    });
  }
}

Deno.test("ProcessGroup without a launcher is rank 0 of 1 and needs no MPI", () => {
  using g = ProcessGroup.init({ env: () => undefined });
  assert.deepStrictEqual([g.rank, g.size, g.mpi], [0, 1, null]);
  const x = new Float16Array([1, 2.5]);
  g.allReduce(x, { op: "avg" });
  assert.deepStrictEqual([...x], [1, 2.5]);
  const out = new Float32Array(2);
  g.reduceScatter(new Float32Array([3, 4]), out, { op: "avg" });
  assert.deepStrictEqual([...out], [3, 4]);
});

Deno.test("ProcessGroup refuses bad arguments with the expected shape named", () => {
  using g = ProcessGroup.init({ env: () => undefined });
  assert.throws(() => g.allGather(new Float32Array(2), new Float32Array(3)), /must hold 1 x 2 f32/);
  assert.throws(() => g.allReduce(new Int32Array(1), { op: "avg" }), /avg of i32/);
  assert.throws(
    () => g.allReduce(new Float32Array(1), { opp: "sum" } as never),
    /did you mean "op"/,
  );
  assert.throws(() => g.broadcast(new Float32Array(1), { root: 1 }), /root must be a rank below 1/);
  assert.throws(() => g.allReduce(new Uint8Array(1) as never), /must be a Float32Array/);
  g.dispose();
  assert.throws(() => g.barrier(), /disposed/);
});

Deno.test("ProcessGroup names what to install when the MPI library is missing", () => {
  const vars: Record<string, string> = {
    OMPI_COMM_WORLD_RANK: "0",
    OMPI_COMM_WORLD_SIZE: "2",
  };
  const saved = Deno.env.get("PINSTREAM_MPI_LIB");
  Deno.env.set("PINSTREAM_MPI_LIB", "/nonexistent/libmpi.so");
  try {
    assert.throws(
      () => ProcessGroup.init({ env: (k) => vars[k] }),
      /^Error: Cannot open the MPI library \/nonexistent\/libmpi.so \(from PINSTREAM_MPI_LIB\): .*No such file.*; install Open MPI \(apt-get install openmpi-bin libopenmpi-dev\)/,
    );
  } finally {
    if (saved === undefined) Deno.env.delete("PINSTREAM_MPI_LIB");
    else Deno.env.set("PINSTREAM_MPI_LIB", saved);
  }
});

Deno.test("ProcessGroup refuses a torchrun-style launch of several ranks without mpirun", () => {
  const vars: Record<string, string> = { RANK: "1", WORLD_SIZE: "2" };
  assert.throws(() => ProcessGroup.init({ env: (k) => vars[k] }), /mpirun -n 2/);
});

Deno.test("the nccl backend says where it looked for NCCL and how to name it", () => {
  const saved = Deno.env.get("PINSTREAM_NCCL_LIB");
  Deno.env.set("PINSTREAM_NCCL_LIB", "/nonexistent/libnccl.so.2");
  try {
    assert.throws(
      () => ProcessGroup.init({ backend: "nccl", env: () => undefined }),
      /^Error: Cannot find NCCL \(tried \/nonexistent\/libnccl.so.2\): .*PINSTREAM_NCCL_LIB/,
    );
  } finally {
    if (saved === undefined) Deno.env.delete("PINSTREAM_NCCL_LIB");
    else Deno.env.set("PINSTREAM_NCCL_LIB", saved);
  }
});
