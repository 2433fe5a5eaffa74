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
mod smoke;

/// The cloud adapters' kit: the bindings, the wasi:http client, the project
/// runner and the probe step.
use plimsoll_plugin_wire as wire;
/// The `cloud-adapter` world's bindings, generated once, in the kit.
use wire::bindings;

use bindings::plimsoll::provider::http;
use bindings::plimsoll::provider::types::{
    Description, Payload, PayloadKind, PreflightReport, Refusal, RunError, RunRequest, RunResult,
    SessionAnswer, SessionFailure, SessionOptions, Tier,
};
use gateway::Gateway;
use project::{Target, WORK_DIR};

struct OpenShell;

impl wire::CloudAdapter for OpenShell {
    fn describe() -> Description {
        Description {
            name: "openshell".to_string(),
            tier: Tier::Container,
            payloads: vec![PayloadKind::Javascript, PayloadKind::Project],
            environment: format!("openshell:image={}", gateway::IMAGE),
            sessions: Some(wire::session::support()),
        }
    }

    fn preflight() -> Result<PreflightReport, String> {
        smoke::preflight(&gateway()?)
    }

    fn run(request: RunRequest) -> Result<RunResult, RunError> {
        let deadline = wire::after_ms(u64::from(request.timeout_ms));
        wire::set_call_deadline(deadline);
        let gw = gateway().map_err(|e| RunError::NotDispatched(Refusal::Environment(e)))?;
        gw.check_driver(deadline)?;
        let made = gw.create(u64::from(request.timeout_ms).div_ceil(1000), deadline)?;
        let limit = request.output_limit;
        let outcome = match request.payload {
            Payload::Javascript(code) => exec::run(
                &gw,
                &made.name,
                &exec::Command {
                    argv: &["node", "-"],
                    workdir: "",
                    stdin: code.as_bytes(),
                    limit: limit as usize,
                },
                deadline,
            )
            .map(RunResult::Javascript),
            Payload::Project(p) => {
                let target = Target {
                    gw: &gw,
                    name: &made.name,
                };
                wire::project::run(&target, WORK_DIR, &p, limit, deadline).map(RunResult::Project)
            }
            Payload::Cell(_) => Err(RunError::NotDispatched(Refusal::Unsupported(
                "cells need a session, and openshell's sessions keep no interpreter".into(),
            ))),
        };
        gw.delete(&made.name);
        outcome
    }

    fn open_session(options: SessionOptions) -> Result<String, RunError> {
        let gw = gateway().map_err(|e| RunError::NotDispatched(Refusal::Environment(e)))?;
        session::open(&gw, options)
    }

    fn session_run(state: String, request: RunRequest) -> Result<SessionAnswer, SessionFailure> {
        let gw = gateway().map_err(|e| SessionFailure {
            error: RunError::NotDispatched(Refusal::Environment(e)),
            ended: None,
        })?;
        session::run(&gw, &state, request)
    }

    fn close_session(state: String) {
        if let Ok(gw) = gateway() {
            session::close(&gw, &state);
        }
    }
}

bindings::export!(OpenShell);

fn gateway() -> Result<Gateway, String> {
    Gateway::configured(http::allowed_origins())
}
