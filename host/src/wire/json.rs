//! proto3 JSON's scalar rules, both ways: the lenient forms a parser must
//! accept (integers as numbers or decimal strings, `null` as the zero
//! value, floats with their special names) and the canonical forms an
//! answer is written in (64-bit integers as strings, bytes as padded
//! standard base64, zero values omitted).

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

use super::{ModuleRow, ProjectFile};

/// A JSON number or a decimal string, as proto3 JSON accepts for integers.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum IntForm {
    Num(serde_json::Number),
    Str(String),
}

pub(super) fn int_from<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i128>, D::Error> {
    match Option::<IntForm>::deserialize(d)? {
        None => Ok(None),
        Some(v) => int_value(v).map(Some).map_err(de::Error::custom),
    }
}

/// The integer rules of proto3 JSON, shared by the typed parse and the shape
/// pass so both read a number the same way.
pub(super) fn int_value(v: IntForm) -> Result<i128, String> {
    match v {
        IntForm::Num(n) => {
            if let Some(i) = n.as_i64() {
                Ok(i128::from(i))
            } else if let Some(u) = n.as_u64() {
                Ok(i128::from(u))
            } else {
                // protobuf accepts 5.0 for an integer field, never 5.5.
                let f = n.as_f64().unwrap_or(f64::NAN);
                if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e18 {
                    Ok(f as i128)
                } else {
                    Err("integer field holds a non-integer number".into())
                }
            }
        }
        IntForm::Str(s) => {
            let digits = s.strip_prefix('-').unwrap_or(&s);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 20
            {
                return Err("integer field holds a string that is not a decimal integer".into());
            }
            s.parse::<i128>().map_err(|_| "integer out of range".into())
        }
    }
}

pub(super) fn de_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match int_from(d)? {
        None => Ok(0),
        Some(v) => u32::try_from(v).map_err(|_| de::Error::custom("uint32 field out of range")),
    }
}

pub(super) fn de_i32<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    match int_from(d)? {
        None => Ok(0),
        Some(v) => i32::try_from(v).map_err(|_| de::Error::custom("int32 field out of range")),
    }
}

pub(super) fn de_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

pub(super) fn de_strings<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(d)?.unwrap_or_default())
}

pub(super) fn de_files<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ProjectFile>, D::Error> {
    Ok(Option::<Vec<ProjectFile>>::deserialize(d)?.unwrap_or_default())
}

pub(super) fn de_rows<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ModuleRow>, D::Error> {
    Ok(Option::<Vec<ModuleRow>>::deserialize(d)?.unwrap_or_default())
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum FloatForm {
    Num(f64),
    Str(String),
}

pub(super) fn float_of<E: de::Error>(v: FloatForm) -> Result<f64, E> {
    match v {
        FloatForm::Num(f) => Ok(f),
        FloatForm::Str(s) => match s.as_str() {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            _ => s
                .parse::<f64>()
                .map_err(|_| E::custom("double field holds a string that is not a number")),
        },
    }
}

pub(super) fn de_f64<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    match Option::<FloatForm>::deserialize(d)? {
        None => Ok(0.0),
        Some(v) => float_of(v),
    }
}

pub(super) fn de_f64s<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    let raw: Option<Vec<FloatForm>> = Option::deserialize(d)?;
    raw.unwrap_or_default().into_iter().map(float_of).collect()
}

// --- canonical forms for answers ------------------------------------------------

pub(super) fn is_zero_i32(v: &i32) -> bool {
    *v == 0
}
pub(super) fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}
pub(super) fn is_false(v: &bool) -> bool {
    !*v
}
pub(super) fn is_empty_bytes(v: &B64) -> bool {
    v.0.is_empty()
}

/// Bytes, serialised as protobuf JSON does: standard base64 with padding.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct B64(pub Vec<u8>);

impl Serialize for B64 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::Engine as _;
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

/// Reads back exactly what `serialize` writes: the standard alphabet with
/// canonical padding (no URL-safe letters, no missing `=`, no stray trailing
/// bits). A looser reading would let two spellings stand for one content,
/// and the digests are over the bytes.
impl<'de> Deserialize<'de> for B64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use base64::Engine as _;
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map(B64)
            .map_err(|e| {
                de::Error::custom(format!("bytes field is not padded standard base64: {e}"))
            })
    }
}

/// An int64/uint64 field, which proto3 JSON writes as a decimal string.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct I64(pub i64);

impl Serialize for I64 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.to_string())
    }
}

/// Reads the decimal string `serialize` writes (an optional `-`, then
/// digits), and also a JSON integer, which proto3 JSON readers accept for
/// 64-bit fields. A fractional number, an exponent, a `+`, blanks or a value
/// outside i64 are refused rather than rounded: the record digest is over
/// the decimal form of the value read.
impl<'de> Deserialize<'de> for I64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match IntForm::deserialize(d)? {
            IntForm::Num(n) => n.as_i64().map(I64).ok_or_else(|| {
                de::Error::custom("int64 field holds a number that is not a 64-bit integer")
            }),
            IntForm::Str(s) => {
                let digits = s.strip_prefix('-').unwrap_or(&s);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(de::Error::custom(
                        "int64 field holds a string that is not a decimal integer",
                    ));
                }
                s.parse::<i64>()
                    .map(I64)
                    .map_err(|_| de::Error::custom("int64 field out of range"))
            }
        }
    }
}

pub(super) fn is_zero_i64(v: &I64) -> bool {
    v.0 == 0
}
