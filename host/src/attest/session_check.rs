//! Whether a session's answers check: its open, each call's record in its
//! place in the chain, and its close, against what the client sent.
//!
//! A session call's record is an answered record like a Run's (`check`
//! covers its digests, evidence, rule and floor) that also states its place:
//! the session's fingerprint, its sequence number and the digest of the
//! record before it. Checked in order, those places make the calls one
//! chain with nothing dropped, added or moved, and the close states how
//! many calls the daemon counted and the last record's digest, so a call
//! missing at the end shows too.
//!
//! The session ID never appears here: it is a capability, and the open
//! answer's is checked against the fingerprint (its SHA-256) by the signer,
//! which holds it, and then left out of everything kept (`without_id`).
//! These checks are the published client's, plus the daemon's own refusals
//! (a call's rule outside the session's, a call after the session ended,
//! evidence that changed), since a record of a call the daemon refuses
//! unrun says something that did not happen.

use serde_json::Value;

use super::check::{Place, as_received, bad, check_answered, parse_request, shown, tier_named};
use super::statement::is_sha256_hex;
use super::{AttestError, receipts};
use crate::admission;
use crate::record;
use crate::sessions;
use crate::tier::Tier;
use crate::wire::{
    self, CloseSessionResponse, OpenSessionRequest, OpenSessionResponse, RECORD_VERSION, RunRecord,
    RunRequest, SessionEnd, SessionRunRequest, SessionRunResponse, SoftwareRule,
};

/// The keys a session ID may come under, in a request or an answer.
const ID_KEYS: [&str; 2] = ["sessionId", "session_id"];

/// Parses an OpenSession request as the daemon does (shape pass,
/// protocol gate, strict typed parse), from the JSON kept or to be sent.
pub fn parse_open_request(request: &Value) -> Result<OpenSessionRequest, AttestError> {
    parse_request(
        wire::Request::OpenSession,
        "OpenSessionRequest",
        &bytes_of(request),
    )
}

/// Parses a session call as kept, without its session ID (one present is
/// refused: nothing kept may hold it), and returns it as the Run it is
/// digested as.
pub fn parse_session_call(request: &Value) -> Result<RunRequest, AttestError> {
    let call: SessionRunRequest = parse_request(
        wire::Request::SessionRun,
        "SessionRunRequest",
        &bytes_of(request),
    )?;
    let named = request
        .as_object()
        .is_some_and(|o| ID_KEYS.iter().any(|k| o.contains_key(*k)));
    if !call.session_id.is_empty() || named {
        return Err(AttestError::Format(
            "the session call holds its session ID; a kept call must not".into(),
        ));
    }
    Ok(call.into_run().1)
}

/// A request's bytes in the one encoding a bundle keeps (compact, keys
/// sorted), which the daemon's parse reads as it reads the request sent.
fn bytes_of(request: &Value) -> Vec<u8> {
    serde_json::to_vec(request).unwrap_or_default()
}

/// An OpenSession answer as kept: without its session ID (one present is
/// refused; `without_id` removes it from the answer as received).
pub fn open_as_received(response: &Value) -> Result<OpenSessionResponse, AttestError> {
    if response
        .as_object()
        .is_some_and(|o| ID_KEYS.iter().any(|k| o.contains_key(*k)))
    {
        return Err(AttestError::Format(
            "the open answer holds its session ID; a kept answer must not".into(),
        ));
    }
    as_received(response, "OpenSession", |_| {})
}

/// The answer as received, without the session ID it carries.
pub fn without_id(response: &Value) -> Value {
    let mut kept = response.clone();
    if let Some(o) = kept.as_object_mut() {
        for k in ID_KEYS {
            o.remove(k);
        }
    }
    kept
}

/// A session call's answer as received (its run's `callTrace` set aside),
/// and the form of any receipt it carries.
pub fn call_as_received(response: &Value) -> Result<SessionRunResponse, AttestError> {
    let answer: SessionRunResponse = as_received(response, "SessionRun", |v| {
        for result in ["javascript", "project", "cell"] {
            if let Some(Value::Object(r)) = v.pointer_mut(&format!("/run/{result}")) {
                r.remove("callTrace");
            }
        }
    })?;
    if let Some(receipt) = &answer.run.receipt {
        receipts::check_form(receipt, &answer.run.record)?;
    }
    Ok(answer)
}

/// A session's close as received, and the form of any receipt it carries.
pub fn close_as_received(response: &Value) -> Result<CloseSessionResponse, AttestError> {
    let closed: CloseSessionResponse = as_received(response, "CloseSession", |_| {})?;
    if let Some(receipt) = &closed.receipt {
        receipts::check_close_form(receipt, &closed)?;
    }
    Ok(closed)
}

/// The Connect codes an unanswered call's record may state (the published
/// client's list).
const CONNECT_CODES: [&str; 16] = [
    "canceled",
    "unknown",
    "invalid_argument",
    "deadline_exceeded",
    "not_found",
    "already_exists",
    "permission_denied",
    "resource_exhausted",
    "failed_precondition",
    "aborted",
    "out_of_range",
    "unimplemented",
    "internal",
    "unavailable",
    "data_loss",
    "unauthenticated",
];

/// A session call's error that carries the record of a call that may have
/// run (the daemon's `UnansweredCall` detail), read as received: exactly
/// `code`, `message` and `details`; one `UnansweredCall`, at most one
/// `SessionEnded`, and no not-dispatched mark (a call marked as never run
/// has no record to chain). Returns the record and whether the error says
/// the session ended.
pub fn unanswered_of(error: &Value) -> Result<(RunRecord, bool), AttestError> {
    let form = |why: &str| AttestError::Format(format!("the unanswered call's error: {why}"));
    let Some(fields) = error.as_object() else {
        return Err(form("not a JSON object"));
    };
    if !fields
        .keys()
        .map(String::as_str)
        .eq(["code", "details", "message"])
    {
        return Err(form("it holds other fields than code, message and details"));
    }
    let code = fields["code"].as_str().ok_or_else(|| form("no code"))?;
    if !fields["message"].is_string() {
        return Err(form("no message"));
    }
    let details = fields["details"]
        .as_array()
        .ok_or_else(|| form("no details"))?;
    let (mut record, mut ended) = (None, false);
    for d in details {
        let Some(o) = d.as_object() else {
            return Err(form("a detail is not an object"));
        };
        if !o.keys().map(String::as_str).eq(["type", "value"]) {
            return Err(form("a detail holds other fields than type and value"));
        }
        let bytes = o["value"]
            .as_str()
            .and_then(|v| {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD_NO_PAD
                    .decode(v)
                    .ok()
            })
            .ok_or_else(|| form("a detail's value is not unpadded base64"))?;
        match o["type"].as_str() {
            Some("plimsoll.v1.UnansweredCall") if record.is_none() => {
                record = Some(wire::decode_unanswered(&bytes).map_err(|e| form(&e))?);
            }
            Some("plimsoll.v1.SessionEnded") if !ended => {
                wire::decode_session_ended(&bytes).map_err(|e| form(&e))?;
                ended = true;
            }
            _ => return Err(form("a detail other than one record and one end")),
        }
    }
    let record = record.ok_or_else(|| form("no UnansweredCall record"))?;
    if record.unanswered != code || !CONNECT_CODES.contains(&code) {
        return Err(bad(format!(
            "record.unanswered {:?} is not the error's Connect code {code:?}",
            record.unanswered
        )));
    }
    Ok((record, ended))
}

/// A session's chain so far, as a checker follows it: what the open stated,
/// and where the calls have reached.
#[derive(Debug, Clone)]
pub struct Chain {
    /// The SHA-256 of the session ID: the only name a session has here.
    pub fingerprint: String,
    sandbox: String,
    isolation: String,
    software_identity: String,
    floor: Option<Tier>,
    rule: Option<SoftwareRule>,
    /// Calls in the chain so far, and the last one's record digest.
    pub calls: u64,
    pub last: String,
    /// The environment and policy of the first call, which every call
    /// shares (the daemon ends a session whose evidence changes).
    evidence: Option<(String, String)>,
    /// An answer said the session ended: no call may follow.
    ended: bool,
}

/// Checks an OpenSession answer against its request: the fingerprint is a
/// digest, the tier is a tier and meets the floor, the software identity is
/// within the rule. Returns the chain the calls must continue.
pub fn check_open(
    req: &OpenSessionRequest,
    resp: &OpenSessionResponse,
) -> Result<Chain, AttestError> {
    if let Some(rule) = &req.software_rule {
        admission::validate_rule(rule)
            .map_err(|r| bad(format!("request.softwareRule: {}", r.message)))?;
    }
    if let Some(lang) = req
        .languages
        .iter()
        .find(|l| !admission::CELL_LANGUAGES.contains(&l.as_str()))
    {
        return Err(bad(format!(
            "request.languages: no session runs {lang:?} cells"
        )));
    }
    if !req.owner.is_empty() && !sessions::valid_owner(&req.owner) {
        return Err(bad(
            "request.owner is not an owner digest the daemon takes".into()
        ));
    }
    if !is_sha256_hex(&resp.session) {
        return Err(bad(format!(
            "session {:?} is not a fingerprint (64 lowercase hex characters)",
            resp.session
        )));
    }
    if resp.sandbox.is_empty() {
        return Err(bad("sandbox: the open answer names no sandbox".into()));
    }
    let floor = Tier::parse_floor(&req.minimum_isolation).map_err(|_| {
        bad(format!(
            "request.minimumIsolation {:?} is not a tier name, so no session opened",
            req.minimum_isolation
        ))
    })?;
    match tier_named(&resp.isolation) {
        None | Some(Tier::None) => {
            return Err(bad(format!(
                "isolation {:?}: no session runs at it",
                resp.isolation
            )));
        }
        Some(tier) if floor.is_some_and(|f| !tier.meets(f)) => {
            return Err(bad(format!(
                "isolation {tier} is below the request's minimumIsolation {}",
                req.minimum_isolation
            )));
        }
        Some(_) => {}
    }
    if let Some(rule) = &req.software_rule
        && !rule.identities.contains(&resp.software_identity)
    {
        return Err(bad(format!(
            "softwareIdentity {:?} is not in the request's software rule",
            resp.software_identity
        )));
    }
    Ok(Chain {
        fingerprint: resp.session.clone(),
        sandbox: resp.sandbox.clone(),
        isolation: resp.isolation.clone(),
        software_identity: resp.software_identity.clone(),
        floor,
        rule: req.software_rule.clone(),
        calls: 0,
        last: String::new(),
        evidence: None,
        ended: false,
    })
}

impl Chain {
    /// Checks a call's answer against its request and its place: the
    /// record checks as any answered record, continues this chain, states
    /// the open's evidence, and the call keeps the session's rule and
    /// floor. Leaves the chain as it was; `advance` moves it on.
    pub fn check_call(
        &self,
        req: &RunRequest,
        resp: &SessionRunResponse,
    ) -> Result<(), AttestError> {
        if self.ended {
            return Err(bad(
                "a call after an answer that ended the session: the daemon runs none".into(),
            ));
        }
        check_answered(req, &resp.run, Place::SessionCall)?;
        let rec = &resp.run.record;
        self.continues(rec)?;
        self.same_evidence(rec)?;
        if !admission::rule_within(req.software_rule.as_ref(), self.rule.as_ref()) {
            return Err(bad(
                "request.softwareRule allows software the session's rule does not".into(),
            ));
        }
        if let (Some(floor), Some(tier)) = (self.floor, tier_named(&rec.isolation))
            && !tier.meets(floor)
        {
            return Err(bad(format!(
                "record.isolation {tier} is below the session's minimumIsolation {floor}"
            )));
        }
        Ok(())
    }

    /// Checks the record of a call that may have run but has no answer
    /// (the published client's checks for one, then its place): version,
    /// no result, the request's digest and rule, its own digest, and the
    /// open's evidence, rule and floor, with nothing to compare it to but
    /// the open answer and the chain.
    pub fn check_unanswered(&self, req: &RunRequest, rec: &RunRecord) -> Result<(), AttestError> {
        if self.ended {
            return Err(bad(
                "a call after an answer that ended the session: the daemon runs none".into(),
            ));
        }
        if rec.version != RECORD_VERSION || !rec.result_sha256.is_empty() {
            return Err(bad(format!(
                "an unanswered call's record is version {RECORD_VERSION} and states no result (version {}, resultSha256 {})",
                rec.version,
                shown(&rec.result_sha256)
            )));
        }
        let request_sha256 = record::request_digest(req);
        if rec.request_sha256 != request_sha256 {
            return Err(bad(format!(
                "record.requestSha256 {} is not the digest of the request sent ({request_sha256})",
                shown(&rec.request_sha256)
            )));
        }
        let rule_id = record::software_rule_id(req.software_rule.as_ref());
        let allowed = req
            .software_rule
            .as_ref()
            .is_none_or(|r| r.identities.contains(&rec.software_identity));
        if rec.software_rule_id != rule_id || !allowed {
            return Err(bad(
                "record.softwareRuleId is not the request's rule, or its software is not in it"
                    .into(),
            ));
        }
        let own = record::record_digest(rec);
        if rec.record_sha256 != own {
            return Err(bad(format!(
                "record.recordSha256 {} is not the record's own digest ({own})",
                shown(&rec.record_sha256)
            )));
        }
        self.continues(rec)?;
        self.same_evidence(rec)?;
        if !admission::rule_within(req.software_rule.as_ref(), self.rule.as_ref()) {
            return Err(bad(
                "request.softwareRule allows software the session's rule does not".into(),
            ));
        }
        let floor = Tier::parse_floor(&req.minimum_isolation)
            .map_err(|_| bad("request.minimumIsolation is not a tier name".into()))?;
        let tier = tier_named(&rec.isolation).unwrap_or(Tier::None);
        for f in [floor, self.floor].into_iter().flatten() {
            if !tier.meets(f) {
                return Err(bad(format!(
                    "record.isolation {:?} is below the floor {f}",
                    rec.isolation
                )));
            }
        }
        Ok(())
    }

    /// Whether an answer or error said the session ended: no call follows.
    pub fn has_ended(&self) -> bool {
        self.ended
    }

    /// Moves the chain past a call whose answer checked.
    pub fn advance(&mut self, resp: &SessionRunResponse) {
        self.advance_past(&resp.run.record, resp.ended != SessionEnd::Open);
    }

    /// Moves the chain past a record that checked, answered or not;
    /// `ended` when its answer or error said the session ended.
    pub fn advance_past(&mut self, rec: &RunRecord, ended: bool) {
        self.calls = rec.sequence.0 as u64;
        self.last = rec.record_sha256.clone();
        self.evidence
            .get_or_insert_with(|| (rec.environment.clone(), rec.policy.clone()));
        self.ended = ended;
    }

    /// The close states this session, and the calls and last record the
    /// chain reached: a call dropped from the end, or one the daemon ran
    /// and the chain does not hold, shows here.
    pub fn check_close(&self, resp: &CloseSessionResponse) -> Result<(), AttestError> {
        if resp.session != self.fingerprint {
            return Err(bad("the close is another session's".into()));
        }
        let calls = u64::try_from(resp.calls.0).unwrap_or(u64::MAX);
        if calls != self.calls || resp.last_record_sha256 != self.last {
            return Err(bad(format!(
                "the close counts {calls} calls ending at {}; the chain holds {} ending at {}",
                shown(&resp.last_record_sha256),
                self.calls,
                shown(&self.last)
            )));
        }
        Ok(())
    }

    fn continues(&self, rec: &RunRecord) -> Result<(), AttestError> {
        if rec.session != self.fingerprint {
            return Err(bad(format!(
                "record.session {} is not this session's fingerprint",
                shown(&rec.session)
            )));
        }
        let expected = self.calls + 1;
        if u64::try_from(rec.sequence.0).ok() != Some(expected) {
            return Err(bad(format!(
                "record.sequence {} is not the next call's ({expected}): the session's chain has a gap or a call moved",
                rec.sequence.0
            )));
        }
        if rec.previous_sha256 != self.last {
            return Err(bad(format!(
                "record.previousSha256 {} is not the previous call's record ({})",
                shown(&rec.previous_sha256),
                shown(&self.last)
            )));
        }
        Ok(())
    }

    fn same_evidence(&self, rec: &RunRecord) -> Result<(), AttestError> {
        let opened = [
            ("provider", &rec.provider, "sandbox", &self.sandbox),
            ("isolation", &rec.isolation, "isolation", &self.isolation),
            (
                "softwareIdentity",
                &rec.software_identity,
                "softwareIdentity",
                &self.software_identity,
            ),
        ];
        for (field, stated, at_open, was) in opened {
            if stated != was {
                return Err(bad(format!(
                    "record.{field} {stated:?} differs from the open answer's {at_open} {was:?}"
                )));
            }
        }
        if let Some((environment, policy)) = &self.evidence
            && (&rec.environment != environment || &rec.policy != policy)
        {
            return Err(bad(
                "record.environment or policy differs from the session's first call: the daemon ends a session whose evidence changes".into(),
            ));
        }
        Ok(())
    }
}

/// Whether an open answer's session ID is the one its fingerprint names:
/// only a holder of the ID (the signer) can check this, so the signer must.
pub fn id_matches(id: &str, fingerprint: &str) -> bool {
    !id.is_empty() && sessions::fingerprint(id) == fingerprint
}

#[cfg(test)]
#[path = "session_check_tests.rs"]
mod tests;
