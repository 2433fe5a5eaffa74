//! What every procedure takes before its own work, as one extractor: who
//! is asking, and the request's body read under the caller's and the
//! daemon's body slots.
//!
//! The order is the API's promise and is kept here in one place: the
//! caller first (a token, or a peer replica's signature on a forwarded
//! call, its nonce recorded before anything else), then the headers, then
//! the slots, and only then a byte of the body; a forwarded call's
//! signature covers the body, so it is checked against it last.

use std::sync::Arc;

use axum::extract::{FromRequest, Request};
use axum::response::Response;
use bytes::Bytes;

use super::body::{CallerBody, check_headers, read_body};
use super::{Api, authenticate, body_slots, replica, serve, stream, unauthenticated};
use crate::callers::Caller;

/// A procedure's request, read.
pub struct Read {
    pub caller: Arc<Caller>,
    /// A peer replica forwarded it (so it is never forwarded again).
    pub forwarded: bool,
    pub body: Bytes,
    slots: Slots,
}

/// A body slot of the caller's and one of the daemon's, given back when
/// dropped: they bound how many bodies are read, parsed or relayed at once.
pub struct Slots {
    _caller: CallerBody,
    _daemon: tokio::sync::OwnedSemaphorePermit,
}

impl Read {
    /// The caller; the body and its slots go back. For a procedure that
    /// needs nothing of the bytes once they are parsed.
    pub fn release(self) -> Arc<Caller> {
        self.caller
    }

    /// The caller, the body and the slots, held by whoever relays the body.
    pub fn keep(self) -> (Arc<Caller>, Bytes, Slots) {
        (self.caller, self.body, self.slots)
    }
}

/// The procedure a request names: the last segment of its path, which the
/// router has already matched.
fn procedure(req: &Request) -> String {
    req.uri()
        .path()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string()
}

impl FromRequest<Api> for Read {
    type Rejection = Response;

    async fn from_request(req: Request, api: &Api) -> Result<Self, Response> {
        let name = procedure(&req);
        let forwarded = replica::forwarded(req.headers());
        // A session call another replica forwarded carries that replica's
        // signature instead of the caller's token; it is checked once the
        // body (which the signature covers) is read.
        let caller = match &forwarded {
            Some(f) => {
                let Some(c) = replica::caller(&api.daemon, &api.verifier, &name, f) else {
                    return Err(unauthenticated(api));
                };
                // Seen once across restarts too: the call's nonce is
                // recorded in the shared store before anything else is done
                // for it, a replay refused as any failed forward is.
                match replica::first_sight(&api.daemon, f).await {
                    replica::Sight::First => {}
                    replica::Sight::Replayed => return Err(unauthenticated(api)),
                    replica::Sight::Refused(r) => return Err(*r),
                }
                // A peer's signed call: its connection is trusted as an
                // authenticated one is.
                if let Some(conn) = req.extensions().get::<Arc<serve::Connection>>() {
                    conn.trust(&c.id);
                }
                c
            }
            None => authenticate(api, &req).map_err(|r| *r)?,
        };
        let content_type = if name == "RunStream" {
            stream::CONTENT_TYPE
        } else {
            "application/json"
        };
        check_headers(req.headers(), content_type).map_err(|r| *r)?;
        let (caller_body, daemon_body) = body_slots(api, &caller).map_err(|r| *r)?;
        let body = read_body(req.into_body()).await.map_err(|r| *r)?;
        if let Some(f) = &forwarded
            && !replica::body_matches(f, &body)
        {
            return Err(unauthenticated(api));
        }
        Ok(Read {
            caller,
            forwarded: forwarded.is_some(),
            body,
            slots: Slots {
                _caller: caller_body,
                _daemon: daemon_body,
            },
        })
    }
}
