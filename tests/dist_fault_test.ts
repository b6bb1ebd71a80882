/**
 * Faults in a data-parallel job end it within a bounded time, with an error naming the rank
 * at fault: a rank that hangs (the collective watchdog), one that dies, ranks that issue
 * different collectives (debug mode), and a launcher killed outright (no rank left behind).
 */

import assert from "node:assert";
import { MPIS, runRanks, runTorchrunStyle } from "./_dist.ts";
import { emulatedNccl } from "./_nccl_stand_in.ts";

const CHILD = "_dist_fault_child.ts";
/** The watchdog's timeout in the child is 3 s, its ranks answer within 3 s more. */
const BOUND_MS = 60_000;

for (const mpi of ["openmpi", "mpich"] as const) {
  const ignore = !MPIS.includes(mpi);
  Deno.test({
    name: `a rank that hangs makes the others fail naming it (${mpi})`,
    ignore,
    async fn() {
      const r = await runRanks(mpi, 3, [CHILD, "--fault", "hang"], { limitMs: BOUND_MS });
      assert.notStrictEqual(r.code, 0);
      assert.ok(r.ms < BOUND_MS, `took ${r.ms} ms`);
      assert.match(
        r.stderr,
        /Cannot finish allReduce #2 on rank [01]: no progress within 3000 ms: rank 2 never issued it \(its last was #1\)/,
      );
    },
  });
  Deno.test({
    name: `a rank that dies ends the job, naming it (${mpi})`,
    ignore,
    async fn() {
      const r = await runRanks(mpi, 3, [CHILD, "--fault", "die"], { limitMs: BOUND_MS });
      assert.notStrictEqual(r.code, 0);
      assert.ok(r.ms < BOUND_MS, `took ${r.ms} ms`);
      assert.match(r.stderr, /pinstream: rank 2 of 3 exits \(status 7\)/);
    },
  });
  Deno.test({
    name: `debug mode names ranks that issue different collectives (${mpi})`,
    ignore,
    async fn() {
      const r = await runRanks(mpi, 3, [CHILD, "--fault", "mismatch"], { limitMs: BOUND_MS });
      assert.notStrictEqual(r.code, 0);
      assert.match(
        r.stderr,
        /the ranks issued different collectives \(rank 0: allReduce #2 of 10 f32; rank 1: allReduce #2 of 10 f32; rank 2: broadcast #2 of 10 f32 from rank 0\)/,
      );
    },
  });
}

const NCCL = emulatedNccl();

Deno.test({
  name: "nccl backend: a rank that hangs makes the others abort NCCL, naming it [cuda]",
  ignore: MPIS.length === 0 || NCCL === undefined,
  async fn() {
    const r = await runRanks(MPIS[0], 3, [CHILD, "--fault", "hang", "--device", "cuda"], {
      limitMs: BOUND_MS,
      env: { PINSTREAM_NCCL_LIB: NCCL! },
    });
    assert.notStrictEqual(r.code, 0);
    assert.ok(r.ms < BOUND_MS, `took ${r.ms} ms`);
    assert.match(
      r.stderr,
      /Cannot finish allReduce #2 on rank [01]: no progress within 3000 ms: rank 2 never issued it \(its last was #1\).*; the NCCL communicator was aborted/,
    );
  },
});

for (const launch of ["mpirun", "torchrun-style"] as const) {
  Deno.test({
    name:
      `nccl backend: debug mode names ranks that issue different collectives (${launch}) [cuda]`,
    ignore: NCCL === undefined || (launch === "mpirun" && MPIS.length === 0),
    async fn() {
      const args = [CHILD, "--fault", "mismatch", "--device", "cuda"];
      const options = { limitMs: BOUND_MS, env: { PINSTREAM_NCCL_LIB: NCCL! } };
      const r = launch === "mpirun"
        ? await runRanks(MPIS[0], 2, args, options)
        : await runTorchrunStyle(2, args, options);
      assert.notStrictEqual(r.code, 0);
      assert.ok(r.ms < BOUND_MS, `took ${r.ms} ms`);
      // Detected before any data moved, not by the watchdog's timeout.
      assert.doesNotMatch(r.stderr, /no progress within/);
      assert.match(
        r.stderr,
        /Cannot run allReduce #2: the ranks issued different collectives \(rank 0: allReduce #2 of 10 f32; rank 1: broadcast #2 of 10 f32 from rank 0\)/,
      );
    },
  });
}

Deno.test({
  name: "nccl backend: a rank that dies ends the job within the bound [cuda]",
  ignore: MPIS.length === 0 || NCCL === undefined,
  async fn() {
    const r = await runRanks(MPIS[0], 3, [CHILD, "--fault", "die", "--device", "cuda"], {
      limitMs: BOUND_MS,
      env: { PINSTREAM_NCCL_LIB: NCCL! },
    });
    assert.notStrictEqual(r.code, 0);
    assert.ok(r.ms < BOUND_MS, `took ${r.ms} ms`);
    assert.match(r.stderr, /pinstream: rank 2 of 3 exits \(status 7\)/);
  },
});

Deno.test({
  name: "nccl backend without MPI: a rank that dies makes the others fail naming it [cuda]",
  ignore: NCCL === undefined,
  async fn() {
    // No launcher stops the others: NCCL's asynchronous error (the stand-in sees the process
    // gone) ends their wait.
    const r = await runTorchrunStyle(3, [CHILD, "--fault", "die", "--device", "cuda"], {
      limitMs: BOUND_MS,
      env: { PINSTREAM_NCCL_LIB: NCCL! },
    });
    assert.notStrictEqual(r.code, 0);
    assert.ok(r.ms < BOUND_MS, `took ${r.ms} ms`);
    assert.match(
      r.stderr,
      /Cannot finish allReduce #2 on rank [01]: NCCL: remote process exited or there was a network error \(rank 2 \(pid \d+\) exited\); the NCCL communicator was aborted/,
    );
  },
});

Deno.test({
  name: "nccl backend without MPI: a rank that hangs makes the others abort NCCL [cuda]",
  ignore: NCCL === undefined,
  async fn() {
    const r = await runTorchrunStyle(3, [CHILD, "--fault", "hang", "--device", "cuda"], {
      limitMs: 20_000,
      env: { PINSTREAM_NCCL_LIB: NCCL! },
    });
    // The hung rank never exits by itself (no launcher): the limit kills it.
    assert.notStrictEqual(r.code, 0);
    assert.match(
      r.stderr,
      /Cannot finish allReduce #2 on rank [01]: no progress within 3000 ms \(a rank died, hangs or skipped it\); the NCCL communicator was aborted/,
    );
  },
});

function alive(pid: number): boolean {
  return new Deno.Command("ps", { args: ["-p", String(pid)], stdout: "null" }).outputSync()
    .success;
}

Deno.test({
  name: "killing the launcher leaves no rank behind",
  ignore: MPIS.length === 0,
  async fn() {
    const launcher = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        new URL("../tools/launch.ts", import.meta.url).pathname,
        "-n",
        "2",
        "--mpi",
        MPIS[0],
        new URL(CHILD, import.meta.url).pathname,
        "--fault",
        "none",
      ],
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const pids: number[] = [];
    let text = "";
    const reader = launcher.stdout.pipeThrough(new TextDecoderStream()).getReader();
    while (pids.length < 2) {
      const { value, done } = await reader.read();
      if (done) break;
      text += value;
      pids.splice(0, pids.length, ...[...text.matchAll(/ready (\d+)/g)].map((m) => +m[1]));
    }
    assert.strictEqual(pids.length, 2, text);
    launcher.kill("SIGKILL");
    await launcher.status;
    const deadline = Date.now() + 20_000;
    while (pids.some(alive) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
    assert.deepStrictEqual(pids.filter(alive), [], "ranks still running after the launcher died");
    reader.cancel();
    await launcher.stderr.cancel();
  },
});
