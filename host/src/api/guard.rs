//! The guard as the listener serves it: the grants' guard service, with
//! the connection rule every listener of the daemon keeps. A connection
//! that carried a live token is a run's, and is not among the first closed
//! to make room; a stranger's is.

use std::sync::Arc;

use axum::extract::{Request, State};
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
        .layer(axum::middleware::from_fn_with_state(guard, trust_live_tokens))
}

async fn trust_live_tokens(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let live = req
        .headers()
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| guard.admits(t));
    if live && let Some(conn) = req.extensions().get::<Arc<Connection>>() {
        conn.trust(TRUSTED_AS);
    }
    next.run(req).await
}
