//! How a brokered call is answered to a client in a sandbox, over the
//! containers' socket and the hosted sandboxes' guard alike: the upstream's
//! status and body, or the broker's refusal as a status, a kind the client
//! maps to its error prefix, and a fixed text.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Response, StatusCode};

use super::broker::{CallError, Session};

/// The header that tells the guest client a broker answer from an upstream
/// one.
pub const BROKER_HEADER: &str = "plimsoll-broker";

/// Makes the call in a task of its own and answers it. Its own task: a
/// client that hangs up mid-call must not cancel a call that may already
/// have left, which would leave a call that reached the API out of the
/// trace.
pub async fn call_detached(
    session: Arc<Session>,
    method: String,
    target: String,
    body: Option<Vec<u8>>,
) -> Response<Body> {
    let call = tokio::spawn(async move { session.call(&method, &target, body).await });
    let answer = call
        .await
        .unwrap_or_else(|_| Err(CallError::Upstream("the broker failed".into())));
    match answer {
        Ok(r) => Response::builder()
            .status(StatusCode::from_u16(r.status).unwrap_or(StatusCode::BAD_GATEWAY))
            .header(BROKER_HEADER, "upstream")
            .body(Body::from(r.body))
            .unwrap_or_default(),
        Err(CallError::NotPermitted(why)) => {
            broker_answer(StatusCode::FORBIDDEN, "not-permitted", why)
        }
        Err(CallError::Budget(why)) => broker_answer(StatusCode::TOO_MANY_REQUESTS, "budget", why),
        Err(CallError::Shed) => broker_answer(
            StatusCode::SERVICE_UNAVAILABLE,
            "shed",
            "calls are being shed after the API asked to back off",
        ),
        Err(CallError::Upstream(why)) => {
            broker_answer(StatusCode::BAD_GATEWAY, "upstream-failed", &why)
        }
    }
}

/// A request's call: its method, and its raw target exactly as sent. The
/// broker refuses a target it would have to rewrite (a query, say), so it
/// is never repaired here.
pub fn call_of<B>(req: &axum::http::Request<B>) -> (String, String) {
    let target = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    (req.method().as_str().to_string(), target)
}

/// A refusal of the broker's own, never an upstream's.
pub fn broker_answer(status: StatusCode, kind: &'static str, text: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(BROKER_HEADER, kind)
        .body(Body::from(text.to_string()))
        .unwrap_or_default()
}
