//! Verifying a bundle's sessions: each open, call and close line's
//! statement, and each session's chain followed from its open to its close.
//!
//! Sessions and runs may interleave; each session's lines are checked
//! against its own chain, found by fingerprint. A session whose close is
//! not in the bundle is incomplete: calls may be missing from its end.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use super::{
    ClosePredicate, OpenPredicate, RECORD_SUBJECT, RunPredicate, SESSION_SUBJECT, placed, signed,
};
use crate::attest::AttestError;
use crate::attest::keys::VerifyingKey;
use crate::attest::session_check::{
    Chain, call_as_received, check_open, close_as_received, open_as_received, parse_open_request,
    parse_session_call, unanswered_of,
};
use crate::attest::statement::{self, RUN_RECORD, SESSION_CLOSE, SESSION_OPEN};
use crate::wire::RunRequest;

/// The sessions a bundle has opened so far, as a verifier follows them.
#[derive(Default)]
pub(super) struct Sessions {
    /// Open sessions by fingerprint: the chain so far and the open's line.
    open: HashMap<String, (Chain, u64)>,
    /// Every fingerprint opened: a second open of one is a copied chain
    /// (IDs are 128 random bits), refused.
    seen: HashSet<String>,
    /// How many sessions closed.
    pub closed: usize,
}

/// A line's parts, once its procedure is the one its kind is for.
fn part<'a>(fields: &'a Map<String, Value>, name: &str) -> Result<&'a Value, AttestError> {
    fields
        .get(name)
        .ok_or_else(|| AttestError::Format(format!("no {name}")))
}

fn procedure(fields: &Map<String, Value>, wanted: &str) -> Result<(), AttestError> {
    if fields.get("procedure").and_then(Value::as_str) == Some(wanted) {
        Ok(())
    } else {
        Err(AttestError::Format(format!(
            "the line's procedure is not {wanted}"
        )))
    }
}

/// What every session call's line holds, checked as far as it can be
/// before the chain: its procedure, its statement in its place, and its
/// request as the daemon parses it. Returns the request, what came back
/// (under `answer_key`), and the statement's subject and predicate.
fn call_parts<'a>(
    fields: &'a Map<String, Value>,
    answer_key: &str,
    key: &VerifyingKey,
    number: u64,
    previous: &str,
) -> Result<(RunRequest, &'a Value, String, RunPredicate), AttestError> {
    procedure(fields, "SessionRun")?;
    let (request, answer) = (part(fields, "request")?, part(fields, answer_key)?);
    let (subject, stated): (String, RunPredicate) =
        statement::open(&signed(fields)?, key, RECORD_SUBJECT, RUN_RECORD)?;
    placed(stated.line, &stated.previous_line_sha256, number, previous)?;
    Ok((parse_session_call(request)?, answer, subject, stated))
}

impl Sessions {
    /// A session's open: signed by `key` in its place, about this
    /// session's fingerprint and this answer, which checks against the
    /// request.
    pub(super) fn open_line(
        &mut self,
        fields: &Map<String, Value>,
        key: &VerifyingKey,
        number: u64,
        previous: &str,
    ) -> Result<(), AttestError> {
        procedure(fields, "OpenSession")?;
        let (request, response) = (part(fields, "request")?, part(fields, "response")?);
        let (subject, stated): (String, OpenPredicate) =
            statement::open(&signed(fields)?, key, SESSION_SUBJECT, SESSION_OPEN)?;
        placed(stated.line, &stated.previous_line_sha256, number, previous)?;
        let opened = open_as_received(response)?;
        let chain = check_open(&parse_open_request(request)?, &opened)?;
        if subject != chain.fingerprint || &stated.opened != response {
            return Err(AttestError::Record(
                "the signed open is not the line's answer".into(),
            ));
        }
        if !self.seen.insert(chain.fingerprint.clone()) {
            return Err(AttestError::Record(
                "this session was opened before in the bundle: a copied chain".into(),
            ));
        }
        self.open.insert(chain.fingerprint.clone(), (chain, number));
        Ok(())
    }

    /// A session call: signed in its place about its record, which checks
    /// against the request and continues its session's chain. Returns the
    /// request's digest.
    pub(super) fn call_line(
        &mut self,
        fields: &Map<String, Value>,
        key: &VerifyingKey,
        number: u64,
        previous: &str,
    ) -> Result<String, AttestError> {
        let (parsed, response, subject, stated) =
            call_parts(fields, "response", key, number, previous)?;
        let called = call_as_received(response)?;
        let record = &called.run.record;
        let chain = self.chain_of(&record.session)?;
        chain.check_call(&parsed, &called)?;
        if subject != record.record_sha256
            || Some(&stated.record) != response.get("run").and_then(|r| r.get("record"))
        {
            return Err(AttestError::Record(
                "the signed record is not the answer's record".into(),
            ));
        }
        chain.advance(&called);
        Ok(record.request_sha256.clone())
    }

    /// A session call with no answer: signed in its place about the record
    /// its error carries, which checks against the request and continues
    /// its session's chain. Returns the request's digest.
    pub(super) fn unanswered_line(
        &mut self,
        fields: &Map<String, Value>,
        key: &VerifyingKey,
        number: u64,
        previous: &str,
    ) -> Result<String, AttestError> {
        let (parsed, error, subject, stated) = call_parts(fields, "error", key, number, previous)?;
        let (record, ended) = unanswered_of(error)?;
        let chain = self.chain_of(&record.session)?;
        chain.check_unanswered(&parsed, &record)?;
        if subject != record.record_sha256
            || serde_json::to_value(&record).ok().as_ref() != Some(&stated.record)
        {
            return Err(AttestError::Record(
                "the signed record is not the one the error carries".into(),
            ));
        }
        chain.advance_past(&record, ended);
        Ok(record.request_sha256)
    }

    /// The open chain of the session `fingerprint` names.
    fn chain_of(&mut self, fingerprint: &str) -> Result<&mut Chain, AttestError> {
        match self.open.get_mut(fingerprint) {
            Some((chain, _)) => Ok(chain),
            None if self.seen.contains(fingerprint) => Err(AttestError::Record(
                "a call after its session's close".into(),
            )),
            None => Err(AttestError::Record(
                "a call of a session with no open before it".into(),
            )),
        }
    }

    /// A session's close: signed in its place about this session and this
    /// answer, which states the calls and last record its chain holds.
    pub(super) fn close_line(
        &mut self,
        fields: &Map<String, Value>,
        key: &VerifyingKey,
        number: u64,
        previous: &str,
    ) -> Result<(), AttestError> {
        procedure(fields, "CloseSession")?;
        let response = part(fields, "response")?;
        let (subject, stated): (String, ClosePredicate) =
            statement::open(&signed(fields)?, key, SESSION_SUBJECT, SESSION_CLOSE)?;
        placed(stated.line, &stated.previous_line_sha256, number, previous)?;
        let closed = close_as_received(response)?;
        if subject != closed.session || &stated.closed != response {
            return Err(AttestError::Record(
                "the signed close is not the line's answer".into(),
            ));
        }
        let Some((chain, _)) = self.open.remove(&closed.session) else {
            return Err(AttestError::Record(
                "a close of a session not open here".into(),
            ));
        };
        chain.check_close(&closed)?;
        self.closed += 1;
        Ok(())
    }

    /// How many sessions are open at this point of the bundle.
    pub(super) fn open(&self) -> usize {
        self.open.len()
    }

    /// Every session opened was closed: one that was not may have lost
    /// calls from its end, which nothing else in the bundle would show.
    pub(super) fn finish(&self) -> Result<(), AttestError> {
        match self.open.values().map(|(_, line)| *line).min() {
            None => Ok(()),
            Some(line) => Err(AttestError::Incomplete(format!(
                "the session opened at line {line} has no close: calls may be missing from its end"
            ))),
        }
    }
}

/// The session an unanswered call's line belongs to, read from the signed
/// record in its statement (for a bundle that already verified).
pub(super) fn fingerprint_of_unanswered(line: &Value) -> String {
    line.get("error")
        .and_then(|e| unanswered_of(e).ok())
        .map(|(record, _)| record.session)
        .unwrap_or_default()
}
