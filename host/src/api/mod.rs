//! The HTTP surface: `plimsoll.v1.SandboxService` over the Connect protocol
//! (unary, JSON codec) on HTTP/1.1 and prior-knowledge h2c, plus `/healthz`
//! and `/readyz`.
//!
//! Every answer carries the caller's `Plimsoll-Request-Id` back, so a client
//! can tell its own answer from anyone else's. Every refusal that ran nothing
//! carries the `Plimsoll-Not-Dispatched` header and, where a Connect body is
//! possible, the `plimsoll.v1.NotDispatched` detail; an answer without the
//! mark may follow execution.

use std::sync::Arc;
use std::time::Duration;

use crate::callers::{Caller, Verifier};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use base64::Engine as _;
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::pipeline::{Daemon, RunError};
use crate::refusal::{Code, Reason, Refusal};
use crate::wire::{self, DescribeRequest, PROTOCOL, RunRequest};

pub mod serve;
pub mod settings;

pub const REQUEST_ID_HEADER: &str = "plimsoll-request-id";
pub const NOT_DISPATCHED_HEADER: &str = "plimsoll-not-dispatched";
const SERVICE_PREFIX: &str = "plimsoll.v1.SandboxService";

/// Largest request body, raw. A project at its 4 MiB file budget fits unless
/// its text is mostly characters JSON must escape.
pub const MAX_REQUEST_BYTES: usize = 8 << 20;
/// A client that cannot deliver its body in this long is holding a slot.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

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

/// Counts the bodies each caller is sending; at most `cap` at once.
pub struct CallerBodies {
    cap: usize,
    held: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

/// One caller's body slot; released when dropped.
pub struct CallerBody {
    bodies: Arc<CallerBodies>,
    caller: String,
}

impl CallerBodies {
    pub fn new(cap: usize) -> Arc<CallerBodies> {
        Arc::new(CallerBodies {
            cap: cap.max(1),
            held: std::sync::Mutex::new(std::collections::HashMap::new()),
        })
    }

    pub fn try_take(self: &Arc<Self>, caller: &str) -> Option<CallerBody> {
        let mut held = self.held.lock().ok()?;
        let n = held.entry(caller.to_string()).or_insert(0);
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(CallerBody {
            bodies: self.clone(),
            caller: caller.to_string(),
        })
    }
}

impl Drop for CallerBody {
    fn drop(&mut self) {
        if let Ok(mut held) = self.bodies.held.lock()
            && let Some(n) = held.get_mut(&self.caller)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.caller);
            }
        }
    }
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
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route(&format!("/{SERVICE_PREFIX}/{{procedure}}"), any(procedure))
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

/// 200 while runs can be dispatched; 503 with the reason otherwise (the
/// docker engine unreachable, or its image re-pointed). Checked afresh on
/// every call, so an orchestrator sees recovery as soon as it happens.
async fn readyz(State(api): State<Api>) -> Response {
    match api.daemon.check_ready().await {
        Ok(()) => (StatusCode::OK, "ok").into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", crate::text::sanitize(&why, 300)),
        )
            .into_response(),
    }
}

async fn not_found() -> Response {
    refusal_response(
        StatusCode::NOT_FOUND,
        &Refusal::unsupported("no such procedure or path"),
    )
}

async fn procedure(
    State(api): State<Api>,
    name: Result<Path<String>, PathRejection>,
    req: Request,
) -> Response {
    // A path segment that is not valid UTF-8 names no procedure.
    let Ok(Path(name)) = name else {
        return not_found().await;
    };
    let known = matches!(
        name.as_str(),
        "Run" | "Describe" | "OpenSession" | "SessionRun" | "CloseSession"
    );
    if !known {
        return not_found().await;
    }
    if req.method() != Method::POST {
        let mut r = refusal_response(
            StatusCode::METHOD_NOT_ALLOWED,
            &Refusal::request("Connect unary calls use POST"),
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return r;
    }
    // Who is asking, before anything else about the request is read.
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    let caller = match api.verifier.verify(authorization) {
        Ok(c) => c,
        Err(_) => {
            api.refused.note();
            let mut r = connect_error(
                Code::Unauthenticated,
                "a valid bearer token is required",
                None,
            );
            *r.status_mut() = StatusCode::UNAUTHORIZED;
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    };
    if !caller.may_run() {
        return refusal_response(
            StatusCode::FORBIDDEN,
            &Refusal::permission("this caller's token does not carry the code:run scope"),
        );
    }
    if let Err(r) = check_headers(req.headers()) {
        return *r;
    }
    // Nothing is read until a body slot is free now, for this caller and
    // for the daemon; no queue.
    let Some(caller_body) = api.caller_bodies.try_take(&caller.id) else {
        return refusal_response(
            StatusCode::TOO_MANY_REQUESTS,
            &Refusal::capacity("this caller is sending as many request bodies as it may at once"),
        );
    };
    let Ok(body_slot) = api.body_slots.clone().try_acquire_owned() else {
        return refusal_response(
            StatusCode::TOO_MANY_REQUESTS,
            &Refusal::capacity("the daemon is reading as many request bodies as it allows"),
        );
    };
    let body = match read_body(req.into_body()).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    match name.as_str() {
        "Describe" => describe(&api.daemon, &body),
        "Run" => {
            let req = match parse_run(&body) {
                Ok(r) => r,
                Err(r) => return refusal_from(&r),
            };
            drop(body);
            drop(body_slot);
            drop(caller_body);
            run(&api.daemon, req, caller).await
        }
        // Sessions are not offered by any provider this daemon has.
        _ => refusal_response(
            StatusCode::NOT_IMPLEMENTED,
            &Refusal::unsupported("sessions are not supported by this daemon's provider"),
        ),
    }
}

/// Content type, encoding and declared length, all before any body byte is
/// read. Boxed: a response is large and this is the error path.
fn check_headers(h: &HeaderMap) -> Result<(), Box<Response>> {
    let refuse =
        |status, why: &str| Err(Box::new(refusal_response(status, &Refusal::request(why))));
    let ctype = h
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    if ctype.as_deref() != Some("application/json") {
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "this daemon speaks the Connect protocol with the JSON codec: Content-Type must be application/json",
        );
    }
    if let Some(v) = h.get("connect-protocol-version")
        && v.as_bytes() != b"1"
    {
        return refuse(
            StatusCode::BAD_REQUEST,
            "unsupported Connect-Protocol-Version (want 1)",
        );
    }
    if let Some(enc) = h.get(header::CONTENT_ENCODING)
        && !enc.as_bytes().eq_ignore_ascii_case(b"identity")
    {
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "compressed request bodies are not accepted",
        );
    }
    if let Some(len) = h.get(header::CONTENT_LENGTH) {
        match len.to_str().ok().and_then(|s| s.parse::<u64>().ok()) {
            Some(n) if n > MAX_REQUEST_BYTES as u64 => return Err(Box::new(too_large())),
            Some(_) => {}
            None => return refuse(StatusCode::BAD_REQUEST, "malformed Content-Length"),
        }
    }
    Ok(())
}

fn too_large() -> Response {
    refusal_response(
        StatusCode::PAYLOAD_TOO_LARGE,
        &Refusal::new(
            Code::ResourceExhausted,
            Reason::Request,
            format!("request body exceeds {MAX_REQUEST_BYTES} bytes"),
        ),
    )
}

async fn read_body(body: Body) -> Result<Bytes, Box<Response>> {
    match tokio::time::timeout(
        BODY_READ_TIMEOUT,
        axum::body::to_bytes(body, MAX_REQUEST_BYTES),
    )
    .await
    {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => {
            let over_limit = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if over_limit {
                Err(Box::new(too_large()))
            } else {
                // The connection broke mid-body: nothing ran, and probably
                // nobody is left to read this.
                Err(Box::new(refusal_response(
                    StatusCode::BAD_REQUEST,
                    &Refusal::request("the request body could not be read"),
                )))
            }
        }
        Err(_) => Err(Box::new(refusal_response(
            StatusCode::REQUEST_TIMEOUT,
            &Refusal::request("the request body did not arrive in time"),
        ))),
    }
}

fn describe(daemon: &Daemon, body: &[u8]) -> Response {
    let parsed = wire::shape_of_describe(body)
        .and_then(|()| serde_json::from_slice::<DescribeRequest>(body));
    if let Err(e) = parsed {
        return refusal_response(
            StatusCode::BAD_REQUEST,
            &Refusal::request(format!("malformed DescribeRequest: {e}")),
        );
    }
    json_ok(&daemon.describe())
}

async fn run(daemon: &Arc<Daemon>, req: RunRequest, caller: Arc<Caller>) -> Response {
    match daemon.run(req, caller).await {
        Ok(resp) => json_ok(&resp),
        Err(RunError::Refused(r)) => refusal_from(&r),
        Err(RunError::Internal { id, .. }) => {
            connect_error(Code::Internal, &format!("internal error {id}"), None)
        }
    }
}

/// Parses a Run body. The protocol number is checked before anything in the
/// payload counts: a request from a client of another protocol is refused as
/// `protocol` even when its payload would not parse here.
pub fn parse_run(body: &[u8]) -> Result<RunRequest, Refusal> {
    let stated = wire::shape_of_run(body)
        .map_err(|e| Refusal::request(format!("malformed RunRequest: {e}")))?;
    match stated {
        Ok(0) => {
            return Err(Refusal::new(
                Code::InvalidArgument,
                Reason::Protocol,
                format!(
                    "the request states no protocol number; this daemon serves protocol {PROTOCOL}"
                ),
            ));
        }
        Ok(p) if p != PROTOCOL => {
            return Err(Refusal::new(
                Code::Unimplemented,
                Reason::Protocol,
                format!("this daemon serves protocol {PROTOCOL}, the request states {p}"),
            ));
        }
        Ok(_) => {}
        Err(why) => return Err(Refusal::new(Code::InvalidArgument, Reason::Protocol, why)),
    }
    serde_json::from_slice::<RunRequest>(body)
        .map_err(|e| Refusal::request(format!("malformed RunRequest: {e}")))
}

fn json_ok<T: Serialize>(v: &T) -> Response {
    match serde_json::to_vec(v) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(_) => connect_error(
            Code::Internal,
            "internal error: encoding the answer failed",
            None,
        ),
    }
}

fn refusal_from(r: &Refusal) -> Response {
    let status = StatusCode::from_u16(r.code.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    refusal_response(status, r)
}

/// A marked refusal: the header and the Connect detail both say nothing ran.
pub fn refusal_response(status: StatusCode, r: &Refusal) -> Response {
    let mut resp = connect_error(r.code, &r.message, Some(r.reason));
    *resp.status_mut() = status;
    resp
}

#[derive(Serialize)]
struct ConnectError<'a> {
    code: &'a str,
    message: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    details: Vec<ConnectDetail>,
}

#[derive(Serialize)]
struct ConnectDetail {
    #[serde(rename = "type")]
    type_: &'static str,
    value: String,
}

fn connect_error(code: Code, message: &str, reason: Option<Reason>) -> Response {
    let details = reason
        .map(|r| {
            vec![ConnectDetail {
                type_: "plimsoll.v1.NotDispatched",
                value: base64::engine::general_purpose::STANDARD_NO_PAD.encode(r.detail_bytes()),
            }]
        })
        .unwrap_or_default();
    let body = serde_json::to_vec(&ConnectError {
        code: code.as_str(),
        message,
        details,
    })
    .unwrap_or_else(|_| br#"{"code":"internal"}"#.to_vec());
    let status =
        StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    if let Some(r) = reason {
        resp.headers_mut()
            .insert(NOT_DISPATCHED_HEADER, HeaderValue::from_static(r.as_str()));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_is_checked_before_payload() {
        let r = parse_run(br#"{"protocol":3,"javascript":{"code":1,"junk":true}}"#)
            .expect_err("refused");
        assert_eq!(r.reason, Reason::Protocol);
        assert_eq!(r.code, Code::Unimplemented);
        let r = parse_run(br#"{"javascript":{"code":"1"}}"#).expect_err("refused");
        assert_eq!(
            (r.reason, r.code),
            (Reason::Protocol, Code::InvalidArgument)
        );
        let r = parse_run(br#"{"protocol":4,"javascript":{"code":"1","junk":true}}"#)
            .expect_err("refused");
        assert_eq!(r.reason, Reason::Request);
        assert!(parse_run(br#"{"protocol":4,"javascript":{"code":"1"}}"#).is_ok());
        let r = parse_run(b"[1,2]").expect_err("refused");
        assert_eq!(r.reason, Reason::Request);
        let r = parse_run(br#"[4,"","",0,null,{"code":"1"}]"#).expect_err("refused");
        assert_eq!(r.reason, Reason::Request);
    }

    #[test]
    fn one_caller_cannot_hold_every_body_slot() {
        let bodies = CallerBodies::new(2);
        let a1 = bodies.try_take("alice").expect("first");
        let _a2 = bodies.try_take("alice").expect("second");
        assert!(bodies.try_take("alice").is_none(), "alice is at her cap");
        assert!(bodies.try_take("bob").is_some(), "bob is not affected");
        drop(a1);
        assert!(bodies.try_take("alice").is_some(), "released on drop");
    }
}

#[cfg(test)]
mod mutation {
    //! Mangled requests through the parser and admission: whatever the
    //! bytes, the answer is a clean refusal or a request that validates, and
    //! nothing panics. A deterministic generator, so a failure reproduces.
    use super::*;
    use crate::admission::{Limits, validate};

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            // xorshift64*: enough spread for mutation, and reproducible.
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    const SEEDS: &[&str] = &[
        r#"{"protocol":4,"javascript":{"code":"console.log(1)","grantProfile":"p"}}"#,
        r#"{"protocol":"4","minimumIsolation":"kernel","traceId":"a:b","timeoutMs":"1500","softwareRule":{"mode":"approved","identities":["a:1","b:2"]},"javascript":{"code":"x"}}"#,
        r#"{"protocol":4,"project":{"files":[{"path":"a/b.txt","content":"hi"}],"steps":["cat a/b.txt"],"artifacts":["a/b.txt"]}}"#,
        r#"{"protocol":4,"module":{"model":"m1","rows":[{"values":[1,2.5,"NaN"]}],"endTime":1,"step":0.1}}"#,
        r#"{"protocol":4,"cell":{"language":"javascript","code":"1","files":[]}}"#,
    ];
    const TOKENS: &[&str] = &[
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "\"",
        "null",
        "true",
        "-0",
        "1e309",
        "4.0",
        "\"4\"",
        "\\u0000",
        "\\ud800",
        "\"javascript\"",
        "\"protocol\"",
        "\"files\"",
        "[[]]",
        "{}",
        "9223372036854775808",
        "\u{feff}",
    ];

    #[test]
    fn mangled_requests_never_panic() {
        let limits = Limits::new(8);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut accepted = 0usize;
        for round in 0..60_000 {
            let seed = SEEDS[round % SEEDS.len()].as_bytes();
            let mut body = seed.to_vec();
            for _ in 0..=rng.below(4) {
                let at = rng.below(body.len() + 1);
                match rng.below(4) {
                    0 if !body.is_empty() => {
                        let end = (at + 1 + rng.below(8)).min(body.len());
                        body.drain(at.min(end)..end);
                    }
                    1 => {
                        let t = TOKENS[rng.below(TOKENS.len())].as_bytes();
                        body.splice(at..at, t.iter().copied()).for_each(drop);
                    }
                    2 if at < body.len() => body[at] = rng.next() as u8,
                    _ => body.insert(at, rng.next() as u8),
                };
            }
            match parse_run(&body) {
                Ok(req) => {
                    // A request that parses either validates or is refused
                    // as a request; it never reaches anything else.
                    if let Err(r) = validate(&req, &limits) {
                        assert_eq!(
                            r.reason,
                            Reason::Request,
                            "{}",
                            String::from_utf8_lossy(&body)
                        );
                    } else {
                        accepted += 1;
                    }
                }
                Err(r) => assert!(
                    matches!(r.reason, Reason::Request | Reason::Protocol),
                    "{:?} for {}",
                    r.reason,
                    String::from_utf8_lossy(&body)
                ),
            }
        }
        // The generator is not so destructive that nothing gets through.
        assert!(
            accepted > 1_000,
            "only {accepted} mutated requests were valid"
        );
    }
}
