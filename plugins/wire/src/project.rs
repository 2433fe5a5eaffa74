//! Projects in a sandbox, the one runner every cloud adapter uses: the
//! directory made and the files written, each step through `<shell> -c`
//! there until the first failure or the deadline, then the artifacts read
//! back, each step and artifact reported to the host as it is learned.

use wasi::clocks::monotonic_clock::{self, Instant};

use crate::bindings::plimsoll::provider::project_report;
use crate::bindings::plimsoll::provider::types::{
    ProjectOutcome, ProjectPayload, ProjectSummary, RunError, StepResult,
};
use crate::sandbox::{Command, Sandbox};

/// Total artifact bytes brought back; more sets `artifacts_truncated`.
pub const ARTIFACT_BYTES: usize = 8 << 20;

/// Runs project `p` in `dir` of `sandbox`, keeping `limit` bytes of each
/// step's streams.
pub fn run<S: Sandbox>(
    sandbox: &S,
    dir: &str,
    p: &ProjectPayload,
    limit: u32,
    deadline: Instant,
) -> Result<ProjectSummary, RunError> {
    let files: Vec<(String, &[u8])> = p
        .files
        .iter()
        .map(|f| (format!("{dir}/{}", f.path), f.content.as_bytes()))
        .collect();
    sandbox.put_project(dir, &files, deadline)?;
    let mut outcome = ProjectOutcome::Completed;
    for (i, step) in p.steps.iter().enumerate() {
        let argv = [S::SHELL, "-c", step.as_str()];
        let command = Command {
            argv: &argv,
            cwd: Some(dir),
            limit,
        };
        let began = monotonic_clock::now();
        let output = sandbox.exec(&command, deadline).map_err(|e| match e {
            RunError::NotDispatched(r) if i > 0 && S::LATER_STEP_MAY_HAVE_RUN => {
                RunError::MayHaveRun(format!("a later step was not started: {r:?}"))
            }
            e => e,
        })?;
        let (timed_out, failed) = (output.timed_out, output.exit_code != 0);
        project_report::add_step(&StepResult {
            command: step.clone(),
            output,
            duration_ms: (monotonic_clock::now() - began) / 1_000_000,
        });
        if timed_out {
            outcome = ProjectOutcome::TimedOut;
            break;
        }
        if failed {
            break;
        }
    }
    let truncated = !p.artifacts.is_empty()
        && sandbox.get_artifacts(dir, &p.artifacts, ARTIFACT_BYTES, deadline);
    Ok(ProjectSummary {
        outcome,
        outcome_detail: String::new(),
        artifacts_truncated: truncated,
    })
}
