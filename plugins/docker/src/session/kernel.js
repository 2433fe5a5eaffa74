// The JavaScript cell kernel of a session (node -e, started by the session
// agent, cwd /work). It is a process of its own so that a cell that never
// returns costs the kernel, not the agent: the agent kills it at the budget
// and starts a fresh one for the next cell.
//
// Protocol, agent side in agent.js: one JSON request per line on fd 3,
// {"nonce","begin","end","code"}. For each, the kernel writes `begin` to
// stdout and stderr, runs the code, writes `end` to both, then
// {"nonce","exit"} on fd 4. The agent keeps only what lies between the
// markers, so a timer that prints between cells is not charged to the next
// one. stdout and stderr are made blocking, so every console.log is written
// before the call returns: the markers land in order, and output written
// before process.exit() is not lost.
//
// Cells are evaluated through the in-process inspector's Runtime.evaluate
// with replMode, V8's own notebook semantics (what DevTools' console uses):
// top-level let/const/class persist into later cells and may be declared
// again there, top-level await works, and the completion value comes back.
// Rewriting the source ourselves would need a JavaScript parser, which node
// does not ship to userland. The value and any exception are fetched back as
// real objects (callFunctionOn into a receiver), printed with util.inspect,
// and the value kept as globalThis._.
//
// Everything lives in this function's scope, so a cell sees no kernel names.
'use strict';
(() => {
  const fs = require('fs');
  const net = require('net');
  const util = require('util');
  const inspector = require('inspector');
  const { createRequire } = require('module');

  for (const s of [process.stdout, process.stderr]) {
    if (s._handle && typeof s._handle.setBlocking === 'function') s._handle.setBlocking(true);
  }
  const nap = new Int32Array(new SharedArrayBuffer(4));
  function put(fd, text) {
    const b = Buffer.from(text);
    for (let off = 0; off < b.length; ) {
      try {
        off += fs.writeSync(fd, b, off, b.length - off);
      } catch (e) {
        if (e.code !== 'EAGAIN') return; // the agent is gone or the cell closed the fd
        Atomics.wait(nap, 0, 0, 1);
      }
    }
  }

  // What a script in /work would have.
  globalThis.require = createRequire('/work/');

  const session = new inspector.Session();
  session.connect();
  const post = (method, params) =>
    new Promise((resolve, reject) =>
      session.post(method, params, (e, r) => (e ? reject(e) : resolve(r))),
    );

  // Inspector results are remote handles; the receiver turns one back into
  // the value itself.
  let taken;
  const receiver = { take: (v) => (taken = v) };
  const ready = (async () => {
    const key = `__plimsoll_kernel_${process.pid}`;
    globalThis[key] = receiver;
    const expression = `globalThis.${key}`;
    const r = await post('Runtime.evaluate', { expression, objectGroup: 'kernel' });
    delete globalThis[key];
    return r.result.objectId;
  })();
  async function valueOf(remote) {
    let arg = {}; // undefined
    const odd = remote.unserializableValue; // 1n, NaN, -0, Infinity
    if (remote.objectId) arg = { objectId: remote.objectId };
    else if (odd !== undefined) arg = { unserializableValue: odd };
    else if (remote.type !== 'undefined') arg = { value: remote.value };
    taken = undefined;
    await post('Runtime.callFunctionOn', {
      objectId: await ready,
      functionDeclaration: 'function (v) { this.take(v); }',
      arguments: [arg],
      objectGroup: 'cell',
    });
    return taken;
  }

  const inspect = (v) => {
    try {
      return util.inspect(v);
    } catch (_) {
      return String(v);
    }
  };
  // Drops the frames below the cell: the inspector's and this kernel's.
  function trim(text) {
    const out = [];
    let cutting = false;
    for (const line of text.split('\n')) {
      const frame = /^\s+at /.test(line);
      if (frame && /node:inspector|\[eval\]/.test(line)) cutting = true;
      if (!frame) cutting = false;
      if (!(frame && cutting)) out.push(line);
    }
    return out.join('\n');
  }
  const describe = (err) => `Uncaught ${trim(inspect(err))}`;

  // A cell that does not compile: where, as node shows it, then the error.
  function failure(err, details, code, name) {
    const text = describe(err);
    if (!(err instanceof SyntaxError) || /\n\s+at /.test(text)) return text;
    const line = code.split('\n')[details.lineNumber] || '';
    const caret = ' '.repeat(details.columnNumber) + '^';
    return `${name}:${details.lineNumber + 1}\n${line}\n${caret}\n\n${text}`;
  }

  // Async work is the cell's own business: reported, never fatal.
  process.on('uncaughtException', (e) => put(2, describe(e) + '\n'));
  process.on('unhandledRejection', (e) => put(2, describe(e) + '\n'));

  let count = 0;
  async function cell(req) {
    const name = `cell-${++count}`;
    put(1, req.begin);
    put(2, req.begin);
    let exit = 0;
    try {
      const r = await post('Runtime.evaluate', {
        expression: `${req.code}\n//# sourceURL=${name}`,
        replMode: true,
        awaitPromise: true,
        objectGroup: 'cell',
      });
      if (r.exceptionDetails) {
        exit = 1;
        const d = r.exceptionDetails;
        put(2, failure(await valueOf(d.exception || r.result), d, req.code, name) + '\n');
      } else {
        const v = await valueOf(r.result);
        if (v !== undefined) {
          globalThis._ = v;
          put(1, inspect(v) + '\n');
        }
      }
    } catch (e) {
      exit = 1;
      put(2, `kernel: ${inspect(e)}\n`);
    }
    post('Runtime.releaseObjectGroup', { objectGroup: 'cell' }).catch(() => {});
    put(1, req.end);
    put(2, req.end);
    put(4, JSON.stringify({ nonce: req.nonce, exit }) + '\n');
  }

  // Requests, one at a time; the agent sends the next only after the status.
  const requests = new net.Socket({ fd: 3, readable: true, writable: false });
  const queue = [];
  let busy = false;
  let pending = '';
  async function drain() {
    if (busy) return;
    busy = true;
    while (queue.length) {
      let req;
      try {
        req = JSON.parse(queue.shift());
      } catch (_) {
        continue;
      }
      if (req && typeof req.nonce === 'string') await cell(req);
    }
    busy = false;
  }
  requests.setEncoding('utf8');
  requests.on('data', (d) => {
    pending += d;
    for (let i; (i = pending.indexOf('\n')) >= 0; pending = pending.slice(i + 1)) {
      queue.push(pending.slice(0, i));
    }
    drain();
  });
  // The agent closed fd 3: the session is over.
  requests.on('end', () => process.exit(0));
  requests.on('error', () => process.exit(0));
})();
