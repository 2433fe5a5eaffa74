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

mod json;
mod proto;
mod session;
mod shape;

use serde::{Deserialize, Serialize};

use json::*;
pub use json::{B64, I64};
pub use proto::{decode_session_ended, decode_unanswered, session_ended_detail, unanswered_detail};
pub use session::{
    CloseSessionRequest, CloseSessionResponse, OpenSessionRequest, OpenSessionResponse, SessionEnd,
    SessionRunRequest, SessionRunResponse,
};
pub use shape::{
    ProtocolMismatch, Request, StatedProtocol, protocol_gate, shape_of, shape_of_describe,
    shape_of_run,
};

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
//
// They read back from exactly that form, so a client checking a run record
// recomputes its digests with the functions in `record` that sealed it, over
// the values it was sent: one encoder, never a second one to drift. Every
// field the writer leaves out at zero reads as zero when absent. Unknown
// fields are ignored rather than refused: `callTrace` is one (it is outside
// every digest and is never read back), and an answer from a newer daemon
// may carry more.

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JavaScriptResult {
    #[serde(default, skip_serializing_if = "is_empty_bytes")]
    pub stdout: B64,
    #[serde(default, skip_serializing_if = "is_empty_bytes")]
    pub stderr: B64,
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "is_false")]
    pub timed_out: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub stdout_truncated: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub stderr_truncated: bool,
    /// The grant's calls, for a granted run. Outside the result digest.
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub call_trace: Option<crate::grants::broker::CallTrace>,
    /// What the run's calls could have cost less, for a profile that gives
    /// advice to its callers: only what the agent can act on. Outside the
    /// result digest, as the trace is.
    #[serde(default, skip_deserializing, skip_serializing_if = "Vec::is_empty")]
    pub advice: Vec<crate::grants::advice::Finding>,
}

/// A cell's result: code run in a session's interpreter.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CellResult {
    #[serde(default, skip_serializing_if = "is_empty_bytes")]
    pub stdout: B64,
    #[serde(default, skip_serializing_if = "is_empty_bytes")]
    pub stderr: B64,
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "is_false")]
    pub timed_out: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub stdout_truncated: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub stderr_truncated: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub interpreter_started: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub interpreter_ended: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    pub version: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request_sha256: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub result_sha256: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub isolation: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub environment: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub policy: String,
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub started_unix_ms: I64,
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub ended_unix_ms: I64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub session: String,
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub sequence: I64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub previous_sha256: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub record_sha256: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub software_identity: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub software_rule_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub unanswered: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunResponse {
    pub sandbox: String,
    pub isolation: String,
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub duration_ms: I64,
    pub record: RunRecord,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub software_identity: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub environment: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub javascript: Option<JavaScriptResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<ProjectResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell: Option<CellResult>,
    /// The daemon's signature on `record` (a DSSE envelope, see
    /// `attest::receipts`), when it has a record signing key: this
    /// daemon's own field, which clients that do not know it skip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepResult {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub command: String,
    #[serde(default, skip_serializing_if = "is_empty_bytes")]
    pub stdout: B64,
    #[serde(default, skip_serializing_if = "is_empty_bytes")]
    pub stderr: B64,
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "is_false")]
    pub timed_out: bool,
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub duration_ms: I64,
    #[serde(default, skip_serializing_if = "is_false")]
    pub stdout_truncated: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub stderr_truncated: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(default, skip_serializing_if = "is_empty_bytes")]
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

impl ProjectOutcome {
    const ALL: [ProjectOutcome; 4] = [
        ProjectOutcome::Completed,
        ProjectOutcome::SetupFailed,
        ProjectOutcome::TimedOut,
        ProjectOutcome::ProtocolError,
    ];

    fn numbered(n: u64) -> Option<ProjectOutcome> {
        ProjectOutcome::ALL.into_iter().find(|o| *o as u64 == n)
    }
}

/// Reads the enum name the serializer writes, or its number, as proto3 JSON
/// allows. The unspecified value (0) and unknown names are refused: the
/// daemon never answers without an outcome, and the outcome is digested by
/// its number, so a guess here would change the digest.
impl<'de> Deserialize<'de> for ProjectOutcome {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OutcomeVisitor)
    }
}

struct OutcomeVisitor;

impl<'de> serde::de::Visitor<'de> for OutcomeVisitor {
    type Value = ProjectOutcome;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a ProjectOutcome name such as PROJECT_OUTCOME_COMPLETED, or its number")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ProjectOutcome, E> {
        ProjectOutcome::ALL
            .into_iter()
            .find(|o| o.name() == v)
            .ok_or_else(|| E::custom("unknown ProjectOutcome name"))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ProjectOutcome, E> {
        ProjectOutcome::numbered(v).ok_or_else(|| E::custom("unknown ProjectOutcome number"))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ProjectOutcome, E> {
        u64::try_from(v)
            .ok()
            .and_then(ProjectOutcome::numbered)
            .ok_or_else(|| E::custom("unknown ProjectOutcome number"))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectResult {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepResult>,
    pub outcome: ProjectOutcome,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub outcome_detail: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub artifacts_truncated: bool,
    /// The grant's calls, for a granted run. Outside the result digest.
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub call_trace: Option<crate::grants::broker::CallTrace>,
    /// What the run's calls could have cost less, for a profile that gives
    /// advice to its callers: only what the agent can act on. Outside the
    /// result digest, as the trace is.
    #[serde(default, skip_deserializing, skip_serializing_if = "Vec::is_empty")]
    pub advice: Vec<crate::grants::advice::Finding>,
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
    /// The container runtime and its version the host verified at start
    /// (this daemon's own field; clients that do not know it skip it).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub runtime: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub policy: String,
    #[serde(skip_serializing_if = "is_false")]
    pub supports_sessions: bool,
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub session_lifetime_ms: u32,
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub session_idle_timeout_ms: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_environment: Option<PayloadEnvironment>,
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub max_sessions_per_caller: u32,
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub max_sessions_per_owner: u32,
    /// The ID of the key the daemon signs records with (this daemon's own
    /// field; empty when it signs none).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub record_signing_key_id: String,
}

#[cfg(test)]
mod tests;
