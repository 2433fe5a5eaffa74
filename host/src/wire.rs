//! The proto3 JSON forms of the `plimsoll.v1` messages this daemon reads and
//! writes, as the Connect JSON codec carries them.
//!
//! Parsing is strict in the ways protobuf's own JSON parser is strict (unknown
//! fields, duplicate keys, two payloads in one oneof, wrong types are all
//! errors) and lenient in the ways it is lenient (lowerCamelCase or the
//! original snake_case name; 32-bit integers as JSON numbers or decimal
//! strings; `null` as the zero value). Getting this exactly right matters:
//! the run record's request digest is computed from what was parsed here, and
//! the client recomputes it from what it sent.

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

/// The protocol number this daemon serves. The published client 0.23.0 sends
/// 4; a request with any other number is refused before its payload is read.
pub const PROTOCOL: u32 = 4;

/// The run record encoding this daemon writes.
pub const RECORD_VERSION: u32 = 4;

// --- requests -------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescribeRequest {}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    #[serde(default, deserialize_with = "de_u32")]
    pub protocol: u32,
    #[serde(
        default,
        alias = "minimum_isolation",
        rename = "minimumIsolation",
        deserialize_with = "de_string"
    )]
    pub minimum_isolation: String,
    #[serde(
        default,
        alias = "trace_id",
        rename = "traceId",
        deserialize_with = "de_string"
    )]
    pub trace_id: String,
    #[serde(
        default,
        alias = "timeout_ms",
        rename = "timeoutMs",
        deserialize_with = "de_i32"
    )]
    pub timeout_ms: i32,
    #[serde(default, alias = "software_rule", rename = "softwareRule")]
    pub software_rule: Option<SoftwareRule>,
    #[serde(default)]
    pub javascript: Option<JavaScriptRun>,
    #[serde(default)]
    pub project: Option<ProjectRun>,
    #[serde(default)]
    pub module: Option<ModuleRun>,
    #[serde(default)]
    pub cell: Option<CellRun>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SoftwareRule {
    #[serde(default, deserialize_with = "de_string")]
    pub mode: String,
    #[serde(default, deserialize_with = "de_strings")]
    pub identities: Vec<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JavaScriptRun {
    #[serde(default, deserialize_with = "de_string")]
    pub code: String,
    #[serde(
        default,
        alias = "grant_profile",
        rename = "grantProfile",
        deserialize_with = "de_string"
    )]
    pub grant_profile: String,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectFile {
    #[serde(default, deserialize_with = "de_string")]
    pub path: String,
    #[serde(default, deserialize_with = "de_string")]
    pub content: String,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectRun {
    #[serde(default, deserialize_with = "de_files")]
    pub files: Vec<ProjectFile>,
    #[serde(default, deserialize_with = "de_strings")]
    pub steps: Vec<String>,
    #[serde(default, deserialize_with = "de_strings")]
    pub artifacts: Vec<String>,
    #[serde(
        default,
        alias = "grant_profile",
        rename = "grantProfile",
        deserialize_with = "de_string"
    )]
    pub grant_profile: String,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleRow {
    #[serde(default, deserialize_with = "de_f64s")]
    pub values: Vec<f64>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleRun {
    #[serde(default, deserialize_with = "de_string")]
    pub model: String,
    #[serde(default, deserialize_with = "de_rows")]
    pub rows: Vec<ModuleRow>,
    #[serde(
        default,
        alias = "end_time",
        rename = "endTime",
        deserialize_with = "de_f64"
    )]
    pub end_time: f64,
    #[serde(default, deserialize_with = "de_f64")]
    pub step: f64,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellRun {
    #[serde(default, deserialize_with = "de_string")]
    pub language: String,
    #[serde(default, deserialize_with = "de_string")]
    pub code: String,
    #[serde(default, deserialize_with = "de_files")]
    pub files: Vec<ProjectFile>,
}

// --- answers --------------------------------------------------------------------
//
// Written in proto3 JSON's canonical form: lowerCamelCase names, 64-bit
// integers as strings, bytes as padded standard base64, zero values omitted.

fn is_zero_i32(v: &i32) -> bool {
    *v == 0
}
fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}
fn is_false(v: &bool) -> bool {
    !*v
}
fn is_empty_bytes(v: &B64) -> bool {
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

/// An int64/uint64 field, which proto3 JSON writes as a decimal string.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct I64(pub i64);

impl Serialize for I64 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.to_string())
    }
}

fn is_zero_i64(v: &I64) -> bool {
    v.0 == 0
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JavaScriptResult {
    #[serde(skip_serializing_if = "is_empty_bytes")]
    pub stdout: B64,
    #[serde(skip_serializing_if = "is_empty_bytes")]
    pub stderr: B64,
    #[serde(skip_serializing_if = "is_zero_i32")]
    pub exit_code: i32,
    #[serde(skip_serializing_if = "is_false")]
    pub timed_out: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub stdout_truncated: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub stderr_truncated: bool,
    /// The grant's calls, for a granted run. Outside the result digest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_trace: Option<crate::grants::broker::CallTrace>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    pub version: u32,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub request_sha256: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub result_sha256: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub provider: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub isolation: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub environment: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub policy: String,
    #[serde(skip_serializing_if = "is_zero_i64")]
    pub started_unix_ms: I64,
    #[serde(skip_serializing_if = "is_zero_i64")]
    pub ended_unix_ms: I64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub session: String,
    #[serde(skip_serializing_if = "is_zero_i64")]
    pub sequence: I64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub previous_sha256: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub record_sha256: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub software_identity: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub software_rule_id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub unanswered: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub instance: String,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunResponse {
    pub sandbox: String,
    pub isolation: String,
    #[serde(skip_serializing_if = "is_zero_i64")]
    pub duration_ms: I64,
    pub record: RunRecord,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub software_identity: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub environment: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub instance: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub javascript: Option<JavaScriptResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project: Option<ProjectResult>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepResult {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub command: String,
    #[serde(skip_serializing_if = "is_empty_bytes")]
    pub stdout: B64,
    #[serde(skip_serializing_if = "is_empty_bytes")]
    pub stderr: B64,
    #[serde(skip_serializing_if = "is_zero_i32")]
    pub exit_code: i32,
    #[serde(skip_serializing_if = "is_false")]
    pub timed_out: bool,
    #[serde(skip_serializing_if = "is_zero_i64")]
    pub duration_ms: I64,
    #[serde(skip_serializing_if = "is_false")]
    pub stdout_truncated: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub stderr_truncated: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(skip_serializing_if = "is_empty_bytes")]
    pub content: B64,
}

/// `ProjectOutcome`, by its proto enum name and number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProjectOutcome {
    Completed = 1,
    SetupFailed = 2,
    TimedOut = 3,
    ProtocolError = 4,
}

impl ProjectOutcome {
    pub fn name(self) -> &'static str {
        match self {
            ProjectOutcome::Completed => "PROJECT_OUTCOME_COMPLETED",
            ProjectOutcome::SetupFailed => "PROJECT_OUTCOME_SETUP_FAILED",
            ProjectOutcome::TimedOut => "PROJECT_OUTCOME_TIMED_OUT",
            ProjectOutcome::ProtocolError => "PROJECT_OUTCOME_PROTOCOL_ERROR",
        }
    }
}

impl Serialize for ProjectOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectResult {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepResult>,
    pub outcome: ProjectOutcome,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub outcome_detail: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    #[serde(skip_serializing_if = "is_false")]
    pub artifacts_truncated: bool,
    /// The grant's calls, for a granted run. Outside the result digest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_trace: Option<crate::grants::broker::CallTrace>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PayloadEnvironment {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub identity: String,
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub max_timeout_ms: u32,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub software_identity: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub languages: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunResources {
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub memory_mb: u32,
    #[serde(skip_serializing_if = "is_zero_f64")]
    pub cpus: f64,
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub pids: u32,
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub disk_mb: u32,
}

fn is_zero_f64(v: &f64) -> bool {
    *v == 0.0
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DescribeResponse {
    pub sandbox: String,
    pub isolation: String,
    #[serde(skip_serializing_if = "is_false")]
    pub supports_project: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub supports_javascript_grants: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub supports_project_grants: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub supports_module: bool,
    pub protocol: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub javascript_environment: Option<PayloadEnvironment>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_environment: Option<PayloadEnvironment>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<RunResources>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub policy: String,
    #[serde(skip_serializing_if = "is_false")]
    pub supports_sessions: bool,
}

// --- lenient scalar forms ---------------------------------------------------------

/// A JSON number or a decimal string, as proto3 JSON accepts for integers.
#[derive(Deserialize)]
#[serde(untagged)]
enum IntForm {
    Num(serde_json::Number),
    Str(String),
}

fn int_from<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i128>, D::Error> {
    match Option::<IntForm>::deserialize(d)? {
        None => Ok(None),
        Some(v) => int_value(v).map(Some).map_err(de::Error::custom),
    }
}

/// The integer rules of proto3 JSON, shared by the typed parse and the shape
/// pass so both read a number the same way.
fn int_value(v: IntForm) -> Result<i128, String> {
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

fn de_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match int_from(d)? {
        None => Ok(0),
        Some(v) => u32::try_from(v).map_err(|_| de::Error::custom("uint32 field out of range")),
    }
}

fn de_i32<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    match int_from(d)? {
        None => Ok(0),
        Some(v) => i32::try_from(v).map_err(|_| de::Error::custom("int32 field out of range")),
    }
}

fn de_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

fn de_strings<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(d)?.unwrap_or_default())
}

fn de_files<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ProjectFile>, D::Error> {
    Ok(Option::<Vec<ProjectFile>>::deserialize(d)?.unwrap_or_default())
}

fn de_rows<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ModuleRow>, D::Error> {
    Ok(Option::<Vec<ModuleRow>>::deserialize(d)?.unwrap_or_default())
}

#[derive(Deserialize)]
#[serde(untagged)]
enum FloatForm {
    Num(f64),
    Str(String),
}

fn float_of<E: de::Error>(v: FloatForm) -> Result<f64, E> {
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

fn de_f64<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    match Option::<FloatForm>::deserialize(d)? {
        None => Ok(0.0),
        Some(v) => float_of(v),
    }
}

fn de_f64s<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    let raw: Option<Vec<FloatForm>> = Option::deserialize(d)?;
    raw.unwrap_or_default().into_iter().map(float_of).collect()
}

// --- the shape pass ----------------------------------------------------------------
//
// serde's derived structs also accept a JSON *array* holding the fields in
// order, which protobuf's JSON never does: `[4,"","",0,null,{"code":"1"}]`
// would otherwise parse as a Run. And the protocol number must be read before
// the payload is interpreted. One pass over the body does both, allocating
// nothing per value (it skips what it does not check), so a large hostile
// body costs no more than reading it.

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

/// What the shape pass learnt: the protocol number as the request states it
/// (`Ok(0)` when absent), or why it is not a uint32.
pub type StatedProtocol = Result<u32, String>;

/// Checks that `body` is a JSON object with objects wherever a message goes,
/// and returns its `protocol` field. An `Err` is a malformed request.
pub fn shape_of_run(body: &[u8]) -> Result<StatedProtocol, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let mut protocol: StatedProtocol = Ok(0);
    de::DeserializeSeed::deserialize(
        MessageSeed {
            fields: RUN_FIELDS,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_both_names_and_string_integers() {
        let r: RunRequest = serde_json::from_str(
            r#"{"protocol":"4","timeout_ms":"1500","minimumIsolation":"process","javascript":{"code":"1","grant_profile":null}}"#,
        )
        .expect("parses");
        assert_eq!(r.protocol, 4);
        assert_eq!(r.timeout_ms, 1500);
        assert_eq!(r.minimum_isolation, "process");
        assert_eq!(r.javascript.expect("js").code, "1");
    }

    #[test]
    fn rejects_unknown_fields_duplicates_and_bad_numbers() {
        for bad in [
            r#"{"protocol":4,"javascript":{"code":"1","extra":1}}"#,
            r#"{"protocol":4,"bogus":true}"#,
            r#"{"protocol":4,"timeoutMs":1.5}"#,
            r#"{"protocol":4,"timeoutMs":"0x10"}"#,
            r#"{"protocol":4,"timeoutMs":4294967296}"#,
            r#"{"protocol":4,"timeoutMs":1,"timeoutMs":2}"#,
            r#"{"protocol":4,"javascript":{"code":5}}"#,
        ] {
            assert!(serde_json::from_str::<RunRequest>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn shape_pass_refuses_positional_arrays_and_reads_protocol() {
        assert_eq!(
            shape_of_run(br#"{"protocol":4,"javascript":{"code":"1"}}"#).expect("shape"),
            Ok(4)
        );
        assert_eq!(shape_of_run(br#"{"protocol":4.0}"#).expect("shape"), Ok(4));
        assert_eq!(shape_of_run(br#"{"protocol":"4"}"#).expect("shape"), Ok(4));
        assert!(
            shape_of_run(br#"{"protocol":"+4"}"#)
                .expect("shape")
                .is_err()
        );
        assert_eq!(
            shape_of_run(br#"{"javascript":null}"#).expect("shape"),
            Ok(0)
        );
        for bad in [
            &br#"[4,"","",0,null,{"code":"1"}]"#[..],
            br#"{"protocol":4,"javascript":["1",""]}"#,
            br#"{"protocol":4,"project":{"files":[["a","b"]],"steps":["x"]}}"#,
            br#"{"protocol":4,"module":{"rows":[[1,2]]}}"#,
            br#"{"protocol":4,"softwareRule":["exact",["a"]]}"#,
            br#"{"protocol":4} trailing"#,
            br#"{"protocol":4"#,
        ] {
            assert!(
                shape_of_run(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(shape_of_describe(b"[]").is_err());
        assert!(shape_of_describe(b"{}").is_ok());
    }

    #[test]
    fn answers_use_canonical_proto3_json() {
        let resp = RunResponse {
            sandbox: "wasm".into(),
            isolation: "process".into(),
            duration_ms: I64(7),
            javascript: Some(JavaScriptResult {
                stdout: B64(b"hi\n".to_vec()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = serde_json::to_value(&resp).expect("serialises");
        assert_eq!(v["durationMs"], "7");
        assert_eq!(v["javascript"]["stdout"], "aGkK");
        assert!(v["javascript"].get("exitCode").is_none());
    }
}
