//! The two session error details in protobuf's binary form, which Connect
//! error details carry (base64 in the JSON error body):
//!
//! - `plimsoll.v1.SessionEnded { SessionEnd reason = 1; string detail = 2; }`
//! - `plimsoll.v1.UnansweredCall { RunRecord record = 1; }`
//!
//! Three small messages do not justify a protobuf code generator; the
//! encoding below is the wire format's varint and length-delimited fields
//! only, and the published client's decoder is the test (tests/compat).
//!
//! The decoders are for a client checking what it was answered (the
//! attest signer and verifier): they take only the fields and wire types
//! the encoder writes, and only the bytes it would write (each message is
//! encoded again and compared), so a detail has one encoding, as a bundle
//! line has one.

use super::{I64, RunRecord, SessionEnd};

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

/// One field as read: a varint, or length-delimited bytes.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn read_varint(bytes: &mut &[u8]) -> Result<u64, String> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let Some((&b, rest)) = bytes.split_first() else {
            return Err("a varint runs past the end".into());
        };
        *bytes = rest;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("a varint longer than ten bytes".into())
}

/// The message's fields in order; wire types other than varint (0) and
/// length-delimited (2) are refused.
fn fields(mut bytes: &[u8]) -> Result<Vec<(u64, Field<'_>)>, String> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let key = read_varint(&mut bytes)?;
        let field = match key & 7 {
            0 => Field::Varint(read_varint(&mut bytes)?),
            2 => {
                let len = usize::try_from(read_varint(&mut bytes)?).unwrap_or(usize::MAX);
                if len > bytes.len() {
                    return Err("a field runs past the end".into());
                }
                let (v, rest) = bytes.split_at(len);
                bytes = rest;
                Field::Bytes(v)
            }
            other => return Err(format!("wire type {other}, which these messages never use")),
        };
        out.push((key >> 3, field));
    }
    Ok(out)
}

fn text(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "a string field is not UTF-8".into())
}

/// `UnansweredCall`'s record, from the detail's bytes.
pub fn decode_unanswered(bytes: &[u8]) -> Result<RunRecord, String> {
    let outer = fields(bytes)?;
    let [(1, Field::Bytes(inner))] = outer.as_slice() else {
        return Err("an UnansweredCall holds exactly one record".into());
    };
    let mut r = RunRecord::default();
    for (number, field) in fields(inner)? {
        match (number, field) {
            (1, Field::Varint(v)) => {
                r.version = u32::try_from(v).map_err(|_| "version is not a uint32")?;
            }
            (8, Field::Varint(v)) => r.started_unix_ms = I64(v as i64),
            (9, Field::Varint(v)) => r.ended_unix_ms = I64(v as i64),
            (11, Field::Varint(v)) => r.sequence = I64(v as i64),
            (n, Field::Bytes(b)) => {
                let slot = match n {
                    2 => &mut r.request_sha256,
                    3 => &mut r.result_sha256,
                    4 => &mut r.provider,
                    5 => &mut r.isolation,
                    6 => &mut r.environment,
                    7 => &mut r.policy,
                    10 => &mut r.session,
                    12 => &mut r.previous_sha256,
                    13 => &mut r.record_sha256,
                    14 => &mut r.software_identity,
                    15 => &mut r.software_rule_id,
                    16 => &mut r.unanswered,
                    17 => &mut r.instance,
                    _ => return Err(format!("field {n} is not a RunRecord string")),
                };
                *slot = text(b)?;
            }
            (n, Field::Varint(_)) => return Err(format!("field {n} is not a RunRecord number")),
        }
    }
    if unanswered_detail(&r) != bytes {
        return Err("not in the one encoding the daemon writes".into());
    }
    Ok(r)
}

/// `SessionEnded`'s reason and detail, from the detail's bytes.
pub fn decode_session_ended(bytes: &[u8]) -> Result<(SessionEnd, String), String> {
    let (mut reason, mut detail) = (SessionEnd::Open, String::new());
    for (number, field) in fields(bytes)? {
        match (number, field) {
            (1, Field::Varint(v)) => {
                reason = SessionEnd::from_number(v).ok_or("not a SessionEnd number")?;
            }
            (2, Field::Bytes(b)) => detail = text(b)?,
            (n, _) => return Err(format!("field {n} is not a SessionEnded field")),
        }
    }
    if session_ended_detail(reason, &detail) != bytes {
        return Err("not in the one encoding the daemon writes".into());
    }
    Ok((reason, detail))
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

    #[test]
    fn details_decode_as_encoded_and_in_no_other_form() {
        let r = RunRecord {
            version: 4,
            request_sha256: "a".repeat(64),
            isolation: "container".into(),
            started_unix_ms: I64(1_700_000_000_000),
            sequence: I64(3),
            unanswered: "internal".into(),
            ..Default::default()
        };
        let d = unanswered_detail(&r);
        let back = decode_unanswered(&d).expect("decodes");
        assert_eq!(unanswered_detail(&back), d);
        assert_eq!((back.sequence.0, back.unanswered.as_str()), (3, "internal"));
        // Trailing bytes, a field the record has not, a wire type it never
        // uses, a number where a string goes, a cut-short field.
        let mut trailing = d.clone();
        trailing.push(0);
        let mut unknown = d.clone();
        unknown.extend_from_slice(&[0x0a, 2, 0xa0, 0x01]);
        for bad in [
            trailing,
            unknown,
            vec![0x0a, 1, 0x0d],
            vec![0x0a, 2, 0x10, 1],
            d[..d.len() - 1].to_vec(),
        ] {
            assert!(decode_unanswered(&bad).is_err(), "{bad:?}");
        }
        // A zero written out is a second encoding of "absent".
        assert!(decode_unanswered(&[0x0a, 2, 0x08, 0]).is_err());

        let e = session_ended_detail(SessionEnd::SandboxChanged, "gone");
        assert_eq!(
            decode_session_ended(&e).expect("decodes"),
            (SessionEnd::SandboxChanged, "gone".into())
        );
        assert!(decode_session_ended(&[0x08, 3]).is_err(), "3 is no end");
    }
}
