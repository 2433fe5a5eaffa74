//! DSSE, the Dead Simple Signing Envelope (secure-systems-lab/dsse v1): a
//! payload, its type, and signatures over both.
//!
//! The signature covers the pre-authentication encoding of the type and the
//! payload bytes, never the JSON around them, so the envelope can be
//! re-serialized freely, and the type is signed too: a payload cannot be
//! passed off as another kind of document. The payload returned by `verify`
//! is the very bytes whose signature was checked, so a caller never parses
//! anything that was not signed.

use base64::Engine as _;
use base64::alphabet;
use base64::engine::general_purpose::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use serde::{Deserialize, Serialize};

use super::AttestError;
use super::keys::{SigningKey, VerifyingKey};

/// The JSON envelope. Fields it does not know are ignored on reading, as
/// DSSE asks of consumers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The payload in standard padded base64 (either alphabet, padded or
    /// not, is accepted on reading, as DSSE requires of verifiers).
    pub payload: String,
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    pub signatures: Vec<Signature>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    /// Which key signed: a hint only, used to pick the signature to check,
    /// never trusted by itself. DSSE lets it be absent, which reads as "".
    #[serde(default)]
    pub keyid: String,
    /// The signature in standard padded base64.
    pub sig: String,
}

/// DSSE's pre-authentication encoding: "DSSEv1" SP LEN(type) SP type SP
/// LEN(body) SP body, lengths as ASCII decimal.
///
/// The lengths make the split between type and body unambiguous, so no two
/// (type, body) pairs encode alike.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let type_len = payload_type.len().to_string();
    let body_len = payload.len().to_string();
    let mut out = Vec::with_capacity(
        10 + type_len.len() + payload_type.len() + body_len.len() + payload.len(),
    );
    out.extend_from_slice(b"DSSEv1 ");
    out.extend_from_slice(type_len.as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload_type.as_bytes());
    out.push(b' ');
    out.extend_from_slice(body_len.as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload);
    out
}

impl Envelope {
    /// An envelope holding `payload`, signed once by `key`.
    pub fn sign(key: &SigningKey, payload_type: &str, payload: &[u8]) -> Envelope {
        let sig = key.sign(&pae(payload_type, payload));
        Envelope {
            payload: STANDARD.encode(payload),
            payload_type: payload_type.to_string(),
            signatures: vec![Signature {
                keyid: key.key_id().to_string(),
                sig: STANDARD.encode(sig),
            }],
        }
    }

    /// The payload, if a signature whose keyid is `key`'s verifies over the
    /// PAE of (payloadType, payload). Signatures by other keys are ignored
    /// (an envelope may carry several); none by this key, or one that
    /// fails, is AttestError::Signature. Malformed base64 is Format.
    ///
    /// A signature with no keyid is tried too (DSSE makes the keyid
    /// optional) and counts if it verifies; one that does not may be any
    /// other signer's, so it is passed over.
    pub fn verify(&self, key: &VerifyingKey) -> Result<Vec<u8>, AttestError> {
        let payload = decode_base64(&self.payload).map_err(|e| {
            AttestError::Format(format!("the envelope's payload is not base64: {e}"))
        })?;
        let message = pae(&self.payload_type, &payload);
        let mut verified = false;
        for signature in &self.signatures {
            let tagged = signature.keyid == key.key_id();
            if !tagged && !signature.keyid.is_empty() {
                continue;
            }
            let sig = decode_base64(&signature.sig).map_err(|e| {
                AttestError::Format(format!("a signature in the envelope is not base64: {e}"))
            })?;
            if key.verify(&message, &sig) {
                verified = true;
            } else if tagged {
                return Err(AttestError::Signature(format!(
                    "the envelope's signature by key {} does not verify",
                    key.key_id()
                )));
            }
        }
        if verified {
            Ok(payload)
        } else {
            Err(AttestError::Signature(format!(
                "the envelope holds no signature by key {}",
                key.key_id()
            )))
        }
    }
}

/// Decoding for reading: DSSE verifiers must take standard and URL-safe
/// base64 alike, and padding is not always present.
const STANDARD_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
const URL_SAFE_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Standard or URL-safe base64, padded or not. The two alphabets differ only
/// in the characters for 62 and 63, so whichever of them appears picks the
/// alphabet; a text mixing both is refused.
fn decode_base64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    if text.bytes().any(|b| b == b'-' || b == b'_') {
        URL_SAFE_LENIENT.decode(text)
    } else {
        STANDARD_LENIENT.decode(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attest::keys::ephemeral;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    const TYPE: &str = "application/vnd.example+json";

    #[test]
    fn pae_matches_the_dsse_vector() {
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
        assert_eq!(pae("", b""), b"DSSEv1 0  0 ".to_vec());
        // Lengths count bytes, not characters.
        assert_eq!(pae("é", b"\x00"), b"DSSEv1 2 \xc3\xa9 1 \x00".to_vec());
    }

    #[test]
    fn sign_then_verify_returns_the_payload() {
        let key = ephemeral();
        let env = Envelope::sign(&key, TYPE, b"{\"a\":1}");
        assert_eq!(env.payload, STANDARD.encode(b"{\"a\":1}"));
        assert_eq!(env.payload_type, TYPE);
        assert_eq!(env.signatures.len(), 1);
        assert_eq!(env.signatures[0].keyid, key.key_id());
        assert_eq!(env.verify(&key.public()).unwrap(), b"{\"a\":1}");
    }

    #[test]
    fn the_json_form_is_dsse_and_survives_a_round_trip() {
        let key = ephemeral();
        let env = Envelope::sign(&key, TYPE, b"body");
        let json = serde_json::to_value(&env).unwrap();
        assert_eq!(json["payloadType"], TYPE);
        assert_eq!(json["payload"], "Ym9keQ==");
        assert_eq!(json["signatures"][0]["keyid"], key.key_id());
        let back: Envelope = serde_json::from_value(json).unwrap();
        assert_eq!(back, env);
        assert_eq!(back.verify(&key.public()).unwrap(), b"body");
    }

    #[test]
    fn unknown_fields_are_ignored_and_a_missing_keyid_reads_as_empty() {
        let key = ephemeral();
        let env = Envelope::sign(&key, TYPE, b"body");
        let json = serde_json::json!({
            "payload": env.payload,
            "payloadType": env.payload_type,
            "signatures": [{"sig": env.signatures[0].sig, "extra": 1}],
            "extra": "ignored",
        });
        let back: Envelope = serde_json::from_value(json).unwrap();
        assert_eq!(back.signatures[0].keyid, "");
        // An unlabelled signature that verifies counts.
        assert_eq!(back.verify(&key.public()).unwrap(), b"body");
        // One that does not is someone else's, and there is none of ours.
        let other = ephemeral();
        assert!(matches!(
            back.verify(&other.public()),
            Err(AttestError::Signature(_))
        ));
    }

    #[test]
    fn a_tampered_payload_is_refused() {
        let key = ephemeral();
        let mut env = Envelope::sign(&key, TYPE, b"the real body");
        env.payload = STANDARD.encode(b"another body");
        assert!(matches!(
            env.verify(&key.public()),
            Err(AttestError::Signature(_))
        ));
    }

    #[test]
    fn a_tampered_payload_type_is_refused() {
        let key = ephemeral();
        let mut env = Envelope::sign(&key, TYPE, b"body");
        env.payload_type = "application/vnd.other+json".to_string();
        assert!(matches!(
            env.verify(&key.public()),
            Err(AttestError::Signature(_))
        ));
    }

    #[test]
    fn a_signature_by_another_key_is_refused() {
        let key = ephemeral();
        let other = ephemeral();
        let env = Envelope::sign(&other, TYPE, b"body");
        assert!(matches!(
            env.verify(&key.public()),
            Err(AttestError::Signature(_))
        ));
        // Relabelled with our key ID, it still does not verify.
        let mut relabelled = env.clone();
        relabelled.signatures[0].keyid = key.key_id().to_string();
        assert!(matches!(
            relabelled.verify(&key.public()),
            Err(AttestError::Signature(_))
        ));
    }

    #[test]
    fn a_flipped_signature_byte_is_refused() {
        let key = ephemeral();
        let mut env = Envelope::sign(&key, TYPE, b"body");
        let mut sig = STANDARD.decode(&env.signatures[0].sig).unwrap();
        sig[0] ^= 0x01;
        env.signatures[0].sig = STANDARD.encode(sig);
        assert!(matches!(
            env.verify(&key.public()),
            Err(AttestError::Signature(_))
        ));
    }

    #[test]
    fn an_envelope_with_no_signatures_is_refused() {
        let key = ephemeral();
        let mut env = Envelope::sign(&key, TYPE, b"body");
        env.signatures.clear();
        assert!(matches!(
            env.verify(&key.public()),
            Err(AttestError::Signature(_))
        ));
    }

    #[test]
    fn other_signers_are_ignored_and_each_key_finds_its_own() {
        let first = ephemeral();
        let second = ephemeral();
        let mut env = Envelope::sign(&first, TYPE, b"body");
        let theirs = Envelope::sign(&second, TYPE, b"body");
        env.signatures.extend(theirs.signatures);
        assert_eq!(env.verify(&first.public()).unwrap(), b"body");
        assert_eq!(env.verify(&second.public()).unwrap(), b"body");
        // Another signer's signature being malformed does not matter to us.
        env.signatures[1].sig = "%%%".to_string();
        assert_eq!(env.verify(&first.public()).unwrap(), b"body");
    }

    #[test]
    fn malformed_base64_is_a_format_error() {
        let key = ephemeral();
        let mut env = Envelope::sign(&key, TYPE, b"body");
        env.payload = "not base64!".to_string();
        assert!(matches!(
            env.verify(&key.public()),
            Err(AttestError::Format(_))
        ));
        let mut env = Envelope::sign(&key, TYPE, b"body");
        env.signatures[0].sig = "%%%".to_string();
        assert!(matches!(
            env.verify(&key.public()),
            Err(AttestError::Format(_))
        ));
    }

    #[test]
    fn url_safe_unpadded_base64_is_accepted() {
        let key = ephemeral();
        // A payload whose standard base64 has '+' or '/' and padding, so the
        // URL-safe form differs from it.
        let payload = [0xfb_u8, 0xff, 0xfe, 0x01];
        let mut env = Envelope::sign(&key, TYPE, &payload);
        let sig = STANDARD.decode(&env.signatures[0].sig).unwrap();
        env.payload = URL_SAFE_NO_PAD.encode(payload);
        env.signatures[0].sig = URL_SAFE_NO_PAD.encode(sig);
        assert_ne!(env.payload, STANDARD.encode(payload));
        assert_eq!(env.verify(&key.public()).unwrap(), payload.to_vec());
    }
}
