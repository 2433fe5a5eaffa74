//! The MCP server at `/mcp`: streamable HTTP on plimsolld's own listener,
//! so it has the API's TLS, connection limits and hardening. In front of
//! the MCP SDK's service sits `guard`, which holds every request to the
//! API's rules before the SDK sees a byte of its body: the same bearer
//! tokens and `code:run` scope, the same body slots, size cap and read
//! timeout. Runs go through the pipeline (admission, floor, limits,
//! record, audit) exactly as Connect's `Run` does.
//!
//! The guard also weighs a message before the SDK parses it (`message`):
//! the SDK's parse costs far more per value than the body's bytes, so
//! what a real message could not be (too nested, too many values, not
//! JSON) is refused first, and the body slot is held until the SDK has
//! parsed what was let through (`HeldBody`). The SDK's own refusals, which
//! can quote what was sent, are answered with fixed text.
//!
//! Stateless: no MCP session is kept between requests, so no MCP session
//! ID exists to log or leak, and any replica can answer any request (a
//! session tool's call for a session another replica holds is forwarded
//! there: `relay`).
//! Requests that carry a browser `Origin` are refused (a page must not
//! drive a daemon it can reach); with no tokens configured (open mode)
//! the `Host` must be a loopback name as well. Both are the API's one
//! rule (`api::browser`), not the SDK's.

mod handler;
mod message;
pub mod relay;
mod results;
mod tools;

pub(crate) use handler::session_tool;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::sync::OwnedSemaphorePermit;

use super::body::{CallerBody, check_encoding_and_length, media_type, read_body};
use super::{Api, MAX_REQUEST_BYTES, authenticate, body_slots, browser, refusal_response};
use crate::refusal::Refusal;
use handler::McpServer;

/// The SDK's service for `/mcp`, one handler per request.
pub fn service(api: &Api) -> StreamableHttpService<McpServer, NeverSessionManager> {
    let server = McpServer {
        daemon: api.daemon.clone(),
    };
    // The SDK's own Host and Origin checks are off: `guard` applies the
    // API's rule (`api::browser`) to every request first, the same rule
    // the Connect procedures keep, and marks its refusals. Two rules
    // would answer one question two ways (the SDK's host list is not the
    // API's), and the SDK's refusals are unmarked and logged with what
    // was sent.
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_sse_keep_alive(None)
        .with_sse_retry(None)
        .with_max_request_body_bytes(MAX_REQUEST_BYTES)
        .disable_allowed_hosts()
        .disable_allowed_origins();
    StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}

/// The API's rules, applied before the MCP SDK reads anything.
pub async fn guard(State(api): State<Api>, req: Request, next: Next) -> Response {
    // The caller first; in open mode this is also where a request must
    // name this machine and carry no Origin.
    let caller = match authenticate(&api, &req) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    // With tokens too: MCP's transport rules ask every server to refuse
    // what a web page sends.
    if let Err(r) = browser::refuse_origin(req.headers()) {
        return *r;
    }
    if let Err(r) = check_encoding_and_length(req.headers()) {
        return *r;
    }
    // Only a POST carries a message; the SDK answers any other method
    // without reading a body.
    let carries_message = req.method() == Method::POST;
    if carries_message && media_type(req.headers()).as_deref() != Some("application/json") {
        return refusal_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &Refusal::request("an MCP message is JSON: Content-Type must be application/json"),
        );
    }
    let (mut parts, body) = req.into_parts();
    // The body is read here, under the API's slots and limits: a slow or
    // endless upload is the API's to refuse.
    let slots = match body_slots(&api, &caller) {
        Ok(slots) => slots,
        Err(r) => return *r,
    };
    let body = match read_body(body).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    if carries_message && let Err(unfit) = message::weigh(&body) {
        return message::refused(unfit);
    }
    parts.extensions.insert(caller);
    // For a session tool's call forwarded to another replica, which holds
    // slots again while it waits (`relay`).
    parts.extensions.insert(relay::RelaySlots {
        caller_bodies: api.caller_bodies.clone(),
        body_slots: api.body_slots.clone(),
    });
    let body = Body::new(HeldBody {
        bytes: (!body.is_empty()).then_some(body),
        _slots: slots,
    });
    message::without_echo(next.run(Request::from_parts(parts, body)).await)
}

/// A body read under the API's slots, handed to the SDK with those slots:
/// they are released when the SDK drops the body. rmcp 3.11 owns the body
/// in `expect_json` until its parse of the message has returned, so the
/// parse runs under the slot as a Connect body's parse does; the run a
/// message starts holds no body slot, as a Connect run holds none. (Were
/// a later SDK to drop the body sooner, `message::weigh` still bounds what
/// its parse can cost; were it to keep the body longer, the slot would be
/// held longer, never less.)
struct HeldBody {
    bytes: Option<Bytes>,
    _slots: (CallerBody, OwnedSemaphorePermit),
}

impl http_body::Body for HeldBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().bytes.take().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.bytes.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.bytes.as_ref().map_or(0, |b| b.len() as u64))
    }
}
