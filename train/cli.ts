// The command-line parser of the examples (examples/*.ts) and the benchmarks (bench/*.ts):
// one table of options per script, from which both the parsing and the --help text come.
//
// Why not node:util's parseArgs: it throws TypeErrors with a stack trace and no suggestion,
// takes `--lr -1` for two options, and checks no values. Here a mistake is one line naming
// the option and what was expected, with a did-you-mean, and exit code 2; --help is printed
// before anything that needs a permission (env, files, FFI) runs.
//
// Not exported from mod.ts: the command line of pinstream's own scripts.

import { closest } from "../internal/options.ts";
import { missingPermission, permissionMessage } from "../internal/permissions.ts";

/** One option of a script. The flag is `--<key>`; a boolean also takes `--no-<key>`. */
export type CliOption =
  | {
    kind: "boolean";
    help: string;
    /** Shown in --help; the value is undefined when the flag is absent. */
    default?: boolean;
    short?: string;
  }
  | {
    kind: "string";
    help: string;
    /** Name of the value in --help (default VALUE). */
    metavar?: string;
    default?: string;
    /** When given, the value must be one of these. */
    choices?: readonly string[];
    short?: string;
  }
  | {
    /** "int" takes whole numbers only. */
    kind: "int" | "number";
    help: string;
    metavar?: string;
    default?: number | "auto";
    /** Also accept the word "auto" (a count the program picks or tunes). */
    auto?: boolean;
    /** Smallest accepted value (inclusive unless `exclusiveMin`). */
    min?: number;
    exclusiveMin?: boolean;
    max?: number;
    short?: string;
  };

/** A script's command line: its options and, optionally, positional arguments. */
export interface CliSpec {
  /** The usage line after "Usage: ", e.g. "deno run -A examples/cifar.ts [options]". */
  usage: string;
  /** What the script does (printed under the usage line). */
  summary?: string;
  options: Readonly<Record<string, CliOption>>;
  /** Positional arguments: their name in --help and, when given, the accepted values. */
  positionals?: {
    name: string;
    help: string;
    choices?: readonly string[];
    /** What one is, for errors ("unknown benchmark ..."; default "argument"). */
    noun?: string;
  };
  /** Text printed after the options in --help. */
  epilog?: string;
}

type ValueOf<O extends CliOption> = O extends { kind: "boolean" } ? boolean
  : O extends { kind: "string" } ? string
  : O extends { auto: true } ? number | "auto"
  : number;

/** The parsed values: one per option (undefined when absent and without a default). */
export type CliValues<S extends CliSpec> =
  & { -readonly [K in keyof S["options"]]: ValueOf<S["options"][K]> | undefined }
  & {
    /** The options given on the command line (others hold their defaults). */
    readonly given: ReadonlySet<string>;
    /** Positional arguments, in order. */
    readonly positionals: string[];
  };

/**
 * A mistake on the command line: printed as one line, without a stack trace, exit code 2.
 *
 * @example
 * ```ts
 * import { UsageError } from "./cli.ts";
 * import assert from "node:assert";
 * assert.strictEqual(new UsageError("x").exitCode, 2);
 * ```
 */
export class UsageError extends Error {
  /** The process exit code for this error. */
  readonly exitCode: number = 2;
  constructor(message: string) {
    super(message);
    this.name = "UsageError";
  }
}

/**
 * An error the user can fix (missing data, unreadable file): one line, no stack trace, exit
 * code 1.
 */
export class CliError extends Error {
  /** The process exit code for this error. */
  readonly exitCode: number = 1;
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "CliError";
  }
}

const HINT = "; see --help";

function describe(o: CliOption): string {
  if (o.kind === "string") {
    return o.choices ? `one of ${o.choices.join(", ")}` : "a value";
  }
  if (o.kind === "boolean") return "no value";
  let what = o.kind === "int" ? "a whole number" : "a number";
  if (o.min !== undefined) what += ` ${o.exclusiveMin ? ">" : ">="} ${o.min}`;
  if (o.max !== undefined) what += `${o.min !== undefined ? " and" : ""} <= ${o.max}`;
  return o.auto ? `${what} or auto` : what;
}

function convert(flag: string, o: CliOption, raw: string): string | number {
  if (o.kind !== "string" && o.kind !== "boolean" && o.auto && raw === "auto") return raw;
  if (o.kind === "string") {
    if (o.choices && !o.choices.includes(raw)) {
      const near = closest(raw, o.choices);
      throw new UsageError(
        `invalid value for ${flag}: ${JSON.stringify(raw)} (expected ${describe(o)}` +
          `${near ? `; did you mean ${near}?` : ""})${HINT}`,
      );
    }
    return raw;
  }
  if (o.kind === "boolean") throw new UsageError(`option ${flag} takes no value${HINT}`);
  const x = raw.trim() === "" ? NaN : Number(raw);
  const ok = Number.isFinite(x) && (o.kind === "number" || Number.isInteger(x)) &&
    (o.min === undefined || (o.exclusiveMin ? x > o.min : x >= o.min)) &&
    (o.max === undefined || x <= o.max);
  if (!ok) {
    throw new UsageError(
      `invalid value for ${flag}: ${JSON.stringify(raw)} (expected ${describe(o)})${HINT}`,
    );
  }
  return x;
}

/**
 * The --help text of a spec: usage, summary, one line per option (wrapped help text aligned),
 * with each default.
 *
 * @param spec The script's command line.
 * @returns The text, ending without a newline.
 * @example
 * ```ts
 * import { helpText } from "./cli.ts";
 * import assert from "node:assert";
 * const text = helpText({
 *   usage: "x.ts [options]",
 *   options: { epochs: { kind: "int", help: "epochs", default: 3, min: 1 } },
 * });
 * assert.match(text, /--epochs N\s+epochs \(default 3\)/);
 * ```
 */
export function helpText(spec: CliSpec): string {
  const lines = [`Usage: ${spec.usage}`];
  if (spec.summary) lines.push("", spec.summary);
  const rows: [string, string][] = [];
  if (spec.positionals) rows.push([spec.positionals.name, spec.positionals.help]);
  for (const [key, o] of Object.entries(spec.options)) {
    const short = o.short ? `-${o.short}, ` : "";
    let left: string;
    let help = o.help;
    if (o.kind === "boolean") {
      left = o.default === true ? `--no-${key}` : `${short}--${key}`;
    } else {
      const meta = o.kind === "string"
        ? (o.metavar ?? (o.choices ? o.choices.join("|") : "VALUE"))
        : (o.metavar ?? (o.kind === "int" ? "N" : "X"));
      left = `${short}--${key} ${meta}`;
      if (o.default !== undefined) help += ` (default ${o.default})`;
    }
    rows.push([left, help]);
  }
  rows.push(["-h, --help", "print this help and exit"]);
  const width = Math.min(24, Math.max(...rows.map(([l]) => l.length)) + 2);
  lines.push("", "Options:");
  for (const [left, help] of rows) {
    const pad = left.length + 2 > width
      ? `\n${" ".repeat(width + 2)}`
      : " ".repeat(width - left.length);
    const body = help.split("\n").join(`\n${" ".repeat(width + 2)}`);
    lines.push(`  ${left}${pad}${body}`);
  }
  if (spec.epilog) lines.push("", spec.epilog);
  return lines.join("\n");
}

/**
 * Parses `argv` against `spec` without side effects: `--name value`, `--name=value`,
 * `--flag`, `--no-flag`, short aliases, `--` ending the options.
 *
 * @param argv The arguments (e.g. `Deno.args`).
 * @param spec The script's command line.
 * @returns `"help"` when -h/--help is among the options, else the values with defaults applied.
 * @throws {UsageError} For an unknown option (with the closest known one), a missing or
 *   invalid value (naming the option and what it takes), or an unexpected positional.
 * @example
 * ```ts
 * import { parseArgv } from "./cli.ts";
 * import assert from "node:assert";
 * const spec = {
 *   usage: "x.ts",
 *   options: { epochs: { kind: "int", help: "epochs", default: 3, min: 1 } },
 * } as const;
 * const v = parseArgv(["--epochs", "5"], spec);
 * assert.ok(v !== "help" && v.epochs === 5 && v.given.has("epochs"));
 * assert.throws(() => parseArgv(["--epoch", "1"], spec), /did you mean --epochs\?/);
 * assert.strictEqual(parseArgv(["--epoch", "-h"], spec), "help");
 * ```
 */
export function parseArgv<S extends CliSpec>(
  argv: readonly string[],
  spec: S,
): CliValues<S> | "help" {
  const end = argv.indexOf("--");
  const opts = end < 0 ? argv : argv.slice(0, end);
  // --help wins over every other mistake: it is what a confused user types next.
  if (opts.includes("--help") || opts.includes("-h")) return "help";
  const options = spec.options;
  const shorts = new Map<string, string>();
  for (const [k, o] of Object.entries(options)) if (o.short) shorts.set(o.short, k);
  const values: Record<string, unknown> = {};
  for (const [k, o] of Object.entries(options)) values[k] = o.default;
  const given = new Set<string>();
  const positionals: string[] = [];
  const names = Object.entries(options).flatMap(([k, o]) =>
    o.kind === "boolean" ? [k, `no-${k}`] : [k]
  ).concat(["help"]);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (i === end) {
      positionals.push(...argv.slice(i + 1));
      break;
    }
    if (!a.startsWith("-") || a === "-") {
      positionals.push(a);
      continue;
    }
    let name: string, inline: string | undefined;
    if (a.startsWith("--")) {
      const eq = a.indexOf("=");
      name = eq < 0 ? a.slice(2) : a.slice(2, eq);
      inline = eq < 0 ? undefined : a.slice(eq + 1);
    } else {
      name = shorts.get(a.slice(1)) ?? a;
    }
    let key = name, negated = false;
    if (!Object.hasOwn(options, key) && key.startsWith("no-")) {
      const base = key.slice(3);
      if (Object.hasOwn(options, base) && options[base].kind === "boolean") {
        key = base;
        negated = true;
      }
    }
    if (!Object.hasOwn(options, key)) {
      const long = a.startsWith("--");
      const near = long ? closest(name, names) : undefined;
      throw new UsageError(
        `unknown option ${long ? `--${name}` : a}${
          near ? ` (did you mean --${near}?)` : ""
        }${HINT}`,
      );
    }
    const o = options[key];
    const flag = negated ? `--no-${key}` : `--${key}`;
    given.add(key);
    if (o.kind === "boolean") {
      if (inline !== undefined) {
        throw new UsageError(
          `option ${flag} takes no value (got ${JSON.stringify(inline)})${HINT}`,
        );
      }
      values[key] = !negated;
      continue;
    }
    let raw = inline;
    if (raw === undefined) {
      // The next argument is the value even when it starts with "-": `--lr -1` is a bad
      // learning rate, not two options.
      if (i + 1 >= argv.length || i + 1 === end) {
        throw new UsageError(`option ${flag} needs a value (${describe(o)})${HINT}`);
      }
      raw = argv[++i];
    }
    values[key] = convert(flag, o, raw);
  }
  const p = spec.positionals;
  if (!p && positionals.length > 0) {
    throw new UsageError(`unexpected argument ${JSON.stringify(positionals[0])}${HINT}`);
  }
  for (const x of positionals) {
    if (p?.choices && !p.choices.includes(x)) {
      const near = closest(x, p.choices);
      throw new UsageError(
        `unknown ${p.noun ?? "argument"} ${JSON.stringify(x)} (${
          near ? `did you mean ${near}? ` : ""
        }` +
          `expected ${p.choices.join(", ")})${HINT}`,
      );
    }
  }
  return { ...values, given, positionals } as CliValues<S>;
}

/**
 * Prints `message` as one line on stderr and exits with `code`: how every script reports a
 * mistake the user can fix.
 *
 * @param message What went wrong, naming the option or path.
 * @param code The exit code.
 */
export function exitWith(message: string, code: number): never {
  console.error(`error: ${message}`);
  Deno.exit(code);
}

/**
 * Parses the command line of a script: prints --help and exits 0, or prints a usage mistake
 * as one line and exits 2. Touches nothing that needs a permission before the help is out.
 *
 * @param argv The arguments (e.g. `Deno.args`).
 * @param spec The script's command line.
 * @returns The values.
 */
export function parseCli<S extends CliSpec>(argv: readonly string[], spec: S): CliValues<S> {
  let v: CliValues<S> | "help";
  try {
    v = parseArgv(argv, spec);
  } catch (e) {
    if (e instanceof UsageError) exitWith(e.message, e.exitCode);
    throw e;
  }
  if (v === "help") {
    console.log(helpText(spec));
    Deno.exit(0);
  }
  return v;
}

/** The one-line report of a permission Deno denied, found anywhere in `e`'s cause chain. */
function deniedPermission(e: unknown): string | undefined {
  for (let c: unknown = e; c instanceof Error; c = c.cause) {
    if (missingPermission(c) !== undefined) {
      return `${permissionMessage(c)}. In a checkout of pinstream, \`deno run -P\` grants ` +
        "what the examples need (the permission set in deno.json); -A grants everything";
    }
  }
  return undefined;
}

/**
 * Runs a script's main function: a {@linkcode UsageError} or {@linkcode CliError} becomes one
 * line on stderr and its exit code, and so does a permission Deno denied (naming the flag and
 * why, exit code 1); any other error keeps its stack trace (it is a bug).
 *
 * @param main The script's body.
 */
export async function runMain(main: () => Promise<unknown>): Promise<void> {
  try {
    await main();
  } catch (e) {
    const denied = deniedPermission(e);
    if (denied !== undefined) exitWith(denied, 1);
    if (e instanceof UsageError || e instanceof CliError) exitWith(e.message, e.exitCode);
    throw e;
  }
}
