//! Projects in a sandbox. OpenShell has no file API, so each file goes in
//! on a command's stdin (`cat >` under `/tmp/work`, the one writable tree),
//! each step runs as `sh -c` there until the first failure or the deadline,
//! and each artifact comes back as a `cat`'s output, 8 MiB in all.

use wasi::clocks::monotonic_clock::{self, Instant};

use crate::bindings::plimsoll::provider::project_report;
use crate::bindings::plimsoll::provider::types::{
    Artifact, ProjectOutcome, ProjectPayload, ProjectSummary, RunError, StepResult,
};
use crate::exec::{self, Command};
use crate::gateway::{self, Gateway};

pub const WORK_DIR: &str = "/tmp/work";
const ARTIFACT_BYTES: usize = 8 << 20;
/// Writes stdin to the file named by $1, making its directory first.
const PUT: &str = r#"mkdir -p -- "$(dirname -- "$1")" && cat > "$1""#;

pub fn put(
    gw: &Gateway,
    name: &str,
    path: &str,
    content: &[u8],
    deadline: Instant,
) -> Result<(), RunError> {
    let out = exec::run(
        gw,
        name,
        &Command {
            argv: &["sh", "-c", PUT, "plimsoll-put", path],
            workdir: "",
            stdin: content,
            limit: 4096,
        },
        deadline,
    )?;
    if out.exit_code != 0 || out.timed_out {
        return Err(gateway::not_started("a project file could not be written"));
    }
    Ok(())
}

pub fn run(
    gw: &Gateway,
    name: &str,
    p: &ProjectPayload,
    limit: u32,
    deadline: Instant,
) -> Result<ProjectSummary, RunError> {
    // The steps run there even with no files.
    let made = exec::run(
        gw,
        name,
        &Command {
            argv: &["mkdir", "-p", WORK_DIR],
            workdir: "",
            stdin: b"",
            limit: 4096,
        },
        deadline,
    )?;
    if made.exit_code != 0 {
        return Err(gateway::not_started(
            "the project directory could not be made",
        ));
    }
    for f in &p.files {
        put(
            gw,
            name,
            &format!("{WORK_DIR}/{}", f.path),
            f.content.as_bytes(),
            deadline,
        )?;
    }
    let mut outcome = ProjectOutcome::Completed;
    for (i, step) in p.steps.iter().enumerate() {
        let began = monotonic_clock::now();
        let output = exec::run(
            gw,
            name,
            &Command {
                argv: &["sh", "-c", step],
                workdir: WORK_DIR,
                stdin: b"",
                limit: limit as usize,
            },
            deadline,
        )
        // Once a step ran, nothing after it can say nothing ran.
        .map_err(|e| match e {
            RunError::NotDispatched(r) if i > 0 => {
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
    let mut total = 0usize;
    let mut truncated = false;
    for path in &p.artifacts {
        let full = format!("{WORK_DIR}/{path}");
        let room = ARTIFACT_BYTES - total;
        let got = exec::run(
            gw,
            name,
            &Command {
                argv: &["cat", "--", &full],
                workdir: "",
                stdin: b"",
                limit: room,
            },
            deadline,
        );
        match got {
            Ok(o) if o.exit_code == 0 && !o.timed_out && !o.stdout_truncated => {
                total += o.stdout.len();
                if !project_report::add_artifact(&Artifact {
                    path: path.clone(),
                    content: o.stdout,
                }) {
                    truncated = true;
                }
            }
            // Cut, or not read within the budget: not brought back whole.
            Ok(o) if o.exit_code == 0 || o.timed_out => truncated = true,
            // Absent: the steps may not have made it.
            Ok(_) => {}
            Err(_) => truncated = true,
        }
    }
    Ok(ProjectSummary {
        outcome,
        outcome_detail: String::new(),
        artifacts_truncated: truncated,
    })
}
