//! Sessions: one sandbox kept for the session's life. Its ID and envd
//! token are the session's state, which the host keeps (away from the log
//! and the caller) and hands back with each call, since every call gets a
//! fresh instance of this plugin. Files written by one call are there for
//! the next; no interpreter is kept, so cells are not offered. After every
//! call each process the call left is killed: E2B runs commands as `user`
//! and nothing of the sandbox's own runs as that user, so none is spared.

use crate::bindings::plimsoll::provider::types::{
    Payload, PayloadKind, Refusal, RunError, RunRequest, RunResult, SessionAnswer,
    SessionEndReason, SessionEnded, SessionFailure, SessionOptions, SessionSupport,
};
use crate::control::{Sandbox, Service, valid_id};
use crate::envd::{Command, Envd};
use crate::{project, service, snippet, wire};
use plimsoll_plugin_probe::leftovers;

pub fn support() -> SessionSupport {
    SessionSupport {
        payloads: vec![PayloadKind::Javascript, PayloadKind::Project],
        cell_languages: vec![],
    }
}

pub fn open(service: &Service, options: SessionOptions) -> Result<String, RunError> {
    let deadline = wire::after_ms(u64::from(options.timeout_ms));
    wire::set_call_deadline(deadline);
    let lifetime_s = u64::from(options.lifetime_ms).div_ceil(1000);
    let sandbox = service.create(lifetime_s, deadline)?;
    Ok(format!(
        "{}:{}:{}",
        sandbox.id, sandbox.token, sandbox.traffic
    ))
}

/// The state `open` returned: the sandbox's ID and its two tokens (none of
/// them contains a colon: IDs are checked, tokens are E2B's hex or base64).
fn parse(state: &str) -> Option<Sandbox> {
    let mut parts = state.splitn(3, ':');
    let (id, token, traffic) = (parts.next()?, parts.next()?, parts.next()?);
    valid_id(id).then(|| Sandbox {
        id: id.to_string(),
        token: token.to_string(),
        traffic: traffic.to_string(),
    })
}

pub fn run(state: &str, request: RunRequest) -> Result<SessionAnswer, SessionFailure> {
    let fail = |error| SessionFailure { error, ended: None };
    let sandbox = parse(state).ok_or_else(|| {
        fail(RunError::NotDispatched(Refusal::Environment(
            "the session's state is not this plugin's".into(),
        )))
    })?;
    let service = service().map_err(fail)?;
    let deadline = wire::after_ms(u64::from(request.timeout_ms));
    wire::set_call_deadline(deadline);
    let envd = Envd::for_session(&service, &sandbox);
    let outcome = match request.payload {
        Payload::Javascript(code) => {
            snippet(&envd, &code, request.output_limit, deadline).map(RunResult::Javascript)
        }
        Payload::Project(p) => {
            project::run(&envd, &p, request.output_limit, deadline).map(RunResult::Project)
        }
        Payload::Cell(_) => {
            return Err(fail(RunError::NotDispatched(Refusal::Unsupported(
                "this provider's sessions keep no interpreter".into(),
            ))));
        }
    };
    let swept = sweep(&envd);
    match outcome {
        Ok(outcome) => Ok(SessionAnswer {
            outcome,
            ended: (!swept).then(unswept),
        }),
        // A failed call may mean the service ended the sandbox (its own
        // timeout, say): ask, so the host can end the session.
        Err(error) => Err(SessionFailure {
            error,
            ended: (service.exists(&sandbox.id) == Some(false))
                .then(|| SessionEnded {
                    reason: SessionEndReason::Expired,
                    detail: "the E2B sandbox is gone".into(),
                })
                .or_else(|| (!swept).then(unswept)),
        }),
    }
}

/// Kills every process of the commands' user the call left; true when
/// none is left.
fn sweep(envd: &Envd<'_>) -> bool {
    let script = leftovers::sweep();
    let out = envd.run(
        &Command {
            cmd: "/bin/sh",
            args: &["-c", &script, "plimsoll-sweep", "0"],
            // A directory that is always there: the work directory may not
            // be yet (a session's first call may be a project).
            cwd: "/",
        },
        4096,
        wire::cleanup_deadline(),
    );
    matches!(out, Ok(o) if o.exit_code == 0 && !o.timed_out && leftovers::swept_clean(&o.stdout))
}

fn unswept() -> SessionEnded {
    SessionEnded {
        reason: SessionEndReason::SandboxChanged,
        detail: "a process the call started could not be stopped".into(),
    }
}

pub fn close(state: &str) {
    // The host waits 8 s for a close: the delete gets most of them.
    wire::set_call_deadline(wire::after_ms(wire::CLOSE_MS));
    if let (Some(sandbox), Ok(service)) = (parse(state), service()) {
        service.delete(&sandbox.id);
    }
}
