//! The `project-report` capability: where a project run's steps and
//! artifacts go, one per call, as the plugin learns them. Every plugin has
//! it. Each is copied under the run's budget (step count, the output limit
//! per stream, artifact bytes); one over it is answered false and nothing of
//! it is kept.
//!
//! An artifact is kept only if the request named its path, and only the
//! first time it is reported: the caller writes what it gets into its own
//! directory, so a plugin must not be able to add a file nobody asked for
//! (a `.git/hooks/pre-commit`, say) or swap a second body in for a name.
//! One that breaks this rule is answered false and dropped, like one over
//! budget, but it does not mark the artifacts truncated (nothing the caller
//! asked for was left out by it); it is counted and logged when the call
//! ends. The run's own result stands: by then the plugin may well have run
//! the code, so this is never a reason to call the run not-dispatched.
//!
//! Results come in through an import rather than in `run`'s return value
//! because a returned value is freed by the plugin as soon as the call ends
//! and would have to be copied whole; arguments can be read in place.

use std::collections::HashSet;

use wasmtime::StoreContextMut;
use wasmtime::component::Linker;

use crate::admission::{MAX_ARTIFACTS, MAX_PATH_BYTES, MAX_PROJECT_STEPS};
use crate::outcome::{ProcessOutput, StepOutput};
use crate::plugin_host::lazy;

/// Total artifact bytes one project may bring back.
const ARTIFACT_BYTES: usize = 8 << 20;
/// Longest step command (the API's own bound).
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
    /// The artifact paths the request asked for and the plugin has not yet
    /// reported. Empty by default, so a report for a call that asked for
    /// no artifacts (a snippet, a cell) keeps none.
    requested: HashSet<String>,
    /// Artifacts refused because the request did not ask for them (or
    /// they were reported twice).
    unrequested: usize,
}

/// What happens to one artifact a plugin reports.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Asked for and within budget: copy it, with at most `room` bytes.
    Keep { room: usize },
    /// Asked for, but over the count or byte budget.
    OverBudget,
    /// Not asked for, or already reported.
    Unrequested,
}

impl ProjectReport {
    /// Sets the paths this call's request asked for; only these can be
    /// kept, each once. Called before the plugin runs.
    pub fn expect_artifacts(&mut self, paths: &[String]) {
        self.requested = paths.iter().cloned().collect();
    }

    /// Logs, once per call, how many artifacts the plugin reported that
    /// were not asked for. The paths are not logged: they are the plugin's
    /// text, and the log carries metadata only.
    pub fn report_unrequested(&self, plugin: &str) {
        if self.unrequested > 0 {
            tracing::warn!(
                target: "plimsoll::plugin",
                plugin,
                dropped = self.unrequested,
                "plugin reported artifacts the request did not ask for; they were dropped"
            );
        }
    }

    /// Decides on one reported artifact from its path and size alone,
    /// before its content is copied. A requested path is used up here
    /// whatever the verdict, so the plugin gets one try per path.
    fn judge(&mut self, path: &str, len: usize) -> Verdict {
        if !self.requested.remove(path) {
            self.unrequested += 1;
            return Verdict::Unrequested;
        }
        let room = ARTIFACT_BYTES.saturating_sub(self.artifact_bytes);
        if self.artifacts.len() >= MAX_ARTIFACTS || len > room {
            self.refused_artifacts = true;
            return Verdict::OverBudget;
        }
        Verdict::Keep { room }
    }
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
    // The path first, under the API's own bound for a path (a longer one
    // cannot have been asked for); the content is not touched until the
    // path is known to be one the request named.
    let Ok(path) = lazy::Budget::new(MAX_PATH_BYTES, 0).string(store, &a.path) else {
        store.data_mut().report().unrequested += 1;
        return false;
    };
    let len = a.content.len();
    let room = match store.data_mut().report().judge(&path, len) {
        Verdict::Keep { room } => room,
        Verdict::OverBudget | Verdict::Unrequested => return false,
    };
    let Ok(content) = lazy::Budget::new(room, 0).bytes(store, &a.content) else {
        store.data_mut().report().refused_artifacts = true;
        return false;
    };
    let r = store.data_mut().report();
    r.artifact_bytes += content.len();
    r.artifacts.push((path, content));
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(paths: &[&str]) -> ProjectReport {
        let mut r = ProjectReport::default();
        r.expect_artifacts(&paths.iter().map(|p| p.to_string()).collect::<Vec<_>>());
        r
    }

    #[test]
    fn an_artifact_not_asked_for_is_dropped_without_marking_truncation() {
        let mut r = asked(&["out.txt"]);
        for p in [
            ".git/hooks/pre-commit",
            "../out.txt",
            "/out.txt",
            "OUT.txt",
            "out.txt/",
            "",
        ] {
            assert_eq!(r.judge(p, 1), Verdict::Unrequested, "{p}");
        }
        assert!(!r.refused_artifacts, "nothing asked for was left out");
        assert_eq!(r.unrequested, 6);
        assert!(matches!(r.judge("out.txt", 1), Verdict::Keep { .. }));
    }

    #[test]
    fn an_artifact_asked_for_is_kept_once() {
        let mut r = asked(&["a", "dist/b"]);
        assert_eq!(
            r.judge("dist/b", 3),
            Verdict::Keep {
                room: ARTIFACT_BYTES
            }
        );
        // A second body for the same name is not a second chance.
        assert_eq!(r.judge("dist/b", 3), Verdict::Unrequested);
        assert!(matches!(r.judge("a", 3), Verdict::Keep { .. }));
        assert_eq!(r.judge("a", 3), Verdict::Unrequested);
    }

    #[test]
    fn a_report_that_asked_for_nothing_keeps_nothing() {
        let mut r = ProjectReport::default();
        assert_eq!(r.judge("anything", 0), Verdict::Unrequested);
    }

    #[test]
    fn an_artifact_asked_for_but_over_budget_marks_truncation() {
        let mut r = asked(&["big", "small"]);
        assert_eq!(r.judge("big", ARTIFACT_BYTES + 1), Verdict::OverBudget);
        assert!(r.refused_artifacts);
        assert_eq!(r.unrequested, 0);
        assert!(matches!(r.judge("small", 1), Verdict::Keep { .. }));
    }
}
