// ps_nn_cast and ps_image_labels_i32 copy with memmove's semantics on every backend: source
// and destination may overlap, forwards or backwards, or be the same range.

import { loadLibrary } from "../ffi/library.ts";
import { BACKENDS } from "./_backends.ts";
import { checkOverlappingCopies } from "./_overlap_copy.ts";

for (const { kind: backend, ignore } of BACKENDS) {
  Deno.test({
    name: `[${backend}] same-type copies of overlapping device ranges equal memmove's result`,
    ignore,
    async fn() {
      await checkOverlappingCopies(loadLibrary(backend));
    },
  });
}
