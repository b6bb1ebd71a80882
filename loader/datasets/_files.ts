// File helpers shared by the dataset readers: gzip, a small tar reader, download with a
// progress line and an MD5 check. Deno's crypto.subtle has no MD5; node:crypto does.

import { permissionMessage } from "../../internal/permissions.ts";
import { createHash } from "node:crypto";
import { dirname, join, normalize } from "node:path";

/** Gunzips bytes, naming the file when the data is truncated or corrupt. */
export async function gunzip(bytes: Uint8Array, file: string): Promise<Uint8Array> {
  try {
    const stream = new Blob([bytes as Uint8Array<ArrayBuffer>]).stream()
      .pipeThrough(new DecompressionStream("gzip"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  } catch (e) {
    throw new Error(
      `Cannot read ${file}: gzip data is truncated or corrupt (${(e as Error).message})`,
      { cause: e },
    );
  }
}

/** Whether bytes start with the gzip magic. */
export function isGzip(bytes: Uint8Array): boolean {
  return bytes.length >= 2 && bytes[0] === 0x1f && bytes[1] === 0x8b;
}

/** One regular file of a tar archive. */
export interface TarEntry {
  name: string;
  data: Uint8Array;
}

function field(block: Uint8Array, at: number, len: number): string {
  let end = at;
  while (end < at + len && block[end] !== 0) end++;
  return new TextDecoder().decode(block.subarray(at, end));
}

/** Reads the regular files of a (ustar / GNU) tar archive held in memory. */
export function readTar(tar: Uint8Array, file: string): TarEntry[] {
  const out: TarEntry[] = [];
  let off = 0;
  let longName: string | undefined;
  while (off + 512 <= tar.length) {
    const block = tar.subarray(off, off + 512);
    if (block.every((b) => b === 0)) break;
    let name = field(block, 0, 100);
    const size = parseInt(field(block, 124, 12).trim() || "0", 8);
    const type = String.fromCharCode(block[156] || 48);
    if (field(block, 257, 5) === "ustar") {
      const prefix = field(block, 345, 155);
      if (prefix) name = `${prefix}/${name}`;
    }
    if (!Number.isFinite(size) || size < 0) {
      throw new Error(`Cannot read ${file}: bad tar header at byte ${off}`);
    }
    const start = off + 512;
    if (start + size > tar.length) {
      throw new Error(
        `Cannot read ${file}: tar entry "${name}" is truncated: expected ${size} bytes, found ${
          tar.length - start
        }`,
      );
    }
    const data = tar.subarray(start, start + size);
    if (type === "L") longName = field(data, 0, data.length);
    else {
      if (longName !== undefined) name = longName;
      longName = undefined;
      if (type === "0" || type === "\0") out.push({ name, data });
    }
    off = start + Math.ceil(size / 512) * 512;
  }
  return out;
}

/** Writes tar entries under `root`, refusing paths that would escape it. */
export async function extractTar(entries: TarEntry[], root: string): Promise<string[]> {
  const written: string[] = [];
  for (const e of entries) {
    const rel = normalize(e.name);
    if (rel.startsWith("/") || rel.startsWith("..")) {
      throw new Error(`Cannot extract "${e.name}": path escapes ${root}`);
    }
    const path = join(root, rel);
    await Deno.mkdir(dirname(path), { recursive: true });
    await Deno.writeFile(path, e.data);
    written.push(path);
  }
  return written;
}

/** MD5 hex digest of bytes. */
export function md5Hex(bytes: Uint8Array): string {
  return createHash("md5").update(bytes).digest("hex");
}

/** Options of {@linkcode downloadFile}. */
export interface DownloadOptions {
  /** Expected MD5 (hex); a mismatch fails and deletes the file. */
  md5?: string;
  /** Print a progress line to stderr (default true). */
  progress?: boolean;
  /** Name for messages. */
  what?: string;
  /** Hint appended to the no-network message. */
  offlineHint?: string;
}

const MiB = 1024 * 1024;

/**
 * Downloads `url` to `path` with a progress line and an MD5 check. The bytes go to a
 * temporary file beside `path`, renamed onto it only once complete and verified: an
 * interrupted or corrupt download leaves nothing at `path` (and no temporary file).
 */
export async function downloadFile(
  url: string,
  path: string,
  options: DownloadOptions = {},
): Promise<void> {
  const what = options.what ?? url;
  const hint = options.offlineHint ? ` ${options.offlineHint}` : "";
  let response: Response;
  try {
    response = await fetch(url);
  } catch (e) {
    const denied = permissionMessage(e);
    if (denied !== undefined) {
      // Not a network problem: the flag to add.
      throw new Error(`Cannot download ${what} from ${url}: ${denied}.${hint}`, { cause: e });
    }
    throw new Error(
      `Cannot download ${what} from ${url}: no network or host unreachable ` +
        `(${(e as Error).message}).${hint}`,
      { cause: e },
    );
  }
  if (!response.ok || response.body === null) {
    await response.body?.cancel();
    throw new Error(
      `Cannot download ${what} from ${url}: HTTP ${response.status} ${response.statusText}.${hint}`,
    );
  }
  const total = Number(response.headers.get("content-length") ?? 0);
  const hash = createHash("md5");
  await Deno.mkdir(dirname(path), { recursive: true });
  const part = `${path}.${Deno.pid}.part`;
  const file = await Deno.open(part, { write: true, create: true, truncate: true });
  const show = options.progress ?? true;
  const enc = new TextEncoder();
  let got = 0;
  let lastShown = 0;
  const t0 = performance.now();
  const line = () => {
    const pct = total > 0 ? ` (${((100 * got) / total).toFixed(1)}%)` : "";
    const rate = got / MiB / Math.max(1e-3, (performance.now() - t0) / 1000);
    return `\rDownloading ${what}: ${(got / MiB).toFixed(1)}${
      total > 0 ? ` / ${(total / MiB).toFixed(1)}` : ""
    } MiB${pct} ${rate.toFixed(1)} MiB/s`;
  };
  try {
    for await (const chunk of response.body) {
      hash.update(chunk);
      let written = 0;
      while (written < chunk.length) written += await file.write(chunk.subarray(written));
      got += chunk.length;
      if (show && performance.now() - lastShown > 200) {
        lastShown = performance.now();
        Deno.stderr.writeSync(enc.encode(line()));
      }
    }
  } catch (e) {
    file.close();
    await Deno.remove(part).catch(() => {});
    throw new Error(
      `Cannot download ${what} from ${url}: the connection failed after ${got} bytes ` +
        `(${(e as Error).message}).${hint}`,
      { cause: e },
    );
  }
  file.close();
  if (show) Deno.stderr.writeSync(enc.encode(line() + "\n"));
  if (total > 0 && got !== total) {
    await Deno.remove(part).catch(() => {});
    throw new Error(`Cannot download ${what}: expected ${total} bytes, found ${got}`);
  }
  const digest = hash.digest("hex");
  if (options.md5 && digest !== options.md5) {
    await Deno.remove(part).catch(() => {});
    throw new Error(
      `Cannot verify ${what} from ${url}: MD5 ${digest} does not match the expected ` +
        `${options.md5} (the download is corrupt or not this file; nothing was kept)`,
    );
  }
  await Deno.rename(part, path);
}
