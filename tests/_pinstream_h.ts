// Reads kernels/pinstream.h's prototypes and ABI version, for the test that holds
// ffi/symbols.ts to the header.

/** One C parameter: its name and its type as written (`const int32_t *`). */
export interface CParam {
  name: string;
  type: string;
}

/** One `PS_API` function of the header. */
export interface CPrototype {
  name: string;
  result: string;
  params: CParam[];
  /** Marked [wait] by the comment right above it: it blocks until the device catches up. */
  wait: boolean;
}

/** The header's text with its comments blanked, each character's offset kept. */
function withoutComments(text: string): string {
  const blank = (c: string) => c.replace(/[^\n]/g, " ");
  return text.replace(/\/\*[\s\S]*?\*\//g, blank).replace(/\/\/[^\n]*/g, blank);
}

/** Whether the comment right above offset `at` (only blanks between) opens with [wait]. */
function markedWait(text: string, at: number): boolean {
  const before = text.slice(0, at).trimEnd();
  if (!before.endsWith("*/")) return false;
  const open = before.lastIndexOf("/*");
  return /^\/\*\s*\[wait\]/.test(before.slice(open));
}

function splitDeclaration(decl: string, what: string): CParam {
  const m = /^(.*?)([A-Za-z_][A-Za-z0-9_]*)$/.exec(decl.trim());
  if (m === null || m[1].trim() === "") {
    throw new SyntaxError(`pinstream.h: cannot read the parameter "${decl}" of ${what}`);
  }
  return { name: m[2], type: m[1].replace(/\s+/g, " ").replace(/\s*\*\s*/g, " *").trim() };
}

/** Every `PS_API` prototype of the header, in the header's order. */
export function parsePrototypes(text: string): CPrototype[] {
  const out: CPrototype[] = [];
  const re = /^PS_API\s+([^;(]*)\(([^)]*)\)\s*;/gm;
  for (const m of withoutComments(text).matchAll(re)) {
    const wait = markedWait(text, m.index);
    const head = splitDeclaration(m[1], "a PS_API declaration");
    const list = m[2].trim();
    const params = list === "void" || list === ""
      ? []
      : list.split(",").map((p) => splitDeclaration(p, head.name));
    out.push({ name: head.name, result: head.type, params, wait });
  }
  return out;
}

/** The header's `PS_ABI_VERSION`. */
export function parseAbiVersion(text: string): number {
  const m = /#define\s+PS_ABI_VERSION\s+(\d+)/.exec(text);
  if (m === null) throw new SyntaxError("pinstream.h: no #define PS_ABI_VERSION");
  return Number(m[1]);
}

/**
 * The Deno FFI types a C type may be declared as: a pointer is a `pointer` (memory the
 * kernel addresses) or a `buffer` (a typed array of the caller's, for out-parameters and host
 * arrays), each scalar has one.
 */
export function ffiTypesOf(cType: string): readonly string[] {
  if (cType.endsWith("*")) return ["pointer", "buffer"];
  const scalar: Record<string, string> = {
    "int": "i32",
    "int32_t": "i32",
    "int64_t": "i64",
    "uint64_t": "u64",
    "float": "f32",
    "double": "f64",
    "void": "void",
  };
  const t = scalar[cType.replace(/^const /, "")];
  if (t === undefined) throw new SyntaxError(`pinstream.h: no FFI type for the C type ${cType}`);
  return [t];
}
