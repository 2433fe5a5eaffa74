//! A run's answer: what the provider produced, in the API's shape, sealed
//! into the run record the client recomputes.

use crate::grants::broker::CallTrace;
use crate::job::Output;
use crate::outcome::{ProjectOutcome as Outcome, ProjectOutput};
use crate::providers::Evidence;
use crate::record;
use crate::wire::{
    Artifact, B64, CellResult, I64, JavaScriptResult, ProjectOutcome, ProjectResult, RunRequest,
    RunResponse, StepResult,
};

/// The answer, and what the audit line says of it.
pub struct Sealed {
    pub response: RunResponse,
    pub exit_code: i32,
    pub timed_out: bool,
    pub outcome: Option<&'static str>,
}

/// Seals `output` for `req` under the evidence that held at dispatch; a
/// session call's record also takes its place in the chain (`link`).
pub fn seal(
    req: &RunRequest,
    ev: &Evidence,
    output: Output,
    call_trace: Option<CallTrace>,
    advice: Vec<crate::grants::advice::Finding>,
    (started_wall, elapsed_ms): (i64, i64),
    link: Option<&record::Link>,
) -> Sealed {
    let mut cell = None;
    let (javascript, project, result_digest, exit_code, timed_out) = match output {
        Output::JavaScript(output) => {
            let result = JavaScriptResult {
                stdout: B64(output.stdout),
                stderr: B64(output.stderr),
                exit_code: output.exit_code,
                timed_out: output.timed_out,
                stdout_truncated: output.stdout_truncated,
                stderr_truncated: output.stderr_truncated,
                call_trace,
                advice,
            };
            let digest = record::javascript_result_digest(&result);
            let (code, t) = (result.exit_code, result.timed_out);
            (Some(result), None, digest, code, t)
        }
        Output::Project(p) => {
            let mut result = project_result(p);
            result.call_trace = call_trace;
            result.advice = advice;
            let digest = record::project_result_digest(&result);
            // The audit line's exit code for a project is its last step's;
            // timed out is the outcome's.
            let code = result.steps.last().map_or(0, |s| s.exit_code);
            let t = result.outcome == ProjectOutcome::TimedOut;
            (None, Some(result), digest, code, t)
        }
        Output::Cell(c) => {
            let result = CellResult {
                stdout: B64(c.output.stdout),
                stderr: B64(c.output.stderr),
                exit_code: c.output.exit_code,
                timed_out: c.output.timed_out,
                stdout_truncated: c.output.stdout_truncated,
                stderr_truncated: c.output.stderr_truncated,
                interpreter_started: c.interpreter_started,
                interpreter_ended: c.interpreter_ended,
            };
            let digest = record::cell_result_digest(&result);
            let (code, t) = (result.exit_code, result.timed_out);
            cell = Some(result);
            (None, None, digest, code, t)
        }
    };
    let rec = record::seal(
        record::request_digest(req),
        result_digest,
        req.software_rule.as_ref(),
        &evidence_of(ev),
        started_wall,
        started_wall + elapsed_ms,
        link,
    );
    let outcome = project.as_ref().map(|p| p.outcome.name());
    Sealed {
        response: RunResponse {
            sandbox: ev.sandbox.clone(),
            isolation: ev.tier.as_str().to_string(),
            duration_ms: I64(elapsed_ms),
            record: rec,
            software_identity: ev.software_identity.clone(),
            environment: ev.environment.clone(),
            instance: String::new(),
            javascript,
            project,
            cell,
            // Signed in dispatch, where the daemon's key is.
            receipt: None,
        },
        exit_code,
        timed_out,
        outcome,
    }
}

fn project_result(p: ProjectOutput) -> ProjectResult {
    ProjectResult {
        steps: p
            .steps
            .into_iter()
            .map(|s| StepResult {
                command: s.command,
                stdout: B64(s.output.stdout),
                stderr: B64(s.output.stderr),
                exit_code: s.output.exit_code,
                timed_out: s.output.timed_out,
                duration_ms: I64(i64::try_from(s.duration_ms).unwrap_or(i64::MAX)),
                stdout_truncated: s.output.stdout_truncated,
                stderr_truncated: s.output.stderr_truncated,
            })
            .collect(),
        outcome: match p.outcome {
            Outcome::Completed => ProjectOutcome::Completed,
            Outcome::SetupFailed => ProjectOutcome::SetupFailed,
            Outcome::TimedOut => ProjectOutcome::TimedOut,
            Outcome::ProtocolError => ProjectOutcome::ProtocolError,
        },
        outcome_detail: p.outcome_detail,
        artifacts: p
            .artifacts
            .into_iter()
            .map(|(path, content)| Artifact {
                path,
                content: B64(content),
            })
            .collect(),
        artifacts_truncated: p.artifacts_truncated,
        call_trace: None,
        advice: Vec::new(),
    }
}

/// The record of a session call that may have run but has no answer: the
/// chain keeps its place, with no result digest.
pub fn unanswered(
    req: &RunRequest,
    ev: &Evidence,
    (received, ended): (i64, i64),
    link: &record::Link,
) -> crate::wire::RunRecord {
    record::seal_unanswered(
        record::request_digest(req),
        "internal",
        req.software_rule.as_ref(),
        &evidence_of(ev),
        received,
        ended,
        link,
    )
}

/// The evidence as a record states it.
fn evidence_of(ev: &Evidence) -> record::Evidence<'_> {
    record::Evidence {
        provider: &ev.sandbox,
        isolation: ev.tier.as_str(),
        environment: &ev.environment,
        policy: &ev.policy,
        software_identity: &ev.software_identity,
        instance: "",
    }
}
