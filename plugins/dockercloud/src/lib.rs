//! dockercloud: a provider plugin that runs snippets and projects in
//! Docker's hosted sandboxes (one microVM per run) through the documented
//! REST API (v1), over standard `wasi:http`.
//!
//! Per run: create a sandbox from the image, wait until it runs, check what
//! the service says it made (name, size, endpoint), read its network policy
//! back and require deny-all with no allow rule, mint one scoped endpoint
//! credential, write the files, run each command through a wrapper that
//! enforces the time limit and the output cap inside the VM, read the
//! artifacts back, and delete the sandbox on every path.
//!
//! The plugin holds no operator credential: the host trades the operator's
//! Docker token for an access token and adds it to requests to the API
//! origin (`SANDBOX_PLUGIN_KEY_EXCHANGE_URL`). The endpoint credential is
//! minted per sandbox by the service and sent by this plugin to the
//! sandbox's own endpoint, an origin that never receives the host's token.
//! The tier claimed is vm, from provider identity; the host caps it at the
//! operator's `SANDBOX_PLUGIN_MAX_TIER`. Sessions keep one such sandbox for
//! many calls (session.rs). See docs/providers/dockercloud.md.

mod api;
mod checks;
mod endpoint;
mod multipart;
mod session;
mod settings;
mod smoke;
mod wrapper;

/// The cloud adapters' kit: the bindings, the wasi:http client, the project
/// runner and the probe step.
use plimsoll_plugin_wire as wire;
/// The `cloud-adapter` world's bindings, generated once, in the kit.
use wire::bindings;

use bindings::plimsoll::provider::types::{
    Payload, ProcessOutput, Refusal, RunError, RunRequest, RunResult,
};
use wasi::clocks::monotonic_clock::Instant;
use wire::Sandbox as _;
use wire::sandbox::Command;

const NAME: &str = "dockercloud";
/// Where a project's files go and its steps run.
pub const PROJECT_DIR: &str = "/tmp/plimsoll-project";
/// Longest run: the endpoint credential lives 300 s and an exec still
/// running when it expires is cut off, so a run ends well inside it.
pub const MAX_RUN_MS: u32 = 270_000;
/// Where a run's snippet is written; it runs with no working directory
/// given. A `.js` file with no package.json: node reads it as CommonJS
/// unless it uses module syntax (top-level `await`, `import`), as `node -`
/// does on the docker tiers; `.cjs` would make top-level `await` a syntax
/// error.
const SNIPPET: &str = "/tmp/plimsoll-snippet.js";

/// The adapter: what it states and its smoke test (smoke.rs), runs (here)
/// and sessions (session.rs).
struct DockerCloud;

impl wire::CloudAdapter for DockerCloud {
    fn run(request: RunRequest) -> Result<RunResult, RunError> {
        if request.timeout_ms > MAX_RUN_MS {
            return Err(too_long());
        }
        let deadline = wire::begin_call(u64::from(request.timeout_ms));
        let service = service()?;
        let limit = request.output_limit;
        match request.payload {
            Payload::Javascript(code) => {
                in_sandbox(&service, request.timeout_ms, deadline, |sandbox| {
                    snippet(sandbox, &code, limit, deadline)
                })
                .map(RunResult::Javascript)
            }
            Payload::Project(p) => in_sandbox(&service, request.timeout_ms, deadline, |sandbox| {
                wire::project::run(sandbox, PROJECT_DIR, &p, limit, deadline)
            })
            .map(RunResult::Project),
            Payload::Cell(_) => Err(RunError::NotDispatched(Refusal::Unsupported(
                "cells need a session, and dockercloud's sessions keep no interpreter".into(),
            ))),
        }
    }
}

bindings::export!(DockerCloud);

fn service() -> Result<api::Service, RunError> {
    wire::adapter::configured(api::Service::configured)
}

/// Creates and checks a sandbox, runs `f` in it, and deletes it however
/// `f` ended.
fn in_sandbox<T>(
    service: &api::Service,
    timeout_ms: u32,
    deadline: Instant,
    f: impl FnOnce(&endpoint::Endpoint<'_>) -> Result<T, RunError>,
) -> Result<T, RunError> {
    let sandbox = service.create(wire::seconds(timeout_ms), deadline)?;
    let outcome = service
        .ready(&sandbox, deadline)
        .and_then(|credential| f(&endpoint::Endpoint::new(&sandbox, credential)));
    service.delete(&sandbox.uid);
    outcome
}

/// What a call longer than a credential's life gets.
fn too_long() -> RunError {
    RunError::NotDispatched(Refusal::Request(format!(
        "dockercloud runs end within {} s (the sandbox endpoint's credential lives 300 s); ask for less",
        MAX_RUN_MS / 1000
    )))
}

/// A snippet: written to a file, run with node through the wrapper.
fn snippet(
    sandbox: &endpoint::Endpoint<'_>,
    code: &str,
    limit: u32,
    deadline: Instant,
) -> Result<ProcessOutput, RunError> {
    sandbox.put_files(&[(SNIPPET.to_string(), code.as_bytes())], deadline)?;
    let command = Command {
        argv: &["node", SNIPPET],
        cwd: None,
        limit,
    };
    sandbox.exec(&command, deadline)
}
