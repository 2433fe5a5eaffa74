//! What sessions on a kept sandbox share: they run snippets and projects
//! and keep no interpreter; after every call each process the call left is
//! killed (`leftovers`), and a sandbox that cannot be swept clean ends the
//! session; a failed call asks whether the sandbox itself ended.

use plimsoll_plugin_probe::leftovers;

use crate::bindings::plimsoll::provider::types::{
    PayloadKind, Refusal, RunError, RunResult, SessionAnswer, SessionEndReason, SessionEnded,
    SessionFailure, SessionSupport,
};
use crate::sandbox::Sandbox;

/// Sessions that keep no interpreter: snippets and projects, no cells.
pub fn support() -> SessionSupport {
    SessionSupport {
        payloads: vec![PayloadKind::Javascript, PayloadKind::Project],
        cell_languages: vec![],
    }
}

/// A cell, refused before anything runs: no interpreter is kept.
pub fn no_interpreter() -> SessionFailure {
    failure(
        RunError::NotDispatched(Refusal::Unsupported(
            "this provider's sessions keep no interpreter".into(),
        )),
        None,
    )
}

/// Runs a sweep `script` (`leftovers::sweep()` or `sweep_marked()`) with
/// `arg` through `/bin/sh` in `cwd`, inside the call's cleanup time; true
/// when it says no process is left.
pub fn sweep<S: Sandbox>(sandbox: &S, script: &str, arg: &str, cwd: Option<&str>) -> bool {
    let out = sandbox.exec(
        &["/bin/sh", "-c", script, "plimsoll-sweep", arg],
        cwd,
        4096,
        crate::cleanup_deadline(),
    );
    matches!(out, Ok(o) if o.exit_code == 0 && !o.timed_out && leftovers::swept_clean(&o.stdout))
}

/// A session call's answer, once its payload ran (`outcome`) and the sweep
/// after it did (`swept`). A failed call may mean the sandbox ended:
/// `gone` asks (only then), so the host can end the session.
pub fn answer(
    outcome: Result<RunResult, RunError>,
    swept: bool,
    gone: impl FnOnce() -> Option<SessionEnded>,
) -> Result<SessionAnswer, SessionFailure> {
    match outcome {
        Ok(outcome) => Ok(SessionAnswer {
            outcome,
            ended: (!swept).then(unswept),
        }),
        Err(error) => Err(failure(error, gone().or_else(|| (!swept).then(unswept)))),
    }
}

/// The session's end when a process the call started outlived it.
pub fn unswept() -> SessionEnded {
    ended(
        SessionEndReason::SandboxChanged,
        "a process the call started could not be stopped",
    )
}

pub fn ended(reason: SessionEndReason, detail: &str) -> SessionEnded {
    SessionEnded {
        reason,
        detail: detail.to_string(),
    }
}

pub fn failure(error: RunError, ended: Option<SessionEnded>) -> SessionFailure {
    SessionFailure { error, ended }
}
