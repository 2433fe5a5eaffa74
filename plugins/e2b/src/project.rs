//! Projects in a sandbox: the files into the project directory, each step
//! through `sh -c` there until the first failure or the deadline, then the
//! artifacts read back, each reported to the host as it is learned.

use wasi::clocks::monotonic_clock::{self, Instant};

use crate::bindings::plimsoll::provider::project_report;
use crate::bindings::plimsoll::provider::types::{
    Artifact, ProjectOutcome, ProjectPayload, ProjectSummary, RunError, StepResult,
};
use crate::envd::{Command, Envd};

/// Where a project's files go and its steps run.
pub const PROJECT_DIR: &str = "/home/user/project";
/// Total artifact bytes brought back; more sets `artifacts_truncated`.
const ARTIFACT_BYTES: usize = 8 << 20;

pub fn run(
    envd: &Envd<'_>,
    p: &ProjectPayload,
    limit: u32,
    deadline: Instant,
) -> Result<ProjectSummary, RunError> {
    let files: Vec<(String, &[u8])> = p
        .files
        .iter()
        .map(|f| (format!("{PROJECT_DIR}/{}", f.path), f.content.as_bytes()))
        .collect();
    // The steps run in the directory, so it must exist even with no files.
    if files.is_empty() {
        envd.make_dir(PROJECT_DIR, deadline)?;
    } else {
        envd.upload(&files, deadline)?;
    }
    let mut outcome = ProjectOutcome::Completed;
    for step in &p.steps {
        let began = monotonic_clock::now();
        let output = envd.run(
            &Command {
                cmd: "/bin/sh",
                args: &["-c", step],
                cwd: PROJECT_DIR,
            },
            limit,
            deadline,
        )?;
        let timed_out = output.timed_out;
        let failed = output.exit_code != 0;
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
    let mut total = 0usize;
    let mut truncated = false;
    for path in &p.artifacts {
        let full = format!("{PROJECT_DIR}/{path}");
        match envd.download(&full, ARTIFACT_BYTES - total, deadline) {
            Ok(Some(content)) => {
                total += content.len();
                if !project_report::add_artifact(&Artifact {
                    path: path.clone(),
                    content,
                }) {
                    truncated = true;
                }
            }
            // Absent: the steps may not have made it.
            Ok(None) => {}
            Err(_) => truncated = true,
        }
    }
    Ok(ProjectSummary {
        outcome,
        outcome_detail: String::new(),
        artifacts_truncated: truncated,
    })
}
