// remote-js: the JavaScript twin of plugins/remote-plimsoll. It runs
// snippets (and sessions) on another plimsolld, which it reaches through the
// host's synchronous `plimsoll:provider/http` interface: the host checks the
// allowlist, adds the upstream's token itself and bounds size and time, so
// this file holds no credential and needs no event loop.
//
// Built by build.sh with componentize-js against the `cloud-adapter` world
// (wit/provider). The upstream is the first origin the operator allowed
// (SANDBOX_PLUGIN_HTTP_ORIGINS); it is spoken to in Connect JSON, as
// remote-plimsoll does.
//
// How the bindings map WIT onto JavaScript: enums are their names as
// strings, variants `{ tag, val }`, records objects with camelCase fields,
// `option` is `undefined` for none, `list<u8>` a Uint8Array. An export that
// returns `result` returns its ok value and throws its error value; an import
// that returns `result` throws an error whose `payload` is its error value.

import { send, allowedOrigins } from 'plimsoll:provider/http@0.1.0';
import { write as log } from 'plimsoll:provider/log@0.1.0';

/** The provider's name: the host requires it to equal the file's stem. */
const NAME = 'remote-js';
/** The protocol number of the upstream API this plugin speaks. */
const PROTOCOL = 4;

const encoder = new TextEncoder();
// Fatal, so an answer that is not UTF-8 reads as no JSON at all rather than
// as text with replacement characters.
const decoder = new TextDecoder('utf-8', { fatal: true });

// ---- The adapter export -------------------------------------------------

export const adapter = {
  // describe cannot fail: an unreachable upstream claims the weakest tier,
  // and preflight then refuses to start.
  describe() {
    const answer = call('Describe', {});
    let tier = 'process';
    let environment = 'remote:unreachable';
    let sessions;
    if (answer.kind === 'ok') {
      const d = answer.value;
      tier = parseTier(at(d, 'isolation'));
      environment = `remote:${text(at(at(d, 'javascriptEnvironment'), 'identity'), 'unknown')}`;
      sessions = sessionSupport(d);
    }
    return { name: NAME, tier, payloads: ['javascript'], environment, sessions };
  },

  // Startup evidence: a real snippet through the whole path, upstream and
  // back, so a daemon that cannot run code refuses to start.
  preflight() {
    const origin = upstream();
    if (origin === undefined) throw NO_ORIGIN;
    const checks = [`upstream origin ${origin}`];
    let out;
    try {
      out = runSnippet('console.log(6 * 7)', 5000, 1024, undefined);
    } catch (e) {
      throw `probe run failed: ${describeError(e)}`;
    }
    const passed = out.exitCode === 0 && sameBytes(out.stdout, '42\n');
    checks.push(`probe snippet exit ${out.exitCode} (${passed ? 'ok' : 'unexpected output'})`);
    return { passed, checks: checks.join('\n'), languages: ['javascript'] };
  },

  run(request) {
    if (request.payload.tag !== 'javascript') {
      throw notDispatched('unsupported', 'remote-js runs snippets only');
    }
    // The floor is the tier the upstream states now: an upstream that got
    // weaker since start refuses the run instead of running it.
    return {
      tag: 'javascript',
      val: runSnippet(request.payload.val, request.timeoutMs, request.outputLimit, floor()),
    };
  },

  // Each of our sessions is one session on the upstream, and its ID is the
  // state the host keeps and hands back with every call (each call gets a
  // fresh instance, so nothing survives here). The upstream keeps the
  // sandbox and serializes the calls.
  openSession(options) {
    const body = {
      protocol: PROTOCOL,
      lifetimeMs: options.lifetimeMs,
      // The WIT enum's names are the API's names.
      languages: options.languages,
    };
    // Held to the tier the upstream states now, as a run is.
    const minimum = floor();
    if (minimum !== undefined) body.minimumIsolation = minimum;
    const answer = call('OpenSession', body);
    switch (answer.kind) {
      case 'ok': {
        const id = at(answer.value, 'sessionId');
        // The state is kept by the host: nothing empty or oversized.
        if (typeof id === 'string' && id.length > 0 && encoder.encode(id).length <= 128) {
          return id;
        }
        throw mayHaveRun('the upstream opened no usable session');
      }
      default:
        throw runError(answer);
    }
  },

  sessionRun(state, request) {
    // A failed call says the session ended only when the upstream said so.
    const fail = (error, upstreamEnded) => ({
      error,
      ended: upstreamEnded ? ended('SESSION_END_MAIN_PROCESS_ENDED') : undefined,
    });
    const body = { protocol: PROTOCOL, sessionId: state, timeoutMs: request.timeoutMs };
    const payload = request.payload;
    if (payload.tag === 'javascript') {
      body.javascript = { code: payload.val };
    } else if (payload.tag === 'cell') {
      const c = payload.val;
      body.cell = {
        language: c.language,
        code: c.code,
        files: c.files.map((f) => ({ path: f.path, content: f.content })),
      };
    } else {
      throw fail(notDispatched('unsupported', 'remote-js runs snippets and cells only'), false);
    }
    const answer = call('SessionRun', body);
    if (answer.kind !== 'ok') throw fail(runError(answer), answer.ended === true);
    const run = at(answer.value, 'run');
    let outcome;
    if (payload.tag === 'cell') {
      const c = at(run, 'cell');
      outcome = {
        tag: 'cell',
        val: {
          output: processOutput(c, request.outputLimit),
          interpreterStarted: at(c, 'interpreterStarted') === true,
          interpreterEnded: at(c, 'interpreterEnded') === true,
        },
      };
    } else {
      outcome = { tag: 'javascript', val: processOutput(at(run, 'javascript'), request.outputLimit) };
    }
    return { outcome, ended: ended(text(at(answer.value, 'ended'), '')) };
  },

  // Closing twice, or closing what the upstream already ended, is fine:
  // the host frees its side whatever happens here.
  closeSession(state) {
    call('CloseSession', { protocol: PROTOCOL, sessionId: state });
  },
};

// ---- The upstream ---------------------------------------------------------

const NO_ORIGIN = 'no origin is allowed: set SANDBOX_PLUGIN_HTTP_ORIGINS';

function upstream() {
  return allowedOrigins()[0];
}

/**
 * One Connect JSON call to the upstream. Never throws; answers one of
 * - `{ kind: 'ok', value }`: status 200 and its JSON (null if none);
 * - `{ kind: 'refused', reason, message, ended }`: the upstream marked its
 *   answer not-dispatched, so nothing ran there;
 * - `{ kind: 'failed', why, ended }`: anything else after the request may
 *   have left: the code may have run;
 * - `{ kind: 'not-sent', why }`: nothing left (no origin, or the host
 *   refused the request before sending it).
 * `ended` says whether an error answer carried the session-ended detail.
 */
function call(procedure, body) {
  const origin = upstream();
  if (origin === undefined) return { kind: 'not-sent', why: NO_ORIGIN };
  let response;
  try {
    response = send({
      method: 'POST',
      url: `${origin}/plimsoll.v1.SandboxService/${procedure}`,
      headers: [['content-type', 'application/json']],
      body: encoder.encode(JSON.stringify(body)),
    });
  } catch (e) {
    const err = e && e.payload;
    if (!err || typeof err.tag !== 'string') throw e; // A bug here, not an answer.
    // `forbidden` is the one error that proves the request never left.
    if (err.tag === 'forbidden') {
      return { kind: 'not-sent', why: `the host refused the request: ${err.val}` };
    }
    const why = err.tag === 'transport' ? err.val : 'the answer was too large';
    return { kind: 'failed', why: `transport: ${why}`, ended: false };
  }
  const parsed = parseJson(response.body);
  if (response.status === 200) return { kind: 'ok', value: parsed };
  const ended = saysEnded(parsed);
  const message = text(at(parsed, 'message'), '');
  const mark = response.headers.find(([k]) => k.toLowerCase() === 'plimsoll-not-dispatched');
  if (mark !== undefined) return { kind: 'refused', reason: mark[1], message, ended };
  return { kind: 'failed', why: `upstream status ${response.status}: ${message}`, ended };
}

/** The tier the upstream states now, as the API names it, if it answers. */
function floor() {
  const answer = call('Describe', {});
  if (answer.kind !== 'ok') return undefined;
  const isolation = at(answer.value, 'isolation');
  return typeof isolation === 'string' ? isolation : undefined;
}

/** Runs one snippet upstream; returns its process-output or throws a run-error. */
function runSnippet(code, timeoutMs, outputLimit, minimum) {
  const body = { protocol: PROTOCOL, timeoutMs, javascript: { code } };
  if (minimum !== undefined) body.minimumIsolation = minimum;
  const answer = call('Run', body);
  if (answer.kind === 'refused') {
    // The reason is the upstream's word for its refusal: metadata, safe to log.
    log('info', `upstream refused the run (${answer.reason})`);
  }
  if (answer.kind !== 'ok') throw runError(answer);
  return processOutput(at(answer.value, 'javascript'), outputLimit);
}

/** A snippet's (or a cell's) output as the upstream answered it. */
function processOutput(js, outputLimit) {
  // The host enforces the limit too; keeping to it here is the plugin's part.
  const bytes = (field) => base64(text(at(js, field), '')).subarray(0, outputLimit);
  const flag = (field) => at(js, field) === true;
  const code = at(js, 'exitCode');
  return {
    stdout: bytes('stdout'),
    stderr: bytes('stderr'),
    // proto3 JSON leaves a zero out; anything not an s32 reads as 0 too.
    exitCode: Number.isInteger(code) && code >= -(2 ** 31) && code < 2 ** 31 ? code : 0,
    timedOut: flag('timedOut'),
    stdoutTruncated: flag('stdoutTruncated'),
    stderrTruncated: flag('stderrTruncated'),
  };
}

// ---- Errors, mapped honestly ------------------------------------------------

/** A run-error for a call that did not answer ok. */
function runError(answer) {
  switch (answer.kind) {
    case 'not-sent':
      return notDispatched('environment', answer.why);
    case 'refused':
      return { tag: 'not-dispatched', val: refusal(answer.reason, answer.message) };
    default:
      return mayHaveRun(answer.why);
  }
}

/** The upstream's not-dispatched reason as this interface's refusal. */
function refusal(reason, message) {
  const tags = {
    request: 'request',
    permission: 'permission',
    unsupported: 'unsupported',
    protocol: 'unsupported',
    isolation: 'isolation',
    capacity: 'capacity',
  };
  const tag = Object.hasOwn(tags, reason) ? tags[reason] : 'environment';
  return { tag, val: `upstream: ${message}` };
}

function notDispatched(tag, why) {
  return { tag: 'not-dispatched', val: { tag, val: why } };
}

function mayHaveRun(why) {
  return { tag: 'may-have-run', val: why };
}

/** A run-error as one line, for preflight's refusal. */
function describeError(e) {
  if (e && e.tag === 'not-dispatched') return `not-dispatched(${e.val.tag}: ${e.val.val})`;
  if (e && e.tag === 'may-have-run') return `may-have-run(${e.val})`;
  return String(e);
}

// ---- Sessions' vocabulary -----------------------------------------------------

/** What the upstream's sessions run, from its Describe; none if it has none. */
function sessionSupport(d) {
  if (at(d, 'supportsSessions') !== true) return undefined;
  const named = at(at(d, 'sessionEnvironment'), 'languages');
  const cellLanguages = Array.isArray(named)
    ? named.filter((l) => l === 'javascript' || l === 'python')
    : [];
  return { payloads: ['javascript'], cellLanguages };
}

/** The session-ended record for the upstream's end reason (none if it goes on). */
function ended(reason) {
  if (reason === '' || reason === 'SESSION_END_UNSPECIFIED') return undefined;
  const reasons = {
    SESSION_END_EXPIRED: 'expired',
    SESSION_END_SANDBOX_CHANGED: 'sandbox-changed',
  };
  return {
    reason: Object.hasOwn(reasons, reason) ? reasons[reason] : 'main-process-ended',
    detail: 'the upstream session ended',
  };
}

/** Whether an upstream error answer carries the session-ended detail. */
function saysEnded(parsed) {
  const details = at(parsed, 'details');
  return (
    Array.isArray(details) &&
    details.some((d) => {
      const type = at(d, 'type');
      return typeof type === 'string' && type.endsWith('plimsoll.v1.SessionEnded');
    })
  );
}

// ---- Small readers ------------------------------------------------------------

function parseTier(s) {
  return s === 'vm' || s === 'kernel' || s === 'container' ? s : 'process';
}

/** `v[k]` when `v` is an object, else undefined: answers are untrusted JSON. */
function at(v, k) {
  return v !== null && typeof v === 'object' ? v[k] : undefined;
}

/** `v` if it is a string, else `fallback`. */
function text(v, fallback) {
  return typeof v === 'string' ? v : fallback;
}

/** The body's JSON, or null when it is not UTF-8 JSON. */
function parseJson(bytes) {
  try {
    return JSON.parse(decoder.decode(bytes));
  } catch {
    return null;
  }
}

/** Standard base64 to bytes; anything malformed reads as nothing. */
function base64(s) {
  try {
    return Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
  } catch {
    return new Uint8Array(0);
  }
}

function sameBytes(bytes, ascii) {
  return bytes.length === ascii.length && bytes.every((b, i) => b === ascii.charCodeAt(i));
}
