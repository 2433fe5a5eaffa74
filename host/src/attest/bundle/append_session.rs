//! Appending a session: its open, each call in chain order, and its close,
//! each checked against the chain the appender keeps before it is signed.
//!
//! The session ID never reaches the file: the open answer's is checked
//! against its fingerprint here (only a holder of the ID can) and then
//! dropped, and a call is kept as sent without it. A session is named in
//! the bundle only by its fingerprint.

use serde_json::Value;

use super::append::Appender;
use super::{
    ClosePredicate, KIND_SESSION_CALL, KIND_SESSION_CLOSE, KIND_SESSION_OPEN,
    KIND_SESSION_UNANSWERED, OpenPredicate, RECORD_SUBJECT, RunPredicate, SESSION_SUBJECT,
};
use crate::attest::AttestError;
use crate::attest::session_check::{
    call_as_received, check_open, close_as_received, id_matches, open_as_received,
    parse_open_request, parse_session_call, unanswered_of, without_id,
};
use crate::attest::statement::{self, RUN_RECORD, SESSION_CLOSE, SESSION_OPEN};

impl Appender<'_> {
    /// Appends a session's open: `request` as sent and `answer` as
    /// received, session ID and all. The answer must check against the
    /// request, and its ID must be the one its fingerprint names. Returns
    /// the fingerprint, which names the session in the calls that follow.
    pub fn append_open(&mut self, request: &Value, answer: &Value) -> Result<String, AttestError> {
        let id = answer
            .get("sessionId")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let kept = without_id(answer);
        let opened = open_as_received(&kept)?;
        let chain = check_open(&parse_open_request(request)?, &opened)?;
        if !id_matches(id, &opened.session) {
            return Err(AttestError::Record(
                "the open answer's session ID is not the one its fingerprint names".into(),
            ));
        }
        let fingerprint = chain.fingerprint.clone();
        if self.sessions.contains_key(&fingerprint) {
            return Err(AttestError::Record(
                "this session is already open here".into(),
            ));
        }
        // Open before the line is written, so its checkpoint counts it;
        // taken back if the write fails.
        self.sessions.insert(fingerprint.clone(), chain);
        let written = self.append_line(
            KIND_SESSION_OPEN,
            "OpenSession",
            Some(request),
            ("response", &kept),
            |key, line, previous_line_sha256| {
                statement::sign(
                    key,
                    SESSION_SUBJECT,
                    &fingerprint,
                    SESSION_OPEN,
                    &OpenPredicate {
                        opened: kept.clone(),
                        line,
                        previous_line_sha256,
                    },
                )
            },
        );
        match written {
            Ok(()) => Ok(fingerprint),
            Err(e) => {
                self.sessions.remove(&fingerprint);
                Err(e)
            }
        }
    }

    /// Appends a call of the session `fingerprint` names: `request` as sent
    /// but without its session ID, and `answer` as received. Its record
    /// must check and continue the session's chain; if it does not, or the
    /// write fails, nothing is written and the chain stays where it was.
    pub fn append_call(
        &mut self,
        fingerprint: &str,
        request: &Value,
        answer: &Value,
    ) -> Result<(), AttestError> {
        let Some(chain) = self.sessions.get(fingerprint) else {
            return Err(AttestError::Record(
                "a call of a session not open in this bundle".into(),
            ));
        };
        let parsed = parse_session_call(request)?;
        let called = call_as_received(answer)?;
        chain.check_call(&parsed, &called)?;
        let record = answer
            .get("run")
            .and_then(|r| r.get("record"))
            .cloned()
            .unwrap_or(Value::Null);
        let record_sha256 = called.run.record.record_sha256.clone();
        self.append_line(
            KIND_SESSION_CALL,
            "SessionRun",
            Some(request),
            ("response", answer),
            |key, line, previous_line_sha256| {
                statement::sign(
                    key,
                    RECORD_SUBJECT,
                    &record_sha256,
                    RUN_RECORD,
                    &RunPredicate {
                        record,
                        line,
                        previous_line_sha256,
                    },
                )
            },
        )?;
        if let Some(chain) = self.sessions.get_mut(fingerprint) {
            chain.advance(&called);
        }
        Ok(())
    }

    /// Appends a call of the session that may have run but has no answer:
    /// `request` as sent without its session ID, and `error` as received,
    /// whose `UnansweredCall` detail holds the call's record. The record
    /// must check and continue the chain, as an answered call's must.
    pub fn append_unanswered(
        &mut self,
        fingerprint: &str,
        request: &Value,
        error: &Value,
    ) -> Result<(), AttestError> {
        let Some(chain) = self.sessions.get(fingerprint) else {
            return Err(AttestError::Record(
                "a call of a session not open in this bundle".into(),
            ));
        };
        let parsed = parse_session_call(request)?;
        let (record, ended) = unanswered_of(error)?;
        chain.check_unanswered(&parsed, &record)?;
        let stated = serde_json::to_value(&record)
            .map_err(|e| AttestError::Format(format!("the record: {e}")))?;
        self.append_line(
            KIND_SESSION_UNANSWERED,
            "SessionRun",
            Some(request),
            ("error", error),
            |key, line, previous_line_sha256| {
                statement::sign(
                    key,
                    RECORD_SUBJECT,
                    &record.record_sha256,
                    RUN_RECORD,
                    &RunPredicate {
                        record: stated,
                        line,
                        previous_line_sha256,
                    },
                )
            },
        )?;
        if let Some(chain) = self.sessions.get_mut(fingerprint) {
            chain.advance_past(&record, ended);
        }
        Ok(())
    }

    /// Appends the session's close: the answer must state the calls and
    /// last record the chain holds. A session whose close does not check
    /// stays open in the bundle, which then verifies as incomplete.
    pub fn append_close(&mut self, fingerprint: &str, answer: &Value) -> Result<(), AttestError> {
        let Some(chain) = self.sessions.get(fingerprint) else {
            return Err(AttestError::Record(
                "a close of a session not open in this bundle".into(),
            ));
        };
        chain.check_close(&close_as_received(answer)?)?;
        // Closed before the line is written, so its checkpoint no longer
        // counts it; put back if the write fails.
        let Some(chain) = self.sessions.remove(fingerprint) else {
            return Err(AttestError::Record("the session is not open here".into()));
        };
        let written = self.append_line(
            KIND_SESSION_CLOSE,
            "CloseSession",
            None,
            ("response", answer),
            |key, line, previous_line_sha256| {
                statement::sign(
                    key,
                    SESSION_SUBJECT,
                    fingerprint,
                    SESSION_CLOSE,
                    &ClosePredicate {
                        closed: answer.clone(),
                        line,
                        previous_line_sha256,
                    },
                )
            },
        );
        if written.is_err() {
            self.sessions.insert(fingerprint.to_string(), chain);
        }
        written
    }
}
