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

mod connect;
mod control;
mod envd;
mod session;
mod settings;
mod smoke;

/// The cloud adapters' kit: the bindings, the wasi:http client, the project
/// runner and the probe step.
use plimsoll_plugin_wire as wire;
/// The `cloud-adapter` world's bindings, generated once, in the kit.
use wire::bindings;

use bindings::plimsoll::provider::types::{
    Payload, ProcessOutput, Refusal, RunError, RunRequest, RunResult,
};
use control::{Sandbox, Service};
use envd::Envd;
use wasi::clocks::monotonic_clock::Instant;

const NAME: &str = "e2b";
/// Where a snippet is written and run.
const WORK_DIR: &str = "/home/user/work";
/// Where a project's files go and its steps run.
const PROJECT_DIR: &str = "/home/user/project";

/// The adapter: what it states and its smoke test (smoke.rs), runs (here)
/// and sessions (session.rs).
struct E2b;

impl wire::CloudAdapter for E2b {
    fn run(request: RunRequest) -> Result<RunResult, RunError> {
        let deadline = wire::begin_call(u64::from(request.timeout_ms));
        let service = service()?;
        let lifetime_s = wire::seconds(request.timeout_ms);
        // Asked before the sandbox exists: its egress is set at create.
        let granted = wire::grant::channel()?;
        let granted = granted.as_ref();
        match request.payload {
            Payload::Javascript(code) => {
                in_sandbox(&service, lifetime_s, deadline, granted, |envd| {
                    snippet(envd, &code, request.output_limit, deadline)
                })
                .map(RunResult::Javascript)
            }
            Payload::Project(p) => in_sandbox(&service, lifetime_s, deadline, granted, |envd| {
                wire::project::run(envd, PROJECT_DIR, &p, request.output_limit, deadline)
            })
            .map(RunResult::Project),
            Payload::Cell(_) => Err(RunError::NotDispatched(Refusal::Unsupported(
                "cells need a session".into(),
            ))),
        }
    }
}

bindings::export!(E2b);

fn service() -> Result<Service, RunError> {
    wire::adapter::configured(Service::configured)
}

/// Creates a sandbox, runs `f` in it, and deletes it however `f` ended. A
/// granted run's sandbox can reach the guard and nothing else, and has the
/// channel's files before `f` starts anything.
fn in_sandbox<T>(
    service: &Service,
    lifetime_s: u64,
    deadline: Instant,
    granted: Option<&wire::grant::Channel>,
    f: impl FnOnce(&Envd<'_>) -> Result<T, RunError>,
) -> Result<T, RunError> {
    let guard = granted.map(|g| (g.host.as_str(), g.port));
    let sandbox: Sandbox = service.create(lifetime_s, deadline, guard)?;
    let outcome = (|| {
        let envd = Envd::for_run(service, &sandbox);
        let Some(g) = granted else { return f(&envd) };
        g.put(&envd, deadline)?;
        f(&envd.with_env(g.env.clone()))
    })();
    service.delete(&sandbox.id);
    outcome
}

/// A snippet: written beside an empty package.json in its own directory
/// under the work directory, run with node there.
fn snippet(
    envd: &Envd<'_>,
    code: &str,
    limit: u32,
    deadline: Instant,
) -> Result<ProcessOutput, RunError> {
    let dir = format!("{WORK_DIR}/.plimsoll-snippet");
    wire::sandbox::node_snippet(envd, &dir, WORK_DIR, code, limit, deadline)
}
