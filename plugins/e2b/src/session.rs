//! Sessions: one sandbox kept for the session's life. Its ID and envd
//! token are the session's state, which the host keeps (away from the log
//! and the caller) and hands back with each call, since every call gets a
//! fresh instance of this plugin. Files written by one call are there for
//! the next; no interpreter is kept, so cells are not offered. After every
//! call each process the call left is killed: E2B runs commands as `user`
//! and nothing of the sandbox's own runs as that user, so none is spared.

use crate::bindings::plimsoll::provider::types::{
    Payload, RunError, RunRequest, RunResult, SessionAnswer, SessionEndReason, SessionEnded,
    SessionFailure, SessionOptions,
};
use crate::control::{Sandbox, Service, valid_id};
use crate::envd::Envd;
use crate::wire::session::{self, ended, failure};
use crate::{E2b, PROJECT_DIR, service, snippet, wire};
use plimsoll_plugin_probe::leftovers;

/// The state `open` returned: the sandbox's ID and its two tokens (none of
/// them contains a colon: IDs are checked, tokens are E2B's hex or base64).
fn parse(state: &str) -> Option<Sandbox> {
    let [id, token, traffic] = session::fields::<3>(state)?;
    valid_id(&id).then_some(Sandbox { id, token, traffic })
}

impl wire::Sessions for E2b {
    fn open_session(options: SessionOptions) -> Result<String, RunError> {
        let service = service()?;
        let deadline = wire::begin_call(u64::from(options.timeout_ms));
        // No egress at all: a granted call opens the guard for its time only.
        let sandbox = service.create(wire::seconds(options.lifetime_ms), deadline, None)?;
        Ok(session::state(&[
            &sandbox.id,
            &sandbox.token,
            &sandbox.traffic,
        ]))
    }

    fn session_run(state: String, request: RunRequest) -> Result<SessionAnswer, SessionFailure> {
        let sandbox = parse(&state).ok_or_else(session::not_ours)?;
        let service = service().map_err(|error| failure(error, None))?;
        let deadline = wire::begin_call(u64::from(request.timeout_ms));
        let envd = Envd::for_session(&service, &sandbox);
        // A granted call: its channel's files written (the token is the
        // call's own), then the guard made reachable for this call only.
        // The files first: a failed write must not leave the way open.
        let granted = wire::grant::channel().map_err(|error| failure(error, None))?;
        let envd = match &granted {
            None => envd,
            Some(g) => {
                g.put(&envd, deadline)
                    .map_err(|error| failure(error, None))?;
                if let Err(error) =
                    service.set_egress(&sandbox.id, Some((&g.host, g.port)), deadline)
                {
                    // The update may have been applied with its answer lost.
                    return Err(failure(error, close_guard(&service, &sandbox)));
                }
                envd.with_env(g.env.clone())
            }
        };
        let outcome = match request.payload {
            Payload::Javascript(code) => {
                snippet(&envd, &code, request.output_limit, deadline).map(RunResult::Javascript)
            }
            Payload::Project(p) => {
                wire::project::run(&envd, PROJECT_DIR, &p, request.output_limit, deadline)
                    .map(RunResult::Project)
            }
            Payload::Cell(_) => return Err(session::no_interpreter()),
        };
        // Every process of the commands' user the call left, killed: none is
        // spared (`0`). Run in a directory that is always there: the work
        // directory may not be yet (a session's first call may be a project).
        let swept = session::sweep(&envd, &leftovers::sweep(), "0", Some("/"));
        // A failed call may mean the service ended the sandbox (its own
        // timeout, say).
        let answer = session::answer(outcome, swept, || {
            (service.exists(&sandbox.id) == Some(false))
                .then(|| ended(SessionEndReason::Expired, "the E2B sandbox is gone"))
        });
        // The guard closed again; the call's token is dead either way.
        match granted {
            None => answer,
            Some(_) => guard_closed(&service, &sandbox, answer),
        }
    }

    fn close_session(state: String) {
        // The host waits 8 s for a close: the delete gets most of them.
        wire::begin_call(wire::CLOSE_MS);
        if let (Some(sandbox), Ok(service)) = (parse(&state), service()) {
            service.delete(&sandbox.id);
        }
    }
}

/// Closes the guard to the sandbox again after a granted call: `None`
/// when done, else why the session must end (a sandbox whose egress could
/// not be closed, or is not known closed, cannot go on as a session whose
/// next call has no grant).
fn close_guard(service: &Service, sandbox: &Sandbox) -> Option<SessionEnded> {
    let closed = service
        .set_egress(&sandbox.id, None, wire::cleanup_deadline())
        .is_ok();
    (!closed).then(|| {
        ended(
            SessionEndReason::SandboxChanged,
            "the sandbox's way to the guard could not be closed after a granted call",
        )
    })
}

/// A granted call's answer once the guard is closed again.
fn guard_closed(
    service: &Service,
    sandbox: &Sandbox,
    answer: Result<SessionAnswer, SessionFailure>,
) -> Result<SessionAnswer, SessionFailure> {
    let Some(end) = close_guard(service, sandbox) else {
        return answer;
    };
    match answer {
        Ok(a) => Ok(SessionAnswer {
            ended: Some(end),
            ..a
        }),
        Err(f) => Err(SessionFailure {
            ended: Some(end),
            ..f
        }),
    }
}
