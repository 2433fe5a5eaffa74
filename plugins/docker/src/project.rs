//! Projects: the plan the runner (or a session's agent) carries out, and
//! its report read back against that plan. Whatever a container printed is
//! untrusted: a report that does not fit the plan is a protocol error,
//! never a result.

use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;

use crate::bindings::plimsoll::provider::container_engine::{self as engine, EngineEnvironment};
use crate::bindings::plimsoll::provider::types::{
    Artifact, ProcessOutput, ProjectOutcome, ProjectPayload, Refusal, RunError, StepResult,
};
use crate::{ProjectResult, REPORT_LIMIT, REPORT_MARGIN_MS, run_error, runner_spec};

/// Total artifact bytes brought back; more sets `artifacts_truncated`.
pub const ARTIFACT_BYTES: u64 = 8 << 20;

#[derive(Deserialize)]
struct ReportStep {
    command: String,
    stdout: String,
    stderr: String,
    exit_code: i32,
    timed_out: bool,
    duration_ms: u64,
    stdout_truncated: bool,
    stderr_truncated: bool,
}

#[derive(Deserialize)]
struct ReportArtifact {
    path: String,
    content: String,
}

#[derive(Deserialize)]
struct ReportEnd {
    outcome: String,
    detail: String,
    artifacts_truncated: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Line {
    Start(usize),
    Step(ReportStep),
    Artifact(ReportArtifact),
    End(ReportEnd),
}

pub fn run_project(
    env: &EngineEnvironment,
    p: &ProjectPayload,
    timeout_ms: u32,
    output_limit: u32,
) -> Result<ProjectResult, RunError> {
    let plan = json!({
        "files": p.files.iter().map(|f| json!({"path": f.path, "content": f.content})).collect::<Vec<_>>(),
        "steps": p.steps,
        "artifacts": p.artifacts,
        "budget_ms": timeout_ms.saturating_sub(REPORT_MARGIN_MS),
        "output_limit": output_limit,
        "artifact_bytes": ARTIFACT_BYTES,
    });
    let plan = serde_json::to_vec(&plan).map_err(|e| {
        RunError::NotDispatched(Refusal::Request(format!("the plan does not encode: {e}")))
    })?;
    let out = engine::run(&runner_spec(env), &plan, timeout_ms, REPORT_LIMIT).map_err(run_error)?;
    Ok(read_report(p, &out, output_limit as usize))
}

/// Reads the runner's report against the plan. Whatever the container
/// printed is untrusted: a report that does not fit the plan is a protocol
/// error, never a result.
pub fn read_report(p: &ProjectPayload, out: &ProcessOutput, output_limit: usize) -> ProjectResult {
    let mut result = ProjectResult {
        steps: vec![],
        outcome: ProjectOutcome::ProtocolError,
        outcome_detail: String::new(),
        artifacts: vec![],
        artifacts_truncated: false,
    };
    let protocol = |mut r: ProjectResult, why: &str| {
        r.outcome = ProjectOutcome::ProtocolError;
        r.outcome_detail = why.to_string();
        r
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut running: Option<usize> = None;
    let mut ended = false;
    if out.stdout_truncated {
        return protocol(result, "the runner's report exceeded its size limit");
    }
    for raw in out.stdout.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        if ended {
            return protocol(result, "the runner's report continues past its end");
        }
        let Ok(line) = serde_json::from_slice::<Line>(raw) else {
            return protocol(result, "the runner's report is not readable");
        };
        match line {
            Line::Start(i) => {
                if i != result.steps.len() || i >= p.steps.len() || running.is_some() {
                    return protocol(result, "the runner started steps out of order");
                }
                running = Some(i);
            }
            Line::Step(s) => {
                let i = result.steps.len();
                if running != Some(i) || p.steps.get(i) != Some(&s.command) {
                    return protocol(result, "the runner reported a step the plan does not have");
                }
                running = None;
                let (Ok(stdout), Ok(stderr)) = (b64.decode(&s.stdout), b64.decode(&s.stderr))
                else {
                    return protocol(result, "the runner's step output is not base64");
                };
                if stdout.len() > output_limit || stderr.len() > output_limit {
                    return protocol(result, "the runner's step output exceeds the limit");
                }
                result.steps.push(StepResult {
                    command: s.command,
                    output: ProcessOutput {
                        stdout,
                        stderr,
                        exit_code: s.exit_code,
                        timed_out: s.timed_out,
                        stdout_truncated: s.stdout_truncated,
                        stderr_truncated: s.stderr_truncated,
                    },
                    duration_ms: s.duration_ms,
                });
            }
            Line::Artifact(a) => {
                let wanted = p.artifacts.contains(&a.path);
                let repeated = result.artifacts.iter().any(|x| x.path == a.path);
                let Ok(content) = b64.decode(&a.content) else {
                    return protocol(result, "the runner's artifact is not base64");
                };
                let total: u64 = result
                    .artifacts
                    .iter()
                    .map(|x| x.content.len() as u64)
                    .sum::<u64>()
                    + content.len() as u64;
                if !wanted || repeated || total > ARTIFACT_BYTES {
                    return protocol(
                        result,
                        "the runner reported an artifact the plan did not ask for",
                    );
                }
                result.artifacts.push(Artifact {
                    path: a.path,
                    content,
                });
            }
            Line::End(e) => {
                ended = true;
                result.artifacts_truncated = e.artifacts_truncated;
                result.outcome_detail = e.detail.chars().take(512).collect();
                result.outcome = match e.outcome.as_str() {
                    "completed" => ProjectOutcome::Completed,
                    "timed_out" => ProjectOutcome::TimedOut,
                    "setup_failed" => ProjectOutcome::SetupFailed,
                    _ => return protocol(result, "the runner reported an unknown outcome"),
                };
            }
        }
    }
    if out.timed_out {
        // The host killed the container at the run's deadline: the steps
        // that finished stand, and the one that was running timed out.
        if let Some(i) = running {
            result.steps.push(StepResult {
                command: p.steps[i].clone(),
                output: ProcessOutput {
                    stdout: vec![],
                    stderr: vec![],
                    exit_code: 124,
                    timed_out: true,
                    stdout_truncated: false,
                    stderr_truncated: false,
                },
                duration_ms: 0,
            });
        }
        result.outcome = ProjectOutcome::TimedOut;
        result.outcome_detail = "the run's time budget ran out".to_string();
        return result;
    }
    if !ended {
        let why = if out.exit_code == 137 {
            "the runner was killed (out of memory or processes) before it reported"
        } else {
            "the runner ended without a complete report"
        };
        return protocol(result, why);
    }
    if matches!(
        result.outcome,
        ProjectOutcome::Completed | ProjectOutcome::TimedOut
    ) {
        // The steps must be a prefix of the plan that stops at the first
        // failure, or run to the end.
        let failed = |s: &StepResult| s.output.exit_code != 0 || s.output.timed_out;
        let n = result.steps.len();
        let prefix_ok = n > 0 && !result.steps[..n - 1].iter().any(failed);
        let end_ok = n == p.steps.len() || result.steps.last().is_some_and(failed);
        if !prefix_ok || !end_ok {
            return protocol(result, "the runner's steps do not match the plan");
        }
    }
    result
}
