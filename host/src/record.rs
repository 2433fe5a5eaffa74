//! Run records: the daemon's hash-only statement of what it ran, under which
//! evidence, and what came back.
//!
//! Every digest is lowercase hex SHA-256 over a length-prefixed encoding
//! (big-endian u64 length, then the bytes) of a domain string followed by
//! name/value pairs in a fixed order. Clients recompute the request digest
//! from what they sent and the result digest from what they received, so the
//! encodings here must match theirs bit for bit; the golden vectors in the
//! tests were produced with the published Python client's own functions.

use sha2::{Digest, Sha256};

use crate::wire::{
    CellResult, I64, JavaScriptResult, ProjectResult, RECORD_VERSION, RunRecord, RunRequest,
    SoftwareRule,
};

struct Encoder(Sha256);

impl Encoder {
    fn new(domain: &str) -> Self {
        let mut e = Encoder(Sha256::new());
        e.value(domain.as_bytes());
        e
    }

    fn value(&mut self, b: &[u8]) {
        self.0.update((b.len() as u64).to_be_bytes());
        self.0.update(b);
    }

    fn bytes(&mut self, name: &str, v: &[u8]) {
        self.value(name.as_bytes());
        self.value(v);
    }

    fn str(&mut self, name: &str, v: &str) {
        self.bytes(name, v.as_bytes());
    }

    fn int(&mut self, name: &str, v: i128) {
        self.str(name, &v.to_string());
    }

    fn bool(&mut self, name: &str, v: bool) {
        self.str(name, if v { "true" } else { "false" });
    }

    fn floats(&mut self, name: &str, vs: &[f64]) {
        let mut buf = Vec::with_capacity(vs.len() * 8);
        for v in vs {
            buf.extend_from_slice(&v.to_be_bytes());
        }
        self.bytes(name, &buf);
    }

    fn finish(self) -> String {
        hex::encode(self.0.finalize())
    }
}

/// The request digest, over the request exactly as it was parsed. The trace
/// ID is left out: it is a join key for logs, not part of what ran.
pub fn request_digest(req: &RunRequest) -> String {
    // Protocol 1 requests had no software rule; the domain says which form.
    let first = req.protocol < 2;
    let mut e = Encoder::new(if first {
        "plimsoll.run-request.v1"
    } else {
        "plimsoll.run-request.v2"
    });
    e.int("protocol", req.protocol.into());
    e.str("minimum_isolation", &req.minimum_isolation);
    e.int("timeout_ms", req.timeout_ms.into());
    if !first {
        let empty = SoftwareRule::default();
        let rule = req.software_rule.as_ref().unwrap_or(&empty);
        e.str("software_mode", &rule.mode);
        e.int("software_identities", rule.identities.len() as i128);
        for id in &rule.identities {
            e.str("software_identity", id);
        }
    }
    if let Some(js) = &req.javascript {
        e.str("kind", "javascript");
        e.str("code", &js.code);
        e.str("grant_profile", &js.grant_profile);
    } else if let Some(cell) = &req.cell {
        e.str("kind", "cell");
        e.str("language", &cell.language);
        e.str("code", &cell.code);
        e.int("files", cell.files.len() as i128);
        for f in &cell.files {
            e.str("file_path", &f.path);
            e.str("file_content", &f.content);
        }
    } else if let Some(p) = &req.project {
        e.str("kind", "project");
        e.str("grant_profile", &p.grant_profile);
        e.int("files", p.files.len() as i128);
        for f in &p.files {
            e.str("file_path", &f.path);
            e.str("file_content", &f.content);
        }
        e.int("steps", p.steps.len() as i128);
        for s in &p.steps {
            e.str("step_command", s);
        }
        e.int("artifacts", p.artifacts.len() as i128);
        for a in &p.artifacts {
            e.str("artifact_path", a);
        }
    } else if let Some(m) = &req.module {
        e.str("kind", "module");
        e.str("model", &m.model);
        e.floats("end_time", &[m.end_time]);
        e.floats("step", &[m.step]);
        e.int("rows", m.rows.len() as i128);
        for r in &m.rows {
            e.floats("row_values", &r.values);
        }
    } else {
        e.str("kind", "");
    }
    e.finish()
}

/// The result digest of a JavaScript result. Durations and evidence fields are
/// not covered: they describe the run, not its output.
pub fn javascript_result_digest(r: &JavaScriptResult) -> String {
    let mut e = Encoder::new("plimsoll.run-result.v1");
    e.str("kind", "javascript");
    e.int("exit_code", r.exit_code.into());
    e.bool("timed_out", r.timed_out);
    e.bytes("stdout", &r.stdout.0);
    e.bytes("stderr", &r.stderr.0);
    e.bool("stdout_truncated", r.stdout_truncated);
    e.bool("stderr_truncated", r.stderr_truncated);
    e.finish()
}

/// The result digest of a cell.
pub fn cell_result_digest(r: &CellResult) -> String {
    let mut e = Encoder::new("plimsoll.run-result.v1");
    e.str("kind", "cell");
    e.int("exit_code", r.exit_code.into());
    e.bool("timed_out", r.timed_out);
    e.bytes("stdout", &r.stdout.0);
    e.bytes("stderr", &r.stderr.0);
    e.bool("stdout_truncated", r.stdout_truncated);
    e.bool("stderr_truncated", r.stderr_truncated);
    e.bool("interpreter_started", r.interpreter_started);
    e.bool("interpreter_ended", r.interpreter_ended);
    e.finish()
}

/// The result digest of a project, field for field as clients compute it.
pub fn project_result_digest(r: &ProjectResult) -> String {
    let mut e = Encoder::new("plimsoll.run-result.v1");
    e.str("kind", "project");
    e.int("outcome", r.outcome as i128);
    e.str("outcome_detail", &r.outcome_detail);
    e.bool("artifacts_truncated", r.artifacts_truncated);
    e.int("steps", r.steps.len() as i128);
    for s in &r.steps {
        e.str("step_command", &s.command);
        e.int("step_exit_code", s.exit_code.into());
        e.bool("step_timed_out", s.timed_out);
        e.bytes("step_stdout", &s.stdout.0);
        e.bytes("step_stderr", &s.stderr.0);
        e.bool("step_stdout_truncated", s.stdout_truncated);
        e.bool("step_stderr_truncated", s.stderr_truncated);
    }
    e.int("artifacts", r.artifacts.len() as i128);
    for a in &r.artifacts {
        e.str("artifact_path", &a.path);
        e.bytes("artifact_content", &a.content.0);
    }
    e.finish()
}

/// The ID a record states for the caller's software rule: `exact:<id>` for a
/// single identity, otherwise a digest of the sorted identities.
pub fn software_rule_id(rule: Option<&SoftwareRule>) -> String {
    let Some(rule) = rule else {
        return String::new();
    };
    match rule.identities.as_slice() {
        [] => String::new(),
        [one] => format!("exact:{one}"),
        many => {
            let mut ids: Vec<&[u8]> = many.iter().map(|s| s.as_bytes()).collect();
            ids.sort_unstable();
            let joined = ids.join(&0u8);
            format!("approved:sha256:{}", hex::encode(Sha256::digest(&joined)))
        }
    }
}

/// The record's own digest, over every field version 4 covers, in order.
pub fn record_digest(r: &RunRecord) -> String {
    let mut e = Encoder::new(&format!("plimsoll.run-record.v{}", r.version));
    e.str("request_sha256", &r.request_sha256);
    e.str("result_sha256", &r.result_sha256);
    e.str("unanswered", &r.unanswered);
    e.str("provider", &r.provider);
    e.str("isolation", &r.isolation);
    e.str("environment", &r.environment);
    e.str("policy", &r.policy);
    e.str("software_identity", &r.software_identity);
    e.str("software_rule_id", &r.software_rule_id);
    e.str("instance", &r.instance);
    e.int("started_unix_ms", r.started_unix_ms.0.into());
    e.int("ended_unix_ms", r.ended_unix_ms.0.into());
    e.str("session", &r.session);
    e.int("sequence", r.sequence.0.into());
    e.str("previous_sha256", &r.previous_sha256);
    e.finish()
}

/// The evidence a record repeats from the answer it is attached to.
pub struct Evidence<'a> {
    pub provider: &'a str,
    pub isolation: &'a str,
    pub environment: &'a str,
    pub policy: &'a str,
    pub software_identity: &'a str,
    pub instance: &'a str,
}

/// A session call's place in its session's chain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Link {
    /// The session's fingerprint (SHA-256 of its ID).
    pub session: String,
    /// This call's number, from 1.
    pub sequence: u64,
    /// The previous record's digest; empty for the first call.
    pub previous: String,
}

/// Builds and seals a single run's record (`link` is `None`) or a session
/// call's (its place in the chain).
pub fn seal(
    request_sha256: String,
    result_sha256: String,
    rule: Option<&SoftwareRule>,
    ev: &Evidence<'_>,
    started_unix_ms: i64,
    ended_unix_ms: i64,
    link: Option<&Link>,
) -> RunRecord {
    stamp(
        request_sha256,
        result_sha256,
        String::new(),
        rule,
        ev,
        (started_unix_ms, ended_unix_ms),
        link,
    )
}

/// The record of a session call that may have run but has no answer: no
/// result digest, the Connect code of the error instead. It takes its place
/// in the chain, so a client can follow the session past it.
pub fn seal_unanswered(
    request_sha256: String,
    code: &str,
    rule: Option<&SoftwareRule>,
    ev: &Evidence<'_>,
    started_unix_ms: i64,
    ended_unix_ms: i64,
    link: &Link,
) -> RunRecord {
    stamp(
        request_sha256,
        String::new(),
        code.to_string(),
        rule,
        ev,
        (started_unix_ms, ended_unix_ms),
        Some(link),
    )
}

fn stamp(
    request_sha256: String,
    result_sha256: String,
    unanswered: String,
    rule: Option<&SoftwareRule>,
    ev: &Evidence<'_>,
    (started_unix_ms, ended_unix_ms): (i64, i64),
    link: Option<&Link>,
) -> RunRecord {
    let link = link.cloned().unwrap_or_default();
    let mut r = RunRecord {
        unanswered,
        session: link.session,
        sequence: I64(i64::try_from(link.sequence).unwrap_or(i64::MAX)),
        previous_sha256: link.previous,
        version: RECORD_VERSION,
        request_sha256,
        result_sha256,
        provider: ev.provider.to_string(),
        isolation: ev.isolation.to_string(),
        environment: ev.environment.to_string(),
        policy: ev.policy.to_string(),
        software_identity: ev.software_identity.to_string(),
        software_rule_id: software_rule_id(rule),
        instance: ev.instance.to_string(),
        started_unix_ms: I64(started_unix_ms),
        ended_unix_ms: I64(ended_unix_ms),
        ..Default::default()
    };
    r.record_sha256 = record_digest(&r);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{B64, JavaScriptRun};

    // Golden values computed with plimsoll_client 0.23.0's own
    // `_record.request_digest`, `result_digest`, `record_digest` and
    // `SoftwareRule.rule_id` (see tests/compat/golden.py, which regenerates
    // them), so a drift in either side's encoding fails here first.
    #[test]
    fn request_digest_matches_published_client() {
        let req = RunRequest {
            protocol: 4,
            minimum_isolation: "process".into(),
            timeout_ms: 1500,
            javascript: Some(JavaScriptRun {
                code: "console.log(6*7)".into(),
                grant_profile: String::new(),
            }),
            ..Default::default()
        };
        assert_eq!(request_digest(&req), GOLDEN_REQUEST);
    }

    #[test]
    fn result_digest_matches_published_client() {
        let r = JavaScriptResult {
            stdout: B64(b"42\n".to_vec()),
            stderr: B64(Vec::new()),
            exit_code: 0,
            ..Default::default()
        };
        assert_eq!(javascript_result_digest(&r), GOLDEN_RESULT);
    }

    #[test]
    fn rule_ids_match_published_client() {
        let exact = SoftwareRule {
            mode: "exact".into(),
            identities: vec!["a:b".into()],
        };
        assert_eq!(software_rule_id(Some(&exact)), "exact:a:b");
        let approved = SoftwareRule {
            mode: "approved".into(),
            identities: vec!["z:1".into(), "a:2".into()],
        };
        assert_eq!(software_rule_id(Some(&approved)), GOLDEN_APPROVED);
    }

    #[test]
    fn record_digest_matches_published_client() {
        let r = seal(
            GOLDEN_REQUEST.into(),
            GOLDEN_RESULT.into(),
            None,
            &Evidence {
                provider: "wasm",
                isolation: "process",
                environment: "quickjs-wasm:sha256:00",
                policy: "",
                software_identity: "quickjs-wasm:sha256:00",
                instance: "",
            },
            1_700_000_000_000,
            1_700_000_000_005,
            None,
        );
        assert_eq!(r.record_sha256, GOLDEN_RECORD);
    }

    #[test]
    fn request_digest_covers_rule_and_accepts_proto_json_variants() {
        // The same request the golden value was computed from, written with
        // the snake_case names and string integers proto3 JSON also accepts.
        let body = br#"{"protocol":"4","software_rule":{"mode":"approved","identities":["b:2","a:1"]},"javascript":{"code":"x","grant_profile":"inv"}}"#;
        let req = crate::api::parse_run(body).expect("parses");
        assert_eq!(request_digest(&req), GOLDEN_REQUEST_RULE);
    }

    const GOLDEN_REQUEST_RULE: &str =
        "ec5c2218d8aca2969fa94c54a64a0e93a9252c5377c26328fb5ad809b49cc818";
    const GOLDEN_REQUEST: &str = "3e67b159a79717db6a92d2ba6e92f6bff3b65d1b2349a85a7c1222373d3a9841";
    const GOLDEN_RESULT: &str = "9a471e25396d4e0a2ef3124f138007aadce1a73d746dd4b99c38c50c0df2a7a5";
    const GOLDEN_APPROVED: &str =
        "approved:sha256:67438f68c481aa8feeb2b73937bfc92d514c1fa47bbc6e17d797b3a9425296d9";
    const GOLDEN_RECORD: &str = "6de6465f26be3cd8b363326b430caacd4bb8195dbad2835ea2858ae0ecb94772";
}
