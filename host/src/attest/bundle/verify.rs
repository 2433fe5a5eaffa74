//! Verifying a bundle: every line's link, every run's signed record
//! checked against its request and answer, every session's chain (in
//! `verify_session`), the checkpoint at the end, and what the caller
//! expected of the runs.

use std::path::Path;

use serde_json::{Map, Value};

use super::append::Checked;
use super::verify_session::Sessions;
use super::{
    CheckpointPredicate, Expect, KIND_CHECKPOINT, KIND_RUN, KIND_SESSION_CALL, KIND_SESSION_CLOSE,
    KIND_SESSION_OPEN, KIND_SESSION_UNANSWERED, LINE_SUBJECT, RECORD_SUBJECT, RunPredicate, SIGNED,
    Verified, canonical, io_error, placed, prefixed, sha256_hex, signed,
};
use crate::attest::AttestError;
use crate::attest::keys::VerifyingKey;
use crate::attest::receipts;
use crate::attest::statement::{self, BUNDLE_CHECKPOINT, RUN_RECORD};
use crate::bounded_read::{Unread, read_regular};

/// Checks every line of the bundle at `path` with `key` (and every run's
/// receipt with `daemon`, if given), then what the caller expected of it.
pub fn verify(
    path: &Path,
    key: &VerifyingKey,
    daemon: Option<&VerifyingKey>,
    expect: &Expect,
) -> Result<Verified, AttestError> {
    let bytes = read_bundle(path)?;
    let verified = verify_bytes(&bytes, key, daemon)?;
    check_expected(&verified, expect)?;
    Ok(verified)
}

/// What a bundle that verified holds, to send again: a run, or a session
/// with its calls, each with the result digest it was answered with.
pub enum Held {
    Run(HeldCall),
    Session { open: Value, calls: Vec<HeldCall> },
}

pub struct HeldCall {
    /// The request as kept (a session call's without its session ID).
    pub request: Value,
    /// Empty for a session call that had no answer.
    pub result_sha256: String,
}

/// The runs and sessions of the bundle at `path`, in the order they
/// started, once every line of it has verified with `key`. The file is
/// read once: what is replayed is exactly what was verified.
pub fn verified_entries(path: &Path, key: &VerifyingKey) -> Result<Vec<Held>, AttestError> {
    let bytes = read_bundle(path)?;
    verify_bytes(&bytes, key, None)?;
    let mut held = Vec::new();
    let mut sessions = std::collections::HashMap::new();
    for raw in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let line: Value = serde_json::from_slice(raw)
            .map_err(|e| AttestError::Format(format!("a verified line is not JSON: {e}")))?;
        let digest = |at: &str| {
            line.pointer(at)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        match line.get("kind").and_then(Value::as_str) {
            Some(KIND_RUN) => held.push(Held::Run(HeldCall {
                request: line["request"].clone(),
                result_sha256: digest("/response/record/resultSha256"),
            })),
            Some(KIND_SESSION_OPEN) => {
                sessions.insert(digest("/response/session"), held.len());
                held.push(Held::Session {
                    open: line["request"].clone(),
                    calls: Vec::new(),
                });
            }
            Some(KIND_SESSION_CALL) => {
                let at = sessions.get(&digest("/response/run/record/session"));
                if let Some(Held::Session { calls, .. }) = at.and_then(|i| held.get_mut(*i)) {
                    calls.push(HeldCall {
                        request: line["request"].clone(),
                        result_sha256: digest("/response/run/record/resultSha256"),
                    });
                }
            }
            // No result to compare with, but sent again all the same: it
            // may have changed what the calls after it see.
            Some(KIND_SESSION_UNANSWERED) => {
                let fingerprint = super::verify_session::fingerprint_of_unanswered(&line);
                let at = sessions.get(&fingerprint);
                if let Some(Held::Session { calls, .. }) = at.and_then(|i| held.get_mut(*i)) {
                    calls.push(HeldCall {
                        request: line["request"].clone(),
                        result_sha256: String::new(),
                    });
                }
            }
            _ => {}
        }
    }
    Ok(held)
}

/// The largest bundle read: far past any batch of runs (a run line holds at
/// most an 8 MiB request and its answer), and short of exhausting memory.
const MAX_BUNDLE_BYTES: u64 = 4 << 30;

/// The bundle's bytes, from a regular file only (a FIFO or a device named
/// as a bundle is refused, not waited on or read forever), and no more
/// than `MAX_BUNDLE_BYTES`.
fn read_bundle(path: &Path) -> Result<Vec<u8>, AttestError> {
    let shown = path.display();
    match read_regular(path, MAX_BUNDLE_BYTES) {
        Ok((bytes, _)) => Ok(bytes),
        Err(Unread::Io(e)) => Err(io_error(&format!("reading {shown}"), e)),
        Err(Unread::NotAFile) => Err(AttestError::Format(format!(
            "{shown} is not a regular file"
        ))),
        Err(Unread::TooLarge) => Err(AttestError::Format(format!(
            "{shown} is larger than any bundle this reads ({} GiB)",
            MAX_BUNDLE_BYTES >> 30
        ))),
    }
}

/// The lines' checks, on the bundle's bytes. With `daemon`, every run must
/// carry a receipt by that key for its record: the bundle then shows the
/// daemon vouched for each run, not only that the signer was answered.
pub fn verify_bytes(
    bytes: &[u8],
    key: &VerifyingKey,
    daemon: Option<&VerifyingKey>,
) -> Result<Verified, AttestError> {
    if bytes.is_empty() {
        return Err(AttestError::Incomplete("the bundle is empty".into()));
    }
    let Some(body) = bytes.strip_suffix(b"\n") else {
        return Err(AttestError::Incomplete(
            "the bundle does not end with a whole line: it was cut short".into(),
        ));
    };
    let mut previous = String::new();
    let mut after_entry = false;
    let mut entries = 0;
    let mut verified = Verified::default();
    let mut sessions = Sessions::default();
    let lines: Vec<&[u8]> = body.split(|b| *b == b'\n').collect();
    for (i, raw) in lines.iter().enumerate() {
        let number = i as u64 + 1;
        let at = |what: String| format!("line {number}: {what}");
        let line: Value = serde_json::from_slice(raw)
            .map_err(|e| AttestError::Format(at(format!("not JSON: {e}"))))?;
        if canonical(&line) != *raw {
            return Err(AttestError::Format(at("not in canonical form".into())));
        }
        let Value::Object(fields) = line else {
            return Err(AttestError::Format(at("not a JSON object".into())));
        };
        if fields.get("line").and_then(Value::as_u64) != Some(number) {
            return Err(AttestError::Format(at(
                "its line number is not its place".into()
            )));
        }
        let last = i + 1 == lines.len();
        let kind = fields.get("kind").and_then(Value::as_str);
        if let Some(keys) = kind.and_then(line_keys)
            && !fields.keys().map(String::as_str).eq(keys.iter().copied())
        {
            return Err(AttestError::Format(at(format!(
                "a {} line holds exactly {keys:?}",
                kind.unwrap_or_default()
            ))));
        }
        match kind {
            Some(KIND_RUN) => {
                let request = check_run_line(&fields, key, number, &previous)
                    .map_err(|e| prefixed(e, number))?;
                let receipt = check_receipt(fields.get("response"), daemon, Receipted::Record)
                    .map_err(|e| prefixed(e, number))?;
                verified.receipts += usize::from(receipt);
                verified.runs += 1;
                verified.requests.push(request);
            }
            Some(KIND_SESSION_OPEN) => sessions
                .open_line(&fields, key, number, &previous)
                .map_err(|e| prefixed(e, number))?,
            Some(KIND_SESSION_CALL) => {
                let request = sessions
                    .call_line(&fields, key, number, &previous)
                    .map_err(|e| prefixed(e, number))?;
                let run = fields.get("response").and_then(|r| r.get("run"));
                let receipt = check_receipt(run, daemon, Receipted::Record)
                    .map_err(|e| prefixed(e, number))?;
                verified.receipts += usize::from(receipt);
                verified.session_calls += 1;
                verified.requests.push(request);
            }
            Some(KIND_SESSION_UNANSWERED) => {
                let request = sessions
                    .unanswered_line(&fields, key, number, &previous)
                    .map_err(|e| prefixed(e, number))?;
                // The daemon signs no receipt for a record it could not
                // answer with (docs/attest.md).
                verified.session_calls += 1;
                verified.unanswered += 1;
                verified.requests.push(request);
            }
            Some(KIND_SESSION_CLOSE) => {
                sessions
                    .close_line(&fields, key, number, &previous)
                    .map_err(|e| prefixed(e, number))?;
                let receipt = check_receipt(fields.get("response"), daemon, Receipted::Close)
                    .map_err(|e| prefixed(e, number))?;
                verified.receipts += usize::from(receipt);
            }
            // A checkpoint follows each append's entry; every one is
            // checked, though only the last closes the bundle.
            Some(KIND_CHECKPOINT) if after_entry => {
                check_checkpoint(&fields, key, number, &previous, entries, sessions.open())
                    .map_err(|e| prefixed(e, number))?;
            }
            Some(KIND_CHECKPOINT) => {
                return Err(AttestError::Format(at(
                    "a checkpoint that follows no entry".into(),
                )));
            }
            _ => return Err(AttestError::Format(at("an unknown kind of line".into()))),
        }
        previous = sha256_hex(raw);
        after_entry = kind != Some(KIND_CHECKPOINT);
        entries += usize::from(after_entry);
        if last && fields.get("kind").and_then(Value::as_str) != Some(KIND_CHECKPOINT) {
            return Err(AttestError::Incomplete(
                "the bundle has no checkpoint at its end: it was cut short or never closed".into(),
            ));
        }
    }
    sessions.finish()?;
    verified.sessions = sessions.closed;
    Ok(verified)
}

/// The keys a line of each kind holds, in the canonical (sorted) order:
/// nothing unsigned can ride along on a line.
fn line_keys(kind: &str) -> Option<&'static [&'static str]> {
    match kind {
        KIND_RUN | KIND_SESSION_OPEN | KIND_SESSION_CALL => {
            Some(&["kind", "line", "procedure", "request", "response", SIGNED])
        }
        KIND_SESSION_CLOSE => Some(&["kind", "line", "procedure", "response", SIGNED]),
        KIND_SESSION_UNANSWERED => Some(&["error", "kind", "line", "procedure", "request", SIGNED]),
        KIND_CHECKPOINT => Some(&["entries", "kind", "line", SIGNED]),
        _ => None,
    }
}

/// The runs a bundle holds against what the caller expected: a batch with
/// runs missing fails here even when every line it holds is good.
fn check_expected(v: &Verified, expect: &Expect) -> Result<(), AttestError> {
    match expect {
        Expect::Nothing => Ok(()),
        Expect::Count(n) if *n == v.runs + v.session_calls => Ok(()),
        Expect::Count(n) => Err(AttestError::Incomplete(format!(
            "expected {n} runs and session calls, the bundle holds {} runs and {} session calls",
            v.runs, v.session_calls
        ))),
        Expect::Requests(wanted) if wanted.is_empty() => Err(AttestError::Incomplete(
            "the list of expected runs is empty: it would accept any bundle".into(),
        )),
        Expect::Requests(wanted) => {
            // The batch exactly: each listed request as many times as
            // listed, and nothing else.
            let mut held = v.requests.clone();
            let mut missing = 0;
            for w in wanted {
                match held.iter().position(|h| h == w) {
                    Some(at) => {
                        held.swap_remove(at);
                    }
                    None => missing += 1,
                }
            }
            match (missing, held.len()) {
                (0, 0) => Ok(()),
                (0, extra) => Err(AttestError::Incomplete(format!(
                    "the bundle holds {extra} runs that are not among the {} expected",
                    wanted.len()
                ))),
                (missing, _) => Err(AttestError::Incomplete(format!(
                    "{missing} of the {} expected runs are not in the bundle",
                    wanted.len()
                ))),
            }
        }
    }
}

/// A run line: its statement is signed by `key`, places it here after the
/// line before it, and names the answer's record; and that record checks
/// against the request. Returns the request's digest.
fn check_run_line(
    fields: &Map<String, Value>,
    key: &VerifyingKey,
    number: u64,
    previous: &str,
) -> Result<String, AttestError> {
    if fields.get("procedure").and_then(Value::as_str) != Some("Run") {
        return Err(AttestError::Format(
            "a run line for another procedure".into(),
        ));
    }
    let request = fields
        .get("request")
        .ok_or_else(|| AttestError::Format("no request".into()))?;
    let response = fields
        .get("response")
        .ok_or_else(|| AttestError::Format("no answer".into()))?;
    let (subject, stated): (String, RunPredicate) =
        statement::open(&signed(fields)?, key, RECORD_SUBJECT, RUN_RECORD)?;
    placed(stated.line, &stated.previous_line_sha256, number, previous)?;
    // The signer's own check, repeated rather than trusted.
    let run = Checked::new(request, response)?;
    if subject != run.record_sha256 || Some(&stated.record) != response.get("record") {
        return Err(AttestError::Record(
            "the signed record is not the answer's record".into(),
        ));
    }
    Ok(run.request_sha256)
}

/// The checkpoint: signed by `key`, closing the bundle right after the line
/// before it, with as many entries as the bundle holds.
fn check_checkpoint(
    fields: &Map<String, Value>,
    key: &VerifyingKey,
    number: u64,
    previous: &str,
    entries: usize,
    open_sessions: usize,
) -> Result<(), AttestError> {
    let (last_line, stated): (String, CheckpointPredicate) =
        statement::open(&signed(fields)?, key, LINE_SUBJECT, BUNDLE_CHECKPOINT)?;
    placed(stated.line, &last_line, number, previous)?;
    let written = fields.get("entries").and_then(Value::as_u64);
    if stated.entries != entries as u64 || written != Some(stated.entries) {
        return Err(AttestError::Incomplete(
            "the checkpoint's count is not the number of entries before it".into(),
        ));
    }
    if stated.open_sessions != open_sessions as u64 {
        return Err(AttestError::Record(
            "the checkpoint's count of open sessions is not the bundle's".into(),
        ));
    }
    Ok(())
}

/// The receipt in an answer (a Run's, a session call's `run`, or a
/// session's close), checked with the daemon's key when one is given (then
/// an answer without one is refused). Says whether the answer carries one.
fn check_receipt(
    answer: Option<&Value>,
    daemon: Option<&VerifyingKey>,
    about: Receipted,
) -> Result<bool, AttestError> {
    let receipt = answer.and_then(|r| r.get("receipt"));
    match (receipt, daemon) {
        (Some(receipt), Some(key)) => {
            match about {
                Receipted::Record => {
                    let record = answer.and_then(|r| r.get("record")).unwrap_or(&Value::Null);
                    receipts::check(receipt, key, record)?;
                }
                Receipted::Close => {
                    receipts::check_close(receipt, key, answer.unwrap_or(&Value::Null))?;
                }
            }
            Ok(true)
        }
        (None, Some(_)) => Err(AttestError::Record(
            "the answer carries no receipt from the daemon".into(),
        )),
        (receipt, None) => Ok(receipt.is_some()),
    }
}

/// What a receipt vouches for: a record, or a session's close.
#[derive(Clone, Copy)]
enum Receipted {
    Record,
    Close,
}
