// A workerSpec() state that structured clone refuses is refused by the DataLoader's constructor,
// naming the field; it used to throw DataCloneError in an event handler and end the process.
import assert from "node:assert";

const CHILD = new URL("./_loader_clone_child.ts", import.meta.url).pathname;

for (
  const [kind, path, what] of [
    ["function", "workerSpec\\(\\)\\.state\\.transform", "a function"],
    ["symbol", "workerSpec\\(\\)\\.state\\.tag", "a symbol"],
    ["weakmap", "workerSpec\\(\\)\\.state\\.cache", "a WeakMap"],
    ["nested", 'workerSpec\\(\\)\\.state\\.parts\\[1\\]\\.hooks\\.get\\("a"\\)', "a function"],
  ]
) {
  Deno.test(`DataLoader refuses a workerSpec state holding ${what} (${kind}), naming it`, async () => {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", CHILD, kind],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(out.stdout);
    const err = new TextDecoder().decode(out.stderr);
    assert.ok(out.success, `the process ended: ${err}`);
    assert.match(text, /^error: Cannot create DataLoader: /, text + err);
    assert.match(text, new RegExp(`${path}.*${what}.*structured-cloned`), text);
  });
}

Deno.test("DataLoader asks the dataset for its workerSpec() once, for every epoch's workers", async () => {
  const { DataLoader } = await import("../loader/data_loader.ts");
  const { FaultyDataset } = await import("./loader_fixtures.ts");
  let calls = 0;
  class Counted extends FaultyDataset {
    override workerSpec() {
      calls++;
      return super.workerSpec();
    }
  }
  await using loader = new DataLoader(new Counted({ length: 8, fault: "none", at: -1 }), {
    batchSize: 4,
    numWorkers: 1,
  });
  // Workers that are not persistent start again each epoch, with the same spec.
  for (let epoch = 0; epoch < 2; epoch++) {
    let n = 0;
    for await (const _ of loader) n++;
    assert.strictEqual(n, 2);
  }
  assert.strictEqual(calls, 1);
});
