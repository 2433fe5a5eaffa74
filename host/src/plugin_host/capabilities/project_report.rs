//! The `project-report` capability: where a project run's steps and
//! artifacts go, one per call, as the plugin learns them. Every plugin has
//! it. Each is copied under the run's budget (step count, the output limit
//! per stream, artifact bytes); one over it is answered false and nothing of
//! it is kept.
//!
//! Results come in through an import rather than in `run`'s return value
//! because a returned value is freed by the plugin as soon as the call ends
//! and would have to be copied whole; arguments can be read in place.

use wasmtime::StoreContextMut;
use wasmtime::component::Linker;

use crate::admission::{MAX_ARTIFACTS, MAX_PROJECT_STEPS};
use crate::outcome::{ProcessOutput, StepOutput};
use crate::plugin_host::lazy;

/// Total artifact bytes one project may bring back.
const ARTIFACT_BYTES: usize = 8 << 20;
/// Longest step command (the API's own bound) and artifact path.
const TEXT_BYTES: usize = 16 << 10;

/// Steps and artifacts a plugin reported during one project run.
#[derive(Default)]
pub struct ProjectReport {
    /// Bytes kept per output stream of a step.
    pub output_limit: usize,
    pub steps: Vec<StepOutput>,
    pub artifacts: Vec<(String, Vec<u8>)>,
    artifact_bytes: usize,
    /// An artifact was refused for its size or count.
    pub refused_artifacts: bool,
}

pub trait ProjectReportView: Send + 'static {
    fn report(&mut self) -> &mut ProjectReport;
}

pub fn add_to_linker<T: ProjectReportView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    let mut report = linker.instance("plimsoll:provider/project-report@0.1.0")?;
    report.func_wrap_async(
        "add-step",
        |mut store: StoreContextMut<'_, T>, (step,): (lazy::StepResult,)| {
            let kept = add_step(&mut store, &step);
            Box::new(async move { Ok((kept,)) })
        },
    )?;
    report.func_wrap_async(
        "add-artifact",
        |mut store: StoreContextMut<'_, T>, (a,): (lazy::Artifact,)| {
            let kept = add_artifact(&mut store, &a);
            Box::new(async move { Ok((kept,)) })
        },
    )?;
    Ok(())
}

fn add_step<T: ProjectReportView>(
    store: &mut StoreContextMut<'_, T>,
    step: &lazy::StepResult,
) -> bool {
    let limit = store.data_mut().report().output_limit;
    if store.data_mut().report().steps.len() >= MAX_PROJECT_STEPS {
        return false;
    }
    let mut budget = lazy::Budget::new(TEXT_BYTES + 2 * limit, 0);
    let Ok(command) = budget.string(store, &step.command) else {
        return false;
    };
    let out = &step.output;
    let (Ok((stdout, cut_out)), Ok((stderr, cut_err))) = (
        budget.bytes_capped(store, &out.stdout, limit),
        budget.bytes_capped(store, &out.stderr, limit),
    ) else {
        return false;
    };
    let output = ProcessOutput {
        stdout,
        stderr,
        exit_code: out.exit_code,
        timed_out: out.timed_out,
        stdout_truncated: out.stdout_truncated || cut_out,
        stderr_truncated: out.stderr_truncated || cut_err,
    };
    store.data_mut().report().steps.push(StepOutput {
        command,
        output,
        duration_ms: step.duration_ms,
    });
    true
}

fn add_artifact<T: ProjectReportView>(
    store: &mut StoreContextMut<'_, T>,
    a: &lazy::Artifact,
) -> bool {
    let r = store.data_mut().report();
    let room = ARTIFACT_BYTES.saturating_sub(r.artifact_bytes);
    if r.artifacts.len() >= MAX_ARTIFACTS || a.content.len() > room {
        r.refused_artifacts = true;
        return false;
    }
    let mut budget = lazy::Budget::new(TEXT_BYTES + room, 0);
    let (Ok(path), Ok(content)) = (
        budget.string(store, &a.path),
        budget.bytes(store, &a.content),
    ) else {
        store.data_mut().report().refused_artifacts = true;
        return false;
    };
    let r = store.data_mut().report();
    r.artifact_bytes += content.len();
    r.artifacts.push((path, content));
    true
}
