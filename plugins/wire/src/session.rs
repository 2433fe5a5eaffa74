//! What sessions on a kept sandbox share: they run snippets and projects
//! and keep no interpreter; before a call the sandbox must still stand as
//! it was opened (`Standing`, one mapping to the session's end); after
//! every call each process the call left is killed (`leftovers`), and a
//! sandbox that cannot be swept clean ends the session; a failed call asks
//! whether the sandbox itself ended.

use plimsoll_plugin_probe::leftovers;

use crate::bindings::plimsoll::provider::types::{
    PayloadKind, Refusal, RunError, RunResult, SessionAnswer, SessionEndReason, SessionEnded,
    SessionFailure, SessionSupport,
};
use crate::not_started;
use crate::sandbox::{Command, Sandbox};

/// A kept sandbox as its service reports it at a call.
pub enum Standing<T> {
    /// Running, and still what was checked at open.
    Running(T),
    /// It stopped or failed, or its main process ended: what ran in it is
    /// gone.
    Ended(String),
    /// The service no longer has it (or is deleting it).
    Gone,
    /// Running, but no longer what was checked at open.
    Changed(String),
    /// Not known (the read failed, or a state that says neither): the call
    /// is refused, the session kept.
    Unknown(String),
}

/// The sandbox a call may use; otherwise the refusal (nothing ran), with
/// the session's end when the sandbox itself ended or changed. `gone`
/// names a sandbox the service no longer has.
pub fn standing<T>(standing: Standing<T>, gone: &str) -> Result<T, SessionFailure> {
    match standing {
        Standing::Running(sandbox) => Ok(sandbox),
        Standing::Ended(why) => Err(failure(
            not_started(&why),
            Some(ended(SessionEndReason::MainProcessEnded, &why)),
        )),
        Standing::Gone => Err(failure(
            not_started(gone),
            Some(ended(SessionEndReason::Expired, gone)),
        )),
        Standing::Changed(why) => Err(failure(
            RunError::NotDispatched(Refusal::Isolation(why.clone())),
            Some(ended(SessionEndReason::SandboxChanged, &why)),
        )),
        Standing::Unknown(why) => Err(failure(not_started(&why), None)),
    }
}

/// A session's state as `open` returns it (the host keeps it and hands it
/// back with each call): `fields` joined by `:`, of which only the last
/// may hold a colon.
pub fn state(fields: &[&str]) -> String {
    fields.join(":")
}

/// The `N` fields of a `state` made by `state`, the last taking the rest;
/// `None` when there are fewer.
pub fn fields<const N: usize>(state: &str) -> Option<[String; N]> {
    let fields: Vec<String> = state.splitn(N, ':').map(str::to_string).collect();
    fields.try_into().ok()
}

/// A call with a state its plugin's `open` never returned: refused before
/// anything ran.
pub fn not_ours() -> SessionFailure {
    failure(
        not_started("the session's state is not this plugin's"),
        None,
    )
}

/// A check at a call of what the session's sandbox was opened with (its
/// policy) failed: a refusal for isolation says it changed, which ends the
/// session (`detail` says how); any other failure leaves it.
pub fn recheck_failure(error: RunError, detail: &str) -> SessionFailure {
    let changed = matches!(error, RunError::NotDispatched(Refusal::Isolation(_)));
    failure(
        error,
        changed.then(|| ended(SessionEndReason::SandboxChanged, detail)),
    )
}

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
    let command = Command {
        argv: &["/bin/sh", "-c", script, "plimsoll-sweep", arg],
        cwd,
        limit: 4096,
    };
    let out = sandbox.exec(&command, crate::cleanup_deadline());
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
