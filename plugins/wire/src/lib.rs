//! The cloud adapters' kit: what every adapter of a hosted sandbox service
//! (e2b, dockercloud, openshell) and the remote-plimsoll example share, so
//! a new cloud adapter is its service's API and nothing else.
//!
//! - `bindings`: the `granted-cloud-adapter` world (`cloud-adapter` and `grant`), generated once, here; an
//!   adapter implements `Startup`, `CloudAdapter` and `Sessions` (none
//!   unless it says so), each beside its code (`adapter`), and exports it
//!   with `plimsoll_plugin_wire::bindings::export!`.
//! - `sandbox` and `project`: the `Sandbox` trait (files in, a command run,
//!   a file back) and the one project runner over it; `capture` keeps a
//!   process's output as the API reports it.
//! - `config`: the keys an adapter reads (the operator's values, through
//!   `wasi:config/store`), declared and checked while it describes itself.
//! - `smoke`: the startup smoke test's probe step, the script lines and
//!   the checks every adapter's probe shares.
//! - `grant`: a granted run's way to its broker through the daemon's
//!   guard, written into the sandbox.
//! - `session`: what sessions on a kept sandbox share: their state, the
//!   sandbox's standing at a call, the sweep after each call and the answer
//!   it shapes.
//! - this module: HTTP over standard `wasi:http`, with the run's deadline
//!   on every wait (its request built once, for an adapter's own client
//!   too), and the call's deadlines.
//!
//! The host polices each request (the allowlist, reserved headers, the
//! operator's key added, byte and time budgets); this side builds requests,
//! waits for answers no later than the deadline it is given, and reads
//! bodies either whole (bounded) or a chunk at a time (the process stream).

pub mod adapter;
pub mod capture;
pub mod config;
pub mod grant;
pub mod project;
pub mod sandbox;
pub mod session;
pub mod smoke;

/// The `granted-cloud-adapter` world's bindings, generated once for every cloud
/// adapter. Its `export!` is public, so an adapter's own crate (the
/// component) exports its `CloudAdapter` with
/// `plimsoll_plugin_wire::bindings::export!(MyAdapter);`: the exports, and
/// the world's description they carry, are then emitted in that crate.
pub mod bindings {
    wit_bindgen::generate!({
        world: "granted-cloud-adapter",
        path: "../../wit/provider",
        generate_all,
        pub_export_macro: true,
        default_bindings_module: "plimsoll_plugin_wire::bindings",
    });
}

pub use adapter::{CloudAdapter, Sessions, Startup};
pub use sandbox::Sandbox;

use std::sync::atomic::{AtomicU64, Ordering};
use wasi::clocks::monotonic_clock::{self, Instant};
use wasi::http::outgoing_handler;
use wasi::http::types::{
    ErrorCode, Fields, IncomingBody, IncomingResponse, Method, OutgoingBody, OutgoingRequest,
    Scheme,
};

use wasi::io::poll;
use wasi::io::streams::{InputStream, OutputStream, StreamError};

use bindings::plimsoll::provider::types::{Refusal, RunError};

/// Most the host lets a plugin write per `write` call.
const WRITE_CHUNK: usize = 4096;
/// Most read from a body per wake-up.
const READ_CHUNK: u64 = 64 << 10;
/// How long cleanup (a kill, a delete, a lookup) may take past the call's
/// own deadline: inside the two seconds the host gives a call past its
/// run's budget, with room for the host's own work.
pub const CLEANUP_MS: u64 = 1500;
/// A session close's own deadline: with `CLEANUP_MS` after it, inside the
/// 8 s the host gives a close, so a slow delete is still waited for.
pub const CLOSE_MS: u64 = 4500;

// Every call gets a fresh instance of the plugin, so these are per call.
/// The call's deadline (monotonic nanoseconds; 0 before it is set).
static CALL_DEADLINE: AtomicU64 = AtomicU64::new(0);
/// Answer bytes received by the call, on the wire, over every request: the
/// host cuts a call at 64 MiB in, so the plugin stops well short of it.
static RECEIVED: AtomicU64 = AtomicU64::new(0);

/// Sets the deadline the call's cleanup is measured from.
pub fn set_call_deadline(deadline: Instant) {
    CALL_DEADLINE.store(deadline, Ordering::Relaxed);
}

/// Begins a call that must end `ms` from now: its deadline, set as the one
/// the call's cleanup is measured from.
pub fn begin_call(ms: u64) -> Instant {
    let deadline = after_ms(ms);
    set_call_deadline(deadline);
    deadline
}

/// The one deadline every cleanup step of the call shares: the call's
/// deadline plus `CLEANUP_MS` (or `CLEANUP_MS` from now in a call without
/// one, such as closing a session).
pub fn cleanup_deadline() -> Instant {
    match CALL_DEADLINE.load(Ordering::Relaxed) {
        0 => after_ms(CLEANUP_MS),
        d => d.saturating_add(CLEANUP_MS * 1_000_000),
    }
}

/// Answer bytes the call has received so far.
pub fn received() -> u64 {
    RECEIVED.load(Ordering::Relaxed)
}

#[derive(Debug)]
pub enum Failure {
    /// The host refused the request before it left: nothing was sent.
    Refused(String),
    /// It may have reached the service.
    Transport(String),
    /// The deadline passed while waiting.
    Deadline,
    /// An answer's body was larger than the caller accepts.
    TooLarge,
}

pub struct Request<'a> {
    pub method: Method,
    /// `scheme://authority/path?query`.
    pub url: &'a str,
    pub headers: Vec<(&'a str, Vec<u8>)>,
    pub body: &'a [u8],
}

pub struct Response {
    pub status: u16,
    /// Every header as the service sent it.
    pub headers: Vec<(String, Vec<u8>)>,
    // Fields drop in order: the stream before the body it belongs to, the
    // body before the response.
    stream: Option<InputStream>,
    _body: Option<IncomingBody>,
    _response: IncomingResponse,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// `Retry-After`, in seconds (the date form is not read).
    pub fn retry_after(&self) -> Option<u64> {
        self.header("retry-after")
            .and_then(|s| s.trim().parse().ok())
    }

    /// The next bytes of the body, `None` at its end. Waits no later than
    /// `deadline`.
    pub fn next_chunk(&mut self, deadline: Instant) -> Result<Option<Vec<u8>>, Failure> {
        let Some(stream) = &self.stream else {
            return Ok(None);
        };
        loop {
            match stream.read(READ_CHUNK) {
                Ok(bytes) if bytes.is_empty() => wait(&stream.subscribe(), deadline)?,
                Ok(bytes) => {
                    RECEIVED.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    return Ok(Some(bytes));
                }
                Err(StreamError::Closed) => return Ok(None),
                Err(StreamError::LastOperationFailed(_)) => {
                    return Err(Failure::Transport("the answer's body failed".into()));
                }
            }
        }
    }

    /// The answer's trailers, once its body was read to the end (gRPC
    /// puts its status there). Waits no later than `deadline`.
    pub fn trailers(&mut self, deadline: Instant) -> Result<Vec<(String, Vec<u8>)>, Failure> {
        // The stream must go before its body can be finished.
        drop(self.stream.take());
        let Some(body) = self._body.take() else {
            return Ok(Vec::new());
        };
        let future = IncomingBody::finish(body);
        loop {
            match future.get() {
                Some(Ok(Ok(Some(fields)))) => return Ok(fields.entries()),
                Some(Ok(Ok(None))) => return Ok(Vec::new()),
                Some(Ok(Err(e))) => return Err(failure(e)),
                Some(Err(())) => return Err(Failure::Transport("no trailers".into())),
                None => wait(&future.subscribe(), deadline)?,
            }
        }
    }

    /// The rest of the body, at most `max` bytes.
    pub fn read_all(&mut self, max: usize, deadline: Instant) -> Result<Vec<u8>, Failure> {
        let mut body = Vec::new();
        while let Some(chunk) = self.next_chunk(deadline)? {
            if body.len() + chunk.len() > max {
                return Err(Failure::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// Sends `method` to `base` (an origin, or an origin and a path prefix)
/// followed by `path`, the way every adapter addresses its service, and
/// waits for the answer's head, no later than `deadline`.
pub fn send_to(
    base: &str,
    method: Method,
    path: &str,
    headers: Vec<(&str, Vec<u8>)>,
    body: &[u8],
    deadline: Instant,
) -> Result<Response, Failure> {
    let url = format!("{base}{path}");
    send(
        Request {
            method,
            url: &url,
            headers,
            body,
        },
        deadline,
    )
}

/// How a client names its request in the refusals `outgoing` words (the
/// host's refusals of a request it would not take: nothing was sent).
pub struct Naming {
    /// The refusal of a URL with no `scheme://`.
    pub no_scheme: &'static str,
    /// What comes before a refused header's name.
    pub header: &'static str,
    /// Whose parts are invalid, as in "the request's".
    pub parts: &'static str,
}

impl Naming {
    /// The refusal of a part of the request (`method`, `body`...).
    pub fn invalid(&self, what: &str) -> Failure {
        Failure::Refused(format!("{} {what} is invalid", self.parts))
    }
}

/// How this module's client names its requests.
const REQUEST: Naming = Naming {
    no_scheme: "a URL without a scheme",
    header: "header ",
    parts: "the request's",
};

/// The request `method` to `url` (`scheme://authority/path?query`) with
/// `headers`, built as the host takes it, before any body; a part the host
/// would not take is refused in the words of `naming`. For `send`, and for
/// an adapter with a `wasi:http` client of its own (remote-plimsoll's).
pub fn outgoing(
    method: &Method,
    url: &str,
    headers: &[(&str, Vec<u8>)],
    naming: &Naming,
) -> Result<OutgoingRequest, Failure> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| Failure::Refused(naming.no_scheme.into()))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let fields = Fields::new();
    for (name, value) in headers {
        fields
            .append(name, value)
            .map_err(|e| Failure::Refused(format!("{}{name}: {e:?}", naming.header)))?;
    }
    let request = OutgoingRequest::new(fields);
    request
        .set_method(method)
        .map_err(|()| naming.invalid("method"))?;
    let scheme = match scheme {
        "https" => Scheme::Https,
        "http" => Scheme::Http,
        _ => return Err(naming.invalid("scheme")),
    };
    request
        .set_scheme(Some(&scheme))
        .map_err(|()| naming.invalid("scheme"))?;
    request
        .set_authority(Some(authority))
        .map_err(|()| naming.invalid("authority"))?;
    request
        .set_path_with_query(Some(path))
        .map_err(|()| naming.invalid("path"))?;
    Ok(request)
}

/// Sends `req` and waits for the answer's head, no later than `deadline`.
pub fn send(req: Request<'_>, deadline: Instant) -> Result<Response, Failure> {
    // Nothing is sent once the deadline passed: it could only be dropped.
    if monotonic_clock::now() >= deadline {
        return Err(Failure::Deadline);
    }
    let request = outgoing(&req.method, req.url, &req.headers, &REQUEST)?;
    let body = request.body().map_err(|()| REQUEST.invalid("body"))?;
    let future = outgoing_handler::handle(request, None).map_err(failure)?;
    let wrote = {
        let stream = body.write().map_err(|()| REQUEST.invalid("body"))?;
        write_all(&stream, req.body, deadline)
    };
    match wrote {
        Ok(()) => OutgoingBody::finish(body, None).map_err(failure)?,
        Err(Failure::Deadline) => return Err(Failure::Deadline),
        // The service may have answered before taking the whole body (an
        // early error, say): its answer, or the request's own failure,
        // says what happened.
        Err(_) => drop(body),
    }

    let response = loop {
        match future.get() {
            Some(Ok(Ok(r))) => break r,
            Some(Ok(Err(e))) => return Err(failure(e)),
            Some(Err(())) => return Err(Failure::Transport("no answer".into())),
            None => wait(&future.subscribe(), deadline)?,
        }
    };
    let status = response.status();
    let headers = response.headers().entries();
    let body = response.consume().ok();
    let stream = body.as_ref().and_then(|b| b.stream().ok());
    Ok(Response {
        status,
        headers,
        stream,
        _body: body,
        _response: response,
    })
}

/// Writes `bytes` and flushes them, waiting no later than `deadline` for
/// the host to take each part (a service that stops reading must not hold
/// the call past its deadline).
fn write_all(stream: &OutputStream, bytes: &[u8], deadline: Instant) -> Result<(), Failure> {
    // A bodiless request: nothing to write or flush (and a service may
    // answer it before a flush would return).
    if bytes.is_empty() {
        return Ok(());
    }
    let broken = |_| Failure::Transport("the request body could not be sent".into());
    let mut rest = bytes;
    while !rest.is_empty() {
        let room = stream.check_write().map_err(broken)?;
        if room == 0 {
            wait(&stream.subscribe(), deadline)?;
            continue;
        }
        let n = rest.len().min(room as usize).min(WRITE_CHUNK);
        stream.write(&rest[..n]).map_err(broken)?;
        rest = &rest[n..];
    }
    stream.flush().map_err(broken)?;
    // Flushed once the stream can take more again.
    while stream.check_write().map_err(broken)? == 0 {
        wait(&stream.subscribe(), deadline)?;
    }
    Ok(())
}

/// Waits for `ready` or the deadline, whichever comes first.
fn wait(ready: &poll::Pollable, deadline: Instant) -> Result<(), Failure> {
    if monotonic_clock::now() >= deadline {
        return Err(Failure::Deadline);
    }
    let timer = monotonic_clock::subscribe_instant(deadline);
    let woke = poll::poll(&[ready, &timer]);
    if woke.contains(&0) {
        Ok(())
    } else {
        Err(Failure::Deadline)
    }
}

/// A `wasi:http` error as a `Failure`: a refusal by the host is the one
/// error that proves nothing left. Public for an adapter with a `wasi:http`
/// client of its own (remote-plimsoll's).
pub fn failure(e: ErrorCode) -> Failure {
    match e {
        ErrorCode::HttpRequestDenied => Failure::Refused("the host denied the request".into()),
        ErrorCode::ConnectionLimitReached => {
            Failure::Refused("the host's in-flight limit was reached".into())
        }
        other => Failure::Transport(
            format!("{other:?}")
                .split(['(', ' ', '{'])
                .next()
                .unwrap_or("transport")
                .to_string(),
        ),
    }
}

/// No process was started: from the adapter's side nothing ran. (The host
/// still withholds the mark once a request went out: it cannot know what
/// the service did with it.)
pub fn not_started(why: &str) -> RunError {
    RunError::NotDispatched(Refusal::Environment(why.to_string()))
}

/// A request made before any process started (a create, a mint, an
/// upload, named by `what`) that failed: nothing ran, as `not_started`.
pub fn lost(e: Failure, what: &str) -> RunError {
    not_started(&match e {
        Failure::Refused(why) => why,
        Failure::Deadline => format!("the {what} answered too late"),
        Failure::TooLarge => format!("the {what} answer was too large"),
        Failure::Transport(why) => format!("the {what} failed: {why}"),
    })
}

/// Milliseconds from now until `deadline` (0 once it passed).
pub fn remaining_ms(deadline: Instant) -> u64 {
    deadline.saturating_sub(monotonic_clock::now()) / 1_000_000
}

/// The instant `ms` milliseconds from now.
pub fn after_ms(ms: u64) -> Instant {
    monotonic_clock::now().saturating_add(ms.saturating_mul(1_000_000))
}

/// `ms` in whole seconds, rounded up: what a service is asked to keep a
/// sandbox for.
pub fn seconds(ms: u32) -> u64 {
    u64::from(ms).div_ceil(1000)
}

/// Percent-encodes everything but unreserved characters, for a query value
/// or a path segment.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The wall clock's Unix second (for labels other instances read).
pub fn wall_seconds() -> u64 {
    wasi::clocks::wall_clock::now().seconds
}

/// Blocks the call for `ms` milliseconds.
pub fn sleep_ms(ms: u64) {
    monotonic_clock::subscribe_duration(ms.saturating_mul(1_000_000)).block();
}
