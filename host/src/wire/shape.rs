//! The shape pass over a request body, before the typed parse.
//!
//! serde's derived structs also accept a JSON *array* holding the fields in
//! order, which protobuf's JSON never does: `[4,"","",0,null,{"code":"1"}]`
//! would otherwise parse as a Run. And the protocol number must be read
//! before the payload is interpreted. One pass over the body does both,
//! allocating nothing per value (it skips what it does not check), so a large
//! hostile body costs no more than reading it.

use serde::Deserializer;
use serde::de;

use super::json::{IntForm, int_value};

/// Where a message (a JSON object) is expected, and what is inside it.
#[derive(Clone, Copy)]
enum Kind {
    Message(&'static [(&'static str, Kind)]),
    Repeated(&'static [(&'static str, Kind)]),
}

const LEAF: &[(&str, Kind)] = &[];
const FILES: (&str, Kind) = ("files", Kind::Repeated(LEAF));
const RUN_FIELDS: &[(&str, Kind)] = &[
    ("softwareRule", Kind::Message(LEAF)),
    ("software_rule", Kind::Message(LEAF)),
    ("javascript", Kind::Message(LEAF)),
    ("project", Kind::Message(&[FILES])),
    ("module", Kind::Message(&[("rows", Kind::Repeated(LEAF))])),
    ("cell", Kind::Message(&[FILES])),
];

const OPEN_SESSION_FIELDS: &[(&str, Kind)] = &[
    ("softwareRule", Kind::Message(LEAF)),
    ("software_rule", Kind::Message(LEAF)),
];

/// Which request a body should be: each has its own nested messages.
#[derive(Clone, Copy)]
pub enum Request {
    Run,
    OpenSession,
    SessionRun,
    CloseSession,
}

impl Request {
    fn fields(self) -> &'static [(&'static str, Kind)] {
        match self {
            // A session call carries the same payloads as a run (a module
            // field is refused by the typed parse, as any unknown field).
            Request::Run | Request::SessionRun => RUN_FIELDS,
            Request::OpenSession => OPEN_SESSION_FIELDS,
            Request::CloseSession => LEAF,
        }
    }
}

/// What the shape pass learnt: the protocol number as the request states it
/// (`Ok(0)` when absent), or why it is not a uint32.
pub type StatedProtocol = Result<u32, String>;

/// Checks that `body` is a JSON object with objects wherever a message goes,
/// and returns its `protocol` field. An `Err` is a malformed request.
pub fn shape_of_run(body: &[u8]) -> Result<StatedProtocol, serde_json::Error> {
    shape_of(Request::Run, body)
}

/// Why a request's stated protocol is not the one this daemon serves.
#[derive(Debug, PartialEq, Eq)]
pub enum ProtocolMismatch {
    /// No protocol number at all (or zero).
    Unstated,
    /// A number, but another protocol's.
    Other(u32),
    /// Something that is not a protocol number.
    Invalid(String),
}

/// The protocol gate, checked before anything in a payload counts: the
/// daemon's API and a client checking a record it was answered both use
/// it, so the two cannot disagree on which requests are this protocol's.
pub fn protocol_gate(stated: StatedProtocol) -> Result<(), ProtocolMismatch> {
    match stated {
        Ok(0) => Err(ProtocolMismatch::Unstated),
        Ok(p) if p != super::PROTOCOL => Err(ProtocolMismatch::Other(p)),
        Ok(_) => Ok(()),
        Err(why) => Err(ProtocolMismatch::Invalid(why)),
    }
}

impl std::fmt::Display for ProtocolMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let served = super::PROTOCOL;
        match self {
            ProtocolMismatch::Unstated => write!(
                f,
                "the request states no protocol number; this daemon serves protocol {served}"
            ),
            ProtocolMismatch::Other(p) => {
                write!(
                    f,
                    "this daemon serves protocol {served}, the request states {p}"
                )
            }
            ProtocolMismatch::Invalid(why) => f.write_str(why),
        }
    }
}

/// The shape pass for any request that states a protocol number.
pub fn shape_of(request: Request, body: &[u8]) -> Result<StatedProtocol, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let mut protocol: StatedProtocol = Ok(0);
    de::DeserializeSeed::deserialize(
        MessageSeed {
            fields: request.fields(),
            protocol: Some(&mut protocol),
        },
        &mut de,
    )?;
    de.end()?;
    Ok(protocol)
}

/// Checks that a Describe body is a JSON object (its fields are checked by
/// the typed parse).
pub fn shape_of_describe(body: &[u8]) -> Result<(), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    de::DeserializeSeed::deserialize(
        MessageSeed {
            fields: LEAF,
            protocol: None,
        },
        &mut de,
    )?;
    de.end()
}

struct MessageSeed<'p> {
    fields: &'static [(&'static str, Kind)],
    /// Only the top level reads `protocol`.
    protocol: Option<&'p mut StatedProtocol>,
}

impl<'de> de::DeserializeSeed<'de> for MessageSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> de::Visitor<'de> for MessageSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: de::MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == "protocol" && self.protocol.is_some() {
                let v: Option<IntForm> = map.next_value()?;
                let stated = match v {
                    None => Ok(0),
                    Some(form) => int_value(form).and_then(|n| {
                        u32::try_from(n).map_err(|_| "protocol is not a uint32".to_string())
                    }),
                };
                if let Some(p) = self.protocol.as_deref_mut() {
                    *p = stated;
                }
                continue;
            }
            match self
                .fields
                .iter()
                .find(|(name, _)| *name == key)
                .map(|(_, k)| *k)
            {
                Some(Kind::Message(fields)) => map.next_value_seed(Nullable(MessageSeed {
                    fields,
                    protocol: None,
                }))?,
                Some(Kind::Repeated(fields)) => {
                    map.next_value_seed(Nullable(RepeatedSeed(fields)))?
                }
                None => {
                    map.next_value::<de::IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// `null` (the field's default) or the inner shape.
struct Nullable<S>(S);

impl<'de, S: de::DeserializeSeed<'de, Value = ()>> de::DeserializeSeed<'de> for Nullable<S> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, S: de::DeserializeSeed<'de, Value = ()>> de::Visitor<'de> for Nullable<S> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("null or a JSON value of the field's type")
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.0.deserialize(d)
    }
}

struct RepeatedSeed(&'static [(&'static str, Kind)]);

impl<'de> de::DeserializeSeed<'de> for RepeatedSeed {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> de::Visitor<'de> for RepeatedSeed {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON array of objects")
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq
            .next_element_seed(MessageSeed {
                fields: self.0,
                protocol: None,
            })?
            .is_some()
        {}
        Ok(())
    }
}
