//! The gateway's side of a run: the one-driver check, create and wait until
//! ready, everything read back, delete, and the sweep of leftovers.

use std::collections::HashMap;

use prost_types::{Duration, Struct, Value, value::Kind};
use wasi::clocks::monotonic_clock::Instant;

use crate::bindings::plimsoll::provider::types::{Refusal, RunError};
use crate::grpc::{self, CallError};
use crate::messages::*;
use crate::policy;
use crate::wire;
pub use crate::wire::not_started;
use crate::wire::session::Standing;

/// Labels: who made it, and the wall-clock second after which no run of any
/// instance can still be using it (any instance's sweep may reap it then).
const LABEL_OWNER: (&str, &str) = ("plimsoll.run", "1");
const LABEL_DEADLINE: &str = "plimsoll.deadline";
const POLL_MS: u64 = 50;
/// The sandbox's main process, named explicitly: one that never exits and
/// needs no terminal. The gateway turns an omitted command into a login
/// shell on a pseudo-terminal (`/bin/bash -l`, `tty` true) before it
/// stores the sandbox, and any end of the main process, exit 0 included,
/// makes the sandbox terminal (COMPLETED or ERROR). The work itself runs
/// in execs; this process only holds the sandbox open.
pub const MAIN_PROCESS: [&str; 2] = ["sleep", "infinity"];
const MAIN_PROCESS_TTY: bool = false;

pub struct Gateway {
    pub origin: String,
}

/// A sandbox made for this run, by name (the gateway addresses them so).
pub struct Made {
    pub name: String,
}

impl Gateway {
    pub fn configured(origins: Vec<String>) -> Result<Gateway, String> {
        let origin = origins.into_iter().next().ok_or(
            "no origin is allowed: set SANDBOX_PLUGIN_HTTP_ORIGINS to the OpenShell gateway",
        )?;
        Ok(Gateway { origin })
    }

    /// Exactly one compute driver, docker, that enforces memory and CPU
    /// limits: the container tier rests on it.
    pub fn check_driver(&self, deadline: Instant) -> Result<(), RunError> {
        let info: GetGatewayInfoResponse = grpc::unary(
            &self.origin,
            "GetGatewayInfo",
            &GetGatewayInfoRequest {},
            deadline,
        )
        .map_err(|e| match e {
            CallError::Status(grpc::PERMISSION_DENIED | grpc::UNAUTHENTICATED, _) => {
                RunError::NotDispatched(Refusal::Permission(
                    "the gateway refused its info (a bearer token needs the platform_admin role)"
                        .into(),
                ))
            }
            e => not_started(&format!("the gateway info failed: {}", e.say())),
        })?;
        let [driver] = info.compute_drivers.as_slice() else {
            return Err(isolation(format!(
                "the gateway has {} compute drivers, not exactly one",
                info.compute_drivers.len()
            )));
        };
        let caps = driver.capabilities.as_ref();
        let limits = caps.and_then(|c| c.resource_capabilities.as_ref());
        let ok = driver.name == "docker"
            && caps.is_some_and(|c| c.driver_name == "docker")
            && limits.is_some_and(|l| {
                l.memory.as_ref().is_some_and(|m| m.limit_supported)
                    && l.cpu.as_ref().is_some_and(|c| c.limit_supported)
            });
        if !ok {
            return Err(isolation(
                "the gateway's compute driver is not docker with memory and CPU limits".into(),
            ));
        }
        Ok(())
    }

    /// Creates a sandbox and waits until it is ready; everything the gateway
    /// reports is checked against what was asked before this returns, and
    /// a sandbox that fails a check is deleted. With `guard`, its policy
    /// lets node and python reach the guard and nothing else.
    pub fn create(
        &self,
        lifetime_s: u64,
        deadline: Instant,
        guard: Option<policy::Guard<'_>>,
    ) -> Result<Made, RunError> {
        let name = format!("plp-{:014x}", wasi::random::random::get_random_u64() >> 8);
        let labels = HashMap::from([
            (LABEL_OWNER.0.to_string(), LABEL_OWNER.1.to_string()),
            (
                LABEL_DEADLINE.to_string(),
                (wire::wall_seconds() + lifetime_s + 60).to_string(),
            ),
        ]);
        let spec = spec(guard);
        let request = CreateSandboxRequest {
            spec: Some(spec.clone()),
            name: name.clone(),
            labels: labels.clone(),
            workspace_scope: workspace_scope(),
        };
        let made = Made { name };
        let created: Result<SandboxResponse, _> =
            grpc::unary(&self.origin, "CreateSandbox", &request, deadline);
        if let Err(e) = created {
            self.delete(&made.name);
            return Err(match e {
                CallError::Status(grpc::RESOURCE_EXHAUSTED, _) => {
                    RunError::NotDispatched(Refusal::Capacity("the gateway is at capacity".into()))
                }
                e => not_started(&format!("the create failed: {}", e.say())),
            });
        }
        let fail = |why: String| {
            self.delete(&made.name);
            Err(not_started(&why))
        };
        let sandbox = loop {
            let got = self.get(&made.name, deadline);
            let sandbox = match got {
                Ok(r) => r.sandbox.unwrap_or_default(),
                Err(e) => return fail(format!("reading the new sandbox failed: {}", e.say())),
            };
            match sandbox.status.as_ref().map_or(0, |s| s.phase) {
                PHASE_READY => break sandbox,
                PHASE_PROVISIONING | PHASE_STARTING | 0 => {}
                phase @ (PHASE_ERROR | PHASE_COMPLETED) => return fail(terminal(&sandbox, phase)),
                phase => return fail(format!("the sandbox reached phase {phase}, not ready")),
            }
            if wire::remaining_ms(deadline) < POLL_MS {
                return fail("the sandbox was not ready within the run's budget".into());
            }
            wire::sleep_ms(POLL_MS);
        };
        if let Err(why) = read_back(&sandbox, &made.name, &labels, &spec) {
            return fail(why);
        }
        if let Err(e) = self.check_config(&made.name, deadline, guard) {
            self.delete(&made.name);
            return Err(e);
        }
        Ok(made)
    }

    /// The policy in force, read back: the sandbox's own, the one sent
    /// (by hash and by value), admitted, and agent proposals proven off.
    /// `guard` is what the sandbox was created with.
    pub fn check_config(
        &self,
        name: &str,
        deadline: Instant,
        guard: Option<policy::Guard<'_>>,
    ) -> Result<(), RunError> {
        let config: GetSandboxConfigResponse = grpc::unary(
            &self.origin,
            "GetSandboxConfig",
            &GetSandboxConfigRequest {
                name: name.to_string(),
                workspace_scope: workspace_scope(),
            },
            deadline,
        )
        .map_err(|e| not_started(&format!("reading the sandbox's config failed: {}", e.say())))?;
        let sent = policy::sandbox_policy(guard);
        let want = policy::hash(&sent).unwrap_or_default();
        if config.policy_source != POLICY_SOURCE_SANDBOX {
            return Err(isolation(
                "the policy in force is not the sandbox's own (a global policy governs)".into(),
            ));
        }
        if config.policy.as_ref() != Some(&sent) {
            return Err(isolation("the policy in force is not the one sent".into()));
        }
        if config.policy_hash != want {
            return Err(isolation(
                "the gateway's policy hash is not the hash of the policy sent".into(),
            ));
        }
        if !config.configuration_admitted {
            return Err(isolation(
                "the gateway did not admit the configuration".into(),
            ));
        }
        let proposals = config
            .settings
            .get("agent_policy_proposals_enabled")
            .and_then(|s| s.value.as_ref());
        let off = match proposals {
            None => config
                .settings
                .contains_key("agent_policy_proposals_enabled"),
            Some(v) => v.bool_value == Some(false),
        };
        if !off {
            return Err(isolation(
                "agent policy proposals are not proven off (the policy could be widened)".into(),
            ));
        }
        Ok(())
    }

    /// Where a session's sandbox stands at a call: ready, its main process
    /// ended (the sandbox is terminal, with the reason), gone, or not known
    /// (the read failed; the call is refused, the session kept).
    pub fn standing(&self, name: &str, deadline: Instant) -> Standing<()> {
        let got = self.get(name, deadline);
        let sandbox = match got {
            Ok(r) => r.sandbox.unwrap_or_default(),
            Err(CallError::Status(grpc::NOT_FOUND, _)) => return Standing::Gone,
            Err(e) => return Standing::Unknown(format!("reading the sandbox failed: {}", e.say())),
        };
        match sandbox.status.as_ref().map_or(0, |s| s.phase) {
            PHASE_READY => Standing::Running(()),
            phase @ (PHASE_ERROR | PHASE_COMPLETED) => Standing::Ended(terminal(&sandbox, phase)),
            phase => Standing::Unknown(format!("the sandbox is in phase {phase}, not ready")),
        }
    }

    fn get(&self, name: &str, deadline: Instant) -> Result<SandboxResponse, CallError> {
        grpc::unary(
            &self.origin,
            "GetSandbox",
            &GetSandboxRequest {
                name: name.to_string(),
                workspace_scope: workspace_scope(),
            },
            deadline,
        )
    }

    /// Deletes the sandbox and waits until it is gone; true once it is.
    pub fn delete(&self, name: &str) -> bool {
        let deadline = wire::cleanup_deadline();
        for _ in 0..3 {
            let deleted: Result<DeleteSandboxResponse, _> = grpc::unary(
                &self.origin,
                "DeleteSandbox",
                &DeleteSandboxRequest {
                    name: name.to_string(),
                    workspace_scope: workspace_scope(),
                    allow_missing: true,
                },
                deadline,
            );
            if deleted.is_ok() && self.gone(name, deadline) {
                return true;
            }
            if wire::remaining_ms(deadline) < 200 {
                return false;
            }
        }
        false
    }

    /// Reads until the gateway says the sandbox is not found.
    fn gone(&self, name: &str, deadline: Instant) -> bool {
        loop {
            let got = self.get(name, deadline);
            match got {
                Err(CallError::Status(grpc::NOT_FOUND, _)) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
            if wire::remaining_ms(deadline) < 100 {
                return false;
            }
            wire::sleep_ms(100);
        }
    }

    /// Deletes every sandbox labelled ours whose labelled deadline passed,
    /// whichever instance made it.
    pub fn sweep(&self, deadline: Instant) -> Result<usize, String> {
        let now = wire::wall_seconds();
        let mut expired = Vec::new();
        let mut token = String::new();
        for _ in 0..50 {
            let page: ListSandboxesResponse = grpc::unary(
                &self.origin,
                "ListSandboxes",
                &ListSandboxesRequest {
                    page_size: 100,
                    page_token: token.clone(),
                    label_selector: format!("{}={}", LABEL_OWNER.0, LABEL_OWNER.1),
                    workspace_scope: workspace_scope(),
                },
                deadline,
            )
            .map_err(|e| e.say())?;
            for s in &page.sandboxes {
                let Some(meta) = &s.metadata else { continue };
                // The selector is the gateway's; checked again here.
                let ours =
                    meta.labels.get(LABEL_OWNER.0).map(String::as_str) == Some(LABEL_OWNER.1);
                let past = meta
                    .labels
                    .get(LABEL_DEADLINE)
                    .and_then(|d| d.parse::<u64>().ok())
                    .is_none_or(|d| d < now);
                if ours && past {
                    expired.push(meta.name.clone());
                }
            }
            token = page.next_page_token;
            if token.is_empty() {
                break;
            }
        }
        Ok(expired.iter().filter(|n| self.delete(n)).count())
    }
}

/// What every sandbox is created with: the image with its limits, the
/// policy, no credential providers, and `MAIN_PROCESS` without a terminal.
fn spec(guard: Option<policy::Guard<'_>>) -> SandboxSpec {
    let text = |s: &str| Value {
        kind: Some(Kind::StringValue(s.into())),
    };
    let limits = Struct {
        fields: [
            ("memory".to_string(), text(&crate::settings::memory())),
            ("cpu".to_string(), text(&crate::settings::cpu())),
        ]
        .into_iter()
        .collect(),
    };
    let resources = Struct {
        fields: [(
            "limits".to_string(),
            Value {
                kind: Some(Kind::StructValue(limits)),
            },
        )]
        .into_iter()
        .collect(),
    };
    SandboxSpec {
        template: Some(SandboxTemplate {
            image: crate::settings::image(),
            resources: Some(resources),
            driver_config: None,
        }),
        policy: Some(policy::sandbox_policy(guard)),
        providers: Vec::new(),
        command: MAIN_PROCESS.iter().map(|s| s.to_string()).collect(),
        tty: MAIN_PROCESS_TTY,
    }
}

/// Why a sandbox that went terminal (ERROR or COMPLETED) before it was
/// ready failed: its main process ended, with the exit the gateway states,
/// or the sandbox itself failed.
fn terminal(s: &Sandbox, phase: i32) -> String {
    match (phase, s.status.as_ref().and_then(|st| st.exit_code)) {
        (_, Some(code)) => format!("the sandbox's main process ended with exit {code}"),
        (PHASE_COMPLETED, None) => "the sandbox's main process ended".into(),
        _ => "the sandbox failed (phase ERROR)".into(),
    }
}

/// The sandbox as the gateway reports it, against what was asked.
fn read_back(
    s: &Sandbox,
    name: &str,
    labels: &HashMap<String, String>,
    asked: &SandboxSpec,
) -> Result<(), String> {
    let meta = s.metadata.as_ref().ok_or("the sandbox has no metadata")?;
    if meta.name != name || meta.id.is_empty() {
        return Err("the gateway reports another sandbox than the one created".into());
    }
    if labels.iter().any(|(k, v)| meta.labels.get(k) != Some(v)) {
        return Err("the gateway lost or changed a label".into());
    }
    let spec = s.spec.as_ref().ok_or("the sandbox reports no spec")?;
    if spec.template != asked.template {
        return Err("the sandbox's image or limits are not the ones asked for".into());
    }
    if spec.policy != asked.policy {
        return Err("the sandbox's policy is not the one sent".into());
    }
    if !spec.providers.is_empty() {
        return Err("the sandbox has credential providers attached".into());
    }
    // Compared exactly: a sandbox running a process nobody asked for (the
    // gateway's login shell, say) is refused.
    if spec.command != asked.command || spec.tty != asked.tty {
        return Err("the sandbox's main process is not the one asked for".into());
    }
    Ok(())
}

pub fn execution_timeout(deadline: Instant) -> Duration {
    Duration {
        seconds: (wire::remaining_ms(deadline) / 1000 + 10) as i64,
        nanos: 0,
    }
}

fn isolation(why: String) -> RunError {
    RunError::NotDispatched(Refusal::Isolation(why))
}
