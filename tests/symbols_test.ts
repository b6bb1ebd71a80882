// ffi/symbols.ts against kernels/pinstream.h: the same functions, each parameter under its C
// name with an FFI type its C type allows, the same results, nonblocking exactly where the
// header says [wait], and the same ABI version. A kernel added to one and not the other, or a
// parameter renamed, moved or retyped on one side only, fails here before any library loads.

import assert from "node:assert";
import { ABI_VERSION, signatures } from "../ffi/symbols.ts";
import { KERNELS } from "../ffi/native_backend.ts";
import { ffiTypesOf, parseAbiVersion, parsePrototypes } from "./_pinstream_h.ts";

const HEADER = new URL("../kernels/pinstream.h", import.meta.url);
const text = Deno.readTextFileSync(HEADER);
const table: Record<string, (typeof signatures)[keyof typeof signatures]> = signatures;

Deno.test("pinstream.h's parser reads names, types, counts and [wait] marks", () => {
  const [p, q] = parsePrototypes(
    "/* note */\nPS_API int ps_a(const int32_t *x, int64_t w_,\n" +
      "            void *stream);\n/* [wait] blocks */\nPS_API const char *ps_b(void);\n",
  );
  assert.deepStrictEqual(p, {
    name: "ps_a",
    result: "int",
    params: [
      { name: "x", type: "const int32_t *" },
      { name: "w_", type: "int64_t" },
      { name: "stream", type: "void *" },
    ],
    wait: false,
  });
  assert.deepStrictEqual(q, { name: "ps_b", result: "const char *", params: [], wait: true });
  assert.throws(() => ffiTypesOf("size_t"), /no FFI type for the C type size_t/);
});

Deno.test("symbols.ts has exactly the header's functions", () => {
  const header = parsePrototypes(text).map((p) => p.name).sort();
  assert.ok(header.length > 40, `only ${header.length} prototypes read from pinstream.h`);
  assert.deepStrictEqual(Object.keys(table).sort(), header);
});

Deno.test("every parameter has the header's name, position and a type its C type allows", () => {
  for (const p of parsePrototypes(text)) {
    const entry = table[p.name];
    const names = entry.params.map(([name]) => name);
    assert.deepStrictEqual(names, p.params.map((c) => c.name), `${p.name}: parameter names`);
    p.params.forEach((c, i) => {
      const ffi = entry.params[i][1];
      assert.ok(
        ffiTypesOf(c.type).includes(ffi),
        `${p.name}: parameter ${c.name} is ${c.type} in pinstream.h, "${ffi}" in symbols.ts`,
      );
    });
    const result = p.result.endsWith("*") ? "pointer" : ffiTypesOf(p.result)[0];
    assert.strictEqual(entry.result, result, `${p.name}: result`);
    const nonblocking = "nonblocking" in entry && entry.nonblocking === true;
    assert.strictEqual(nonblocking, p.wait, `${p.name}: nonblocking iff [wait] in pinstream.h`);
  }
});

Deno.test("every kernel entry point is a function of the header that takes a stream", () => {
  for (const [name, symbol] of Object.entries(KERNELS)) {
    const params = table[symbol].params;
    assert.strictEqual(params.at(-1)?.[0], "stream", `${name} (${symbol}) queues on a stream`);
  }
});

Deno.test("ABI_VERSION is the header's PS_ABI_VERSION", () => {
  assert.strictEqual(ABI_VERSION, parseAbiVersion(text));
});
