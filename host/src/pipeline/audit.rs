//! The audit line: one per dispatched run, whatever became of it, on the
//! `plimsoll::audit` target. Metadata only, by construction: every field is
//! a count, a size, a timing, a fixed name, or an identifier the operator
//! made (the caller's id, a grant profile's name) or checked (a well-formed
//! trace ID). Nothing from a request body or a run's output has a field to
//! go into.

use crate::grants::advice::{self, Finding};
use crate::grants::broker::CallTrace;
use crate::grants::catalog::Retention;
use crate::providers::Evidence;
use crate::wire::RunRequest;

/// What is known about a run when it is dispatched.
pub struct AuditLine<'a> {
    pub op: &'static str,
    pub caller: &'a str,
    pub evidence: &'a Evidence,
    pub duration_ms: i64,
    pub code_bytes: usize,
    /// A project's sizes: counts and bytes, never names or contents.
    pub files: Option<usize>,
    pub steps: Option<usize>,
    pub total_bytes: Option<usize>,
    pub trace_id: &'a str,
    pub trace_id_rejected: bool,
    pub grant_profile: Option<&'a str>,
    pub host_calls: u32,
    pub host_calls_denied: u32,
    pub host_calls_shed: u32,
    /// Advice after a granted run, as counts, when the profile keeps them.
    pub advice: Option<advice::Totals>,
    /// Each finding's fixed words and route template, when the profile
    /// keeps detail.
    pub advice_detail: Option<String>,
    /// A session call's session fingerprint and place in its chain.
    pub session: Option<&'a str>,
    pub session_call: Option<u64>,
}

impl<'a> AuditLine<'a> {
    pub fn new(
        op: &'static str,
        caller: &'a str,
        evidence: &'a Evidence,
        req: &RunRequest,
        trace_id: &'a str,
        trace_id_rejected: bool,
        duration_ms: i64,
    ) -> AuditLine<'a> {
        let (files, steps, total_bytes) = req.project.as_ref().map_or((None, None, None), |p| {
            (
                Some(p.files.len()),
                Some(p.steps.len()),
                Some(p.files.iter().map(|f| f.content.len()).sum::<usize>()),
            )
        });
        AuditLine {
            op,
            caller,
            evidence,
            duration_ms,
            code_bytes: req
                .javascript
                .as_ref()
                .map(|j| j.code.len())
                .or_else(|| req.cell.as_ref().map(|c| c.code.len()))
                .unwrap_or(0),
            files,
            steps,
            total_bytes,
            trace_id,
            trace_id_rejected,
            grant_profile: None,
            host_calls: 0,
            host_calls_denied: 0,
            host_calls_shed: 0,
            advice: None,
            advice_detail: None,
            session: None,
            session_call: None,
        }
    }

    /// A session call: its session's fingerprint (never the ID) and its
    /// number in the chain.
    pub fn with_session(mut self, fingerprint: &'a str, sequence: u64) -> Self {
        self.session = Some(fingerprint);
        self.session_call = Some(sequence);
        self
    }

    /// The grant a run carried, and what its code did with it.
    pub fn with_grant(mut self, profile: Option<&'a str>, trace: Option<&CallTrace>) -> Self {
        self.grant_profile = profile;
        if let Some(t) = trace {
            self.host_calls = t.calls.len() as u32 + t.dropped;
            self.host_calls_denied = t.denied;
            self.host_calls_shed = t.shed;
        }
        self
    }

    /// A granted run's advice, kept as its profile's retention says.
    pub fn with_advice(mut self, retention: Retention, findings: &[Finding]) -> Self {
        if retention == Retention::None {
            return self;
        }
        self.advice = Some(advice::totals(findings));
        if retention == Retention::Detailed {
            let detail: Vec<_> = findings
                .iter()
                .map(|f| {
                    serde_json::json!({
                        "pattern": f.pattern.as_str(), "remedy": f.remedy.as_str(),
                        "method": f.method, "route": f.route, "calls": f.calls,
                        "suggestedRoute": f.suggested_route, "grantRoute": f.grant_route,
                    })
                })
                .collect();
            self.advice_detail = Some(serde_json::Value::from(detail).to_string());
        }
        self
    }

    /// A run that answered: its exit code, whether it timed out, a
    /// project's outcome, and the digest of its record (a hash the caller
    /// was given too, so a signed record can be found in the log).
    pub fn answered(
        &self,
        exit_code: i32,
        timed_out: bool,
        outcome: Option<&str>,
        record_sha256: &str,
    ) {
        self.write(
            Some(exit_code),
            Some(timed_out),
            None,
            outcome,
            Some(record_sha256),
        );
    }

    /// A run that failed after it may have started; `error_id` joins the
    /// caller's answer to the detailed log line.
    pub fn failed(&self, error_id: &str) {
        self.write(None, None, Some(error_id), None, None);
    }

    fn write(
        &self,
        exit_code: Option<i32>,
        timed_out: Option<bool>,
        error_id: Option<&str>,
        outcome: Option<&str>,
        record_sha256: Option<&str>,
    ) {
        tracing::info!(
            target: "plimsoll::audit",
            op = self.op,
            caller = self.caller,
            sandbox = self.evidence.sandbox.as_str(),
            isolation = self.evidence.tier.as_str(),
            duration_ms = self.duration_ms,
            code_bytes = self.code_bytes,
            files = self.files,
            steps = self.steps,
            total_bytes = self.total_bytes,
            outcome,
            exit_code,
            timed_out,
            error_id,
            record_sha256,
            trace_id = self.trace_id,
            trace_id_rejected = self.trace_id_rejected,
            grant_profile = self.grant_profile,
            host_calls = self.host_calls,
            host_calls_denied = self.host_calls_denied,
            host_calls_shed = self.host_calls_shed,
            advice_findings = self.advice.map(|a| a.findings),
            advice_agent_fixable = self.advice.map(|a| a.agent_fixable),
            advice_extra_calls = self.advice.map(|a| a.extra_calls),
            advice_added_latency_ms = self.advice.map(|a| a.added_latency_ms),
            advice_bytes_moved = self.advice.map(|a| a.bytes_moved),
            advice_ungranted_routes = self.advice.map(|a| a.ungranted_routes),
            advice_finding_details = self.advice_detail.as_deref(),
            session = self.session,
            session_call = self.session_call,
            "code run"
        );
    }
}
