//! Daemon receipts: the daemon's own signature on each record it seals.
//!
//! A client's signature says what the client was answered; a receipt says
//! what the daemon vouched for, with a key only the operator holds. A
//! bundle carrying both shows the two agreed. The receipt travels as a
//! `receipt` field beside the answer's record, which clients that do not
//! know it skip (the published one reads fields by name), and Describe
//! states the key's ID, so a client can tell which key to expect.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AttestError;
use super::dsse::Envelope;
use super::keys::{SigningKey, VerifyingKey};
use super::statement::{self, PAYLOAD_TYPE, RUN_RECEIPT, SESSION_CLOSE_RECEIPT, is_sha256_hex};
use crate::env_vars::{ConfigError, Env, Var, invalid, var};
use crate::wire::{CloseSessionResponse, RunRecord};

const KEY_VAR: &str = "PLIMSOLL_RECORD_SIGNING_KEY";

pub const VARIABLES: &[Var] = &[var(
    KEY_VAR,
    "(unset: records are not signed)",
    "an Ed25519 private key (PKCS#8 PEM) in a file only the daemon's user may read: each record the daemon seals is signed with it, the DSSE envelope returned beside the answer as `receipt`, the key's ID stated in Describe (docs/attest.md)",
)];

/// A receipt's subject: the record, by its own digest.
const SUBJECT: &str = "run-record";

/// A close receipt's subject: the session, by its fingerprint.
const CLOSE_SUBJECT: &str = "session";

/// What a close receipt states besides the fingerprint: the close answer,
/// less the receipt itself.
#[derive(Serialize, Deserialize)]
struct ClosePredicate {
    closed: Value,
}

/// What a receipt states besides the record's digest.
#[derive(Serialize, Deserialize)]
struct ReceiptPredicate {
    record: Value,
}

/// The daemon's signing key for receipts.
#[derive(Debug)]
pub struct Receipts {
    key: SigningKey,
}

impl Receipts {
    /// The key `PLIMSOLL_RECORD_SIGNING_KEY` names, if set. A key that does
    /// not load, or a file others may read, stops the daemon at start.
    pub fn from_env(env: &Env) -> Result<Option<Receipts>, ConfigError> {
        let Some(path) = env.get(KEY_VAR) else {
            return Ok(None);
        };
        // The error names the problem, never the key's bytes.
        let key = SigningKey::load(Path::new(path)).map_err(|e| invalid(KEY_VAR, e.to_string()))?;
        Ok(Some(Receipts { key }))
    }

    pub fn key_id(&self) -> &str {
        self.key.key_id()
    }

    /// The receipt for `record`, as the JSON the answer carries. None only
    /// if the record's digest is not one (which sealing never makes).
    pub fn sign(&self, record: &RunRecord) -> Option<Value> {
        let predicate = ReceiptPredicate {
            record: serde_json::to_value(record).ok()?,
        };
        let envelope = statement::sign(
            &self.key,
            SUBJECT,
            &record.record_sha256,
            RUN_RECEIPT,
            &predicate,
        )
        .ok()?;
        serde_json::to_value(envelope).ok()
    }
}

impl Receipts {
    /// The receipt for a session's close: the calls the daemon counted and
    /// the last record's digest, so a bundle cannot lose calls from the
    /// end of a session and still show a close that accounts for them.
    pub fn sign_close(&self, closed: &CloseSessionResponse) -> Option<Value> {
        let mut stated = serde_json::to_value(closed).ok()?;
        stated.as_object_mut()?.remove("receipt");
        let envelope = statement::sign(
            &self.key,
            CLOSE_SUBJECT,
            &closed.session,
            SESSION_CLOSE_RECEIPT,
            &ClosePredicate { closed: stated },
        )
        .ok()?;
        serde_json::to_value(envelope).ok()
    }
}

/// A close receipt checks: signed by `key`, over the close answer `closed`
/// as it was carried (its `receipt` aside) and the session it names.
pub fn check_close(receipt: &Value, key: &VerifyingKey, closed: &Value) -> Result<(), AttestError> {
    let envelope: Envelope = serde_json::from_value(receipt.clone())
        .map_err(|e| AttestError::Format(format!("the close receipt: {e}")))?;
    let (fingerprint, stated): (String, ClosePredicate) =
        statement::open(&envelope, key, CLOSE_SUBJECT, SESSION_CLOSE_RECEIPT)?;
    let mut answered = closed.clone();
    if let Some(o) = answered.as_object_mut() {
        o.remove("receipt");
    }
    let named = closed.get("session").and_then(Value::as_str);
    if Some(fingerprint.as_str()) != named || stated.closed != answered {
        return Err(AttestError::Record(
            "the daemon's close receipt is for another close".into(),
        ));
    }
    Ok(())
}

/// A receipt carried where no daemon key is at hand to check it: it must be
/// the envelope this daemon signs for this record in every byte but the
/// signature's (one signature, by a key named by a digest, of an Ed25519
/// signature's length), so nothing else rides along under its name into
/// what a signer keeps. `check` then checks the signature, given the key.
pub fn check_form(receipt: &Value, record: &RunRecord) -> Result<(), AttestError> {
    let predicate = ReceiptPredicate {
        record: serde_json::to_value(record)
            .map_err(|e| AttestError::Format(format!("the record: {e}")))?,
    };
    form(
        receipt,
        SUBJECT,
        &record.record_sha256,
        RUN_RECEIPT,
        &predicate,
    )
}

/// `check_form` for a session close's receipt.
pub fn check_close_form(receipt: &Value, closed: &CloseSessionResponse) -> Result<(), AttestError> {
    let mut stated =
        serde_json::to_value(closed).map_err(|e| AttestError::Format(format!("the close: {e}")))?;
    if let Some(o) = stated.as_object_mut() {
        o.remove("receipt");
    }
    let predicate = ClosePredicate { closed: stated };
    form(
        receipt,
        CLOSE_SUBJECT,
        &closed.session,
        SESSION_CLOSE_RECEIPT,
        &predicate,
    )
}

fn form<P: Serialize>(
    receipt: &Value,
    subject: &str,
    digest: &str,
    predicate_type: &str,
    predicate: &P,
) -> Result<(), AttestError> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let envelope: Envelope = serde_json::from_value(receipt.clone())
        .map_err(|e| AttestError::Format(format!("the receipt: {e}")))?;
    if serde_json::to_value(&envelope).ok().as_ref() != Some(receipt) {
        return Err(AttestError::Format(
            "the receipt holds fields a receipt has not".into(),
        ));
    }
    let expected = statement::payload(subject, digest, predicate_type, predicate)?;
    if envelope.payload_type != PAYLOAD_TYPE || envelope.payload != b64.encode(expected) {
        return Err(AttestError::Record(
            "the receipt is not the daemon's statement about this answer".into(),
        ));
    }
    let [signature] = envelope.signatures.as_slice() else {
        return Err(AttestError::Format("a receipt holds one signature".into()));
    };
    let length = b64.decode(&signature.sig).map(|s| s.len());
    if !is_sha256_hex(&signature.keyid) || length != Ok(64) {
        return Err(AttestError::Format(
            "the receipt's signature is not one Ed25519 signature by a key named by its digest"
                .into(),
        ));
    }
    Ok(())
}

/// A receipt checks: signed by `key`, over the record `record` (as the
/// answer carried it) and its digest.
pub fn check(receipt: &Value, key: &VerifyingKey, record: &Value) -> Result<(), AttestError> {
    let envelope: Envelope = serde_json::from_value(receipt.clone())
        .map_err(|e| AttestError::Format(format!("the receipt: {e}")))?;
    let (digest, stated): (String, ReceiptPredicate) =
        statement::open(&envelope, key, SUBJECT, RUN_RECEIPT)?;
    let named = record.get("recordSha256").and_then(Value::as_str);
    if Some(digest.as_str()) != named || &stated.record != record {
        return Err(AttestError::Record(
            "the daemon's receipt is for another record".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attest::keys::ephemeral;

    fn record(digest: char) -> RunRecord {
        RunRecord {
            version: 2,
            isolation: "process".into(),
            record_sha256: digest.to_string().repeat(64),
            ..Default::default()
        }
    }

    #[test]
    fn a_receipt_checks_for_its_record_and_key_only() {
        let receipts = Receipts { key: ephemeral() };
        let rec = record('a');
        let json = serde_json::to_value(&rec).expect("json");
        let receipt = receipts.sign(&rec).expect("signed");
        check(&receipt, &receipts.key.public(), &json).expect("checks");

        let other = ephemeral();
        assert!(matches!(
            check(&receipt, &other.public(), &json),
            Err(AttestError::Signature(_))
        ));
        let mut moved = json.clone();
        moved["isolation"] = "vm".into();
        assert!(matches!(
            check(&receipt, &receipts.key.public(), &moved),
            Err(AttestError::Record(_))
        ));
        let elsewhere = serde_json::to_value(record('b')).expect("json");
        assert!(check(&receipt, &receipts.key.public(), &elsewhere).is_err());
    }
}
