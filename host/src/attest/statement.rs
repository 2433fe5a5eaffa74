//! in-toto Statement v1 (in-toto/attestation, spec/v1): what is being
//! attested (the subject, named and digested) and a typed predicate saying
//! what is claimed about it, carried as the payload of a DSSE envelope.
//!
//! Each run record is a statement whose subject is the record's own digest,
//! so a checker holding the record can tie the signature to it without
//! trusting anything else in the bundle.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::AttestError;
use super::dsse::Envelope;
use super::keys::{SigningKey, VerifyingKey};

pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// Our predicate types (URNs: we own no domain to put them under).
pub const RUN_RECORD: &str = "urn:plimsoll:attest:run-record:v1";
pub const SESSION_OPEN: &str = "urn:plimsoll:attest:session-open:v1";
pub const SESSION_CLOSE: &str = "urn:plimsoll:attest:session-close:v1";
pub const BUNDLE_CHECKPOINT: &str = "urn:plimsoll:attest:bundle-checkpoint:v1";
/// A daemon's receipt for a record it sealed (`receipts`).
pub const RUN_RECEIPT: &str = "urn:plimsoll:attest:run-receipt:v1";
/// A daemon's receipt for a session's close: the calls it counted.
pub const SESSION_CLOSE_RECEIPT: &str = "urn:plimsoll:attest:session-close-receipt:v1";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Statement<P> {
    #[serde(rename = "_type")]
    pub statement_type: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: P,
}

/// One attested artifact: a name and its digests by algorithm.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subject {
    pub name: String,
    pub digest: BTreeMap<String, String>,
}

/// A Statement about one subject (name, sha256 hex), signed into a DSSE
/// envelope with PAYLOAD_TYPE. The payload is serde_json compact bytes of
/// the statement.
///
/// A digest that is not 64 lowercase hex characters is refused here, so
/// nothing is signed that `open` would then refuse.
pub fn sign<P: Serialize>(
    key: &SigningKey,
    subject_name: &str,
    sha256_hex: &str,
    predicate_type: &str,
    predicate: &P,
) -> Result<Envelope, AttestError> {
    if !is_sha256_hex(sha256_hex) {
        return Err(AttestError::Format(format!(
            "the subject's digest {sha256_hex:?} is not 64 lowercase hex characters"
        )));
    }
    let payload = payload(subject_name, sha256_hex, predicate_type, predicate)?;
    Ok(Envelope::sign(key, PAYLOAD_TYPE, &payload))
}

/// The statement's bytes as `sign` signs them: one encoding, so a checker
/// can rebuild the payload it expects and compare.
pub fn payload<P: Serialize>(
    subject_name: &str,
    sha256_hex: &str,
    predicate_type: &str,
    predicate: &P,
) -> Result<Vec<u8>, AttestError> {
    let statement = Statement {
        statement_type: STATEMENT_TYPE.to_string(),
        subject: vec![Subject {
            name: subject_name.to_string(),
            digest: BTreeMap::from([("sha256".to_string(), sha256_hex.to_string())]),
        }],
        predicate_type: predicate_type.to_string(),
        predicate,
    };
    serde_json::to_vec(&statement)
        .map_err(|e| AttestError::Format(format!("the statement does not serialize: {e}")))
}

/// Verifies the envelope with `key`, then requires payloadType ==
/// PAYLOAD_TYPE, _type == STATEMENT_TYPE, predicateType == `predicate_type`,
/// exactly one subject named `subject_name` whose digest map is exactly
/// {"sha256": 64 lowercase hex}; returns (that sha256 hex, the predicate).
///
/// Everything is read from the payload bytes the signature was checked
/// over; the signature is checked before any of them is parsed.
pub fn open<P: DeserializeOwned>(
    envelope: &Envelope,
    key: &VerifyingKey,
    subject_name: &str,
    predicate_type: &str,
) -> Result<(String, P), AttestError> {
    let payload = envelope.verify(key)?;
    if envelope.payload_type != PAYLOAD_TYPE {
        return Err(AttestError::Format(format!(
            "the envelope's payloadType is {:?}, not {PAYLOAD_TYPE:?}",
            envelope.payload_type
        )));
    }
    let statement: Statement<P> = serde_json::from_slice(&payload).map_err(|e| {
        AttestError::Format(format!(
            "the payload is not an in-toto statement of this kind: {e}"
        ))
    })?;
    if statement.statement_type != STATEMENT_TYPE {
        return Err(AttestError::Format(format!(
            "the statement's _type is {:?}, not {STATEMENT_TYPE:?}",
            statement.statement_type
        )));
    }
    if statement.predicate_type != predicate_type {
        return Err(AttestError::Format(format!(
            "the statement's predicateType is {:?}, not {predicate_type:?}",
            statement.predicate_type
        )));
    }
    let [subject] = statement.subject.as_slice() else {
        return Err(AttestError::Format(format!(
            "the statement has {} subjects, not one",
            statement.subject.len()
        )));
    };
    if subject.name != subject_name {
        return Err(AttestError::Format(format!(
            "the statement's subject is {:?}, not {subject_name:?}",
            subject.name
        )));
    }
    let sha256 = match subject.digest.get("sha256") {
        Some(value) if subject.digest.len() == 1 && is_sha256_hex(value) => value.clone(),
        _ => {
            return Err(AttestError::Format(format!(
                "the subject's digest is not exactly one sha256 of 64 lowercase hex characters: {:?}",
                subject.digest
            )));
        }
    };
    Ok((sha256, statement.predicate))
}

/// 64 characters of 0-9 and a-f: the one spelling of a SHA-256 digest we
/// write, so two spellings of one digest can never both pass.
pub(crate) fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attest::keys::ephemeral;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Claim {
        tier: String,
        runs: u32,
    }

    fn claim() -> Claim {
        Claim {
            tier: "container".to_string(),
            runs: 3,
        }
    }

    const DIGEST: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// Signs a hand-made statement, to reach what `sign` would never write.
    fn seal(key: &SigningKey, statement: serde_json::Value) -> Envelope {
        Envelope::sign(key, PAYLOAD_TYPE, &serde_json::to_vec(&statement).unwrap())
    }

    fn statement_with(subject: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "_type": STATEMENT_TYPE,
            "subject": subject,
            "predicateType": RUN_RECORD,
            "predicate": {"tier": "container", "runs": 3},
        })
    }

    #[test]
    fn sign_then_open_returns_the_digest_and_predicate() {
        let key = ephemeral();
        let env = sign(&key, "run-7", DIGEST, RUN_RECORD, &claim()).unwrap();
        assert_eq!(env.payload_type, PAYLOAD_TYPE);
        let (digest, predicate): (String, Claim) =
            open(&env, &key.public(), "run-7", RUN_RECORD).unwrap();
        assert_eq!(digest, DIGEST);
        assert_eq!(predicate, claim());
    }

    #[test]
    fn the_payload_is_an_in_toto_statement() {
        let key = ephemeral();
        let env = sign(&key, "run-7", DIGEST, RUN_RECORD, &claim()).unwrap();
        let payload = env.verify(&key.public()).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "_type": "https://in-toto.io/Statement/v1",
                "subject": [{"name": "run-7", "digest": {"sha256": DIGEST}}],
                "predicateType": "urn:plimsoll:attest:run-record:v1",
                "predicate": {"tier": "container", "runs": 3},
            })
        );
        // Compact: no value above holds white space, so none may appear.
        assert!(!payload.iter().any(|b| b.is_ascii_whitespace()));
    }

    #[test]
    fn a_wrong_predicate_type_is_refused() {
        let key = ephemeral();
        let env = sign(&key, "run-7", DIGEST, SESSION_CLOSE, &claim()).unwrap();
        let r: Result<(String, Claim), _> = open(&env, &key.public(), "run-7", RUN_RECORD);
        assert!(matches!(r, Err(AttestError::Format(_))), "{r:?}");
    }

    #[test]
    fn a_wrong_subject_name_is_refused() {
        let key = ephemeral();
        let env = sign(&key, "run-7", DIGEST, RUN_RECORD, &claim()).unwrap();
        let r: Result<(String, Claim), _> = open(&env, &key.public(), "run-8", RUN_RECORD);
        assert!(matches!(r, Err(AttestError::Format(_))), "{r:?}");
    }

    #[test]
    fn two_subjects_are_refused() {
        let key = ephemeral();
        let one = serde_json::json!({"name": "run-7", "digest": {"sha256": DIGEST}});
        let env = seal(
            &key,
            statement_with(serde_json::json!([one.clone(), one.clone()])),
        );
        let r: Result<(String, Claim), _> = open(&env, &key.public(), "run-7", RUN_RECORD);
        assert!(matches!(r, Err(AttestError::Format(_))), "{r:?}");
        // The same statement with the one subject opens: the refusal above
        // is the count, nothing else.
        let env = seal(&key, statement_with(serde_json::json!([one])));
        let r: Result<(String, Claim), _> = open(&env, &key.public(), "run-7", RUN_RECORD);
        assert_eq!(r.unwrap().0, DIGEST);
    }

    #[test]
    fn a_digest_not_of_lowercase_hex_is_refused() {
        let key = ephemeral();
        let bad = [
            "z".repeat(64),
            DIGEST.to_uppercase(),
            DIGEST[..63].to_string(),
            format!("{DIGEST}0"),
        ];
        for digest in &bad {
            let subject = serde_json::json!([{"name": "run-7", "digest": {"sha256": digest}}]);
            let env = seal(&key, statement_with(subject));
            let r: Result<(String, Claim), _> = open(&env, &key.public(), "run-7", RUN_RECORD);
            assert!(matches!(r, Err(AttestError::Format(_))), "{digest}: {r:?}");
            // And `sign` will not write it in the first place.
            assert!(matches!(
                sign(&key, "run-7", digest, RUN_RECORD, &claim()),
                Err(AttestError::Format(_))
            ));
        }
    }

    #[test]
    fn a_digest_map_with_more_than_sha256_is_refused() {
        let key = ephemeral();
        let subject = serde_json::json!([{
            "name": "run-7",
            "digest": {"sha256": DIGEST, "sha512": DIGEST},
        }]);
        let env = seal(&key, statement_with(subject));
        let r: Result<(String, Claim), _> = open(&env, &key.public(), "run-7", RUN_RECORD);
        assert!(matches!(r, Err(AttestError::Format(_))), "{r:?}");
    }

    #[test]
    fn a_wrong_statement_type_or_payload_type_is_refused() {
        let key = ephemeral();
        let mut statement = statement_with(serde_json::json!([
            {"name": "run-7", "digest": {"sha256": DIGEST}}
        ]));
        statement["_type"] = serde_json::json!("https://in-toto.io/Statement/v0.1");
        let env = seal(&key, statement);
        let r: Result<(String, Claim), _> = open(&env, &key.public(), "run-7", RUN_RECORD);
        assert!(matches!(r, Err(AttestError::Format(_))), "{r:?}");

        let good = sign(&key, "run-7", DIGEST, RUN_RECORD, &claim()).unwrap();
        let payload = good.verify(&key.public()).unwrap();
        let env = Envelope::sign(&key, "application/json", &payload);
        let r: Result<(String, Claim), _> = open(&env, &key.public(), "run-7", RUN_RECORD);
        assert!(matches!(r, Err(AttestError::Format(_))), "{r:?}");
    }

    #[test]
    fn a_statement_signed_by_another_key_is_refused() {
        let key = ephemeral();
        let other = ephemeral();
        let env = sign(&other, "run-7", DIGEST, RUN_RECORD, &claim()).unwrap();
        let r: Result<(String, Claim), _> = open(&env, &key.public(), "run-7", RUN_RECORD);
        assert!(matches!(r, Err(AttestError::Signature(_))), "{r:?}");
    }
}
