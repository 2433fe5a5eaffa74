//! The HTTP surface: `plimsoll.v1.SandboxService` over the Connect protocol
//! (unary, JSON codec) on HTTP/1.1 and prior-knowledge h2c, plus `/healthz`
//! and `/readyz`.
//!
//! Every answer carries the caller's `Plimsoll-Request-Id` back, so a client
//! can tell its own answer from anyone else's. Every refusal that ran nothing
//! carries the `Plimsoll-Not-Dispatched` header and, where a Connect body is
//! possible, the `plimsoll.v1.NotDispatched` detail; an answer without the
//! mark may follow execution.
//!
//! With no callers configured (open mode) a request is taken only under a
//! loopback `Host` and without an `Origin`, so a web page cannot drive the
//! daemon by rebinding its name to this machine (`browser`).

use std::sync::Arc;
use std::time::Duration;

use crate::callers::{Caller, Verifier};

use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, any_service, get, post};
use tokio::sync::Semaphore;

use crate::pipeline::{Daemon, RunError};
use crate::refusal::{Code, Reason, Refusal};
use crate::wire::{self, DescribeRequest};

mod body;
mod browser;
mod call;
mod conn_io;
mod connect;
pub mod connections;
mod delivery;
pub mod guard;
mod mcp;
#[cfg(test)]
mod mutation_tests;
mod replica;
pub mod serve;
mod session;
mod session_error;
pub mod settings;
mod stream;
mod watch;

use body::CallerBodies;
pub use body::MAX_REQUEST_BYTES;
use call::Read;
use connect::{connect_error, json_ok, refusal_from};
pub use connect::{parse_run, refusal_response};

pub const REQUEST_ID_HEADER: &str = "plimsoll-request-id";
pub const NOT_DISPATCHED_HEADER: &str = "plimsoll-not-dispatched";
const SERVICE_PREFIX: &str = "plimsoll.v1.SandboxService";

/// What the HTTP layer shares between requests.
#[derive(Clone)]
pub struct Api {
    daemon: Arc<Daemon>,
    verifier: Arc<Verifier>,
    refused: Arc<RefusedCredentials>,
    /// Bodies being read and parsed at once. Reading happens before
    /// admission, so without this bound many slow or large uploads could
    /// hold memory no concurrency limit ever sees.
    body_slots: Arc<Semaphore>,
    /// Body slots per caller: one caller with slow uploads must not hold
    /// every slot and lock the others out.
    caller_bodies: Arc<CallerBodies>,
}

/// Refused credentials, counted and logged at most every 30 s: a flood of
/// bad tokens must not become a flood of log lines, and no line ever holds
/// what was presented.
#[derive(Default)]
pub struct RefusedCredentials {
    count: std::sync::atomic::AtomicU64,
    last_log: std::sync::Mutex<Option<std::time::Instant>>,
}

impl RefusedCredentials {
    fn note(&self) {
        use std::sync::atomic::Ordering;
        self.count.fetch_add(1, Ordering::Relaxed);
        let Ok(mut last) = self.last_log.lock() else {
            return;
        };
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
            *last = Some(std::time::Instant::now());
            let n = self.count.swap(0, Ordering::Relaxed);
            tracing::warn!(
                refused = n,
                "requests with a missing or unknown token were refused"
            );
        }
    }
}

pub fn router(daemon: Arc<Daemon>, body_slots: usize, verifier: Arc<Verifier>) -> Router {
    let open = verifier.is_open();
    let api = Api {
        daemon,
        verifier,
        refused: Arc::new(RefusedCredentials::default()),
        body_slots: Arc::new(Semaphore::new(body_slots.max(1))),
        // Half the slots at most for any one caller (all of them in open
        // mode, where there is only one caller).
        caller_bodies: CallerBodies::new(if open { body_slots } else { body_slots / 2 }),
    };
    let mcp = any_service(mcp::service(&api))
        .layer(middleware::from_fn_with_state(api.clone(), mcp::guard));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/mcp", mcp)
        .route("/readyz", get(readyz))
        .route(&procedure("Describe"), post(describe).fallback(post_only))
        .route(&procedure("Run"), post(run).fallback(post_only))
        .route(
            &procedure("RunStream"),
            post(run_stream).fallback(post_only),
        )
        .route(&procedure("OpenSession"), session("OpenSession"))
        .route(&procedure("SessionRun"), session("SessionRun"))
        .route(&procedure("CloseSession"), session("CloseSession"))
        .route(&procedure("{procedure}"), any(internal))
        .fallback(not_found)
        .layer(middleware::from_fn(bind_answer))
        .with_state(api)
}

/// Copies a well-formed request ID onto the answer, whatever the answer is.
/// Only the form official clients send (32 lowercase hex) is echoed, so the
/// header can never reflect arbitrary caller bytes.
async fn bind_answer(req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get(REQUEST_ID_HEADER)
        .filter(|v| {
            v.len() == 32
                && v.as_bytes()
                    .iter()
                    .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
        .cloned();
    let mut resp = next.run(req).await;
    if let Some(id) = id {
        resp.headers_mut().insert(REQUEST_ID_HEADER, id);
    }
    resp
}

/// 200 while runs can be dispatched; 503 with a reason code otherwise
/// (`engine_unreachable`, `runtime_changed`, `image_changed`). Checked
/// afresh, so an orchestrator sees recovery as soon as it happens.
async fn readyz(State(api): State<Api>) -> Response {
    match api.daemon.check_ready().await {
        Ok(()) => (StatusCode::OK, "ok").into_response(),
        // Anyone may ask, so the answer is a fixed word; what failed (engine
        // errors, the image's name) goes to the log, where the provider
        // already reported the change.
        Err(why) => {
            tracing::debug!(code = why.code, detail = %why.detail, "readiness refused");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {}\n", why.code),
            )
                .into_response()
        }
    }
}

async fn not_found() -> Response {
    refusal_response(
        StatusCode::NOT_FOUND,
        &Refusal::unsupported("no such procedure or path"),
    )
}

/// The path of procedure `name`.
fn procedure(name: &str) -> String {
    format!("/{SERVICE_PREFIX}/{name}")
}

/// A procedure asked with a method other than POST.
async fn post_only() -> Response {
    let mut r = refusal_response(
        StatusCode::METHOD_NOT_ALLOWED,
        &Refusal::request("Connect calls use POST"),
    );
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    r
}

async fn describe(State(api): State<Api>, read: Read) -> Response {
    let parsed = wire::shape_of_describe(&read.body)
        .and_then(|()| serde_json::from_slice::<DescribeRequest>(&read.body));
    if let Err(e) = parsed {
        return refusal_response(
            StatusCode::BAD_REQUEST,
            &Refusal::request(connect::malformed("DescribeRequest", &e)),
        );
    }
    json_ok(&api.daemon.describe())
}

async fn run(State(api): State<Api>, read: Read) -> Response {
    let req = match parse_run(&read.body) {
        Ok(r) => r,
        Err(r) => return refusal_from(&r),
    };
    // Parsed: the body and its slots go back before the run.
    let caller = read.release();
    match api.daemon.run(req, caller).await {
        Ok(resp) => json_ok(&resp),
        Err(e) => e.into_response(),
    }
}

async fn run_stream(State(api): State<Api>, read: Read) -> Response {
    let req = match stream::unframe(&read.body).and_then(parse_run) {
        Ok(r) => r,
        Err(r) => return refusal_from(&r),
    };
    let caller = read.release();
    stream::run_stream(&api.daemon, req, caller).await
}

/// OpenSession, SessionRun and CloseSession: one handler, told which.
fn session(name: &'static str) -> axum::routing::MethodRouter<Api> {
    post(move |State(api): State<Api>, read: Read| async move {
        let req = match session::parse_session(name, &read.body) {
            Ok(r) => r,
            Err(refusal) => return refusal_from(&refusal),
        };
        // Kept to be relayed if the session is held elsewhere, with the
        // caller's body slots held until the relay ends (they bound how
        // many forwards a caller has in flight); a call that was forwarded
        // here is never forwarded again.
        let relays = !read.forwarded && api.daemon.replicas().is_some();
        let (caller, body, slots) = read.keep();
        let answer = session::call(&api.daemon, req, caller, relays.then_some(body)).await;
        drop(slots);
        answer
    })
    .fallback(post_only)
}

/// MCP's session tools travel between replicas under procedures of their
/// own, which exist only for a forwarded call: any other name, or one of
/// these not forwarded, is no procedure at all.
async fn internal(
    State(api): State<Api>,
    name: Result<Path<String>, PathRejection>,
    req: Request,
) -> Response {
    // A path segment that is not valid UTF-8 names no procedure.
    let Ok(Path(name)) = name else {
        return not_found().await;
    };
    let Some(tool) = mcp::relay::tool_of(&name) else {
        return not_found().await;
    };
    if replica::forwarded(req.headers()).is_none() {
        return not_found().await;
    }
    if req.method() != Method::POST {
        return post_only().await;
    }
    let read = match Read::from_request(req, &api).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let (caller, body, slots) = read.keep();
    let result = mcp::session_tool(&api.daemon, tool, &body, caller).await;
    drop(slots);
    json_ok(&result)
}

/// Who is asking, before anything else about the request is read: a known
/// bearer token (401 otherwise, counted, never logged) with the `code:run`
/// scope (403). In open mode no token says who is asking, and what stands
/// in for it is that the request names this machine and no web page sent
/// it (403, marked `permission`). Boxed: a response is large and this is
/// the error path.
fn authenticate(api: &Api, req: &Request) -> Result<Arc<Caller>, Box<Response>> {
    // Before the connection is trusted below: a page's request earns its
    // connection nothing.
    if api.verifier.is_open() {
        browser::from_this_machine(req.headers(), req.uri())?;
    }
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    let Ok(caller) = api.verifier.verify(authorization) else {
        return Err(Box::new(unauthenticated(api)));
    };
    // The connection carried an authenticated request: it is no longer
    // among the first closed to make room.
    if let Some(conn) = req.extensions().get::<Arc<serve::Connection>>() {
        conn.trust(&caller.id);
        // Answers a caller leaves unread hold the daemon's memory: past its
        // budget it gets no new work until it reads them (`delivery`).
        if conn.unread_answers() > delivery::UNREAD_ANSWERS_PER_CALLER {
            return Err(Box::new(refusal_response(
                StatusCode::TOO_MANY_REQUESTS,
                &Refusal::capacity(
                    "this caller has left too many bytes of answers unread; read them first",
                ),
            )));
        }
    }
    if !caller.may_run() {
        return Err(Box::new(refusal_response(
            StatusCode::FORBIDDEN,
            &Refusal::permission("this caller's token does not carry the code:run scope"),
        )));
    }
    Ok(caller)
}

/// 401, counted (never logged with what was presented), and marked
/// `permission`: it is answered before the body is read, so nothing of the
/// request can have run, and a client may say so.
fn unauthenticated(api: &Api) -> Response {
    api.refused.note();
    let mut r = connect_error(
        Code::Unauthenticated,
        "a valid bearer token is required",
        Some(Reason::Permission),
    );
    *r.status_mut() = StatusCode::UNAUTHORIZED;
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// A slot to read a body in, now, for this caller and for the daemon; no
/// queue. Nothing is read without both.
fn body_slots(
    api: &Api,
    caller: &Caller,
) -> Result<(body::CallerBody, tokio::sync::OwnedSemaphorePermit), Box<Response>> {
    take_body_slots(&api.caller_bodies, &api.body_slots, &caller.id)
        .map_err(|r| Box::new(refusal_response(StatusCode::TOO_MANY_REQUESTS, &r)))
}

/// One of the caller's body slots and one of the daemon's, or the
/// capacity refusal saying which is full: for reading a body, and for a
/// forwarded MCP call waiting on its answer (`mcp::relay`).
fn take_body_slots(
    caller_bodies: &Arc<CallerBodies>,
    body_slots: &Arc<Semaphore>,
    caller: &str,
) -> Result<(body::CallerBody, tokio::sync::OwnedSemaphorePermit), Refusal> {
    let Some(caller_body) = caller_bodies.try_take(caller) else {
        return Err(Refusal::capacity(
            "this caller is sending as many request bodies as it may at once",
        ));
    };
    let Ok(body_slot) = body_slots.clone().try_acquire_owned() else {
        return Err(Refusal::capacity(
            "the daemon is reading as many request bodies as it allows",
        ));
    };
    Ok((caller_body, body_slot))
}

/// A run that produced no result, as the API answers it: a refusal keeps
/// its mark; anything that may have run is an unmarked internal error
/// whose ID joins it to the log line.
impl IntoResponse for RunError {
    fn into_response(self) -> Response {
        match self {
            RunError::Refused(r) => refusal_from(&r),
            RunError::Internal { id, .. } => {
                connect_error(Code::Internal, &format!("internal error {id}"), None)
            }
        }
    }
}
