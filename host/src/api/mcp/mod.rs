//! The MCP server at `/mcp`: streamable HTTP on plimsolld's own listener,
//! so it has the API's TLS, connection limits and hardening. In front of
//! the MCP SDK's service sits `guard`, which holds every request to the
//! API's rules before the SDK sees a byte of its body: the same bearer
//! tokens and `code:run` scope, the same body slots, size cap and read
//! timeout. Runs go through the pipeline (admission, floor, limits,
//! record, audit) exactly as Connect's `Run` does.
//!
//! Stateless: no MCP session is kept between requests, so no MCP session
//! ID exists to log or leak, and any replica can answer any request (a
//! session tool's call for a session another replica holds is forwarded
//! there: `relay`).
//! Requests that carry a browser `Origin` are refused (a page must not
//! drive a daemon it can reach); with no tokens configured (open mode,
//! loopback only) the `Host` must be a loopback name as well.

mod handler;
pub mod relay;
mod results;
mod tools;

pub(crate) use handler::session_tool;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use super::body::{check_encoding_and_length, read_body};
use super::{Api, MAX_REQUEST_BYTES, authenticate, body_slots};
use handler::McpServer;

/// The SDK's service for `/mcp`, one handler per request.
pub fn service(api: &Api) -> StreamableHttpService<McpServer, NeverSessionManager> {
    let server = McpServer {
        daemon: api.daemon.clone(),
    };
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_sse_keep_alive(None)
        .with_sse_retry(None)
        .with_max_request_body_bytes(MAX_REQUEST_BYTES)
        .enforce_origin_validation();
    if !api.verifier.is_open() {
        // A bearer token is the defence against a rebound name; the
        // daemon's own name is the operator's to choose.
        config = config.disable_allowed_hosts();
    }
    StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}

/// The API's rules, applied before the MCP SDK reads anything.
pub async fn guard(State(api): State<Api>, req: Request, next: Next) -> Response {
    let caller = match authenticate(&api, &req) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    if let Err(r) = check_encoding_and_length(req.headers()) {
        return *r;
    }
    let (mut parts, body) = req.into_parts();
    // The body is read here, under the API's slots and limits, and handed
    // on whole: a slow or endless upload is the API's to refuse.
    let slots = match body_slots(&api, &caller) {
        Ok(slots) => slots,
        Err(r) => return *r,
    };
    let body = match read_body(body).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    drop(slots);
    parts.extensions.insert(caller);
    // For a session tool's call forwarded to another replica, which holds
    // slots again while it waits (`relay`).
    parts.extensions.insert(relay::RelaySlots {
        caller_bodies: api.caller_bodies.clone(),
        body_slots: api.body_slots.clone(),
    });
    next.run(Request::from_parts(parts, Body::from(body))).await
}
