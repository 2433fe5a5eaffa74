// Builds adapter.js into a component of the `cloud-adapter` world with
// componentize-js's API. Usage: node build.mjs OUT.wasm
import { writeFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { componentize } from '@bytecodealliance/componentize-js';

const out = process.argv[2];
if (!out) throw new Error('usage: node build.mjs OUT.wasm');
const here = (p) => fileURLToPath(new URL(p, import.meta.url));

const { component } = await componentize({
  sourcePath: here('./adapter.js'),
  witPath: here('../../wit/provider'),
  worldName: 'cloud-adapter',
  // Every WASI feature of the engine off: the adapter needs no stdio
  // (it logs through plimsoll:provider/log), no clocks, no randomness, and
  // reaches the network only through plimsoll:provider/http, never
  // fetch()/wasi:http. What stays imported is what the world names.
  disableFeatures: ['stdio', 'random', 'clocks', 'http', 'fetch-event'],
});
await writeFile(out, component);
