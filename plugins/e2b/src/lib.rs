//! e2b: a provider plugin that runs snippets and projects in E2B's hosted
//! Firecracker microVMs, one fresh sandbox per run, over standard
//! `wasi:http` (the host polices every request and adds the API key, which
//! this plugin never holds).
//!
//! Per run: create a sandbox with internet access off and inbound traffic
//! locked, labelled for sweeping; write the files through envd; start each
//! command over envd's Connect stream, keeping `output-limit` bytes per
//! stream; kill at the deadline; delete the sandbox on every path.
//!
//! Configuration is the operator's origins (`SANDBOX_PLUGIN_HTTP_ORIGINS`):
//! the first is E2B's API, the second the sandbox edge that routes by the
//! `E2b-Sandbox-Id` header (one origin may serve both). The key goes in
//! `X-API-Key` (`SANDBOX_PLUGIN_API_KEY_HEADER=x-api-key`). The tier claimed
//! is vm, from provider identity; the host caps it at the operator's
//! `SANDBOX_PLUGIN_MAX_TIER`. See docs/providers/e2b.md.

mod capture;
mod connect;
mod control;
mod envd;
mod project;
mod session;
mod smoke;

/// The shared wasi:http client every cloud adapter uses.
use plimsoll_plugin_wire as wire;

mod bindings {
    wit_bindgen::generate!({
        world: "cloud-adapter",
        path: "../../wit/provider",
        generate_all,
    });
}

use bindings::exports::plimsoll::provider::adapter::Guest;
use bindings::plimsoll::provider::http;
use bindings::plimsoll::provider::types::{
    Description, PayloadKind, PreflightReport, ProcessOutput, Refusal, RunError, RunRequest,
    RunResult, SessionAnswer, SessionFailure, SessionOptions, Tier,
};
use control::{Sandbox, Service};
use envd::{Command, Envd};
use wasi::clocks::monotonic_clock::Instant;

const NAME: &str = "e2b";
/// Where a snippet is written and run.
const WORK_DIR: &str = "/home/user/work";

struct E2b;

impl Guest for E2b {
    fn describe() -> Description {
        Description {
            name: NAME.to_string(),
            tier: Tier::Vm,
            payloads: vec![PayloadKind::Javascript, PayloadKind::Project],
            environment: format!("e2b:template={}", control::TEMPLATE),
            sessions: Some(session::support()),
        }
    }

    fn preflight() -> Result<PreflightReport, String> {
        smoke::preflight(&service().map_err(|e| format!("{e:?}"))?)
    }

    fn run(request: RunRequest) -> Result<RunResult, RunError> {
        let deadline = wire::after_ms(u64::from(request.timeout_ms));
        wire::set_call_deadline(deadline);
        let service = service()?;
        let lifetime_s = u64::from(request.timeout_ms).div_ceil(1000);
        use bindings::plimsoll::provider::types::Payload;
        match request.payload {
            Payload::Javascript(code) => in_sandbox(&service, lifetime_s, deadline, |envd| {
                snippet(envd, &code, request.output_limit, deadline)
            })
            .map(RunResult::Javascript),
            Payload::Project(p) => in_sandbox(&service, lifetime_s, deadline, |envd| {
                project::run(envd, &p, request.output_limit, deadline)
            })
            .map(RunResult::Project),
            Payload::Cell(_) => Err(RunError::NotDispatched(Refusal::Unsupported(
                "cells need a session".into(),
            ))),
        }
    }

    fn open_session(options: SessionOptions) -> Result<String, RunError> {
        session::open(&service()?, options)
    }

    fn session_run(state: String, request: RunRequest) -> Result<SessionAnswer, SessionFailure> {
        session::run(&state, request)
    }

    fn close_session(state: String) {
        session::close(&state)
    }
}

bindings::export!(E2b with_types_in bindings);

fn service() -> Result<Service, RunError> {
    Service::configured(http::allowed_origins())
        .map_err(|e| RunError::NotDispatched(Refusal::Environment(e.to_string())))
}

/// Creates a sandbox, runs `f` in it, and deletes it however `f` ended.
fn in_sandbox<T>(
    service: &Service,
    lifetime_s: u64,
    deadline: Instant,
    f: impl FnOnce(&Envd<'_>) -> Result<T, RunError>,
) -> Result<T, RunError> {
    let sandbox: Sandbox = service.create(lifetime_s, deadline)?;
    let outcome = f(&Envd::for_run(service, &sandbox));
    service.delete(&sandbox.id);
    outcome
}

/// A snippet: written to the work directory, run with node.
fn snippet(
    envd: &Envd<'_>,
    code: &str,
    limit: u32,
    deadline: Instant,
) -> Result<ProcessOutput, RunError> {
    // `.js`, not `.cjs`: node then reads a snippet with module syntax
    // (top-level `await`) as a module, as `node -` does on the docker tiers.
    // An empty package.json beside it ends node's search for one, so a
    // package.json a session's earlier call left higher up (with a `type`)
    // cannot change how the snippet is read.
    let dir = format!("{WORK_DIR}/.plimsoll-snippet");
    let file = format!("{dir}/snippet.js");
    envd.upload(
        &[
            (format!("{dir}/package.json"), b"{}\n".as_slice()),
            (file.clone(), code.as_bytes()),
        ],
        deadline,
    )?;
    envd.run(
        &Command {
            cmd: "node",
            args: &[&file],
            cwd: WORK_DIR,
        },
        limit,
        deadline,
    )
}
