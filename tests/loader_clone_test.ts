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
