//! The session procedures' HTTP side: parsing (with Run's protocol gate)
//! and answers, including the two details only sessions carry: the
//! session's end (`plimsoll.v1.SessionEnded`) and the record of a call that
//! may have run without an answer (`plimsoll.v1.UnansweredCall`).

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;

use super::connect::{ConnectDetail, connect_error_with, detail, json_ok, parse};
use crate::callers::Caller;
use crate::pipeline::Daemon;
use crate::pipeline::session::SessionError;
use crate::providers::Ended;
use crate::refusal::{Code, Refusal};
use crate::wire::{self, CloseSessionRequest, OpenSessionRequest, Request, SessionRunRequest};

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

fn ended_detail(e: &Ended) -> ConnectDetail {
    detail(
        "plimsoll.v1.SessionEnded",
        &wire::session_ended_detail(e.reason, &e.detail),
    )
}

pub fn error_response(e: SessionError) -> Response {
    match e {
        SessionError::Refused { refusal, ended } => {
            let mut resp = connect_error_with(
                refusal.code,
                &refusal.message,
                Some(refusal.reason),
                ended.iter().map(ended_detail).collect(),
            );
            if let Ok(status) = StatusCode::from_u16(refusal.code.http_status()) {
                *resp.status_mut() = status;
            }
            resp
        }
        SessionError::Unanswered { id, record, ended } => {
            let mut extra = vec![detail(
                "plimsoll.v1.UnansweredCall",
                &wire::unanswered_detail(&record),
            )];
            extra.extend(ended.iter().map(ended_detail));
            connect_error_with(
                Code::Internal,
                &format!(
                    "internal error {id}; the call may have run, and its record is in this error"
                ),
                None,
                extra,
            )
        }
        SessionError::Internal { id } => connect_error_with(
            Code::Internal,
            &format!("internal error {id}"),
            None,
            vec![],
        ),
    }
}
