//! The bundle: an append-only JSON Lines file of signed runs that anyone
//! holding the signer's public key can check later, line by line.
//!
//! Each run is one line holding the request as sent, the answer as
//! received, and the run record signed as an in-toto statement. Every line
//! also carries a signed link: the digest of the line itself and of the
//! line before it, so a line removed, moved, added or changed breaks the
//! chain at that point. The last line is a checkpoint, linked the same way
//! and stating how many runs came before it: a bundle cut short has lost
//! its checkpoint, and only the key's holder can write a new one.
//!
//! Lines are in one canonical form (compact JSON, object keys sorted, as
//! `serde_json::Value` writes them), so a line's digest is over exactly
//! the bytes in the file and a verifier can refuse any other encoding.
//!
//! `append` writes a bundle (one run at a time, reading only its end);
//! `verify` reads one whole.

mod append;
mod verify;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::AttestError;
use super::keys::SigningKey;
use super::statement::{self, BUNDLE_LINK};

pub use append::append_run;
pub use verify::{verify, verify_bytes};

/// The link statement's subject: the line it belongs to.
const LINE_SUBJECT: &str = "bundle-line";
/// The record statement's subject: the run record, by its own digest.
const RECORD_SUBJECT: &str = "run-record";
const KIND_RUN: &str = "run";
const KIND_CHECKPOINT: &str = "checkpoint";

/// What a line's link states besides the line's own digest.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LinkPredicate {
    line: u64,
    /// SHA-256 of the previous line's bytes; empty for the first line.
    previous_line_sha256: String,
}

/// What a record statement carries: the record as the daemon answered it.
#[derive(Serialize, Deserialize)]
struct RecordPredicate {
    record: Value,
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
    /// Request digests of the runs, in order.
    pub requests: Vec<String>,
}

/// `fields` with its link: the link signs the line as it is without one.
fn signed_line(
    key: &SigningKey,
    mut fields: Map<String, Value>,
    number: u64,
    previous: &str,
) -> Result<Vec<u8>, AttestError> {
    let unlinked = canonical(&Value::Object(fields.clone()));
    let link = statement::sign(
        key,
        LINE_SUBJECT,
        &sha256_hex(&unlinked),
        BUNDLE_LINK,
        &LinkPredicate {
            line: number,
            previous_line_sha256: previous.to_string(),
        },
    )?;
    fields.insert("link".into(), to_value(&link));
    Ok(canonical(&Value::Object(fields)))
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
