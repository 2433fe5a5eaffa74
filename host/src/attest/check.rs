//! Whether a Run answer's record checks against the request that was sent.
//!
//! A run record states digests, evidence and a place (none, for a Run) in a
//! session chain. On its own it proves nothing: it is the daemon's claim.
//! It becomes worth signing only once the claim is tied to what the client
//! actually sent and received, so a signer must refuse any record that does
//! not check, and a verifier repeats every check below on every line rather
//! than trusting that the signer did.
//!
//! The checks, each failing as `AttestError::Record` naming the field:
//! - the record is an answered one of the version this code reads: `version`
//!   is `RECORD_VERSION` and `unanswered` is empty;
//! - it is a Run's, not a session call's: no `session`, `sequence` or
//!   `previousSha256`;
//! - `requestSha256` is the digest of the request as parsed here;
//! - the request carries exactly one payload and the answer exactly one
//!   result, of the same kind, and `resultSha256` is that result's digest;
//! - `recordSha256` is the record's own digest, so every field above, and
//!   those no answer field repeats (`policy`, the times), are as sealed;
//! - the evidence the record states is the evidence the answer states:
//!   `provider` is the answer's `sandbox`, and `isolation`, `environment`,
//!   `softwareIdentity` and `instance` are the answer's own; `softwareRuleId`
//!   is the ID of the rule the request states;
//! - the record's isolation tier is a tier, and it meets the request's
//!   `minimumIsolation`.
//!
//! Every digest is recomputed with the functions in `record` that sealed
//! it, over the wire types the answer is read into: there is one encoder,
//! so the check cannot drift from what the daemon does.

use super::{AttestError, receipts};
use serde_json::Value;

use crate::admission;
use crate::record;
use crate::tier::Tier;
use crate::wire::{self, RECORD_VERSION, RunRecord, RunRequest, RunResponse};

/// Parses a Run request body exactly as the daemon does: the shape pass
/// (objects where messages go, no positional arrays), the protocol gate,
/// then the strict typed parse. The daemon's own entry point,
/// `api::parse_run`, is these same wire steps answered as a refusal, so a
/// request this refuses is one the daemon would have refused unrun.
pub fn parse_run_request(body: &[u8]) -> Result<RunRequest, AttestError> {
    parse_request(wire::Request::Run, "RunRequest", body)
}

/// Any request body, parsed as the daemon parses one of its kind.
pub(super) fn parse_request<T: serde::de::DeserializeOwned>(
    request: wire::Request,
    name: &str,
    body: &[u8],
) -> Result<T, AttestError> {
    let stated = wire::shape_of(request, body)
        .map_err(|e| AttestError::Format(format!("malformed {name}: {e}")))?;
    wire::protocol_gate(stated).map_err(|m| AttestError::Format(format!("{name}: {m}")))?;
    serde_json::from_slice::<T>(body)
        .map_err(|e| AttestError::Format(format!("malformed {name}: {e}")))
}

/// Reads a Run answer as the JSON it arrived as, refusing anything in it
/// the answer types do not carry: a field no check covers (an "attested"
/// flag inside the record, a result kind the digest leaves out, a
/// snake_case twin another reader would prefer, a number too large to
/// keep) would otherwise be signed beside what was checked. Only
/// `callTrace`, which no digest covers by design, is set aside.
pub fn answer_as_received(response: &Value) -> Result<RunResponse, AttestError> {
    let answer: RunResponse = as_received(response, "Run", |received| {
        for result in ["javascript", "project"] {
            if let Some(Value::Object(r)) = received.get_mut(result) {
                r.remove("callTrace");
            }
        }
    })?;
    if let Some(receipt) = &answer.receipt {
        receipts::check_form(receipt, &answer.record)?;
    }
    Ok(answer)
}

/// Any answer read into its type, refusing anything the type does not
/// carry; `set_aside` removes what no digest covers before the comparison.
pub(super) fn as_received<T>(
    response: &Value,
    name: &str,
    set_aside: fn(&mut Value),
) -> Result<T, AttestError>
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let answer: T = serde_json::from_value(response.clone())
        .map_err(|e| AttestError::Format(format!("the answer is not a {name} answer: {e}")))?;
    let mut received = response.clone();
    set_aside(&mut received);
    let read = serde_json::to_value(&answer)
        .map_err(|e| AttestError::Format(format!("the answer: {e}")))?;
    if read != received {
        return Err(AttestError::Format(format!(
            "the answer carries fields or forms a {name} answer does not have"
        )));
    }
    Ok(answer)
}

/// Checks a Run answer's record against the request sent (see the module
/// documentation for the list). `Ok` means every check held.
pub fn check_run(request: &RunRequest, response: &RunResponse) -> Result<(), AttestError> {
    check_answered(request, response, Place::Run)
}

/// Where an answered record belongs: a Run has no place in a chain; a
/// session call's place is checked against its chain by `session_check`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    Run,
    SessionCall,
}

/// The checks every answered record gets, a Run's or a session call's.
pub(super) fn check_answered(
    request: &RunRequest,
    response: &RunResponse,
    place: Place,
) -> Result<(), AttestError> {
    let rec = &response.record;
    answered(rec, place)?;

    let request_sha256 = record::request_digest(request);
    if rec.request_sha256 != request_sha256 {
        return Err(bad(format!(
            "record.requestSha256 {} is not the digest of the request sent ({request_sha256})",
            shown(&rec.request_sha256)
        )));
    }

    let asked = request_kind(request)?;
    refused_unrun(request, rec, place)?;
    let (answered, result_sha256) = result_of(response)?;
    if answered != asked {
        return Err(bad(format!(
            "result: the answer carries a {} result for a {} request",
            answered.name(),
            asked.name()
        )));
    }
    if rec.result_sha256 != result_sha256 {
        return Err(bad(format!(
            "record.resultSha256 {} is not the digest of the answer's {} result ({result_sha256})",
            shown(&rec.result_sha256),
            answered.name()
        )));
    }

    let record_sha256 = record::record_digest(rec);
    if rec.record_sha256 != record_sha256 {
        return Err(bad(format!(
            "record.recordSha256 {} is not the record's own digest ({record_sha256})",
            shown(&rec.record_sha256)
        )));
    }

    same_evidence(rec, response)?;
    let rule_id = record::software_rule_id(request.software_rule.as_ref());
    if rec.software_rule_id != rule_id {
        return Err(bad(format!(
            "record.softwareRuleId {:?} is not the ID of the rule the request states ({rule_id:?})",
            rec.software_rule_id
        )));
    }

    meets_floor(rec, request)
}

pub(super) fn bad(why: String) -> AttestError {
    AttestError::Record(why)
}

/// A digest as a message shows it: "(none)" rather than nothing at all.
pub(super) fn shown(digest: &str) -> &str {
    if digest.is_empty() { "(none)" } else { digest }
}

/// The record is of an answered call: the version whose fields the digest
/// below covers, and no unanswered code (a record with one states no
/// result). A Run's record has no place in a session chain: one there would
/// let a session call's record pass as a standalone run.
fn answered(rec: &RunRecord, place: Place) -> Result<(), AttestError> {
    if rec.version != RECORD_VERSION {
        return Err(bad(format!(
            "record.version is {}; an answered run's record is version {RECORD_VERSION}",
            rec.version
        )));
    }
    if !rec.unanswered.is_empty() {
        return Err(bad(format!(
            "record.unanswered is {:?}: the record is of a call that has no answer",
            rec.unanswered
        )));
    }
    if place == Place::SessionCall {
        return Ok(());
    }
    if !rec.session.is_empty() {
        return Err(bad(
            "record.session is set: a Run is not a session call".into()
        ));
    }
    if rec.sequence.0 != 0 {
        return Err(bad(format!(
            "record.sequence is {}: a Run is not a session call",
            rec.sequence.0
        )));
    }
    if !rec.previous_sha256.is_empty() {
        return Err(bad(
            "record.previousSha256 is set: a Run is not a session call".into(),
        ));
    }
    Ok(())
}

/// The payload kinds a request carries and an answer's result reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    JavaScript,
    Project,
    Cell,
    Module,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::JavaScript => "javascript",
            Kind::Project => "project",
            Kind::Cell => "cell",
            Kind::Module => "module",
        }
    }
}

/// The request's one payload. The request digest covers a single payload
/// (the first present, in its own order), so a request with two would have
/// a digest that says nothing of the second; the daemon refuses such a
/// request before running anything, and so a record for one is false.
fn request_kind(req: &RunRequest) -> Result<Kind, AttestError> {
    let stated: Vec<Kind> = [
        (req.javascript.is_some(), Kind::JavaScript),
        (req.project.is_some(), Kind::Project),
        (req.module.is_some(), Kind::Module),
        (req.cell.is_some(), Kind::Cell),
    ]
    .into_iter()
    .filter_map(|(set, kind)| set.then_some(kind))
    .collect();
    match stated.as_slice() {
        [one] => Ok(*one),
        [] => Err(bad(
            "request: it carries no payload, so no run answered it".into()
        )),
        _ => Err(bad(
            "request: it carries more than one payload; its digest covers only one".into(),
        )),
    }
}

/// The answer's one result and its digest, by the function that sealed it.
fn result_of(resp: &RunResponse) -> Result<(Kind, String), AttestError> {
    match (&resp.javascript, &resp.project, &resp.cell) {
        (Some(r), None, None) => Ok((Kind::JavaScript, record::javascript_result_digest(r))),
        (None, Some(r), None) => Ok((Kind::Project, record::project_result_digest(r))),
        (None, None, Some(r)) => Ok((Kind::Cell, record::cell_result_digest(r))),
        (None, None, None) => Err(bad(
            "result: the answer carries no javascript, project or cell result".into(),
        )),
        _ => Err(bad(
            "result: the answer carries more than one of javascript, project and cell".into(),
        )),
    }
}

/// The record repeats the evidence the answer states (`record::seal` is
/// given the same provider evidence the answer's fields are filled from).
/// `policy` has no field in the answer; the record digest covers it.
fn same_evidence(rec: &RunRecord, resp: &RunResponse) -> Result<(), AttestError> {
    let pairs = [
        ("provider", &rec.provider, "sandbox", &resp.sandbox),
        ("isolation", &rec.isolation, "isolation", &resp.isolation),
        (
            "environment",
            &rec.environment,
            "environment",
            &resp.environment,
        ),
        (
            "softwareIdentity",
            &rec.software_identity,
            "softwareIdentity",
            &resp.software_identity,
        ),
        ("instance", &rec.instance, "instance", &resp.instance),
    ];
    for (in_record, stated, in_answer, answered) in pairs {
        if stated != answered {
            return Err(bad(format!(
                "record.{in_record} {stated:?} differs from the answer's {in_answer} {answered:?}"
            )));
        }
    }
    Ok(())
}

/// A tier by the name a record states it, `none` included (unlike a floor).
pub(super) fn tier_named(name: &str) -> Option<Tier> {
    [
        Tier::None,
        Tier::Process,
        Tier::Container,
        Tier::Kernel,
        Tier::Vm,
    ]
    .into_iter()
    .find(|t| t.as_str() == name)
}

/// The tier the record states is one this code knows, and it meets the
/// floor the request asked for (a request with no floor asks for none).
fn meets_floor(rec: &RunRecord, req: &RunRequest) -> Result<(), AttestError> {
    let Some(tier) = tier_named(&rec.isolation) else {
        return Err(bad(format!(
            "record.isolation {:?} is not a tier name",
            rec.isolation
        )));
    };
    let floor = Tier::parse_floor(&req.minimum_isolation).map_err(|_| {
        bad(format!(
            "request.minimumIsolation {:?} is not a tier name, so no run answered it",
            req.minimum_isolation
        ))
    })?;
    if tier == Tier::None {
        return Err(bad(
            "record.isolation is none: nothing runs at that tier, so no run answered it".into(),
        ));
    }
    match floor {
        Some(floor) if !tier.meets(floor) => Err(bad(format!(
            "record.isolation {tier} is below the request's minimumIsolation {floor}"
        ))),
        _ => Ok(()),
    }
}

/// What the daemon refuses before anything runs, whatever its limits: a
/// record answering such a request says something that did not happen.
/// The rule's membership test is the floor check's (pipeline/floor.rs),
/// repeated here because a client has only the record's word for the
/// software that ran.
fn refused_unrun(req: &RunRequest, rec: &RunRecord, place: Place) -> Result<(), AttestError> {
    match (&req.cell, place) {
        (Some(_), Place::Run) => {
            return Err(bad(
                "request: a cell runs only inside a session; a Run never answers one".into(),
            ));
        }
        (Some(cell), Place::SessionCall)
            if !admission::CELL_LANGUAGES.contains(&cell.language.as_str()) =>
        {
            return Err(bad(format!(
                "request: no session runs {:?} cells",
                cell.language
            )));
        }
        _ => {}
    }

    if let Some(rule) = &req.software_rule {
        admission::validate_rule(rule)
            .map_err(|r| bad(format!("request.softwareRule: {}", r.message)))?;
        if rec.software_identity.is_empty() || !rule.identities.contains(&rec.software_identity) {
            return Err(bad(format!(
                "record.softwareIdentity {:?} is not in the request's software rule",
                rec.software_identity
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
