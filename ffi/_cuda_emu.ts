/**
 * Internal: the source rewrite that lets the host C++ compiler build kernels/cuda/*.cu
 * against the CUDA emulator (kernels/emu). Everything else CUDA-specific is a header of the
 * emulator; these two constructs are not C++ and cannot be:
 *
 * - a launch `kernel<<<grid, block, smem, stream>>>(args)` becomes
 *   `::ps_emu::launch(::ps_emu::Site{"kernel", __FILE__, __LINE__},
 *   ::ps_emu::Config(grid, block, smem, stream), [](auto... a) { kernel(a...); }, args)`:
 *   the arguments are evaluated once, on the host, and every CUDA thread calls the kernel with
 *   its own copies (the generic lambda also deduces a template kernel's arguments);
 * - a declaration `__shared__ [__align__(N)] T name[dims];` becomes
 *   `auto &name = ::ps_emu::shared_var<T[dims], N>([] {});` (the block's one instance; the
 *   lambda's type identifies the declaration), and `extern __shared__ T name[];` becomes
 *   `T *const name = ::ps_emu::dynamic_shared<T>();`.
 *
 * Comments and string literals are left alone, and every rewrite keeps the line count, so
 * `__LINE__` and compiler messages still point at the original source.
 *
 * @module
 */

/** Marks which characters of `text` are code (not a comment, string or character literal). */
function codeMask(text: string): Uint8Array {
  const code = new Uint8Array(text.length);
  let i = 0;
  while (i < text.length) {
    const c = text[i], d = text[i + 1];
    if (c === "/" && d === "/") {
      const end = text.indexOf("\n", i);
      i = end < 0 ? text.length : end;
    } else if (c === "/" && d === "*") {
      const end = text.indexOf("*/", i + 2);
      i = end < 0 ? text.length : end + 2;
    } else if (c === "R" && d === '"' && !/\w/.test(text[i - 1] ?? "")) {
      const open = text.indexOf("(", i + 2);
      const delim = text.slice(i + 2, open);
      const end = text.indexOf(`)${delim}"`, open);
      i = end < 0 ? text.length : end + delim.length + 2;
    } else if (c === '"' || (c === "'" && !/[0-9A-Fa-f]/.test(text[i - 1] ?? ""))) {
      // A quote after a hex digit is a digit separator (1'000'000), not a character literal.
      let j = i + 1;
      while (j < text.length && text[j] !== c && text[j] !== "\n") j += text[j] === "\\" ? 2 : 1;
      i = j + 1;
    } else {
      code[i] = 1;
      i++;
    }
  }
  return code;
}

const OPEN = "([{", CLOSE = ")]}";

/** Index just past the bracket that closes the one at `at`. */
function matchForward(text: string, code: Uint8Array, at: number): number {
  let depth = 0;
  for (let i = at; i < text.length; i++) {
    if (!code[i]) continue;
    if (OPEN.includes(text[i])) depth++;
    else if (CLOSE.includes(text[i]) && --depth === 0) return i + 1;
  }
  throw new SyntaxError(`unbalanced brackets from offset ${at}`);
}

/** Index of the `>>>` that ends the launch configuration starting at `from`. */
function configEnd(text: string, code: Uint8Array, from: number): number {
  let depth = 0;
  for (let i = from; i < text.length; i++) {
    if (!code[i]) continue;
    if (OPEN.includes(text[i])) depth++;
    else if (CLOSE.includes(text[i])) depth--;
    else if (depth === 0 && text.startsWith(">>>", i)) return i;
  }
  throw new SyntaxError(`no >>> after the <<< at offset ${from - 3}`);
}

/** Start of the kernel expression (`name`, `ns::name`, `name<T, 2>`) that ends at `end`. */
function kernelStart(text: string, end: number): number {
  let i = end;
  while (i > 0 && /\s/.test(text[i - 1])) i--;
  if (text[i - 1] === ">") {
    // Template arguments: angle brackets outside parentheses ("(A > B)" is an argument).
    let depth = 0, parens = 0;
    for (i--; i >= 0; i--) {
      const c = text[i];
      if (c === ")") parens++;
      else if (c === "(") parens--;
      else if (parens === 0 && c === ">") depth++;
      else if (parens === 0 && c === "<" && --depth === 0) break;
    }
    while (i > 0 && /\s/.test(text[i - 1])) i--;
  }
  while (i > 0 && /[\w:]/.test(text[i - 1])) i--;
  return i;
}

function lines(s: string): number {
  let n = 0;
  for (const c of s) if (c === "\n") n++;
  return n;
}

/** `replacement`, padded with newlines to span as many lines as `original`. */
function keepLines(original: string, replacement: string): string {
  const missing = lines(original) - lines(replacement);
  if (missing < 0) throw new SyntaxError(`rewrite adds lines: ${original}`);
  return replacement + "\n".repeat(missing);
}

/** A kernel launch in a CUDA source: its 1-based line and the kernel as written. */
export interface LaunchSite {
  /** The line of the kernel's name. */
  line: number;
  /** The kernel expression, e.g. `augment_kernel<Out, PS_IMAGE_NCHW>`. */
  kernel: string;
}

function rewriteLaunches(text: string, sites: LaunchSite[] = []): string {
  const code = codeMask(text);
  let out = "", copied = 0;
  for (let at = text.indexOf("<<<"); at >= 0; at = text.indexOf("<<<", at + 3)) {
    if (!code[at] || at < copied) continue;
    const cfgEnd = configEnd(text, code, at + 3);
    let open = cfgEnd + 3;
    while (/\s/.test(text[open])) open++;
    if (text[open] !== "(") throw new SyntaxError(`no argument list after the >>> at ${cfgEnd}`);
    const close = matchForward(text, code, open);
    const start = kernelStart(text, at);
    const kernel = text.slice(start, at).replace(/\s+/g, " ").trim();
    if (!/^[\w:]/.test(kernel)) throw new SyntaxError(`no kernel name before the <<< at ${at}`);
    sites.push({ line: lines(text.slice(0, start)) + 1, kernel });
    const config = text.slice(at + 3, cfgEnd);
    const args = text.slice(open + 1, close - 1);
    const launch = `::ps_emu::launch(::ps_emu::Site{${JSON.stringify(kernel)}, __FILE__, ` +
      `__LINE__}, ::ps_emu::Config(${config}), [](auto... ps_emu_a) { ${kernel}(ps_emu_a...); }` +
      `${args.trim() === "" ? "" : `, ${args}`})`;
    out += text.slice(copied, start) + keepLines(text.slice(start, close), launch);
    copied = close;
  }
  return out + text.slice(copied);
}

// One declarator, no initializer, a type without commas: anything else is left to fail at the
// emulator's __shared__ macro, at compile time.
const EXTERN_SHARED =
  /extern\s+__shared__\s+(?:__align__\s*\(\s*(\w+)\s*\)\s+)?([^;={},]*?)\s*\b([A-Za-z_]\w*)\s*\[\s*\]\s*;/g;
const SHARED =
  /__shared__\s+(?:__align__\s*\(\s*(\w+)\s*\)\s+)?([^;={},]*?)\s*\b([A-Za-z_]\w*)\s*((?:\[[^\];]*\]\s*)*);/g;

function rewriteShared(text: string): string {
  const replace = (pattern: RegExp, make: (m: RegExpExecArray) => string) => {
    const code = codeMask(text);
    let out = "", copied = 0;
    for (const m of text.matchAll(pattern)) {
      if (!code[m.index]) continue;
      out += text.slice(copied, m.index) + keepLines(m[0], make(m as RegExpExecArray));
      copied = m.index + m[0].length;
    }
    return out + text.slice(copied);
  };
  text = replace(
    EXTERN_SHARED,
    ([, , type, name]) => `${type} *const ${name} = ::ps_emu::dynamic_shared<${type}>();`,
  );
  return replace(SHARED, ([, align, type, name, dims]) => {
    const t = `${type}${dims.replace(/\s+/g, " ").trimEnd()}`;
    return `auto &${name} = ::ps_emu::shared_var<${t}, ${align ?? 0}>([] {});`;
  });
}

/**
 * Rewrites one CUDA source file for the emulator build.
 *
 * @param text The text of a .cu or .cuh file.
 * @returns The same program with launches and `__shared__` declarations in plain C++.
 * @throws {SyntaxError} When a launch cannot be parsed.
 *
 * @example
 * ```ts
 * import { rewriteForEmulator } from "./_cuda_emu.ts";
 * import assert from "node:assert";
 * const out = rewriteForEmulator("k<<<g, 256, 0, st>>>(x, n); // k<<<>>>");
 * assert.match(out, /^::ps_emu::launch\(.*\[\]\(auto\.\.\. ps_emu_a\) \{ k\(ps_emu_a\.\.\.\); \}, x, n\);/);
 * assert.match(out, /\/\/ k<<<>>>$/);
 * ```
 */
export function rewriteForEmulator(text: string): string {
  return rewriteShared(rewriteLaunches(text));
}

/**
 * The kernel launches of a CUDA source, as the emulator reports them when it records which
 * ran (`PINSTREAM_EMU_LAUNCHES`): what "every kernel runs in CI" is checked against.
 *
 * @param text The text of a .cu file.
 * @returns Every `<<<>>>` launch outside comments and strings, in order.
 *
 * @example
 * ```ts
 * import { launchSites } from "./_cuda_emu.ts";
 * import assert from "node:assert";
 * assert.deepStrictEqual(launchSites("// k<<<1, 1>>>();\n  k<T><<<1, 1>>>(x);"), [
 *   { line: 2, kernel: "k<T>" },
 * ]);
 * ```
 */
export function launchSites(text: string): LaunchSite[] {
  const sites: LaunchSite[] = [];
  rewriteLaunches(text, sites);
  return sites;
}
