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
mod file;
mod tail;
mod verify;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::AttestError;

pub use append::{Appender, Checked, Durability, append_run};
pub use tail::{Repaired, repair};
pub use verify::{HeldRun, verified_runs, verify, verify_bytes};

/// A run statement's subject: the run record, by its own digest.
const RECORD_SUBJECT: &str = "run-record";
/// A checkpoint's subject: the line it closes the bundle after.
const LINE_SUBJECT: &str = "bundle-line";
const KIND_RUN: &str = "run";
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

/// What a checkpoint's statement says besides the last run line's digest.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CheckpointPredicate {
    line: u64,
    /// How many runs the bundle holds before the checkpoint.
    entries: u64,
}

/// Whether others may read the bundle file.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// Owner only (0600): anything else is refused.
    Private,
    /// The caller asked for a bundle others can read.
    Shared,
}

/// What a verifier was told to expect of the runs in a bundle.
pub enum Expect {
    Nothing,
    /// Exactly this many runs.
    Count(usize),
    /// These request digests, each as many times as listed.
    Requests(Vec<String>),
}

/// What a bundle that verified holds.
#[derive(Debug, PartialEq, Eq)]
pub struct Verified {
    pub runs: usize,
    /// Runs whose answer carries the daemon's receipt (each checked, if
    /// the daemon's key was given).
    pub receipts: usize,
    /// Request digests of the runs, in order.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_lines_have_their_keys_sorted() {
        let v: Value = serde_json::from_str(r#"{"b":1,"a":{"d":2,"c":3}}"#).expect("json");
        assert_eq!(canonical(&v), br#"{"a":{"c":3,"d":2},"b":1}"#);
    }
}
