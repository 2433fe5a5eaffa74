//! A session error as its Connect answer, with the two details only
//! sessions carry: the session's end (`plimsoll.v1.SessionEnded`) and the
//! record of a call that may have run without an answer
//! (`plimsoll.v1.UnansweredCall`). A leaf: the session procedures and the
//! replica relay both answer with it.

use axum::http::StatusCode;
use axum::response::Response;

use super::connect::{ConnectDetail, connect_error_with, detail};
use crate::job::Ended;
use crate::pipeline::session::SessionError;
use crate::refusal::Code;
use crate::wire;

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
