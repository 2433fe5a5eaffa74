//! The bundle: an append-only JSON Lines file of signed runs that anyone
//! holding the signer's public key can check later, line by line.
//!
//! Each run is one line holding the request as sent, the answer as
//! received, and one signed in-toto statement whose subject is the run
//! record (by its own digest) and whose predicate places it: the record,
//! its line number, and the digest of the line before it. So a line
//! removed, moved or added breaks the chain where it was, and a line
//! changed breaks it at the next line, whose statement names the old
//! bytes. Each run is followed by a checkpoint, signed over the digest of
//! the run line with the number of runs so far; the last line is always
//! one: a bundle cut short has lost its checkpoint, and only the key's
//! holder can write a new one. Appends never rewrite a line, so a crash
//! part way through one leaves the checkpoint before it whole.
//!
//! Lines are in one canonical form (compact JSON, object keys sorted, as
//! `serde_json::Value` writes them), so a line's digest is over exactly
//! the bytes in the file and a verifier can refuse any other encoding.
//!
//! `append` writes a bundle (one run at a time, reading only its end);
//! `verify` reads one whole.

mod append;
mod append_session;
mod file;
mod tail;
mod verify;
mod verify_session;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::AttestError;
use super::dsse::Envelope;

pub use append::{Appender, Checked, Durability, append_run};
pub use tail::{Repaired, repair};
pub use verify::{Held, HeldCall, verified_entries, verify, verify_bytes};

/// A run statement's subject: the run record, by its own digest.
const RECORD_SUBJECT: &str = "run-record";
/// A checkpoint's subject: the line it closes the bundle after.
const LINE_SUBJECT: &str = "bundle-line";
/// A session's open and close statements' subject: the session, by its
/// fingerprint (the SHA-256 of its ID, which a bundle never holds).
const SESSION_SUBJECT: &str = "session";
const KIND_RUN: &str = "run";
const KIND_SESSION_OPEN: &str = "session-open";
const KIND_SESSION_CALL: &str = "session-call";
/// A session call that may have run but has no answer: the error that
/// carries its record, in the answer's place.
const KIND_SESSION_UNANSWERED: &str = "session-unanswered";
const KIND_SESSION_CLOSE: &str = "session-close";
const KIND_CHECKPOINT: &str = "checkpoint";
/// The key under which each line carries its signed statement.
const SIGNED: &str = "signed";

/// What a run's statement says besides the record's digest.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RunPredicate {
    /// The record as the daemon answered it.
    record: Value,
    line: u64,
    /// SHA-256 of the previous line's bytes; empty for the first line.
    previous_line_sha256: String,
}

/// What a session's open statement says besides its fingerprint: the
/// answer as kept (without the session ID), and the line's place.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct OpenPredicate {
    opened: Value,
    line: u64,
    previous_line_sha256: String,
}

/// What a session's close statement says besides its fingerprint: the
/// close answer (the calls the daemon counted, the last record's digest).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClosePredicate {
    closed: Value,
    line: u64,
    previous_line_sha256: String,
}

/// What a checkpoint's statement says besides the last run line's digest.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CheckpointPredicate {
    line: u64,
    /// How many entries (runs, session opens, calls and closes) the
    /// bundle holds before the checkpoint.
    entries: u64,
    /// Sessions opened and not yet closed at this point. Left out at zero,
    /// as it is in every bundle without sessions; after a signer that was
    /// stopped between a session's open and close it is not zero, and the
    /// next signer refuses to extend a bundle that can no longer verify.
    #[serde(default, skip_serializing_if = "is_zero")]
    open_sessions: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Whether others may read the bundle file.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// Owner only (0600): anything else is refused.
    Private,
    /// The caller asked for a bundle others can read.
    Shared,
}

/// What a verifier was told to expect of the runs in a bundle (runs and
/// session calls alike: each is code that ran).
pub enum Expect {
    Nothing,
    /// Exactly this many runs and session calls.
    Count(usize),
    /// These request digests, each as many times as listed.
    Requests(Vec<String>),
}

/// What a bundle that verified holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verified {
    pub runs: usize,
    /// Sessions, each opened, chained call by call, and closed.
    pub sessions: usize,
    pub session_calls: usize,
    /// Of the session calls, those that may have run but had no answer.
    pub unanswered: usize,
    /// Runs and calls whose answer carries the daemon's receipt (each
    /// checked, if the daemon's key was given).
    pub receipts: usize,
    /// Request digests of the runs and session calls, in order.
    pub requests: Vec<String>,
}

fn object(fields: &[(&str, Value)]) -> Map<String, Value> {
    fields
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.clone()))
        .collect()
}

fn to_value<T: Serialize>(v: &T) -> Value {
    // Our own envelope types serialize to JSON objects without fail.
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// The one encoding lines are written and checked in.
fn canonical(v: &Value) -> Vec<u8> {
    // A Value's maps are sorted by key (serde_json without its
    // preserve_order feature, which a test below holds us to).
    serde_json::to_vec(v).unwrap_or_default()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn io_error(what: &str, source: std::io::Error) -> AttestError {
    AttestError::Io {
        what: what.to_string(),
        source,
    }
}

/// A line's failure, said with its place.
fn prefixed(e: AttestError, number: u64) -> AttestError {
    let at = |m: String| format!("line {number}: {m}");
    match e {
        AttestError::Key(m) => AttestError::Key(at(m)),
        AttestError::Signature(m) => AttestError::Signature(at(m)),
        AttestError::Format(m) => AttestError::Format(at(m)),
        AttestError::Record(m) => AttestError::Record(at(m)),
        AttestError::Incomplete(m) => AttestError::Incomplete(at(m)),
        io @ AttestError::Io { .. } => io,
    }
}

/// A signed place against the line's real one.
fn placed(
    signed_line: u64,
    signed_previous: &str,
    number: u64,
    previous: &str,
) -> Result<(), AttestError> {
    if signed_line != number {
        return Err(AttestError::Format(format!(
            "signed as line {signed_line}: lines were removed, moved or added"
        )));
    }
    if signed_previous != previous {
        return Err(AttestError::Format(
            "the line before it is not the one it was signed after (it was changed, removed or added)".into(),
        ));
    }
    Ok(())
}

/// The line's signed statement.
fn signed(fields: &Map<String, Value>) -> Result<Envelope, AttestError> {
    fields
        .get(SIGNED)
        .cloned()
        .ok_or_else(|| AttestError::Format("no signed statement".into()))
        .and_then(|v| {
            serde_json::from_value(v)
                .map_err(|e| AttestError::Format(format!("the signed statement: {e}")))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_lines_have_their_keys_sorted() {
        let v: Value = serde_json::from_str(r#"{"b":1,"a":{"d":2,"c":3}}"#).expect("json");
        assert_eq!(canonical(&v), br#"{"a":{"c":3,"d":2},"b":1}"#);
    }
}

#[cfg(test)]
mod session_tests;
