// The grant client for node, preloaded (NODE_OPTIONS --require) only in
// runs that carry a grant. In a container it speaks HTTP to the broker over
// the run's Unix socket; in a hosted sandbox, HTTPS to the daemon's guard
// with the run's token, trusting only the authority it was handed if any.
// The broker decides everything. Same surface as the QuickJS guest's client:
// call/get/put/post/patch/del, Promise-based, JSON in and out, rejecting on
// anything but a 2xx.
'use strict';
(function () {
  const socketPath = process.env.HOST_API_SOCKET;
  const guardUrl = process.env.PLIMSOLL_GUARD_URL;
  const name = process.env.PLIMSOLL_GRANT_GLOBAL || 'host';
  if (!socketPath && !guardUrl) return;

  // How one request goes out: options for http(s).request, and which.
  let transport;
  if (socketPath) {
    const http = require('http');
    transport = (options, onAnswer) => http.request({ socketPath, ...options }, onAnswer);
  } else {
    const https = require('https');
    const guard = new URL(guardUrl);
    const token = process.env.PLIMSOLL_GUARD_TOKEN || '';
    const caFile = process.env.PLIMSOLL_GUARD_CA;
    // The handed authority, else node's bundled roots only: never one the
    // sandbox's environment adds (OpenShell injects its own MITM CA there).
    const ca = caFile ? require('fs').readFileSync(caFile) : require('tls').rootCertificates;
    const host = guard.hostname;
    const port = Number(guard.port || 443);
    // SNI names a host, never an address.
    const servername = require('net').isIP(host) ? undefined : host;
    // A sandbox whose only way out is its service's egress proxy
    // (OpenShell's) names it here: the guard is then reached through a
    // CONNECT tunnel, with this client's own TLS inside it, verified as
    // ever; the proxy sees the guard's name and port, never the token.
    const proxy = process.env.HTTPS_PROXY || process.env.https_proxy;
    const tunnel = proxy
      ? (_opts, done) => {
          const p = new URL(proxy);
          const req = require('http').request({
            host: p.hostname,
            port: Number(p.port || 80),
            method: 'CONNECT',
            path: `${host}:${port}`,
            agent: false,
          });
          req.on('connect', (res, socket) => {
            if (res.statusCode !== 200) {
              socket.destroy();
              done(new Error(`the egress proxy refused the guard (${res.statusCode})`));
              return;
            }
            // `host` too: the certificate is checked against the guard's
            // name or address, never the proxy's.
            done(null, require('tls').connect({ socket, host, servername, ca }));
          });
          req.on('error', done);
          req.end();
        }
      : undefined;
    // An agent of this client's own, made per request (no connection kept,
    // nothing the snippet could reconfigure): through the tunnel when the
    // sandbox names a proxy.
    class Tunnelled extends https.Agent {
      createConnection(opts, done) {
        tunnel(opts, done);
      }
    }
    transport = (options, onAnswer) =>
      https.request(
        {
          host,
          port,
          servername,
          agent: tunnel ? new Tunnelled({ keepAlive: false }) : false,
          ca,
          ...options,
          headers: { ...options.headers, 'x-plimsoll-guard': token },
        },
        onAnswer,
      );
  }

  function call(method, path, body) {
    return new Promise((resolve, reject) => {
      const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
      const req = transport(
        {
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
