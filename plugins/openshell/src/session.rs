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
//!
//! On a daemon with a guard, the session's sandbox is made with the guard
//! in its policy (a policy cannot change under a running sandbox without
//! the gateway's admin role), so its node and python can reach the guard
//! for the session's life; the guard answers only a granted call's token,
//! while that call runs, as a docker session's broker socket serves only
//! a granted call.

use crate::bindings::plimsoll::provider::types::{
    Payload, ProcessOutput, RunError, RunRequest, RunResult, SessionAnswer, SessionFailure,
    SessionOptions,
};
use crate::exec::{self, Command};
use crate::gateway::{self, Gateway};
use crate::project::{Target, WORK_DIR};
use crate::wire::session::{self, failure};
use crate::{OpenShell, wire};
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
    let [name, main] = session::fields::<2>(state)?;
    let hex = name.strip_prefix("plp-")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let main_ok = main == "0"
        || main
            .split_once(':')
            .is_some_and(|(p, t)| digits(p) && digits(t));
    (hex.len() == 14 && hex.bytes().all(|b| b.is_ascii_hexdigit()) && main_ok)
        .then_some(Kept { name, main })
}

impl wire::Sessions for OpenShell {
    fn open_session(options: SessionOptions) -> Result<String, RunError> {
        let gw = crate::gateway()?;
        let deadline = wire::begin_call(u64::from(options.timeout_ms));
        gw.check_driver(deadline)?;
        let made = gw.create(wire::seconds(options.lifetime_ms), deadline, guard(&dial()))?;
        // The work directory, and the main process found before any call's
        // code ran: the one process of ours the sweeps spare.
        let script = format!("mkdir -p {WORK_DIR} || exit 1\n{}", leftovers::FIND_MAIN);
        let mut argv = vec!["/bin/sh", "-c", &script, "plimsoll-open"];
        argv.extend(gateway::MAIN_PROCESS);
        let found = exec::run(
            &gw,
            &made.name,
            &Command {
                argv: &argv,
                workdir: "",
                stdin: b"",
                limit: 4096,
                env: &[],
            },
            deadline,
        );
        let main = match found {
            Ok(out) if out.exit_code == 0 && !out.timed_out => leftovers::main_process(&out.stdout),
            _ => None,
        };
        match main {
            Some(main) => Ok(session::state(&[&made.name, &main])),
            None => {
                gw.delete(&made.name);
                Err(gateway::not_started(
                    "the new sandbox's work directory or main process could not be found",
                ))
            }
        }
    }

    fn session_run(state: String, request: RunRequest) -> Result<SessionAnswer, SessionFailure> {
        let gw = crate::gateway().map_err(|error| failure(error, None))?;
        let kept = parse(&state).ok_or_else(session::not_ours)?;
        let deadline = wire::begin_call(u64::from(request.timeout_ms));
        // Still the sandbox the session opened on: ready, its policy the one
        // sent. A policy changed under the session ends it.
        check(&gw, &kept.name, deadline)?;
        let dial = dial();
        gw.check_config(&kept.name, deadline, guard(&dial))
            .map_err(|e| session::recheck_failure(e, "its policy changed"))?;
        let limit = request.output_limit as usize;
        // A granted call: its channel's files written (its own token), and
        // its processes pointed at them.
        let granted = wire::grant::channel().map_err(|error| failure(error, None))?;
        if let Some(g) = &granted {
            let plain = Target {
                gw: &gw,
                name: &kept.name,
                env: &[],
            };
            g.put(&plain, deadline)
                .map_err(|error| failure(error, None))?;
        }
        let env = granted.as_ref().map_or(&[][..], |g| g.env.as_slice());
        let target = Target {
            gw: &gw,
            name: &kept.name,
            env,
        };
        let outcome = match request.payload {
            Payload::Javascript(code) => {
                snippet(&gw, &kept.name, &code, limit, env, deadline).map(RunResult::Javascript)
            }
            Payload::Project(p) => {
                wire::project::run(&target, WORK_DIR, &p, request.output_limit, deadline)
                    .map(RunResult::Project)
            }
            Payload::Cell(_) => return Err(session::no_interpreter()),
        };
        // Every process the call left, killed; the main process found at
        // open is spared.
        let swept = session::sweep(&target, &leftovers::sweep(), &kept.main, None);
        session::answer(outcome, swept, || {
            check(&gw, &kept.name, wire::cleanup_deadline())
                .err()
                .and_then(|f| f.ended)
        })
    }

    fn close_session(state: String) {
        let Ok(gw) = crate::gateway() else {
            return;
        };
        // The host waits 8 s for a close: the delete gets most of them.
        wire::begin_call(wire::CLOSE_MS);
        if let Some(kept) = parse(&state) {
            gw.delete(&kept.name);
        }
    }
}

/// Where the daemon's guard is, if it has one.
fn dial() -> Option<(String, u16)> {
    wire::grant::guard()
}

fn guard(dial: &Option<(String, u16)>) -> Option<crate::policy::Guard<'_>> {
    dial.as_ref()
        .map(|(host, port)| crate::policy::Guard { host, port: *port })
}

/// A snippet on node's stdin, in the work directory.
fn snippet(
    gw: &Gateway,
    name: &str,
    code: &str,
    limit: usize,
    env: &[(String, String)],
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
            env,
        },
        deadline,
    )
}

/// The sandbox still ready; otherwise the refusal, with the session's end
/// when the sandbox itself ended.
fn check(gw: &Gateway, name: &str, deadline: Instant) -> Result<(), SessionFailure> {
    session::standing(gw.standing(name, deadline), "the OpenShell sandbox is gone")
}
