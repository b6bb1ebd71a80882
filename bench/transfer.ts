/**
 * Host <-> device copy bandwidth, 64 KiB to 256 MiB: pinned (`HostBuffer`) vs pageable (a
 * plain ArrayBuffer) through the `DeviceBuffer` wrappers, against the raw bound of the same
 * copies issued back to back by a C loop (`ps_bench_memcpy_loop`: cudaMemcpyAsync on CUDA,
 * memcpy on the CPU backend). Prints a table and writes bench/out/transfer.json (bench/results/ with --save).
 *
 *     deno run -A bench/transfer.ts [--device auto|cuda|cpu] [--max-mib 256]
 *
 * Every rate is bytes x iterations / (time between two timing events around the copies) in
 * GB/s (1e9 bytes/s), best of 3 repeats after an untimed warm-up copy.
 *
 * @module
 */

import { Device, DeviceBuffer, type DeviceKind, Event, HostBuffer, Stream } from "../mod.ts";
import { unwrap } from "../ffi/errors.ts";
import { assertMeasurable, commitStamp, writeResult } from "./_results.ts";
import { parseCli } from "../train/cli.ts";

const CLI = {
  usage: "deno run -A bench/transfer.ts [options]",
  summary: "Host <-> device copy bandwidth, pinned vs pageable; writes " +
    "bench/results/transfer.json.",
  options: {
    save: { kind: "boolean", help: "write to bench/results/ (tracked) instead of bench/out/" },
    device: { kind: "string", choices: ["auto", "cuda", "cpu"], default: "auto", help: "backend" },
    "max-mib": { kind: "int", min: 1, default: 256, help: "largest copy size in MiB" },
  },
} as const;

const KiB = 1024, MiB = 1024 * KiB;
const REPEATS = 3;
/** Bytes moved per measurement (at least 3, at most 200 copies). */
const TARGET_BYTES = 512 * MiB;

/** One size's measurements in GB/s. */
export interface TransferRow {
  /** Copy size in bytes. */
  bytes: number;
  /** Copies per timed repeat. */
  iters: number;
  /** Host-to-device. */
  h2d: Rates;
  /** Device-to-host. */
  d2h: Rates;
}

/** GB/s of one direction. */
export interface Rates {
  /** From/to a pinned HostBuffer through DeviceBuffer.copyFrom/copyTo. */
  pinned: number;
  /** From/to a plain ArrayBuffer through DeviceBuffer.copyFrom/copyTo. */
  pageable: number;
  /** The raw bound: the C loop from/to the same pinned memory. */
  raw: number;
  /** The C loop from/to the same pageable memory. */
  rawPageable: number;
}

/** Where the results go. */
export const RESULTS_URL: URL = new URL("./results/transfer.json", import.meta.url);

/**
 * Runs the benchmark, prints the table and writes the results file.
 *
 * @param args `--device auto|cuda|cpu` (default auto), `--max-mib N` (default 256); not
 * read from `Deno.args` when imported (bench/all.ts passes its own arguments elsewhere).
 * @returns The measured rows.
 */
export async function main(args: string[] = []): Promise<TransferRow[]> {
  const cli = parseCli(args, CLI);
  const kind = cli.device as DeviceKind, maxBytes = cli["max-mib"]! * MiB;
  using dev = Device.open(kind);
  assertMeasurable(dev);
  const sizes: number[] = [];
  for (let s = 64 * KiB; s <= maxBytes; s *= 4) sizes.push(s);

  console.log(`transfer bandwidth on ${dev} (${dev.props.name}), GB/s, best of ${REPEATS}`);
  const header = [
    "size",
    "H2D pinned",
    "H2D pageable",
    "H2D raw",
    "pinned/raw",
    "D2H pinned",
    "D2H pageable",
    "D2H raw",
    "pinned/raw",
  ];
  console.log(header.map((h, i) => i === 0 ? h.padEnd(9) : h.padStart(14)).join(""));

  const rows: TransferRow[] = [];
  using stream = new Stream(dev);
  {
    // Warm the JIT on the wrapper path with tiny copies (as a training loop would be after
    // its first batches), so the small sizes measure steady state, not compilation.
    using h = HostBuffer.alloc(dev, 64), d = DeviceBuffer.alloc(dev, 64);
    const plain = new ArrayBuffer(64);
    for (let i = 0; i < 5000; i++) {
      d.copyFrom(h, { stream });
      d.copyTo(h, { stream });
      d.copyFrom(plain, { stream });
      d.copyTo(plain, { stream });
    }
    await stream.synchronize();
  }
  using start = new Event(dev, { timing: true }), end = new Event(dev, { timing: true });
  for (const bytes of sizes) {
    const iters = Math.min(200, Math.max(3, Math.ceil(TARGET_BYTES / bytes)));
    using pinned = HostBuffer.alloc(dev, bytes);
    using device = DeviceBuffer.alloc(dev, bytes);
    const pageable = new ArrayBuffer(bytes);
    pinned.u8.fill(1);
    new Uint8Array(pageable).fill(2); // fault the pages in before timing
    device.fill(3, { stream });

    const timed = async (enqueue: () => void): Promise<number> => {
      // Warm-up: enough calls for the JIT to optimize the wrapper path before timing it.
      for (let i = 0; i < Math.min(iters, 50); i++) enqueue();
      let best = Infinity;
      for (let r = 0; r < REPEATS; r++) {
        start.record(stream);
        for (let i = 0; i < iters; i++) enqueue();
        end.record(stream);
        await end.synchronize();
        best = Math.min(best, start.elapsedMs(end));
      }
      return gbps(bytes * iters, best);
    };
    const raw = async (dst: Deno.PointerValue, src: Deno.PointerValue, dir: 1 | 2) => {
      let best = Infinity;
      for (let r = 0; r < REPEATS; r++) {
        const ms = new Float32Array(1), msg = new Uint8Array(1024);
        const status = await dev.lib.symbols.ps_bench_memcpy_loop(
          dev.index,
          dst,
          src,
          BigInt(bytes),
          dir,
          iters,
          stream.handle,
          ms,
          msg,
          BigInt(msg.length),
        );
        unwrap(dev.lib, status, "run the raw copy loop", msg);
        best = Math.min(best, ms[0]);
      }
      return gbps(bytes * iters, best);
    };
    const pageablePtr = Deno.UnsafePointer.of(pageable);

    const row: TransferRow = {
      bytes,
      iters,
      h2d: {
        pinned: await timed(() => device.copyFrom(pinned, { stream })),
        pageable: await timed(() => device.copyFrom(pageable, { stream })),
        raw: await raw(device.pointer, pinned.pointer, 1),
        rawPageable: await raw(device.pointer, pageablePtr, 1),
      },
      d2h: {
        pinned: await timed(() => device.copyTo(pinned, { stream })),
        pageable: await timed(() => device.copyTo(pageable, { stream })),
        raw: await raw(pinned.pointer, device.pointer, 2),
        rawPageable: await raw(pageablePtr, device.pointer, 2),
      },
    };
    rows.push(row);
    const cells = [
      row.h2d.pinned,
      row.h2d.pageable,
      row.h2d.raw,
      row.h2d.pinned / row.h2d.raw,
      row.d2h.pinned,
      row.d2h.pageable,
      row.d2h.raw,
      row.d2h.pinned / row.d2h.raw,
    ].map((v, i) => (i % 4 === 3 ? `${(v * 100).toFixed(0)}%` : v.toFixed(2)).padStart(14));
    console.log(formatSize(bytes).padEnd(9) + cells.join(""));
    await stream.synchronize();
  }

  const result = {
    benchmark: "transfer",
    date: new Date().toISOString(),
    machine: await machine(dev),
    backend: dev.kind,
    device: dev.props.name,
    deno: Deno.version.deno,
    commit: await commitStamp(),
    unit: "GB/s (1e9 bytes per second), best of 3, timed between device events",
    notes: dev.kind === "cpu"
      ? "cpu backend: every copy is a memcpy on the calling thread (pinned and pageable are the same path)"
      : "pageable = a plain ArrayBuffer passed to the copy (CUDA stages it); raw = cudaMemcpyAsync loop in C",
    rows,
  };
  await writeResult("transfer", result, cli.save ?? false);
  return rows;
}

function gbps(bytes: number, ms: number): number {
  // A copy faster than the timer's resolution reads as 0 ms: report Infinity honestly.
  return ms > 0 ? Math.round(bytes / (ms * 1e6) * 1000) / 1000 : Infinity;
}

function formatSize(bytes: number): string {
  return bytes >= MiB ? `${bytes / MiB} MiB` : `${bytes / KiB} KiB`;
}

function text(cmd: string, args: string[]): string | undefined {
  try {
    const out = new Deno.Command(cmd, { args, stdout: "piped", stderr: "null" }).outputSync();
    return out.success ? new TextDecoder().decode(out.stdout).trim() : undefined;
  } catch {
    return undefined;
  }
}

async function machine(dev: Device) {
  let cpu: string | undefined;
  try {
    const info = await Deno.readTextFile("/proc/cpuinfo");
    cpu = info.match(/^model name\s*:\s*(.*)$/m)?.[1];
  } catch {
    cpu = undefined;
  }
  const smi = text("nvidia-smi", [
    "--query-gpu=name,driver_version",
    "--format=csv,noheader",
  ]);
  return {
    hostname: Deno.hostname(),
    os: `${Deno.build.os} ${Deno.osRelease()}`,
    cpu: cpu ?? Deno.build.arch,
    cores: navigator.hardwareConcurrency,
    memoryBytes: Deno.systemMemoryInfo().total,
    // Other work on the machine skews CPU-backend numbers: recorded so readers can tell.
    loadAverage: Deno.loadavg(),
    gpu: dev.kind === "cuda" ? dev.props.name : null,
    gpuDriver: smi?.split("\n")[0]?.split(",")[1]?.trim() ?? null,
  };
}

if (import.meta.main) await main(Deno.args);
