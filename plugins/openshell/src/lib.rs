//! openshell: a provider plugin that runs snippets and projects through an
//! NVIDIA OpenShell gateway, gRPC over standard `wasi:http` (HTTP/2, TLS).
//!
//! Per run: the gateway must have exactly one compute driver, docker, that
//! enforces memory and CPU limits; a sandbox is created with labels, the
//! image, limits, a deny-all sandbox policy and its own main process (one
//! that never exits and needs no terminal), polled until ready (a sandbox
//! whose main process ended is a failure), and everything read back
//! (metadata, spec with that main process, and the policy in force by value
//! and by OpenShell's policy hash, admitted, agent proposals off); each
//! command runs over the interactive exec stream with stdin in frames and
//! the exit event authoritative, cancelled at the deadline; the sandbox is
//! deleted on every path, and labelled leftovers are swept at start.
//! Sessions keep one such sandbox for many calls (session.rs).
//!
//! The plugin holds no credential: the host presents the operator's client
//! certificate (mutual TLS) or adds the bearer token. The tier claimed is
//! container: the sandbox user and the rest of the runtime are the
//! gateway's choice; the host caps the claim at `SANDBOX_PLUGIN_MAX_TIER`.
//! See docs/providers/openshell.md.

mod exec;
mod gateway;
mod grpc;
mod messages;
mod policy;
mod project;
mod session;
mod settings;
mod smoke;

/// The cloud adapters' kit: the bindings, the wasi:http client, the project
/// runner and the probe step.
use plimsoll_plugin_wire as wire;
/// The `cloud-adapter` world's bindings, generated once, in the kit.
use wire::bindings;

use bindings::plimsoll::provider::types::{Payload, Refusal, RunError, RunRequest, RunResult};
use gateway::Gateway;
use project::{Target, WORK_DIR};

/// The adapter: what it states and its smoke test (smoke.rs), runs (here)
/// and sessions (session.rs).
struct OpenShell;

impl wire::CloudAdapter for OpenShell {
    fn run(request: RunRequest) -> Result<RunResult, RunError> {
        let deadline = wire::begin_call(u64::from(request.timeout_ms));
        let gw = gateway()?;
        gw.check_driver(deadline)?;
        // Asked before the sandbox exists: its policy names the guard.
        let granted = wire::grant::channel()?;
        let guard = granted.as_ref().map(|g| policy::Guard {
            host: &g.host,
            port: g.port,
        });
        let made = gw.create(wire::seconds(request.timeout_ms), deadline, guard)?;
        let limit = request.output_limit;
        let env = granted.as_ref().map_or(&[][..], |g| g.env.as_slice());
        let target = Target {
            gw: &gw,
            name: &made.name,
            env,
        };
        let written = match &granted {
            Some(g) => g.put(&target, deadline),
            None => Ok(()),
        };
        let outcome = match (written, request.payload) {
            (Err(e), _) => Err(e),
            (Ok(()), Payload::Javascript(code)) => exec::run(
                &gw,
                &made.name,
                &exec::Command {
                    argv: &["node", "-"],
                    workdir: "",
                    stdin: code.as_bytes(),
                    limit: limit as usize,
                    env,
                },
                deadline,
            )
            .map(RunResult::Javascript),
            (Ok(()), Payload::Project(p)) => {
                wire::project::run(&target, WORK_DIR, &p, limit, deadline).map(RunResult::Project)
            }
            (Ok(()), Payload::Cell(_)) => Err(RunError::NotDispatched(Refusal::Unsupported(
                "cells need a session, and openshell's sessions keep no interpreter".into(),
            ))),
        };
        gw.delete(&made.name);
        outcome
    }
}

bindings::export!(OpenShell);

/// The gateway at the first origin the operator allowed.
fn gateway() -> Result<Gateway, RunError> {
    wire::adapter::configured(Gateway::configured)
}
