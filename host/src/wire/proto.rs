//! The two session error details in protobuf's binary form, which Connect
//! error details carry (base64 in the JSON error body):
//!
//! - `plimsoll.v1.SessionEnded { SessionEnd reason = 1; string detail = 2; }`
//! - `plimsoll.v1.UnansweredCall { RunRecord record = 1; }`
//!
//! Three small messages do not justify a protobuf code generator; the
//! encoding below is the wire format's varint and length-delimited fields
//! only, and the published client's decoder is the test (tests/compat).

use super::{RunRecord, SessionEnd};

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

/// A varint field, left out at zero as proto3 does.
fn uint(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        tag(out, field, 0);
        varint(out, v);
    }
}

/// An int64 field: negative values are ten-byte two's complement varints.
fn int64(out: &mut Vec<u8>, field: u32, v: i64) {
    uint(out, field, v as u64);
}

/// A length-delimited field, left out when empty.
fn bytes(out: &mut Vec<u8>, field: u32, v: &[u8]) {
    if !v.is_empty() {
        tag(out, field, 2);
        varint(out, v.len() as u64);
        out.extend_from_slice(v);
    }
}

/// `SessionEnded { reason, detail }`.
pub fn session_ended_detail(reason: SessionEnd, detail: &str) -> Vec<u8> {
    let mut out = Vec::new();
    uint(&mut out, 1, reason as u64);
    bytes(&mut out, 2, detail.as_bytes());
    out
}

/// `UnansweredCall { record }`.
pub fn unanswered_detail(r: &RunRecord) -> Vec<u8> {
    let mut rec = Vec::new();
    uint(&mut rec, 1, u64::from(r.version));
    bytes(&mut rec, 2, r.request_sha256.as_bytes());
    bytes(&mut rec, 3, r.result_sha256.as_bytes());
    bytes(&mut rec, 4, r.provider.as_bytes());
    bytes(&mut rec, 5, r.isolation.as_bytes());
    bytes(&mut rec, 6, r.environment.as_bytes());
    bytes(&mut rec, 7, r.policy.as_bytes());
    int64(&mut rec, 8, r.started_unix_ms.0);
    int64(&mut rec, 9, r.ended_unix_ms.0);
    bytes(&mut rec, 10, r.session.as_bytes());
    uint(&mut rec, 11, r.sequence.0 as u64);
    bytes(&mut rec, 12, r.previous_sha256.as_bytes());
    bytes(&mut rec, 13, r.record_sha256.as_bytes());
    bytes(&mut rec, 14, r.software_identity.as_bytes());
    bytes(&mut rec, 15, r.software_rule_id.as_bytes());
    bytes(&mut rec, 16, r.unanswered.as_bytes());
    bytes(&mut rec, 17, r.instance.as_bytes());
    let mut out = Vec::new();
    bytes(&mut out, 1, &rec);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::I64;

    #[test]
    fn session_ended_is_an_enum_and_a_string() {
        assert_eq!(
            session_ended_detail(SessionEnd::Expired, "idle"),
            [0x08, 2, 0x12, 4, b'i', b'd', b'l', b'e']
        );
        assert_eq!(session_ended_detail(SessionEnd::Closed, ""), [0x08, 1]);
    }

    #[test]
    fn record_fields_past_fifteen_take_two_byte_tags() {
        let r = RunRecord {
            version: 4,
            sequence: I64(300),
            unanswered: "internal".into(),
            ..Default::default()
        };
        let d = unanswered_detail(&r);
        // UnansweredCall.record, then the record's own length.
        assert_eq!(d[0], 0x0a);
        let rec = &d[2..];
        assert_eq!(d[1] as usize, rec.len());
        assert_eq!(&rec[..2], [0x08, 4]);
        // sequence (11, varint) = 300 = 0xac 0x02
        assert_eq!(&rec[2..5], [0x58, 0xac, 0x02]);
        // unanswered (16, length-delimited): tag 130 = 0x82 0x01
        assert_eq!(&rec[5..8], [0x82, 0x01, 8]);
        assert_eq!(&rec[8..], b"internal");
    }
}
