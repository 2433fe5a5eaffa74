// The grant client for node in a container, preloaded (NODE_OPTIONS
// --require) only in runs that carry a grant. It speaks HTTP to the broker
// over the run's Unix socket; the broker decides everything. Same surface as
// the QuickJS guest's client: call/get/put/post/patch/del, Promise-based,
// JSON in and out, rejecting on anything but a 2xx.
'use strict';
(function () {
  const socketPath = process.env.HOST_API_SOCKET;
  const name = process.env.PLIMSOLL_GRANT_GLOBAL || 'host';
  if (!socketPath) return;
  const http = require('http');

  function call(method, path, body) {
    return new Promise((resolve, reject) => {
      const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
      const req = http.request(
        {
          socketPath,
          method: String(method).toUpperCase(),
          path: String(path),
          headers: payload ? { 'content-type': 'application/json', 'content-length': payload.length } : {},
        },
        (res) => {
          const chunks = [];
          res.on('data', (c) => chunks.push(c));
          res.on('end', () => {
            const text = Buffer.concat(chunks).toString('utf8');
            const broker = res.headers['plimsoll-broker'];
            if (broker && broker !== 'upstream') {
              const prefix = {
                'not-permitted': 'not permitted by sandbox capability',
                budget: 'host call budget exhausted',
                shed: 'host api 503',
                'upstream-failed': 'host api call failed',
              }[broker] || 'host api refused';
              reject(new Error(`${prefix}: ${text}`));
              return;
            }
            if (res.statusCode < 200 || res.statusCode > 299) {
              const err = new Error(`host api ${res.statusCode}: ${text}`);
              err.status = res.statusCode;
              reject(err);
              return;
            }
            try {
              resolve(text === '' ? null : JSON.parse(text));
            } catch (_) {
              resolve(text);
            }
          });
        },
      );
      req.on('error', (e) => reject(new Error(`host api call failed: ${e.code || e.message}`)));
      if (payload) req.write(payload);
      req.end();
    });
  }

  const client = {
    call,
    get: (p) => call('GET', p),
    del: (p) => call('DELETE', p),
    put: (p, b) => call('PUT', p, b),
    post: (p, b) => call('POST', p, b),
    patch: (p, b) => call('PATCH', p, b),
  };
  globalThis[name] = client;
  // The profile's preamble (an SDK over the client, say) runs before the
  // snippet, then the client is frozen so the snippet cannot swap its
  // methods. The broker decides every call either way.
  const preamble = process.env.PLIMSOLL_GRANT_PREAMBLE;
  if (preamble) {
    try {
      const text = require('fs').readFileSync(preamble, 'utf8');
      // Strict, as QuickJS runs it (a module there): one meaning in both.
      require('vm').runInThisContext('"use strict";' + text, { filename: 'preamble.js' });
    } catch (e) {
      process.stderr.write(`plimsoll: the grant's preamble failed: ${e && e.stack ? e.stack : e}\n`);
      process.exit(1);
    }
  }
  Object.freeze(client);
})();
