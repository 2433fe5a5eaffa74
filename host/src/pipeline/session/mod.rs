//! The session procedures: OpenSession, SessionRun and CloseSession, with
//! the same gates as Run (protocol, authentication, validation, the wall)
//! and what sessions add: the registry's caps, the turn that serializes a
//! session's calls, the chain of records, and the evidence a session opened
//! under, which every later call must still meet.

mod call;
mod close;
mod open;

use std::sync::Arc;

use crate::callers::Caller;
use crate::job::Ended;
use crate::pipeline::Daemon;
use crate::refusal::{Code, Reason, Refusal};
use crate::sessions::Entry;
use crate::wire::{RunRecord, SessionEnd};

/// A session procedure that produced no answer.
#[derive(Debug)]
pub enum SessionError {
    /// Nothing ran. `ended` is the session's end when the refusal is
    /// because of it (the client's `SessionEnded` detail).
    Refused {
        refusal: Refusal,
        ended: Option<Ended>,
    },
    /// The call may have run and has no answer: its unanswered record took
    /// its place in the chain, and the error carries it.
    Unanswered {
        id: String,
        record: Box<RunRecord>,
        ended: Option<Ended>,
    },
    /// Something failed after a sandbox may have been started, outside any
    /// call (an open). Unmarked.
    Internal { id: String },
}

impl SessionError {
    /// An internal error: `detail` is logged under a fresh ID, and only the
    /// ID reaches the caller.
    pub(crate) fn internal(detail: &str) -> Self {
        SessionError::Internal {
            id: crate::pipeline::internal_id(detail),
        }
    }
}

impl From<Refusal> for SessionError {
    fn from(refusal: Refusal) -> Self {
        SessionError::Refused {
            refusal,
            ended: None,
        }
    }
}

impl Daemon {
    /// The caller's session named by `id` (ended or not), or `not_found`.
    fn callers_session(&self, id: &str, caller: &Caller) -> Result<Arc<Entry>, SessionError> {
        self.sessions.get(id, &caller.id).ok_or_else(not_found)
    }
}

/// The answer to an ID that names no session of this caller: unknown,
/// another caller's, or closed and collected. One answer for all three, so
/// a session's existence never leaks.
pub fn not_found() -> SessionError {
    SessionError::Refused {
        refusal: Refusal::new(
            Code::NotFound,
            Reason::Request,
            "no such session for this caller",
        ),
        ended: Some(Ended {
            reason: SessionEnd::NotFound,
            detail: "no such session for this caller".into(),
        }),
    }
}

/// The refusal of a call on a session that has ended.
pub fn ended_refusal(ended: Ended, reason: Reason) -> SessionError {
    SessionError::Refused {
        refusal: Refusal::new(
            Code::FailedPrecondition,
            reason,
            format!("the session has ended ({})", ended.reason.label()),
        ),
        ended: Some(ended),
    }
}
