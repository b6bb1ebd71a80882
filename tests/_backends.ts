/**
 * The backends the backend-parameterized suites run on: always "cpu", and "cuda" where
 * `Device.open("cuda")` succeeds: on a GPU, or on the CUDA emulator when
 * `PINSTREAM_CUDA_EMULATOR=1` (`deno task test:emulator`). Elsewhere the cuda cases are
 * registered with `ignore`, so `deno test` lists them as skipped instead of silently dropping
 * them.
 *
 * @module
 */

import assert from "node:assert";
import { Device } from "../ffi/device.ts";
import { PinstreamError } from "../internal/errors.ts";
import type { Backend } from "../ffi/library.ts";

/** One backend to test. */
export interface BackendCase {
  /** The backend. */
  kind: Backend;
  /** true when the backend cannot be used here (its cases are skipped). */
  ignore: boolean;
  /** Why it is skipped. */
  reason?: string;
}

function probe(kind: Backend): BackendCase {
  try {
    Device.open(kind).dispose();
    return { kind, ignore: false };
  } catch (err) {
    if (!(err instanceof PinstreamError)) throw err;
    return { kind, ignore: true, reason: err.message };
  }
}

/** The backends, cpu first; cuda with `ignore: true` on machines without a usable GPU. */
export const BACKENDS: readonly BackendCase[] = [{ kind: "cpu", ignore: false }, probe("cuda")];

/** The cuda case, for tests that are about CUDA's absence or presence. */
export const CUDA: BackendCase = BACKENDS[1];

/**
 * Registers `fn` once per backend as "<name> [<backend>]", handing it a fresh Device that is
 * disposed afterwards; skipped (visibly) on backends that are not available.
 *
 * @param name What the test shows.
 * @param fn The test body.
 */
export function testEachBackend(
  name: string,
  fn: (device: Device, t: Deno.TestContext) => void | Promise<void>,
): void {
  for (const backend of BACKENDS) {
    Deno.test({
      name: `${name} [${backend.kind}]`,
      ignore: backend.ignore,
      async fn(t) {
        using device = Device.open(backend.kind);
        await fn(device, t);
      },
    });
  }
}

/** Whether the cuda backend here is the CUDA emulator (which can play devices a GPU cannot). */
export function cudaIsEmulated(): boolean {
  if (CUDA.ignore) return false;
  using dev = Device.open("cuda");
  return dev.props.emulated;
}

/**
 * Runs a child test script on the emulator playing a device without memory pools
 * (`PINSTREAM_EMU_MEMORY_POOLS=0`, read once per process), and returns its trimmed standard
 * output after asserting that it exited 0.
 */
export async function runWithoutMemoryPools(child: URL): Promise<string> {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", child.pathname],
    env: { PINSTREAM_CUDA_EMULATOR: "1", PINSTREAM_EMU_MEMORY_POOLS: "0" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const out = new TextDecoder().decode(stdout), err = new TextDecoder().decode(stderr);
  assert.strictEqual(code, 0, `child exited with ${code}:\n${out}\n${err}`);
  return out.trim();
}
