/**
 * Refusing unknown keys in an options object, with a suggestion for a near miss (a misspelt
 * option is otherwise ignored and its default silently used), and the error of an option
 * whose value is wrong.
 *
 * @module
 */

/**
 * Throws a TypeError naming the first key of `options` that is not in `known`, with the
 * closest known name when one is near (a typo or a case slip), else the list of names.
 *
 * @param options The object the caller passed.
 * @param known Every accepted key.
 * @param action What the caller was doing, for "Cannot <action>: ...".
 * @param hints Extra advice for keys users reach for that belong elsewhere.
 * @throws {TypeError} On the first unknown key.
 *
 * @example A typo is refused with the name it was meant to be
 * ```ts
 * import { refuseUnknownKeys } from "./options.ts";
 * import assert from "node:assert";
 *
 * assert.throws(
 *   () => refuseUnknownKeys({ dept: 2 }, ["depth", "dtype"], "create it"),
 *   /Cannot create it: unknown option "dept" \(did you mean "depth"\?\)/,
 * );
 * refuseUnknownKeys({ depth: 2 }, ["depth", "dtype"], "create it");
 * ```
 */
export function refuseUnknownKeys(
  options: object,
  known: readonly string[],
  action: string,
  hints: Readonly<Record<string, string>> = {},
): void {
  for (const key of Object.keys(options)) {
    if (known.includes(key)) continue;
    const near = closest(key, known);
    const advice = Object.hasOwn(hints, key)
      ? `: ${hints[key]}`
      : near !== undefined
      ? ` (did you mean "${near}"?)`
      : "";
    throw new TypeError(
      `Cannot ${action}: unknown option "${key}"${advice}; options are ${known.join(", ")}`,
    );
  }
}

/**
 * Throws the error of an invalid option value or combination, worded one way everywhere:
 * "Cannot <action>: <option> option <message>".
 *
 * @param action What the caller was doing ("create DataLoader").
 * @param option The option's name, or its path ("augment.cutout").
 * @param message What is wrong, with the value that was given.
 * @param type "type" for a value of the wrong kind or a forbidden combination (TypeError),
 * "range" for a value out of range (RangeError, the default).
 * @throws {TypeError} / {RangeError} Always.
 *
 * @example
 * ```ts
 * import { optionError } from "./options.ts";
 * import assert from "node:assert";
 *
 * assert.throws(
 *   () => optionError("create it", "depth", "should be >= 1, got 0"),
 *   (e: Error) => e instanceof RangeError && e.message === "Cannot create it: depth option should be >= 1, got 0",
 * );
 * assert.throws(() => optionError("create it", "depth", "should be a number", "type"), TypeError);
 * ```
 */
export function optionError(
  action: string,
  option: string,
  message: string,
  type: "type" | "range" = "range",
): never {
  const text = `Cannot ${action}: ${option} option ${message}`;
  throw type === "type" ? new TypeError(text) : new RangeError(text);
}

/**
 * The known name within a small edit distance of `key` (case ignored), if any: one edit per
 * three characters.
 *
 * @param key the unknown key
 * @param known every accepted name
 * @returns the nearest accepted name, or undefined when none is near
 * @example
 * ```ts
 * import { closest } from "./options.ts";
 * import assert from "node:assert";
 * assert.strictEqual(closest("numWorker", ["numWorkers", "seed"]), "numWorkers");
 * assert.strictEqual(closest("vflip", ["padding", "flip"]), "flip");
 * assert.strictEqual(closest("trian", ["root", "train"]), "train");
 * ```
 */
export function closest(key: string, known: readonly string[]): string | undefined {
  const k = key.toLowerCase();
  // One edit per three characters: "paddding" finds "padding", "shufle" finds "shuffle".
  let best: string | undefined, bestD = Math.max(1, Math.floor(k.length / 3)) + 1;
  for (const name of known) {
    const d = distance(k, name.toLowerCase());
    if (d < bestD) [best, bestD] = [name, d];
  }
  return best;
}

/**
 * Edit distance with adjacent transpositions as one edit (optimal string alignment): swapped
 * letters ("trian", "stpe") are the commonest typo, and plain Levenshtein counts them as two.
 */
function distance(a: string, b: string): number {
  let before: number[] = [];
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++) {
      row[j] = Math.min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) {
        row[j] = Math.min(row[j], before[j - 2] + 1);
      }
    }
    [before, prev] = [prev, row];
  }
  return prev[b.length];
}
