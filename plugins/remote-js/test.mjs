// Checks a built remote-js component without the daemon: jco transpiles it
// to JavaScript (the same StarlingMonkey wasm, run by node), each call gets a
// fresh instance as in the host, and a scripted upstream answers its requests.
// Usage: node test.mjs [remote-js.wasm] (default ../../target/plugins/remote-js.wasm)
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, writeFile, mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { transpile } from '@bytecodealliance/jco';

const wasm = process.argv[2] ?? fileURLToPath(new URL('../../target/plugins/remote-js.wasm', import.meta.url));
const dir = await mkdtemp(join(tmpdir(), 'remote-js-test-'));
let instantiate;
let compile;
try {
  const { files } = await transpile(await readFile(wasm), { name: 'remote-js', instantiation: 'sync', noTypescript: true, quiet: true });
  for (const [name, bytes] of Object.entries(files)) {
    const path = join(dir, name);
    await mkdir(dirname(path), { recursive: true });
    await writeFile(path, bytes);
  }
  ({ instantiate } = await import(pathToFileURL(join(dir, 'remote-js.js'))));
  const modules = {};
  for (const name of Object.keys(files).filter((n) => n.endsWith('.wasm'))) {
    modules[name] = new WebAssembly.Module(await readFile(join(dir, name)));
  }
  compile = (name) => modules[name];
} finally {
  await rm(dir, { recursive: true });
}

// ---- The scripted host and upstream ----

/** An import's error, as the bindings expect it thrown. */
class HttpError extends Error {
  constructor(payload) {
    super('http error');
    this.payload = payload;
  }
}

let origins = ['http://127.0.0.1:9999'];
let sent = [];
let logs = [];
const upstream = {}; // procedure -> (body) => answer | HttpError

const host = {
  'plimsoll:provider/http': {
    allowedOrigins: () => origins,
    send(request) {
      const body = JSON.parse(Buffer.from(request.body).toString());
      sent.push({ method: request.method, url: request.url, headers: request.headers, body });
      const answer = upstream[request.url.split('/').pop()](body);
      if (answer instanceof HttpError) throw answer;
      const bytes = answer.raw ?? Buffer.from(typeof answer.json === 'string' ? answer.json : JSON.stringify(answer.json));
      return { status: answer.status ?? 200, headers: answer.headers ?? [], body: new Uint8Array(bytes) };
    },
  },
  'plimsoll:provider/log': { write: (level, message) => logs.push([level, message]) },
  'plimsoll:provider/types': {},
  'plimsoll:provider/project-report': { addStep: () => false, addArtifact: () => false },
  'plimsoll:provider/config-keys': { declare: () => false, reject: () => {} },
  'wasi:config/store': { get: () => undefined, getAll: () => [] },
};

/** Calls `name` on a fresh instance; returns its value or its error value. */
function call(name, ...args) {
  const adapter = instantiate(compile, host).adapter;
  try {
    return { ok: adapter[name](...args) };
  } catch (e) {
    if (!e || !Object.hasOwn(e, 'payload')) throw e;
    return { err: e.payload };
  }
}

const reset = () => {
  sent = [];
  logs = [];
};
const b64 = (s) => Buffer.from(s).toString('base64');
const text = (bytes) => Buffer.from(bytes).toString();
const snippet = (code, outputLimit = 100) => ({ timeoutMs: 1234, outputLimit, payload: { tag: 'javascript', val: code } });
const refused = (tag, val) => ({ tag: 'not-dispatched', val: { tag, val } });
const ENDED = { reason: 'main-process-ended', detail: 'the upstream session ended' };
const DESCRIBE = {
  isolation: 'kernel',
  javascriptEnvironment: { identity: 'sha256:abc' },
  supportsSessions: true,
  sessionEnvironment: { languages: ['javascript', 'python', 'cobol'] },
};

// ---- describe ----
upstream.Describe = () => ({ json: DESCRIBE });
reset();
assert.deepEqual(call('describe').ok, {
  name: 'remote-js',
  tier: 'kernel',
  payloads: ['javascript'],
  environment: 'remote:sha256:abc',
  sessions: { payloads: ['javascript'], cellLanguages: ['javascript', 'python'] },
});
assert.deepEqual(sent, [{
  method: 'POST',
  url: 'http://127.0.0.1:9999/plimsoll.v1.SandboxService/Describe',
  headers: [['content-type', 'application/json']],
  body: {},
}]);
upstream.Describe = () => new HttpError({ tag: 'transport', val: 'connection refused' });
assert.deepEqual(call('describe').ok, {
  name: 'remote-js', tier: 'process', payloads: ['javascript'], environment: 'remote:unreachable', sessions: undefined,
});
upstream.Describe = () => ({ json: { isolation: 'container' } });
assert.deepEqual(call('describe').ok.environment, 'remote:unknown');
upstream.Describe = () => ({ json: DESCRIBE });

// ---- preflight ----
upstream.Run = () => ({ json: { javascript: { stdout: b64('42\n') } } });
reset();
assert.deepEqual(call('preflight').ok, {
  passed: true,
  checks: 'upstream origin http://127.0.0.1:9999\nprobe snippet exit 0 (ok)',
  languages: ['javascript'],
});
assert.deepEqual(sent[0].body, { protocol: 4, timeoutMs: 5000, javascript: { code: 'console.log(6 * 7)' } });
upstream.Run = () => ({ json: { javascript: { stdout: b64('41\n'), exitCode: 3 } } });
assert.equal(call('preflight').ok.passed, false);
upstream.Run = () => new HttpError({ tag: 'forbidden', val: 'off the allowlist' });
assert.equal(call('preflight').err, 'probe run failed: not-dispatched(environment: the host refused the request: off the allowlist)');
origins = [];
assert.equal(call('preflight').err, 'no origin is allowed: set SANDBOX_PLUGIN_HTTP_ORIGINS');
origins = ['http://127.0.0.1:9999'];

// ---- run ----
upstream.Run = () => ({
  json: { javascript: { stdout: b64('hello world'), stderr: b64('é'), exitCode: 7, timedOut: true, stdoutTruncated: true } },
});
reset();
let out = call('run', snippet('print(1) // ü', 5)).ok;
assert.equal(out.tag, 'javascript');
assert.equal(text(out.val.stdout), 'hello');
assert.equal(text(out.val.stderr), 'é');
assert.deepEqual([out.val.exitCode, out.val.timedOut, out.val.stdoutTruncated, out.val.stderrTruncated], [7, true, true, false]);
// The floor is what Describe says now.
assert.deepEqual(sent.map((s) => s.url.split('/').pop()), ['Describe', 'Run']);
assert.deepEqual(sent[1].body, { protocol: 4, timeoutMs: 1234, javascript: { code: 'print(1) // ü' }, minimumIsolation: 'kernel' });
upstream.Describe = () => ({ status: 503, json: {} });
reset();
call('run', snippet('x'));
assert.equal('minimumIsolation' in sent[1].body, false);
upstream.Describe = () => ({ json: DESCRIBE });

// Untrusted answers read as defaults.
for (const [answer, exitCode] of [
  [{ json: { javascript: { stdout: '!!', exitCode: 2 ** 40 } } }, 0],
  [{ json: 'not json' }, 0],
  [{ raw: Buffer.concat([Buffer.from('{"javascript":{"exitCode":5,"x":"'), Buffer.from([0xff]), Buffer.from('"}}')]) }, 0],
  [{ json: { javascript: { exitCode: -1 } } }, -1],
]) {
  upstream.Run = () => answer;
  out = call('run', snippet('x')).ok;
  assert.deepEqual([out.val.exitCode, out.val.stdout.length], [exitCode, 0]);
}

// Errors, mapped honestly.
const runError = (answer) => {
  upstream.Run = () => answer;
  return call('run', snippet('x')).err;
};
reset();
assert.deepEqual(
  runError({ status: 429, headers: [['Plimsoll-Not-Dispatched', 'capacity']], json: { message: 'busy' } }),
  refused('capacity', 'upstream: busy'),
);
assert.deepEqual(logs, [['info', 'upstream refused the run (capacity)']]);
assert.deepEqual(runError({ status: 400, headers: [['plimsoll-not-dispatched', 'protocol']], json: {} }), refused('unsupported', 'upstream: '));
assert.deepEqual(runError({ status: 400, headers: [['plimsoll-not-dispatched', 'odd']], json: { message: 'm' } }), refused('environment', 'upstream: m'));
assert.deepEqual(runError({ status: 500, json: { message: 'boom' } }), { tag: 'may-have-run', val: 'upstream status 500: boom' });
assert.deepEqual(runError(new HttpError({ tag: 'transport', val: 'reset' })), { tag: 'may-have-run', val: 'transport: reset' });
assert.deepEqual(runError(new HttpError({ tag: 'too-large' })), { tag: 'may-have-run', val: 'transport: the answer was too large' });
assert.deepEqual(runError(new HttpError({ tag: 'forbidden', val: 'no' })), refused('environment', 'the host refused the request: no'));
const project = { tag: 'project', val: { files: [], steps: [], artifacts: [] } };
assert.deepEqual(call('run', { timeoutMs: 1, outputLimit: 1, payload: project }).err, refused('unsupported', 'remote-js runs snippets only'));

// ---- sessions ----
const options = { languages: ['python'], lifetimeMs: 60000, timeoutMs: 5000 };
upstream.OpenSession = () => ({ json: { sessionId: 'sess-1' } });
reset();
assert.equal(call('openSession', options).ok, 'sess-1');
assert.deepEqual(sent[1].body, { protocol: 4, lifetimeMs: 60000, languages: ['python'], minimumIsolation: 'kernel' });
upstream.OpenSession = () => ({ json: { sessionId: 'é'.repeat(64) } }); // 128 bytes
assert.equal(call('openSession', options).ok.length, 64);
upstream.OpenSession = () => ({ json: { sessionId: 'é'.repeat(65) } }); // 130 bytes
assert.deepEqual(call('openSession', options).err, { tag: 'may-have-run', val: 'the upstream opened no usable session' });
upstream.OpenSession = () => ({ status: 403, headers: [['plimsoll-not-dispatched', 'isolation']], json: { message: 'weak' } });
assert.deepEqual(call('openSession', options).err, refused('isolation', 'upstream: weak'));

upstream.SessionRun = (body) => body.cell
  ? { json: { run: { cell: { stdout: b64('3\n'), interpreterStarted: true } }, ended: 'SESSION_END_EXPIRED' } }
  : { json: { run: { javascript: { stdout: b64('ok'), exitCode: 1 } } } };
reset();
let answer = call('sessionRun', 'sess-1', snippet('x')).ok;
assert.deepEqual(sent[0].body, { protocol: 4, sessionId: 'sess-1', timeoutMs: 1234, javascript: { code: 'x' } });
assert.deepEqual([answer.outcome.tag, text(answer.outcome.val.stdout), answer.outcome.val.exitCode, answer.ended], ['javascript', 'ok', 1, undefined]);
const cell = { language: 'python', code: '1+2', files: [{ path: 'a.txt', content: 'A' }] };
answer = call('sessionRun', 'sess-1', { timeoutMs: 9, outputLimit: 9, payload: { tag: 'cell', val: cell } }).ok;
assert.deepEqual(sent[1].body, { protocol: 4, sessionId: 'sess-1', timeoutMs: 9, cell });
assert.equal(answer.outcome.tag, 'cell');
assert.deepEqual([text(answer.outcome.val.output.stdout), answer.outcome.val.interpreterStarted, answer.outcome.val.interpreterEnded], ['3\n', true, false]);
assert.deepEqual(answer.ended, { reason: 'expired', detail: 'the upstream session ended' });
for (const [reason, ended] of [['SESSION_END_SANDBOX_CHANGED', 'sandbox-changed'], ['SESSION_END_OTHER', 'main-process-ended'], ['SESSION_END_UNSPECIFIED', undefined]]) {
  upstream.SessionRun = () => ({ json: { run: {}, ended: reason } });
  assert.equal(call('sessionRun', 's', snippet('x')).ok.ended?.reason, ended);
}
upstream.SessionRun = () => ({
  status: 404,
  headers: [['plimsoll-not-dispatched', 'request']],
  json: { message: 'gone', details: [{ type: 'type.googleapis.com/plimsoll.v1.SessionEnded' }] },
});
assert.deepEqual(call('sessionRun', 's', snippet('x')).err, { error: refused('request', 'upstream: gone'), ended: ENDED });
upstream.SessionRun = () => ({ status: 500, json: { message: 'x' } });
assert.deepEqual(call('sessionRun', 's', snippet('x')).err, { error: { tag: 'may-have-run', val: 'upstream status 500: x' }, ended: undefined });
assert.deepEqual(
  call('sessionRun', 's', { timeoutMs: 1, outputLimit: 1, payload: project }).err,
  { error: refused('unsupported', 'remote-js runs snippets and cells only'), ended: undefined },
);

upstream.CloseSession = () => new HttpError({ tag: 'transport', val: 'x' });
reset();
assert.deepEqual(call('closeSession', 'sess-1'), { ok: undefined });
assert.deepEqual(sent[0].body, { protocol: 4, sessionId: 'sess-1' });

console.log('remote-js: all checks passed');
