/**
 * What the CUDA emulator's test runner and tests read from the CUDA sources: the kernel
 * launches (`PS_LAUNCH`, kernels/cuda/launch.cuh) and any CUDA syntax that bypasses the launch
 * and shared-memory macros.
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

function lineOf(text: string, at: number): number {
  let n = 1;
  for (let i = 0; i < at; i++) if (text[i] === "\n") n++;
  return n;
}

/** A kernel launch in a CUDA source, as the emulator records it when it runs. */
export interface LaunchSite {
  /** The 1-based line of `PS_LAUNCH`. */
  line: number;
  /** The kernel argument as the preprocessor stringifies it, e.g. `(k<Out, 2>)`. */
  kernel: string;
}

/**
 * The kernel launches of a CUDA source: what "every kernel of the backend ran on the
 * emulator" is checked against (`PINSTREAM_EMU_LAUNCHES` records `file:line kernel`).
 *
 * @param text The text of a .cu file.
 * @returns Every `PS_LAUNCH(...)` outside comments and strings, in order.
 *
 * @example
 * ```ts
 * import { launchSites } from "./_emu_sources.ts";
 * import assert from "node:assert";
 * const src = "// PS_LAUNCH(a, 1, 1, 0, 0);\n  PS_LAUNCH((k<T,  2>), g, b, 0, st,\n x);";
 * assert.deepStrictEqual(launchSites(src), [{ line: 2, kernel: "(k<T, 2>)" }]);
 * ```
 */
export function launchSites(text: string): LaunchSite[] {
  const code = codeMask(text);
  const sites: LaunchSite[] = [];
  for (const m of text.matchAll(/\bPS_LAUNCH\s*\(/g)) {
    if (!code[m.index]) continue;
    let depth = 0, end = m.index + m[0].length;
    for (; end < text.length; end++) {
      const c = text[end];
      if (!code[end]) continue;
      if ("([{".includes(c)) depth++;
      else if (")]}".includes(c)) {
        if (depth === 0) break;
        depth--;
      } else if (c === "," && depth === 0) break;
    }
    const kernel = text.slice(m.index + m[0].length, end).replace(/\s+/g, " ").trim();
    sites.push({ line: lineOf(text, m.index), kernel });
  }
  return sites;
}

/**
 * CUDA syntax that bypasses kernels/cuda/launch.cuh: a `<<<` launch or a `__shared__`
 * declaration outside comments and strings (the header itself excepted by the caller).
 *
 * @param text The text of a .cu or .cuh file.
 * @returns The 1-based lines where such syntax appears.
 *
 * @example
 * ```ts
 * import { bareCudaSyntax } from "./_emu_sources.ts";
 * import assert from "node:assert";
 * assert.deepStrictEqual(bareCudaSyntax('// k<<<1, 1>>>()\nk<<<1, 1>>>();\n"__shared__";'), [2]);
 * ```
 */
export function bareCudaSyntax(text: string): number[] {
  const code = codeMask(text);
  const lines: number[] = [];
  for (const m of text.matchAll(/<<<|\b__shared__\b/g)) {
    if (code[m.index]) lines.push(lineOf(text, m.index));
  }
  return lines;
}
