//! Verifying a bundle: every line's link, every run's signed record
//! checked against its request and answer, the checkpoint at the end, and
//! what the caller expected of the runs.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde_json::{Map, Value};

use super::append::Checked;
use super::{
    CheckpointPredicate, Expect, KIND_CHECKPOINT, KIND_RUN, LINE_SUBJECT, RECORD_SUBJECT,
    RunPredicate, SIGNED, Verified, canonical, io_error, prefixed, sha256_hex,
};
use crate::attest::AttestError;
use crate::attest::dsse::Envelope;
use crate::attest::keys::VerifyingKey;
use crate::attest::receipts;
use crate::attest::statement::{self, BUNDLE_CHECKPOINT, RUN_RECORD};

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

/// A run as a bundle that verified holds it: what to send again, and the
/// result digest it was answered with.
pub struct HeldRun {
    pub request: Value,
    pub result_sha256: String,
}

/// The runs of the bundle at `path`, in order, once every line of it has
/// verified with `key`. The file is read once: what is replayed is exactly
/// what was verified.
pub fn verified_runs(path: &Path, key: &VerifyingKey) -> Result<Vec<HeldRun>, AttestError> {
    let bytes = read_bundle(path)?;
    verify_bytes(&bytes, key, None)?;
    let mut runs = Vec::new();
    for raw in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let line: Value = serde_json::from_slice(raw)
            .map_err(|e| AttestError::Format(format!("a verified line is not JSON: {e}")))?;
        if line.get("kind").and_then(Value::as_str) != Some(KIND_RUN) {
            continue;
        }
        let result_sha256 = line["response"]["record"]["resultSha256"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        runs.push(HeldRun {
            request: line["request"].clone(),
            result_sha256,
        });
    }
    Ok(runs)
}

/// The largest bundle read: far past any batch of runs (a run line holds at
/// most an 8 MiB request and its answer), and short of exhausting memory.
const MAX_BUNDLE_BYTES: u64 = 4 << 30;

/// The bundle's bytes, from a regular file only (opened without blocking,
/// so a FIFO or a device named as a bundle is refused, not waited on or
/// read forever), and no more than `MAX_BUNDLE_BYTES`.
fn read_bundle(path: &Path) -> Result<Vec<u8>, AttestError> {
    let shown = path.display();
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| io_error(&format!("opening {shown}"), e))?;
    let meta = file
        .metadata()
        .map_err(|e| io_error(&format!("reading {shown}"), e))?;
    if !meta.is_file() {
        return Err(AttestError::Format(format!(
            "{shown} is not a regular file"
        )));
    }
    let mut bytes = Vec::new();
    file.take(MAX_BUNDLE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(&format!("reading {shown}"), e))?;
    if bytes.len() as u64 > MAX_BUNDLE_BYTES {
        return Err(AttestError::Format(format!(
            "{shown} is larger than any bundle this reads ({} GiB)",
            MAX_BUNDLE_BYTES >> 30
        )));
    }
    Ok(bytes)
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
    let mut after_run = false;
    let mut verified = Verified {
        runs: 0,
        receipts: 0,
        requests: Vec::new(),
    };
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
                let receipt = check_receipt(&fields, daemon).map_err(|e| prefixed(e, number))?;
                verified.receipts += usize::from(receipt);
                verified.runs += 1;
                verified.requests.push(request);
            }
            // A checkpoint follows each append's run; every one is checked,
            // though only the last closes the bundle.
            Some(KIND_CHECKPOINT) if after_run => {
                check_checkpoint(&fields, key, number, &previous, verified.runs)
                    .map_err(|e| prefixed(e, number))?;
            }
            Some(KIND_CHECKPOINT) => {
                return Err(AttestError::Format(at(
                    "a checkpoint that follows no run".into()
                )));
            }
            _ => return Err(AttestError::Format(at("an unknown kind of line".into()))),
        }
        previous = sha256_hex(raw);
        after_run = kind == Some(KIND_RUN);
        if last && fields.get("kind").and_then(Value::as_str) != Some(KIND_CHECKPOINT) {
            return Err(AttestError::Incomplete(
                "the bundle has no checkpoint at its end: it was cut short or never closed".into(),
            ));
        }
    }
    Ok(verified)
}

/// The keys a line of each kind holds, in the canonical (sorted) order:
/// nothing unsigned can ride along on a line.
fn line_keys(kind: &str) -> Option<&'static [&'static str]> {
    match kind {
        KIND_RUN => Some(&["kind", "line", "procedure", "request", "response", SIGNED]),
        KIND_CHECKPOINT => Some(&["entries", "kind", "line", SIGNED]),
        _ => None,
    }
}

/// The runs a bundle holds against what the caller expected: a batch with
/// runs missing fails here even when every line it holds is good.
fn check_expected(v: &Verified, expect: &Expect) -> Result<(), AttestError> {
    match expect {
        Expect::Nothing => Ok(()),
        Expect::Count(n) if *n == v.runs => Ok(()),
        Expect::Count(n) => Err(AttestError::Incomplete(format!(
            "expected {n} runs, the bundle holds {}",
            v.runs
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
/// before it, with as many runs as the bundle holds.
fn check_checkpoint(
    fields: &Map<String, Value>,
    key: &VerifyingKey,
    number: u64,
    previous: &str,
    runs: usize,
) -> Result<(), AttestError> {
    let (last_line, stated): (String, CheckpointPredicate) =
        statement::open(&signed(fields)?, key, LINE_SUBJECT, BUNDLE_CHECKPOINT)?;
    placed(stated.line, &last_line, number, previous)?;
    let written = fields.get("entries").and_then(Value::as_u64);
    if stated.entries != runs as u64 || written != Some(stated.entries) {
        return Err(AttestError::Incomplete(
            "the checkpoint's count is not the number of runs before it".into(),
        ));
    }
    Ok(())
}

/// A run's receipt, checked with the daemon's key when one is given (then
/// a run without one is refused). Says whether the run carries one.
fn check_receipt(
    fields: &Map<String, Value>,
    daemon: Option<&VerifyingKey>,
) -> Result<bool, AttestError> {
    let response = fields.get("response");
    let receipt = response.and_then(|r| r.get("receipt"));
    match (receipt, daemon) {
        (Some(receipt), Some(key)) => {
            let record = response
                .and_then(|r| r.get("record"))
                .unwrap_or(&Value::Null);
            receipts::check(receipt, key, record)?;
            Ok(true)
        }
        (None, Some(_)) => Err(AttestError::Record(
            "the answer carries no receipt from the daemon".into(),
        )),
        (receipt, None) => Ok(receipt.is_some()),
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
