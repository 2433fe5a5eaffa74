// The session agent: the main process of a session container (node, as the
// guest user, cwd /work), kept for many calls. The host writes one request
// per call as a JSON line on stdin and reads JSON lines on stdout from
// {"begin":id} to {"done":id}; whatever a call runs writes only to pipes this
// process reads, so stdout carries protocol lines alone, each written whole.
//
// Requests are handled one at a time, in order. After every call that ran
// code, the sweep SIGKILLs every process but PID 1, this one and the live
// kernels, until a scan of /proc finds none, so no process a call starts
// outlives it (a fork loop included). Kernels are processes of their own
// (kernel.js, kernel.py), so a cell that never returns costs the kernel, not
// the agent. A cell's output is cut out of its kernel's pipes by marker
// strings holding a random nonce; what a kernel prints between cells is
// dropped, not charged to the next cell.
//
// hello is on the path that opens a session, so nothing it does not need is
// loaded before it answers: stdin is read with fs.read (process.stdin would
// load net), child_process and crypto come later.
//
// Like runner.js this is not a security boundary: code in the container runs
// as the same user and can reach this process. The container is the
// boundary; the host believes nothing here it does not check.
'use strict';
const fs = require('fs');

const WORK = '/work';
// Not the session's: no cell sees it.
const PREBOOTED = 'PLIMSOLL_END' in process.env;
delete process.env.PLIMSOLL_END;
const MAX_LINE = 64 << 20; // a longer request is refused, not buffered
const ID = /^[0-9A-Za-z_-]{1,128}$/;
const SOURCE = { javascript: process.argv[1], python: process.argv[2] };
const { O_WRONLY, O_CREAT, O_TRUNC, O_RDONLY, O_NOFOLLOW, O_NONBLOCK } = fs.constants;
const EMPTY = Buffer.alloc(0);
const spawn = (...a) => require('child_process').spawn(...a);
const nonce = () => require('crypto').randomBytes(16).toString('hex');
function quietly(f) {
  try {
    return f();
  } catch (_) {
    return undefined;
  }
}
const nap = new Int32Array(new SharedArrayBuffer(4));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const kill = (pid) => quietly(() => process.kill(pid, 'SIGKILL'));

function emit(o) {
  const b = Buffer.from(JSON.stringify(o) + '\n');
  for (let off = 0; off < b.length; ) {
    try {
      off += fs.writeSync(1, b, off, b.length - off);
    } catch (e) {
      if (e.code !== 'EAGAIN') quit(); // the host is gone
      Atomics.wait(nap, 0, 0, 1);
    }
  }
}

class BadRequest extends Error {}
const need = (ok, what) => {
  if (!ok) throw new BadRequest(`bad request: ${what}`);
};
const isStrings = (v) => Array.isArray(v) && v.every((s) => typeof s === 'string');
const isFiles = (v) =>
  Array.isArray(v) && v.every((f) => f && typeof f.path === 'string' && typeof f.content === 'string');
const isLimits = (r, ...names) => names.every((n) => Number.isSafeInteger(r[n]) && r[n] >= 0);

function envWith(list) {
  need(list === undefined || isStrings(list), 'env');
  const env = { ...process.env };
  for (const kv of list || []) {
    const i = kv.indexOf('=');
    need(i > 0, 'env entries are K=V');
    env[kv.slice(0, i)] = kv.slice(i + 1);
  }
  return env;
}
const exitStatus = (code, signal) =>
  code !== null && code !== undefined
    ? code
    : 128 + (require('os').constants.signals[signal] || 0);
// What the agent starts is the OOM killer's first choice, never the agent.
const expendable = (pid) => quietly(() => fs.writeFileSync(`/proc/${pid}/oom_score_adj`, '500'));

// ---- Files: every path stays under /work, whatever it says ----

const errno = (code) => Object.assign(new Error(code), { code });
// The full path of rel, its directories walked one by one: a symlink or a
// non-directory on the way is refused, never followed.
function under(rel, create) {
  const parts = rel.split('/');
  const odd = (p) => p === '' || p === '.' || p === '..';
  if (rel.includes('\0') || parts.some(odd)) throw errno('EINVAL');
  let dir = WORK;
  for (const p of parts.slice(0, -1)) {
    dir += '/' + p;
    let st = quietly(() => fs.lstatSync(dir));
    if (!st && create) {
      quietly(() => fs.mkdirSync(dir, 0o755)); // EEXIST: someone was quicker
      st = fs.lstatSync(dir);
    } else if (!st) throw errno('ENOENT');
    if (st.isSymbolicLink()) throw errno('ELOOP');
    if (!st.isDirectory()) throw errno('ENOTDIR');
  }
  return dir + '/' + parts[parts.length - 1];
}

// Sessions keep /work, so files overwrite. A link, FIFO or socket at the
// path is replaced: never written through, never waited on.
function writeFile(rel, content) {
  const p = under(rel, true);
  const st = quietly(() => fs.lstatSync(p));
  if (st && st.isDirectory()) throw errno('EISDIR');
  if (st && !st.isFile()) fs.unlinkSync(p);
  const fd = fs.openSync(p, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK, 0o644);
  try {
    if (!fs.fstatSync(fd).isFile()) throw errno('EEXIST');
    fs.writeFileSync(fd, content);
  } finally {
    fs.closeSync(fd);
  }
}

// null, or "<path>: <errno code>" for the first file that could not be written.
function writeFiles(files) {
  need(files === undefined || isFiles(files), 'files');
  for (const f of files || []) {
    try {
      writeFile(f.path, f.content);
    } catch (e) {
      return `${f.path}: ${e.code || 'failed'}`;
    }
  }
  return null;
}

// A regular file's bytes; 'big' if over room; null if missing or not a file.
function readArtifact(rel, room) {
  let fd;
  try {
    fd = fs.openSync(under(rel, false), O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
    const st = fs.fstatSync(fd);
    if (!st.isFile()) return null;
    if (st.size > room) return 'big';
    // Exactly the size seen: a file something still appends to stays bounded.
    const buf = Buffer.alloc(st.size);
    let n = 0;
    for (let k; n < buf.length && (k = fs.readSync(fd, buf, n, buf.length - n, n)) > 0; ) n += k;
    return buf.subarray(0, n);
  } catch (_) {
    return null; // the steps may not have made it
  } finally {
    if (fd !== undefined) fs.closeSync(fd);
  }
}

// ---- The sweep ----

const kernels = { javascript: null, python: null };
// Longest status line a kernel writes, with room to spare.
const STATUS_MAX = 4096;

// SIGKILLs every live process but the keepers; returns how many it signalled,
// or -1 if /proc cannot be read. A process whose main thread exited
// (pthread_exit) shows as a zombie while its other threads run on: it is
// signalled and counted while it has a task besides the exited leader, so a
// round that killed one looks again for what it forked before it died (a
// relay of them could otherwise leave a round counting none with its newest
// member alive). A dead zombie (no other task) is signalled, not counted:
// it ignores the signal, and counting it would keep the sweep going.
function killPass() {
  const keep = new Set([1, process.pid]);
  for (const k of Object.values(kernels)) if (k) keep.add(k.pid);
  const names = quietly(() => fs.readdirSync('/proc'));
  if (!names) return -1;
  let n = 0;
  for (const name of names) {
    const c = name.charCodeAt(0);
    if (c < 48 || c > 57 || keep.has(Number(name))) continue;
    const stat = quietly(() => fs.readFileSync(`/proc/${name}/stat`, 'latin1'));
    const state = stat && stat.charAt(stat.lastIndexOf(')') + 2);
    if (!stat || state === 'X' || state === 'x') continue;
    if (state === 'Z') {
      const tasks = quietly(() => fs.readdirSync(`/proc/${name}/task`));
      if (quietly(() => process.kill(Number(name), 'SIGKILL')) && tasks && tasks.length > 1) n++;
      continue;
    }
    if (quietly(() => process.kill(Number(name), 'SIGKILL'))) n++;
  }
  return n;
}

// Repeats until a scan kills nothing, so what a fork loop makes between two
// scans is caught by the next. True when the container is clean.
async function sweepRounds() {
  for (let round = 0; round < 100; round++) {
    const n = killPass();
    if (n <= 0) return n === 0;
    await sleep(Math.min(1 + round, 10)); // let the killed exit and be reaped
  }
  return false;
}

// One sweep at a time, and nothing starts while one runs: a sweep kills
// every process it did not start with, so one still going when the next
// step or call began would kill that too. Callers share the sweep in flight.
let sweeping = null;
function sweep() {
  if (!sweeping) sweeping = sweepRounds().finally(() => (sweeping = null));
  return sweeping;
}
// Resolves when no sweep is running.
const swept = () => sweeping || Promise.resolve(true);

// ---- Processes: snippets and project steps ----

const capture = (limit) => ({ chunks: [], n: 0, cut: false, limit });
function take(c, d) {
  const room = c.limit - c.n;
  if (d.length > room) c.cut = true;
  if (room > 0 && d.length > 0) {
    const part = d.length > room ? d.subarray(0, room) : d;
    c.chunks.push(Buffer.from(part));
    c.n += part.length;
  }
}
const b64 = (c) => Buffer.concat(c.chunks).toString('base64');
// What a process or a cell printed and how it ended.
const report = (so, se, exitCode, timedOut, more) => ({
  stdout: b64(so),
  stderr: b64(se),
  exit_code: exitCode,
  timed_out: timedOut,
  ...more,
  stdout_truncated: so.cut,
  stderr_truncated: se.cut,
});

// Runs file in its own process group, killed whole at the deadline. What it
// leaves behind outside its group is swept when it exits, so its pipes close.
function runProcess(file, args, { input, env, deadline, limit }) {
  return new Promise((resolve) => {
    const started = Date.now();
    const [so, se] = [capture(limit), capture(limit)];
    let timedOut = false;
    let code = null;
    let child = null;
    const killGroup = () => child && child.pid && kill(-child.pid);
    const finish = () => {
      if (!timer) return;
      clearTimeout(timer);
      timer = null;
      const exitCode = timedOut ? 124 : code === null ? 127 : code;
      const r = report(so, se, exitCode, timedOut, { duration_ms: Date.now() - started });
      swept().finally(() => resolve(r)); // the next step must not meet this one's sweep
    };
    let timer = setTimeout(() => {
      timedOut = true;
      killGroup();
      sweep();
    }, Math.max(0, deadline - Date.now()));
    const stdio = [input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'];
    child = quietly(() => spawn(file, args, { cwd: WORK, env, detached: true, stdio }));
    if (!child) return finish();
    child.on('error', () => !child.pid && setImmediate(finish)); // never started: 127
    if (!child.pid) return;
    expendable(child.pid);
    if (input !== undefined) child.stdin.on('error', () => {}).end(input);
    child.stdout.on('data', (d) => take(so, d));
    child.stderr.on('data', (d) => take(se, d));
    child.on('exit', (c, signal) => {
      code = exitStatus(c, signal);
      killGroup();
      // The pipes usually close at once; if something outside the group
      // holds them, sweep it, then stop waiting on pipes nobody can write.
      setTimeout(() => timer && sweep().then(() => setTimeout(finish, 1000)), 20);
    });
    child.on('close', finish);
  });
}

// ---- Kernels ----

// python3 on PATH, and "3.11" from the name it links to: asking python
// itself would cost a process start on the path that opens a session.
let python;
function findPython() {
  if (python !== undefined) return python;
  python = null;
  for (const dir of (process.env.PATH || '').split(':')) {
    const p = `${dir}/python3`;
    const st = dir.startsWith('/') && quietly(() => fs.statSync(p));
    if (!st || !st.isFile() || !(st.mode & 0o111)) continue;
    const m = /python(\d+\.\d+)$/.exec(quietly(() => fs.readlinkSync(p)) || '');
    return (python = { path: p, version: m ? m[1] : '3' });
  }
  return python;
}

// One kernel process. Its stdout and stderr are read at all times (it never
// blocks on a full pipe) and kept only between the current cell's markers.
class Kernel {
  constructor(lang, child) {
    Object.assign(this, { lang, child, pid: child.pid, exited: null, cell: null });
    this.fresh = true; // no cell has run in it yet
    this.streams = [child.stdout, child.stderr].map((s) => {
      const st = { mode: 'idle', tail: EMPTY, eof: false, out: null };
      s.on('data', (d) => this.data(st, d));
      s.on('close', () => this.ended(Object.assign(st, { eof: true })));
      return st;
    });
    let status = '';
    child.stdio[3].on('error', () => {});
    child.stdio[4].on('error', () => {}).setEncoding('utf8');
    child.stdio[4].on('data', (d) => {
      status += d;
      // A status line is a few dozen bytes; anything longer is not one, and
      // must not grow the agent (a cell can write to this pipe itself).
      if (status.length > STATUS_MAX && status.indexOf('\n') < 0) status = '';
      for (let i; (i = status.indexOf('\n')) >= 0; status = status.slice(i + 1)) {
        const m = quietly(() => JSON.parse(status.slice(0, i)));
        const c = this.cell;
        if (c && m && m.nonce === c.nonce && Number.isInteger(m.exit)) {
          c.status = m.exit;
          c.check();
        }
      }
    });
    child.on('exit', (code, signal) => {
      this.exited = exitStatus(code, signal);
      if (kernels[lang] === this) kernels[lang] = null;
      if (this.cell) this.cell.died();
    });
  }

  // seek: dropping output until the begin marker; take: keeping it until the
  // end marker; idle: dropping it (between cells, after the end marker).
  data(st, chunk) {
    if (st.mode === 'idle') return;
    const c = this.cell;
    let d = st.tail.length ? Buffer.concat([st.tail, chunk]) : chunk;
    st.tail = EMPTY;
    if (st.mode === 'seek') {
      const k = d.indexOf(c.begin);
      if (k < 0) {
        st.tail = Buffer.from(d.subarray(Math.max(0, d.length - c.begin.length + 1)));
        return;
      }
      d = d.subarray(k + c.begin.length);
      st.mode = 'take';
    }
    const k = d.indexOf(c.end);
    if (k >= 0) {
      take(st.out, d.subarray(0, k));
      st.mode = 'idle';
      return this.ended(st);
    }
    const keep = Math.min(d.length, c.end.length - 1); // could start the end marker
    take(st.out, d.subarray(0, d.length - keep));
    st.tail = Buffer.from(d.subarray(d.length - keep));
  }

  // At the end marker (mode is idle already) or at EOF.
  ended(st) {
    if (st.eof) {
      if (st.mode === 'take') take(st.out, st.tail);
      Object.assign(st, { mode: 'idle', tail: EMPTY });
    }
    if (this.cell) this.cell.check();
  }

  run(code, deadline, limit) {
    return new Promise((resolve) => {
      const id = nonce();
      const started = this.fresh;
      this.fresh = false;
      for (const st of this.streams) {
        Object.assign(st, { out: capture(limit), tail: EMPTY, mode: st.eof ? 'idle' : 'seek' });
      }
      let timedOut = false;
      const timers = [];
      const c = {
        nonce: id,
        begin: Buffer.from(`<plimsoll:${id}:begin>`),
        end: Buffer.from(`<plimsoll:${id}:end>`),
        status: null,
        grace: false,
        check: () => {
          if (c.status === null && this.exited === null) return;
          if (this.streams.every((st) => st.mode === 'idle')) return finish();
          // The kernel writes its markers before its status, so they are on
          // their way; a cell that redirected its own fds gets a second.
          if (!c.grace) timers.push(setTimeout(finish, 1000));
          c.grace = true;
        },
        // Its children may hold the pipes open: kill them, then wait for EOF.
        died: () => sweep().then(c.check),
      };
      const finish = () => {
        if (this.cell !== c) return;
        this.cell = null;
        timers.forEach(clearTimeout);
        for (const st of this.streams) {
          if (st.mode === 'take') take(st.out, st.tail);
          Object.assign(st, { mode: 'idle', tail: EMPTY });
        }
        const [so, se] = this.streams.map((st) => st.out);
        const exitCode = timedOut ? 124 : c.status !== null ? c.status : this.exited;
        const ended = timedOut || this.exited !== null;
        resolve(report(so, se, exitCode, timedOut, {
          interpreter_started: started,
          interpreter_ended: ended,
        }));
      };
      this.cell = c;
      const budget = () => {
        timedOut = true;
        if (kernels[this.lang] === this) kernels[this.lang] = null; // the sweep may take it
        kill(-this.pid);
        timers.push(setTimeout(finish, 2000)); // in case its death is never seen
      };
      timers.push(setTimeout(budget, Math.max(0, deadline - Date.now())));
      if (this.exited !== null) return c.died();
      const req = { nonce: id, begin: c.begin.toString(), end: c.end.toString(), code };
      this.child.stdio[3].write(JSON.stringify(req) + '\n');
    });
  }
}

// The live kernel for lang, started if need be; or {error}.
function kernel(lang) {
  if (kernels[lang]) return Promise.resolve(kernels[lang]);
  const py = lang === 'python' && findPython();
  if (lang === 'python' && !py) return Promise.resolve({ error: 'python3 is not installed' });
  const file = py ? py.path : process.execPath;
  const args = py ? ['-I', '-u', '-c', SOURCE.python] : ['-e', SOURCE.javascript];
  // Its own group: a timeout kills it and what it started.
  const stdio = ['ignore', 'pipe', 'pipe', 'pipe', 'pipe'];
  const opts = { cwd: WORK, env: process.env, detached: true, stdio };
  const failed = (e) => ({ error: `starting ${file}: ${(e && e.code) || 'failed'}` });
  const child = quietly(() => spawn(file, args, opts));
  if (!child) return Promise.resolve(failed());
  if (!child.pid) return new Promise((r) => child.once('error', (e) => r(failed(e))));
  child.on('error', () => {});
  expendable(child.pid);
  return Promise.resolve((kernels[lang] = new Kernel(lang, child)));
}

// ---- Calls ----

const CALLS = {
  hello(req) {
    const py = findPython();
    emit({ hello: { node: process.version, python: py ? py.version : null } });
    // Warm the kernels once the answer is out; nobody waits for them.
    const langs = (Array.isArray(req.languages) ? req.languages : []).filter((l) => l in kernels);
    return () => langs.forEach((l) => setImmediate(() => kernel(l)));
  },

  async snippet(req, at) {
    need(typeof req.code === 'string', 'code');
    need(isLimits(req, 'budget_ms', 'output_limit'), 'limits');
    const env = envWith(req.env);
    const opts = { input: req.code, env, deadline: at + req.budget_ms, limit: req.output_limit };
    const r = await runProcess(process.execPath, ['-'], opts);
    delete r.duration_ms;
    emit({ process: r });
  },

  // runner.js's report, line for line.
  async project(req, at) {
    need(isStrings(req.steps), 'steps');
    need(req.artifacts === undefined || isStrings(req.artifacts), 'artifacts');
    need(isLimits(req, 'budget_ms', 'output_limit', 'artifact_bytes'), 'limits');
    const opts = { env: envWith(req.env), deadline: at + req.budget_ms, limit: req.output_limit };
    const end = (outcome, detail, cut) => emit({ end: { outcome, detail, artifacts_truncated: cut } });
    const failed = writeFiles(req.files);
    if (failed) return end('setup_failed', `writing ${failed}`, false);
    let outcome = 'completed';
    for (let i = 0; i < req.steps.length; i++) {
      emit({ start: i });
      const r = await runProcess('/bin/sh', ['-c', req.steps[i]], opts);
      emit({ step: { command: req.steps[i], ...r } });
      if (r.timed_out) outcome = 'timed_out';
      if (r.exit_code !== 0 || r.timed_out) break;
    }
    let total = 0;
    let truncated = false;
    for (const a of req.artifacts || []) {
      const content = readArtifact(a, req.artifact_bytes - total);
      if (content === 'big') truncated = true;
      if (!Buffer.isBuffer(content)) continue;
      total += content.length;
      emit({ artifact: { path: a, content: content.toString('base64') } });
    }
    end(outcome, '', truncated);
  },

  async cell(req, at) {
    need(req.language === 'python' || req.language === 'javascript', 'language');
    need(typeof req.code === 'string', 'code');
    need(isLimits(req, 'budget_ms', 'output_limit'), 'limits');
    const failed = writeFiles(req.files);
    if (failed) return emit({ cell_refused: { why: 'files', detail: failed } });
    const k = await kernel(req.language);
    if (k.error) return emit({ cell_refused: { why: 'no_interpreter', detail: k.error } });
    emit({ cell: await k.run(req.code, at + req.budget_ms, req.output_limit) });
  },
};
const SWEEPS = new Set(['snippet', 'project', 'cell']);

async function handle(item) {
  if (item.overlong) return emit({ bad: 'request line too long' });
  const text = item.line.toString('utf8');
  if (!text.trim()) return; // blank lines are not requests
  const req = quietly(() => JSON.parse(text));
  if (req === undefined) return emit({ bad: 'request is not JSON' });
  if (!req || typeof req.id !== 'string' || !ID.test(req.id)) {
    return emit({ bad: 'request has no readable id' });
  }
  emit({ begin: req.id });
  const call = Object.prototype.hasOwnProperty.call(CALLS, req.kind) ? CALLS[req.kind] : null;
  let later;
  if (!call) emit({ error: 'unknown kind' });
  else {
    try {
      later = await call(req, item.at);
    } catch (e) {
      emit({ error: e instanceof BadRequest ? e.message : `agent failure: ${e.code || e.message}` });
    }
    if (SWEEPS.has(req.kind)) {
      await swept(); // one left by the call may have started before its last process
      if (!(await sweep())) emit({ swept: false });
      // Python does not reap on its own (a SIGCHLD handler would steal the
      // status a cell's subprocess waits for): told to, between cells, it
      // collects what the sweep killed, and those pids are free again.
      const py = kernels.python;
      if (py && !py.cell) py.child.stdio[3].write('{"reap":true}\n');
    }
  }
  emit({ done: req.id });
  if (typeof later === 'function') later();
}

// ---- Input ----

const queue = [];
// The host sends one request at a time; a backlog this deep was not written
// by the host (something in the container reached the agent's input), and
// the session cannot be trusted further: the agent ends, and the session
// with it.
const MAX_QUEUED = 16;
let busy = false;
async function pump() {
  if (busy) return;
  busy = true;
  while (queue.length) {
    await handle(queue.shift()).catch((e) => process.stderr.write(`agent: ${e.stack}\n`));
  }
  busy = false;
}

let pending = [];
let pendingLen = 0;
let overlong = false;
function intake(chunk) {
  let from = 0;
  for (let nl; (nl = chunk.indexOf(10, from)) >= 0; from = nl + 1) {
    if (overlong) queue.push({ overlong: true });
    else {
      pending.push(chunk.subarray(from, nl));
      queue.push({ line: Buffer.concat(pending), at: Date.now() }); // the budget runs from here
    }
    [pending, pendingLen, overlong] = [[], 0, false];
  }
  if (queue.length > MAX_QUEUED) process.exit(70);
  if (from < chunk.length && !overlong) {
    pending.push(chunk.subarray(from));
    pendingLen += chunk.length - from;
    if (pendingLen > MAX_LINE) [pending, pendingLen, overlong] = [[], 0, true];
  }
  pump();
}

// Stdin's end is the session's end: nothing this agent started survives it.
function quit() {
  for (const k of Object.values(kernels)) if (k) kill(-k.pid);
  kernels.javascript = kernels.python = null;
  for (let i = 0; i < 20 && killPass() > 0; i++) Atomics.wait(nap, 0, 0, 5);
  process.exit(0);
}

const inbuf = Buffer.allocUnsafe(1 << 16);
(function readIn() {
  fs.read(0, inbuf, 0, inbuf.length, null, (e, n) => {
    if (e && (e.code === 'EAGAIN' || e.code === 'EINTR')) return setTimeout(readIn, 2);
    if (e || n === 0) return quit();
    intake(Buffer.from(inbuf.subarray(0, n)));
    readIn();
  });
})();
findPython(); // while the first request is on its way: hello needs it
// Pre-booted (the host's end-frame variable is set only in a container it
// launched at once, before any request): the kernels boot now, while the
// container waits, so the first cell finds them up. Behind the gate, they
// wait for hello, which is then on the open's path.
if (PREBOOTED) ['javascript', 'python'].forEach((l) => setImmediate(() => kernel(l)));
process.on('uncaughtException', (e) => process.stderr.write(`agent: ${e && e.stack}\n`));
