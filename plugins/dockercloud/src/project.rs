//! Projects in a sandbox: the directories made, the files written in one
//! upload, each step through `sh -c` in the project directory (under the
//! wrapper) until the first failure or the deadline, then the artifacts
//! read back in one download, each reported to the host as it is learned.

use wasi::clocks::monotonic_clock::{self, Instant};

use crate::bindings::plimsoll::provider::project_report;
use crate::bindings::plimsoll::provider::types::{
    Artifact, ProjectOutcome, ProjectPayload, ProjectSummary, RunError, StepResult,
};
use crate::endpoint::Endpoint;

/// Where a project's files go and its steps run.
pub const PROJECT_DIR: &str = "/tmp/plimsoll-project";
/// Total artifact bytes brought back; more sets `artifacts_truncated`.
const ARTIFACT_BYTES: usize = 8 << 20;

pub fn run(
    sandbox: &Endpoint<'_>,
    p: &ProjectPayload,
    limit: u32,
    deadline: Instant,
) -> Result<ProjectSummary, RunError> {
    let files: Vec<(String, &[u8])> = p
        .files
        .iter()
        .map(|f| (format!("{PROJECT_DIR}/{}", f.path), f.content.as_bytes()))
        .collect();
    // The project directory and every file's parent, made first: the
    // steps run there even with no files.
    let mut dirs: Vec<&str> = files
        .iter()
        .filter_map(|(path, _)| path.rsplit_once('/').map(|(d, _)| d))
        .collect();
    dirs.push(PROJECT_DIR);
    dirs.sort_unstable();
    dirs.dedup();
    sandbox.make_dirs(&dirs, deadline)?;
    sandbox.upload(&files, deadline)?;
    let mut outcome = ProjectOutcome::Completed;
    for step in &p.steps {
        let began = monotonic_clock::now();
        let output = sandbox.run(&["sh", "-c", step], Some(PROJECT_DIR), limit, deadline)?;
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
    let mut truncated = false;
    if !p.artifacts.is_empty() {
        let full: Vec<String> = p
            .artifacts
            .iter()
            .map(|a| format!("{PROJECT_DIR}/{a}"))
            .collect();
        match sandbox.download(&full, ARTIFACT_BYTES, deadline) {
            Ok(got) => {
                truncated = got.truncated;
                for (path, content) in got.files {
                    let path = path
                        .strip_prefix(PROJECT_DIR)
                        .and_then(|p| p.strip_prefix('/'))
                        .unwrap_or(&path)
                        .to_string();
                    if !project_report::add_artifact(&Artifact { path, content }) {
                        truncated = true;
                    }
                }
            }
            // The steps ran; what they made could not be brought back.
            Err(_) => truncated = true,
        }
    }
    Ok(ProjectSummary {
        outcome,
        outcome_detail: String::new(),
        artifacts_truncated: truncated,
    })
}
