// The CUDA emulator (kernels/emu) against its own promises: tests/emu/selftest.cu breaks
// CUDA's rules on purpose (missing barriers, divergent barriers and shuffles, misaligned
// wmma pointers, host pointers, out-of-bounds writes, stream-ordered use after free) and
// keeps them elsewhere (warp reductions, wmma, atomics, streams and events); each case runs in
// its own process because a kernel fault poisons the CUDA context for good, as on a GPU.
// Cases run in every thread order where the order matters.

import assert from "node:assert";
import { buildLibrary, emulatorCommand, LibraryError, SOURCES } from "../ffi/library.ts";
import { ABI_VERSION } from "../ffi/symbols.ts";
import { buildEmulatorProgram, runEmulatorProgram } from "./_emu_program.ts";

const SELFTEST = new URL("./emu/selftest.cu", import.meta.url);

/** The emulator's compile line for the self-test, or undefined without a C++ compiler. */
function command(): { compiler: string; args: string[] } | undefined {
  try {
    return emulatorCommand(
      ["selftest.cu", ...SOURCES.emulator.filter((p) => p.startsWith("emu/") && p.endsWith(".cc"))],
      "selftest",
      { program: true },
    );
  } catch (err) {
    if (err instanceof LibraryError) return undefined;
    throw err;
  }
}

const COMMAND = command();

const built = new Map<string, Promise<string>>();

/**
 * Builds the self-test program once per source version and extra flags (cached next to the
 * libraries).
 */
function selftest(extra: string[] = []): Promise<string> {
  const key = extra.join(" ");
  if (!built.has(key)) built.set(key, build(extra));
  return built.get(key)!;
}

function build(extra: string[]): Promise<string> {
  return buildEmulatorProgram("selftest", SELFTEST, {
    compiler: COMMAND!.compiler,
    args: [...extra, ...COMMAND!.args],
  });
}

interface Run {
  code: number;
  out: Record<string, string>;
  stdout: string;
  stderr: string;
}

type Order = "forward" | "reverse" | "random" | "greedy" | "greedy-reverse";

async function run(
  name: string,
  env: Record<string, string> = {},
  flags: string[] = [],
): Promise<Run> {
  const exe = await selftest(flags);
  const { code, stdout, stderr } = await runEmulatorProgram(exe, name, {
    PINSTREAM_EMU_ORDER: "random",
    ...env,
  });
  const out: Record<string, string> = {};
  for (const line of stdout.split("\n")) {
    for (const m of line.matchAll(/(\w+)=(\S+)/g)) out[m[1]] ??= m[2];
    const msg = line.match(/^message=(.*)$/);
    if (msg) out.message = msg[1];
  }
  assert.ok(!("unexpected" in out), stdout + stderr);
  return { code, out, stdout, stderr };
}

const ORDERS: Order[] = ["forward", "reverse", "random", "greedy", "greedy-reverse"];

function emuTest(name: string, fn: () => void | Promise<void>) {
  Deno.test({ name: `[emulator] ${name}`, ignore: COMMAND === undefined, fn });
}

/** Asserts a kernel fault: the sync error, the sticky error after it, and the message. */
function assertFault(r: Run, error: string, message: RegExp) {
  assert.strictEqual(r.code, 0, r.stdout + r.stderr);
  assert.strictEqual(r.out.sync, error, r.stdout);
  assert.strictEqual(r.out.after, error, "the error is sticky: later calls return it");
  assert.strictEqual(r.out.last, error);
  assert.strictEqual(r.out.last_again, error, "cudaGetLastError does not clear a sticky error");
  assert.match(r.out.message, message);
  assert.match(r.stderr, /^pinstream CUDA emulator: kernel /m, "the fault is printed once");
}

emuTest("the cuda backend builds against the emulator with the host C++ compiler", () => {
  const path = buildLibrary("cuda", { emulator: true });
  assert.match(path, /libpinstream_cuda_emulator_[0-9a-f]{20}\.so$/);
  assert.notStrictEqual(path, buildLibrary("cpu"));
  const lib = Deno.dlopen(path, {
    ps_abi_version: { parameters: ["buffer"], result: "i32" },
    ps_backend: { parameters: ["buffer"], result: "i32" },
    ps_device_count: { parameters: ["buffer"], result: "i32" },
    ps_device_props_get: { parameters: ["i32", "buffer"], result: "i32" },
  });
  try {
    const i32 = new Int32Array(1);
    assert.strictEqual(lib.symbols.ps_abi_version(i32), 0);
    assert.strictEqual(i32[0], ABI_VERSION);
    assert.strictEqual(lib.symbols.ps_backend(i32), 0);
    assert.strictEqual(i32[0], 1, "the emulator runs the cuda backend");
    assert.strictEqual(lib.symbols.ps_device_count(i32), 0);
    assert.strictEqual(i32[0], 1);
    const props = new Uint8Array(328);
    assert.strictEqual(lib.symbols.ps_device_props_get(0, props), 0);
    const view = new DataView(props.buffer);
    assert.deepStrictEqual([view.getInt32(264, true), view.getInt32(268, true)], [9, 0]);
    assert.strictEqual(view.getInt32(284, true), 1, "props.emulated");
    assert.match(
      new TextDecoder().decode(props.subarray(0, props.indexOf(0))),
      /^pinstream CUDA emulator \(sm_90/,
    );
  } finally {
    lib.close();
  }
});

emuTest("a missing __syncthreads() reads poisoned shared memory in every order", async () => {
  for (const order of ORDERS) {
    const bad = await run("race", { PINSTREAM_EMU_ORDER: order });
    assert.ok(Number(bad.out.wrong) > 0, `${order}: the race went unnoticed`);
    const good = await run("race_fixed", { PINSTREAM_EMU_ORDER: order });
    assert.strictEqual(good.out.wrong, "0", `${order}: with the barrier`);
  }
});

emuTest(
  "a warp that reads a later warp's writes after a shuffle: greedy finds what round-robin hides",
  async () => {
    // The round-robin orders both miss this race (see warp_ahead in selftest.cu): that is why CI
    // runs the greedy order too.
    for (const order of ["forward", "reverse"] as const) {
      const r = await run("warp_ahead", { PINSTREAM_EMU_ORDER: order });
      assert.strictEqual(r.out.wrong, "0", `${order} was expected to miss this race`);
    }
    const bad = await run("warp_ahead", { PINSTREAM_EMU_ORDER: "greedy" });
    assert.strictEqual(bad.out.wrong, "32", "greedy: warp 0 reads poison for every lane");
    for (const order of ORDERS) {
      const good = await run("warp_ahead_fixed", { PINSTREAM_EMU_ORDER: order });
      assert.strictEqual(good.out.wrong, "0", `${order}: with the barrier`);
    }
  },
);

emuTest(
  "__syncthreads() that some threads skip stops the kernel with who waits where",
  async () => {
    const r = await run("divergent_barrier");
    assertFault(
      r,
      "cudaErrorLaunchFailure",
      /divergent_barrier .*block \(\d,0,0\): no thread of the block can run: 32 thread\(s\) .*wait at __syncthreads\(\) at selftest\.cu:\d+; 32 of 64 exited/,
    );
  },
);

emuTest("threads at two different __syncthreads() calls are refused", async () => {
  assertFault(
    await run("different_barriers"),
    "cudaErrorLaunchFailure",
    /thread \(\d+,0,0\) at selftest\.cu:\d+: __syncthreads\(\) here while \d+ thread\(s\) wait at __syncthreads\(\) at selftest\.cu:\d+/,
  );
});

emuTest("__syncthreads_count/and/or reduce the predicate over the block", async () => {
  for (const order of ORDERS) {
    const r = await run("barrier_counts", { PINSTREAM_EMU_ORDER: order });
    assert.strictEqual(r.out.counts, "34,1,1,0", order);
  }
});

emuTest("more than 48 KiB of __shared__ variables is refused", async () => {
  assertFault(
    await run("too_much_shared"),
    "cudaErrorLaunchOutOfResources",
    /__shared__ variables need 53248 bytes; a block has 49152 bytes/,
  );
});

emuTest("extern __shared__ is the launch's dynamic shared memory", async () => {
  for (const order of ORDERS) {
    assert.strictEqual(
      (await run("dynamic_shared", { PINSTREAM_EMU_ORDER: order })).out.wrong,
      "0",
    );
  }
});

emuTest("a shuffle mask that leaves out the calling lane is refused", async () => {
  assertFault(
    await run("shfl_mask_lane"),
    "cudaErrorIllegalInstruction",
    /__shfl_down_sync: mask 0x0000ffff does not name the calling lane (1[6-9]|2\d|3[01])/,
  );
});

emuTest("a full-warp shuffle in a block of 48 threads names lanes that do not exist", async () => {
  assertFault(
    await run("shfl_partial_warp"),
    "cudaErrorIllegalInstruction",
    /mask 0xffffffff names lanes that do not exist \(warp 1 has 16 lanes/,
  );
});

emuTest("a shuffle waiting for a lane that exited is a deadlock, reported", async () => {
  assertFault(
    await run("shfl_exited_lane"),
    "cudaErrorLaunchFailure",
    /31 thread\(s\) \(first: \d+, warp 0\) wait in __shfl_sync\(mask 0xffffffff\) at selftest\.cu:\d+; 1 of 32 exited/,
  );
});

emuTest("warp shuffles and votes compute what CUDA defines, in every order", async () => {
  for (const order of ORDERS) {
    const r = await run("warp_reduce", { PINSTREAM_EMU_ORDER: order });
    assert.deepStrictEqual(
      [r.out.sum, r.out.xor_sum, r.out.long, r.out.ballot, r.out.up, r.out.grouped],
      ["496", "496", String(31n << 33n), "aaaaaaaa", "8", "10"],
      order,
    );
  }
});

emuTest("wmma computes C + A.B exactly for small integers, in every fragment layout", async () => {
  for (const order of ORDERS) {
    assert.strictEqual((await run("wmma_gemm", { PINSTREAM_EMU_ORDER: order })).out.max_error, "0");
  }
});

emuTest("a wmma pointer that is not 256-bit aligned is refused", async () => {
  assertFault(
    await run("wmma_misaligned"),
    "cudaErrorMisalignedAddress",
    /wmma::load_matrix_sync: pointer 0x[0-9a-f]+ is not 256-bit aligned/,
  );
});

emuTest(
  "an asynchronous copy reads as poison until its batch is waited for, not at a barrier",
  async () => {
    const r = await run("pipeline");
    assert.strictEqual(r.code, 0, r.stdout + r.stderr);
    // 0xffffffff poison, then the first batch alone, then the second with its zero fill
    assert.deepStrictEqual(
      [r.out.before, r.out.first, r.out.second_pending, r.out.second],
      ["-1", "10", "-1", "14,15,0,0"],
    );
    assertFault(
      await run("pipeline_misaligned"),
      "cudaErrorMisalignedAddress",
      /__pipeline_memcpy_async: 0x[0-9a-f]+ <- 0x[0-9a-f]+ not aligned to 16 bytes/,
    );
  },
);

emuTest("code that assumes a wmma fragment layout sees it change between orders", async () => {
  const seen = new Set<string>();
  for (const order of ORDERS) {
    seen.add((await run("wmma_layout", { PINSTREAM_EMU_ORDER: order })).out.x0);
  }
  assert.strictEqual(seen.size, 3);
});

emuTest("blocks and threads run in the configured order", async () => {
  const one = { PINSTREAM_EMU_WORKERS: "0" }; // one host thread: the order is exact
  for (const what of ["block_order", "thread_order"]) {
    assert.strictEqual(
      (await run(what, { ...one, PINSTREAM_EMU_ORDER: "forward" })).out.order,
      "01234567",
    );
    assert.strictEqual(
      (await run(what, { ...one, PINSTREAM_EMU_ORDER: "reverse" })).out.order,
      "76543210",
    );
    const a = (await run(what, { ...one, PINSTREAM_EMU_SEED: "1" })).out.order;
    const b = (await run(what, { ...one, PINSTREAM_EMU_SEED: "1" })).out.order;
    assert.strictEqual(a, b, "a seed reproduces the random order");
    assert.deepStrictEqual([...a].sort().join(""), "01234567");
  }
});

emuTest("atomics from blocks running in parallel lose nothing", async () => {
  const r = await run("atomics", { PINSTREAM_EMU_WORKERS: "3" });
  assert.deepStrictEqual([r.out.float, r.out.int, r.out.max, r.out.half], [
    "16384",
    "32768",
    "16383",
    "512",
  ]);
});

emuTest("fresh device memory reads as 0xff bytes", async () => {
  assert.strictEqual((await run("uninitialized")).out.poisoned, "64");
});

emuTest("a kernel given a host pointer faults with an illegal address", async () => {
  assertFault(
    await run("host_pointer"),
    "cudaErrorIllegalAddress",
    /copy_words .*parameter 1 is 0x[0-9a-f]+, which is not inside any live device, pinned or registered allocation/,
  );
});

emuTest("a write past the end of an allocation faults and names the thread", async () => {
  const r = await run("out_of_bounds");
  assert.notStrictEqual(r.code, 0, "the process dies, as under compute-sanitizer");
  assert.match(
    r.stderr,
    /pinstream CUDA emulator: kernel write_at .*block \(0,0,0\) thread \(0,0,0\): illegal address 0x[0-9a-f]+ \(SIGSEGV\)/,
  );
});

emuTest("a CUDA thread that outgrows its stack is named, not taken for a bad pointer", async () => {
  // 1 MiB of locals: without stack probes the first store lands far below the thread's own
  // guard page (outside the stacks, or in another thread's), which some orders and worker
  // counts reached; every one must name the overflow.
  for (const order of ORDERS) {
    for (const workers of ["1", "2", "3"]) {
      const r = await run("stack_overflow", {
        PINSTREAM_EMU_ORDER: order,
        PINSTREAM_EMU_WORKERS: workers,
      });
      assert.notStrictEqual(r.code, 0);
      assert.match(
        r.stderr,
        /kernel big_locals .*thread \(\d+,0,0\): stack overflow \(a CUDA thread has 128 KiB/,
        `${order}, ${workers} workers`,
      );
    }
  }
});

emuTest("memory freed with cudaFreeAsync is gone for work queued after the free", async () => {
  assertFault(
    await run("use_after_free_async"),
    "cudaErrorIllegalAddress",
    /set_value .*parameter 1 is 0x[0-9a-f]+, which is not inside any live/,
  );
});

emuTest("unwritten shared and fresh device memory read as NaN, in every block", async () => {
  for (const order of ORDERS) {
    const r = await run("read_unwritten", { PINSTREAM_EMU_ORDER: order });
    assert.deepStrictEqual(
      [r.out.shared_nan, r.out.half_nan, r.out.shared_written, r.out.fresh_nan],
      ["64", "64", "64", "128"],
      `${order}: ${r.stdout}`,
    );
  }
});

emuTest("an overlapping cudaMemcpyAsync is refused, not given memmove semantics", async () => {
  const r = await run("overlap_copy");
  assert.deepStrictEqual(
    [r.out.overlap, r.out.apart, r.out.sync],
    ["cudaErrorInvalidValue", "cudaSuccess", "cudaSuccess"],
  );
  assert.match(r.stderr, /source and destination overlap/);
});

emuTest("a bad launch configuration is the launch's error, not a sticky one", async () => {
  const r = await run("bad_config");
  assert.deepStrictEqual(
    [r.out.launch, r.out.cleared, r.out.sync],
    ["cudaErrorInvalidConfiguration", "cudaSuccess", "cudaSuccess"],
  );
});

emuTest(
  "copies to pinned memory happen when the stream gets there, to pageable at once",
  async () => {
    const r = await run("async", { PINSTREAM_EMU_DELAY_US: "50000" });
    assert.deepStrictEqual(
      [r.out.pinned_before, r.out.query, r.out.pinned_after, r.out.pageable],
      ["0", "cudaErrorNotReady", "42", "7"],
    );
  },
);

emuTest("the legacy default stream and events order work across streams", async () => {
  for (const delay of ["0", "20000"]) {
    const r = await run("stream_order", { PINSTREAM_EMU_DELAY_US: delay });
    assert.deepStrictEqual([r.out.legacy, r.out.event], ["5", "9"], `delay ${delay}`);
  }
});

emuTest(
  "the portable context switch (ucontext, for hosts other than x86-64) runs the same",
  async () => {
    const flags = ["-DPS_EMU_UCONTEXT"];
    for (const order of ORDERS) {
      const env = { PINSTREAM_EMU_ORDER: order };
      assert.strictEqual((await run("race_fixed", env, flags)).out.wrong, "0", order);
      assert.strictEqual((await run("wmma_gemm", env, flags)).out.max_error, "0", order);
      assert.strictEqual((await run("barrier_counts", env, flags)).out.counts, "34,1,1,0", order);
    }
    assertFault(
      await run("shfl_exited_lane", {}, flags),
      "cudaErrorLaunchFailure",
      /31 thread\(s\) .*wait in __shfl_sync/,
    );
  },
);
