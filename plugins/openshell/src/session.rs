//! Sessions: one sandbox kept for the session's life, made and checked as a
//! run's is. Its name and its main process's PID are the session's state,
//! which the host keeps and hands back with each call (every call gets a
//! fresh instance of this plugin). Snippets and projects run in the work
//! directory, so files stay between calls; no interpreter is kept, so
//! cells are not offered.
//!
//! Before each call the sandbox must still be ready and its policy still
//! the one sent (read again, as at open); after each call every process the
//! call left is killed, and a session whose sandbox cannot be swept clean
//! ends. OpenShell has no lifetime of its own: the host ends the session
//! at its lifetime or idle timeout, and the sandbox's deadline label lets
//! any instance's sweep reap it if this one is gone by then.

use crate::bindings::plimsoll::provider::types::{
    Payload, ProcessOutput, Refusal, RunError, RunRequest, RunResult, SessionAnswer,
    SessionEndReason, SessionFailure, SessionOptions,
};
use crate::exec::{self, Command};
use crate::gateway::{self, Gateway, Standing};
use crate::project::{Target, WORK_DIR};
use crate::wire;
use crate::wire::session::{self, ended, failure};
use plimsoll_plugin_probe::leftovers;
use wasi::clocks::monotonic_clock::Instant;

/// The state `open` returns and each call parses: the sandbox's name and
/// its main process as the sweep takes it (`<pid>:<start time>`, or `0`:
/// none of the calls' user to spare).
struct Kept {
    name: String,
    main: String,
}

fn parse(state: &str) -> Option<Kept> {
    let (name, main) = state.split_once(':')?;
    let hex = name.strip_prefix("plp-")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let main_ok = main == "0"
        || main
            .split_once(':')
            .is_some_and(|(p, t)| digits(p) && digits(t));
    (hex.len() == 14 && hex.bytes().all(|b| b.is_ascii_hexdigit()) && main_ok).then(|| Kept {
        name: name.to_string(),
        main: main.to_string(),
    })
}

pub fn open(gw: &Gateway, options: SessionOptions) -> Result<String, RunError> {
    let deadline = wire::after_ms(u64::from(options.timeout_ms));
    wire::set_call_deadline(deadline);
    gw.check_driver(deadline)?;
    let made = gw.create(u64::from(options.lifetime_ms).div_ceil(1000), deadline)?;
    // The work directory, and the main process found before any call's
    // code ran: the one process of ours the sweeps spare.
    let script = format!("mkdir -p {WORK_DIR} || exit 1\n{}", leftovers::FIND_MAIN);
    let mut argv = vec!["/bin/sh", "-c", &script, "plimsoll-open"];
    argv.extend(gateway::MAIN_PROCESS);
    let found = exec::run(
        gw,
        &made.name,
        &Command {
            argv: &argv,
            workdir: "",
            stdin: b"",
            limit: 4096,
        },
        deadline,
    );
    let main = match found {
        Ok(out) if out.exit_code == 0 && !out.timed_out => leftovers::main_process(&out.stdout),
        _ => None,
    };
    match main {
        Some(main) => Ok(format!("{}:{main}", made.name)),
        None => {
            gw.delete(&made.name);
            Err(gateway::not_started(
                "the new sandbox's work directory or main process could not be found",
            ))
        }
    }
}

pub fn run(
    gw: &Gateway,
    state: &str,
    request: RunRequest,
) -> Result<SessionAnswer, SessionFailure> {
    let kept = parse(state).ok_or_else(|| {
        failure(
            RunError::NotDispatched(Refusal::Environment(
                "the session's state is not this plugin's".into(),
            )),
            None,
        )
    })?;
    let deadline = wire::after_ms(u64::from(request.timeout_ms));
    wire::set_call_deadline(deadline);
    // Still the sandbox the session opened on: ready, its policy the one
    // sent. A policy changed under the session ends it.
    if let Some(failed) = check(gw, &kept.name, deadline) {
        return Err(failed);
    }
    if let Err(e) = gw.check_config(&kept.name, deadline) {
        let changed = matches!(e, RunError::NotDispatched(Refusal::Isolation(_)));
        return Err(failure(
            e,
            changed.then(|| ended(SessionEndReason::SandboxChanged, "its policy changed")),
        ));
    }
    let limit = request.output_limit as usize;
    let target = Target {
        gw,
        name: &kept.name,
    };
    let outcome = match request.payload {
        Payload::Javascript(code) => {
            snippet(gw, &kept.name, &code, limit, deadline).map(RunResult::Javascript)
        }
        Payload::Project(p) => {
            wire::project::run(&target, WORK_DIR, &p, request.output_limit, deadline)
                .map(RunResult::Project)
        }
        Payload::Cell(_) => return Err(session::no_interpreter()),
    };
    // Every process the call left, killed; the main process found at open
    // is spared.
    let swept = session::sweep(&target, &leftovers::sweep(), &kept.main, None);
    session::answer(outcome, swept, || {
        check(gw, &kept.name, wire::cleanup_deadline()).and_then(|f| f.ended)
    })
}

pub fn close(gw: &Gateway, state: &str) {
    // The host waits 8 s for a close: the delete gets most of them.
    wire::set_call_deadline(wire::after_ms(wire::CLOSE_MS));
    if let Some(kept) = parse(state) {
        gw.delete(&kept.name);
    }
}

/// A snippet on node's stdin, in the work directory.
fn snippet(
    gw: &Gateway,
    name: &str,
    code: &str,
    limit: usize,
    deadline: Instant,
) -> Result<ProcessOutput, RunError> {
    exec::run(
        gw,
        name,
        &Command {
            argv: &["node", "-"],
            workdir: WORK_DIR,
            stdin: code.as_bytes(),
            limit,
        },
        deadline,
    )
}

/// None while the sandbox is ready; otherwise the refusal, with the
/// session's end when the sandbox itself ended.
fn check(gw: &Gateway, name: &str, deadline: Instant) -> Option<SessionFailure> {
    let refused = |why: String| RunError::NotDispatched(Refusal::Environment(why));
    match gw.standing(name, deadline) {
        Standing::Ready => None,
        Standing::MainProcessEnded(why) => Some(failure(
            refused(why.clone()),
            Some(ended(SessionEndReason::MainProcessEnded, &why)),
        )),
        Standing::Gone => Some(failure(
            refused("the OpenShell sandbox is gone".into()),
            Some(ended(
                SessionEndReason::Expired,
                "the OpenShell sandbox is gone",
            )),
        )),
        Standing::Unknown(why) => Some(failure(refused(why), None)),
    }
}
