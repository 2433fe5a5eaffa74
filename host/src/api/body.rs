//! A request body, from headers to bytes: content type, encoding and
//! declared length are checked before a byte is read; at most
//! `MAX_REQUEST_BYTES` are read, within `BODY_READ_TIMEOUT`; and no caller
//! may hold more than its share of the slots bodies are read in.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;

use super::connect::refusal_response;
use crate::refusal::{Code, Reason, Refusal};

/// Largest request body, raw. A project at its 4 MiB file budget fits unless
/// its text is mostly characters JSON must escape.
pub const MAX_REQUEST_BYTES: usize = 8 << 20;
/// A client that cannot deliver its body in this long is holding a slot.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

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

/// Content type, encoding and declared length, all before any body byte is
/// read. Boxed: a response is large and this is the error path.
pub(super) fn check_headers(h: &HeaderMap, content_type: &str) -> Result<(), Box<Response>> {
    let refuse =
        |status, why: &str| Err(Box::new(refusal_response(status, &Refusal::request(why))));
    if media_type(h).as_deref() != Some(content_type) {
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &format!(
                "this daemon speaks the Connect protocol with the JSON codec: Content-Type must be {content_type}"
            ),
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
    check_encoding_and_length(h)
}

/// The body's media type: the `Content-Type` before any parameter, trimmed
/// and lowercased (for Connect's bodies and MCP's).
pub(super) fn media_type(h: &HeaderMap) -> Option<String> {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
}

/// Encoding and declared length, before any body byte is read (for every
/// body the daemon reads: Connect's and MCP's).
pub(super) fn check_encoding_and_length(h: &HeaderMap) -> Result<(), Box<Response>> {
    let refuse =
        |status, why: &str| Err(Box::new(refusal_response(status, &Refusal::request(why))));
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

pub(super) async fn read_body(body: Body) -> Result<Bytes, Box<Response>> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
