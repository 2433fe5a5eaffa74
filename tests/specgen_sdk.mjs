// Runs a generated petstore SDK (tests/specgen.rs) against a stub grant
// client that records every call, and checks what the methods send and
// what they refuse. Usage: node specgen_sdk.mjs PATH/petstore.sdk.js
// Prints "ok" and exits 0, or prints the failure and exits 1.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import vm from "node:vm";

const file = process.argv[2];
if (!file) {
  console.error("usage: node specgen_sdk.mjs SDK.js");
  process.exit(2);
}

const calls = [];
const client = {
  call(method, path, body) {
    calls.push([method, path, body]);
    return Promise.resolve({ ok: true });
  },
};

try {
  // With no client installed the SDK refuses to load.
  assert.throws(() => vm.runInThisContext(readFileSync(file, "utf8"), { filename: file }), Error);

  globalThis.petstore = client;
  vm.runInThisContext(readFileSync(file, "utf8"), { filename: file });

  // Plain properties, one per operation, and nothing else.
  const keys = Object.keys(client);
  assert.equal(keys[0], "call");
  for (const name of keys.slice(1)) {
    assert.equal(typeof client[name], "function", name);
  }
  assert.ok(keys.includes("getPetById"));
  assert.ok(!keys.includes("findPetsByStatus"), "a skipped operation has a method");

  const answer = petstore.getPetById(7);
  assert.ok(answer instanceof Promise);
  assert.deepEqual(calls, [["GET", "/v2/pet/7", undefined]]);

  for (const bad of ["a/b", "..", ".", "", "a b", "%2e", undefined, null]) {
    assert.throws(() => petstore.getPetById(bad), TypeError, String(bad));
  }
  assert.throws(() => petstore.getPetById(), TypeError);
  assert.equal(calls.length, 1, "a refused argument was sent");

  petstore.updatePet({ name: "doggie" });
  petstore.updateUser("user-1", { id: 1 });
  petstore.getInventory();
  petstore.deleteOrder("x.y~z_1");
  assert.deepEqual(calls.slice(1), [
    ["PUT", "/v2/pet", { name: "doggie" }],
    ["PUT", "/v2/user/user-1", { id: 1 }],
    ["GET", "/v2/store/inventory", undefined],
    ["DELETE", "/v2/store/order/x.y~z_1", undefined],
  ]);
  console.log("ok");
} catch (e) {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
}
