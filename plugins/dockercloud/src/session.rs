//! Sessions: one sandbox kept for the session's life, made and checked at
//! open as a run's is, with the service's own timeout set to the session's
//! lifetime (plus the margin runs get) and its delete action. The state
//! the host keeps and hands back with each call is the sandbox's uid, its
//! display name and the session's mark; the endpoint credential lives five
//! minutes, so every call mints its own.
//!
//! Before each call the sandbox is read again: running, still the one
//! checked at open (name, size, endpoint), and its network policy still
//! deny-all. Snippets and projects run in the project directory, so files
//! stay between calls; no interpreter is kept, so cells are not offered.
//! The calls run as the service's default user, root in what the fake
//! does, beside the VM's own processes: each command carries the session's
//! mark in its environment, the wrapper kills what holds it as each command
//! ends, and after every call one more sweep must find nothing
//! (`leftovers::sweep_marked`), best effort against code that sets out
//! to escape it (docs/providers/dockercloud.md).

use plimsoll_plugin_probe::leftovers;
use wasi::clocks::monotonic_clock::Instant;

use crate::api::{self, Sandbox, Service};
use crate::bindings::plimsoll::provider::types::{
    Payload, RunError, RunRequest, RunResult, SessionAnswer, SessionFailure, SessionOptions,
};
use crate::endpoint::{Endpoint, SESSION_MARK};
use crate::wire::session::{self, Standing, failure};
use crate::wire::{self, Sandbox as _};
use crate::{DockerCloud, MAX_RUN_MS, PROJECT_DIR, service};

/// Where a session's snippets are written (made at open).
const SNIPPET_DIR: &str = "/tmp/plimsoll-snippet";

/// What `open` returns and each call parses.
struct Kept {
    uid: String,
    name: String,
    mark: String,
    /// The endpoint checked at open: a call goes nowhere else.
    endpoint: String,
}

fn parse(state: &str) -> Option<Kept> {
    let [uid, name, mark, endpoint] = session::fields::<4>(state)?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    let valid = api::valid_uid(&uid)
        && name.strip_prefix("plimsoll-").is_some_and(|h| hex(h, 16))
        && hex(&mark, 32);
    valid.then_some(Kept {
        uid,
        name,
        mark,
        endpoint,
    })
}

impl wire::Sessions for DockerCloud {
    fn open_session(options: SessionOptions) -> Result<String, RunError> {
        let service = service()?;
        let deadline = wire::begin_call(u64::from(options.timeout_ms));
        let sandbox = service.create(wire::seconds(options.lifetime_ms), deadline)?;
        // The project directory (snippets run in it too) and the snippets'
        // own, made before any caller's code runs.
        let made = service.ready(&sandbox, deadline).and_then(|credential| {
            Endpoint::new(&sandbox, credential).make_dirs(&[PROJECT_DIR, SNIPPET_DIR], deadline)
        });
        if let Err(e) = made {
            service.delete(&sandbox.uid);
            return Err(e);
        }
        let mark = format!(
            "{:016x}{:016x}",
            wasi::random::random::get_random_u64(),
            wasi::random::random::get_random_u64()
        );
        Ok(session::state(&[
            &sandbox.uid,
            &sandbox.name,
            &mark,
            &sandbox.endpoint,
        ]))
    }

    fn session_run(state: String, request: RunRequest) -> Result<SessionAnswer, SessionFailure> {
        let service = service().map_err(|error| failure(error, None))?;
        let kept = parse(&state).ok_or_else(session::not_ours)?;
        if request.timeout_ms > MAX_RUN_MS {
            return Err(failure(crate::too_long(), None));
        }
        let deadline = wire::begin_call(u64::from(request.timeout_ms));
        let sandbox = standing(&service, &kept, deadline)?;
        // The network policy read back and a fresh credential, as for a
        // run; a policy no longer deny-all ends the session.
        let credential = service
            .ready(&sandbox, deadline)
            .map_err(|e| session::recheck_failure(e, "its network policy changed"))?;
        let plain = Endpoint::new(&sandbox, credential);
        let marker = format!("{SESSION_MARK}={}", kept.mark);
        let endpoint = plain.marked(&marker);
        let limit = request.output_limit;
        let outcome = match request.payload {
            // A session's snippet: written beside an empty package.json, so
            // node reads it as CommonJS unless it uses module syntax,
            // whatever package.json an earlier call left higher up; run in
            // the project directory.
            Payload::Javascript(code) => wire::sandbox::node_snippet(
                &endpoint,
                SNIPPET_DIR,
                PROJECT_DIR,
                &code,
                limit,
                deadline,
            )
            .map(RunResult::Javascript),
            Payload::Project(p) => wire::project::run(&endpoint, PROJECT_DIR, &p, limit, deadline)
                .map(RunResult::Project),
            Payload::Cell(_) => return Err(session::no_interpreter()),
        };
        // Every process carrying the session's mark, killed. Sent without
        // the mark, so the sweep does not find itself.
        let swept = session::sweep(&plain, &leftovers::sweep_marked(), &marker, None);
        session::answer(outcome, swept, || {
            standing(&service, &kept, wire::cleanup_deadline())
                .err()
                .and_then(|f| f.ended)
        })
    }

    fn close_session(state: String) {
        let Ok(service) = service() else {
            return;
        };
        // The host waits 8 s for a close: the delete gets most of them.
        wire::begin_call(wire::CLOSE_MS);
        if let Some(kept) = parse(&state) {
            service.delete(&kept.uid);
        }
    }
}

/// The sandbox, running and still what was checked at open; otherwise the
/// refusal, with the session's end when the sandbox itself ended.
fn standing(service: &Service, kept: &Kept, deadline: Instant) -> Result<Sandbox, SessionFailure> {
    let reported = match service.standing(&kept.uid, &kept.name, deadline) {
        Standing::Running(sandbox) if sandbox.endpoint != kept.endpoint => {
            Standing::Changed("the sandbox's endpoint is not the one it had at open".into())
        }
        reported => reported,
    };
    session::standing(reported, "the Docker sandbox is gone")
}
