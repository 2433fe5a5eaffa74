//! The session messages: OpenSession, SessionRun and CloseSession, in the
//! same proto3 JSON forms (and with the same strictness) as Run.
//!
//! A session call carries the envelope and payloads of a Run plus the
//! session ID; `SessionRunRequest::as_run` is that call as a Run, so
//! validation, admission and the request digest are the ones a Run gets
//! (the client digests a session call exactly as a run, without the ID).

use serde::{Deserialize, Serialize};

use super::json::*;
use super::{CellRun, JavaScriptRun, ProjectRun, RunRequest, RunResponse, SoftwareRule};

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenSessionRequest {
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
        alias = "lifetime_ms",
        rename = "lifetimeMs",
        deserialize_with = "de_u32"
    )]
    pub lifetime_ms: u32,
    #[serde(
        default,
        alias = "idle_timeout_ms",
        rename = "idleTimeoutMs",
        deserialize_with = "de_u32"
    )]
    pub idle_timeout_ms: u32,
    #[serde(default, alias = "software_rule", rename = "softwareRule")]
    pub software_rule: Option<SoftwareRule>,
    #[serde(default, deserialize_with = "de_strings")]
    pub languages: Vec<String>,
    #[serde(default, deserialize_with = "de_string")]
    pub owner: String,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRunRequest {
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
    #[serde(
        default,
        alias = "session_id",
        rename = "sessionId",
        deserialize_with = "de_string"
    )]
    pub session_id: String,
    #[serde(default, alias = "software_rule", rename = "softwareRule")]
    pub software_rule: Option<SoftwareRule>,
    #[serde(default)]
    pub javascript: Option<JavaScriptRun>,
    #[serde(default)]
    pub project: Option<ProjectRun>,
    #[serde(default)]
    pub cell: Option<CellRun>,
}

impl SessionRunRequest {
    /// The call as a Run: everything but the session ID, which is a
    /// capability and never part of a digest, a log line or a record.
    pub fn into_run(self) -> (String, RunRequest) {
        (
            self.session_id,
            RunRequest {
                protocol: self.protocol,
                minimum_isolation: self.minimum_isolation,
                trace_id: self.trace_id,
                timeout_ms: self.timeout_ms,
                software_rule: self.software_rule,
                javascript: self.javascript,
                project: self.project,
                module: None,
                cell: self.cell,
            },
        )
    }
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloseSessionRequest {
    #[serde(default, deserialize_with = "de_u32")]
    pub protocol: u32,
    #[serde(
        default,
        alias = "session_id",
        rename = "sessionId",
        deserialize_with = "de_string"
    )]
    pub session_id: String,
}

/// `plimsoll.v1.SessionEnd`, by its proto enum name and number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SessionEnd {
    /// Not ended: the zero value, omitted on the wire.
    #[default]
    Open = 0,
    Closed = 1,
    Expired = 2,
    MainProcessEnded = 4,
    SandboxChanged = 6,
    Shutdown = 7,
    Replaced = 8,
    NotFound = 9,
}

impl SessionEnd {
    const ALL: [SessionEnd; 8] = [
        SessionEnd::Open,
        SessionEnd::Closed,
        SessionEnd::Expired,
        SessionEnd::MainProcessEnded,
        SessionEnd::SandboxChanged,
        SessionEnd::Shutdown,
        SessionEnd::Replaced,
        SessionEnd::NotFound,
    ];

    /// The end a proto enum number names, if any.
    pub fn from_number(n: u64) -> Option<SessionEnd> {
        SessionEnd::ALL.into_iter().find(|e| *e as u64 == n)
    }

    pub fn name(self) -> &'static str {
        match self {
            SessionEnd::Open => "SESSION_END_UNSPECIFIED",
            SessionEnd::Closed => "SESSION_END_CLOSED",
            SessionEnd::Expired => "SESSION_END_EXPIRED",
            SessionEnd::MainProcessEnded => "SESSION_END_MAIN_PROCESS_ENDED",
            SessionEnd::SandboxChanged => "SESSION_END_SANDBOX_CHANGED",
            SessionEnd::Shutdown => "SESSION_END_SHUTDOWN",
            SessionEnd::Replaced => "SESSION_END_REPLACED",
            SessionEnd::NotFound => "SESSION_END_NOT_FOUND",
        }
    }

    /// The short name logs and metrics use (the client's names).
    pub fn label(self) -> &'static str {
        match self {
            SessionEnd::Open => "open",
            SessionEnd::Closed => "closed",
            SessionEnd::Expired => "expired",
            SessionEnd::MainProcessEnded => "main_process_ended",
            SessionEnd::SandboxChanged => "sandbox_changed",
            SessionEnd::Shutdown => "shutdown",
            SessionEnd::Replaced => "replaced",
            SessionEnd::NotFound => "not_found",
        }
    }

    pub fn is_open(&self) -> bool {
        *self == SessionEnd::Open
    }
}

impl Serialize for SessionEnd {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// An answer's end, read back by its proto name only: a client checking
/// what it was answered reads the one form the daemon writes.
impl<'de> Deserialize<'de> for SessionEnd {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        SessionEnd::ALL
            .into_iter()
            .find(|e| e.name() == name)
            .ok_or_else(|| serde::de::Error::custom(format!("{name:?} is not a SessionEnd name")))
    }
}

// The answers are Deserialize so a client (the attest signer) can read
// what it was answered into the types the daemon wrote it from.

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenSessionResponse {
    /// Never empty on the wire; left out only where an answer is kept
    /// without its ID (a bundle line), which then reads back the same.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub session_id: String,
    pub session: String,
    pub sandbox: String,
    pub isolation: String,
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub expires_unix_ms: I64,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub idle_timeout_ms: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub software_identity: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRunResponse {
    pub run: RunResponse,
    #[serde(default, skip_serializing_if = "SessionEnd::is_open")]
    pub ended: SessionEnd,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub end_detail: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CloseSessionResponse {
    pub session: String,
    /// A uint64: a decimal string in proto3 JSON, omitted at zero.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub calls: I64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_record_sha256: String,
    #[serde(default, skip_serializing_if = "SessionEnd::is_open")]
    pub ended: SessionEnd,
    /// The daemon's signature on the fields above (see
    /// `attest::receipts`), when it has a record signing key; as a Run
    /// answer's `receipt`, a field clients that do not know it skip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_call_is_a_run_without_its_id() {
        let r: SessionRunRequest = serde_json::from_str(
            r#"{"protocol":4,"sessionId":"ab","timeoutMs":"900","cell":{"language":"python","code":"1"}}"#,
        )
        .expect("parses");
        let (id, run) = r.into_run();
        assert_eq!(id, "ab");
        assert_eq!(run.timeout_ms, 900);
        assert_eq!(run.cell.expect("cell").language, "python");
        for bad in [
            r#"{"protocol":4,"sessionId":"a","module":{"model":"m"}}"#,
            r#"{"protocol":4,"sessionId":5}"#,
            r#"{"protocol":4,"owner":"x"}"#,
        ] {
            assert!(
                serde_json::from_str::<SessionRunRequest>(bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn open_reads_every_field_and_close_only_its_two() {
        let o: OpenSessionRequest = serde_json::from_str(
            r#"{"protocol":4,"languages":["python"],"owner":"ab12","lifetimeMs":5000,"idle_timeout_ms":"100","softwareRule":{"mode":"exact","identities":["x"]}}"#,
        )
        .expect("parses");
        assert_eq!((o.lifetime_ms, o.idle_timeout_ms), (5000, 100));
        assert_eq!(o.languages, ["python"]);
        assert!(
            serde_json::from_str::<CloseSessionRequest>(r#"{"protocol":4,"sessionId":"a"}"#)
                .is_ok()
        );
        assert!(serde_json::from_str::<CloseSessionRequest>(r#"{"protocol":4,"x":1}"#).is_err());
    }

    #[test]
    fn answers_leave_zero_values_out_and_name_the_end() {
        let v = serde_json::to_value(CloseSessionResponse {
            session: "f".into(),
            calls: I64(3),
            last_record_sha256: "d".into(),
            ended: SessionEnd::Closed,
            receipt: None,
        })
        .expect("serialises");
        assert_eq!(v["calls"], "3");
        assert_eq!(v["ended"], "SESSION_END_CLOSED");
        let v = serde_json::to_value(SessionRunResponse::default()).expect("serialises");
        assert!(v.get("ended").is_none());
    }

    #[test]
    fn answers_read_back_as_written_and_ends_only_by_name() {
        let close =
            r#"{"calls":"3","ended":"SESSION_END_CLOSED","lastRecordSha256":"d","session":"f"}"#;
        let read: CloseSessionResponse = serde_json::from_str(close).expect("reads");
        let written = serde_json::to_value(&read).expect("writes");
        assert_eq!(
            written,
            serde_json::from_str::<serde_json::Value>(close).expect("json")
        );
        let empty: CloseSessionResponse =
            serde_json::from_str(r#"{"session":"f"}"#).expect("reads");
        assert_eq!((empty.calls.0, empty.ended), (0, SessionEnd::Open));
        for bad in [r#""closed""#, "1", r#""SESSION_END_LATER""#] {
            assert!(serde_json::from_str::<SessionEnd>(bad).is_err(), "{bad}");
        }
        for end in SessionEnd::ALL {
            let v = serde_json::to_string(&end).expect("writes");
            assert_eq!(serde_json::from_str::<SessionEnd>(&v).expect("reads"), end);
        }
    }
}
