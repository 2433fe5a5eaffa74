//! The session procedures' HTTP side: parsing (with Run's protocol gate),
//! where each is answered (here, or through the replica that holds the
//! session), and the answers (errors in `session_error.rs`).

use std::sync::Arc;

use axum::response::Response;

use super::connect::{json_ok, parse};
use super::session_error::error_response;
use crate::callers::Caller;
use crate::pipeline::Daemon;
use crate::pipeline::session::SessionError;
use crate::refusal::Refusal;
use crate::wire::{CloseSessionRequest, OpenSessionRequest, Request, SessionRunRequest};

/// A parsed session request, ready for the pipeline.
pub enum Parsed {
    Open(OpenSessionRequest),
    Run(SessionRunRequest),
    Close(CloseSessionRequest),
}

/// Parses a session procedure's body, with Run's protocol gate.
pub fn parse_session(procedure: &str, body: &[u8]) -> Result<Parsed, Refusal> {
    match procedure {
        "OpenSession" => parse(Request::OpenSession, "OpenSessionRequest", body).map(Parsed::Open),
        "SessionRun" => parse(Request::SessionRun, "SessionRunRequest", body).map(Parsed::Run),
        _ => parse(Request::CloseSession, "CloseSessionRequest", body).map(Parsed::Close),
    }
}

/// Answers a session procedure here, or, for a session (or an owner's
/// sessions) another replica holds, through that replica (`relay` is the
/// body to forward, when this replica forwards at all).
pub async fn call(
    daemon: &Arc<Daemon>,
    req: Parsed,
    caller: Arc<Caller>,
    relay: Option<bytes::Bytes>,
) -> Response {
    match req {
        Parsed::Open(r) => {
            match super::replica::owner_home(daemon, &r.owner, &caller, relay).await {
                Ok(place) => answer(daemon.open_session(r, caller, place).await),
                Err(resp) => resp,
            }
        }
        Parsed::Run(r) => {
            match super::replica::elsewhere(daemon, "SessionRun", &r.session_id, &caller, relay)
                .await
            {
                Some(resp) => resp,
                None => answer(daemon.session_run(r, caller).await),
            }
        }
        Parsed::Close(r) => {
            match super::replica::elsewhere(daemon, "CloseSession", &r.session_id, &caller, relay)
                .await
            {
                Some(resp) => resp,
                None => answer(daemon.close_session(r, caller).await),
            }
        }
    }
}

fn answer<T: serde::Serialize>(r: Result<T, SessionError>) -> Response {
    match r {
        Ok(v) => json_ok(&v),
        Err(e) => error_response(e),
    }
}
