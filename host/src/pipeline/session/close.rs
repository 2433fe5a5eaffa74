//! CloseSession: ends the caller's session, or collects one that ended by
//! itself, and states the chain's length and last record.
//!
//! The close waits for a call in progress (its own deadline bounds the
//! wait), so the count it states covers every call that may have run,
//! answered or not: a client that compares it with its own count learns
//! whether anyone else used the session.

use std::sync::Arc;

use super::SessionError;
use crate::callers::Caller;
use crate::pipeline::{Daemon, own_task};
use crate::wire::{CloseSessionRequest, CloseSessionResponse, I64, SessionEnd};

impl Daemon {
    pub async fn close_session(
        self: &Arc<Self>,
        req: CloseSessionRequest,
        caller: Arc<Caller>,
    ) -> Result<CloseSessionResponse, SessionError> {
        let entry = self.callers_session(&req.session_id, &caller)?;
        let daemon = self.clone();
        // In a task of its own: a caller that leaves mid-close does not leave
        // the sandbox half closed.
        let task = own_task("session close", async move {
            let mut turn = entry.turn().await;
            entry.mark_ended(SessionEnd::Closed, "closed by its caller");
            turn.finish(&entry, &daemon.metrics).await;
            // Collected: a session that had ended by itself kept its holder
            // record for this close; nothing needs it any more. Deleted
            // before the answer, so the caller never sees the close done
            // and the record still there.
            turn.delete_holder().await;
            daemon.sessions.remove(&entry.fingerprint);
            let end = entry.ended().map_or(SessionEnd::Closed, |e| e.reason);
            let mut closed = CloseSessionResponse {
                session: entry.fingerprint.clone(),
                calls: I64(i64::try_from(turn.chain.calls).unwrap_or(i64::MAX)),
                last_record_sha256: turn.chain.last.clone(),
                ended: end,
                receipt: None,
            };
            // The daemon vouches for the count too: without this, whoever
            // keeps a session's records could drop its last calls and
            // write a close that counts only the rest.
            if let Some(receipts) = &daemon.receipts {
                closed.receipt = receipts.sign_close(&closed);
            }
            closed
        });
        task.await.map_err(|failed| SessionError::internal(&failed))
    }
}
