//! The guard as the listener serves it: the grants' guard service, with
//! the connection rules of every listener of the daemon and two of its own.
//!
//! - One request per connection: each answer closes its HTTP/1 connection
//!   (the sandbox clients open one per call anyway), so no connection
//!   outlives the call it carried, and a token once live cannot keep
//!   connections open, trusted, after it dies.
//! - A connection carrying a request with a live token is trusted (not
//!   among the first closed to make room) for that request's time only; at
//!   most a run's 16 slots' worth of such requests hold their connections
//!   for long. An HTTP/2 connection, which could carry many requests, is
//!   never trusted.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Version, header};
use axum::middleware::Next;
use axum::response::Response;

use super::serve::Connection;
use crate::grants::guard::{Guard, TOKEN_HEADER};

/// The caller name a trusted guard connection is counted under.
const TRUSTED_AS: &str = "guard";

pub fn router(guard: Arc<Guard>) -> axum::Router {
    guard
        .clone()
        .router()
        .layer(axum::middleware::from_fn_with_state(
            guard,
            one_call_per_connection,
        ))
}

async fn one_call_per_connection(
    State(guard): State<Arc<Guard>>,
    req: Request,
    next: Next,
) -> Response {
    let http1 = matches!(req.version(), Version::HTTP_10 | Version::HTTP_11);
    let live = req
        .headers()
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| guard.admits(t));
    if http1
        && live
        && let Some(conn) = req.extensions().get::<Arc<Connection>>()
    {
        conn.trust(TRUSTED_AS);
    }
    let mut answer = next.run(req).await;
    if http1 {
        answer
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    answer
}
