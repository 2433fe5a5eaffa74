//! What the adapter states (a vm tier, from provider identity) and the
//! startup smoke test: one real sandbox made the way runs make it,
//! proving from inside what the tier and SECURITY.md rest on. The API
//! answers a list (and leftovers of ours past their labelled deadline are
//! swept); the new sandbox's policy reads back deny-all; a project file
//! arrives; a step runs in the project directory, finds node, shows a
//! virtual CPU and no container marker, and cannot open a connection out;
//! the wrapper ends `sleep 30` at a 1 s limit and cuts `yes` at exactly
//! the cap. Any promise broken and the daemon does not start, naming it.
//!
//! This is observation, not attestation: a service that lied about what
//! it runs could show all of this. docs/providers/dockercloud.md says what
//! it rests on.

use crate::bindings::plimsoll::provider::types::{
    Description, PreflightReport, ProcessOutput, RunError, Tier,
};
use crate::endpoint::Endpoint;
use crate::wire::sandbox::Command;
use crate::wire::smoke::{self, describe};
use crate::wire::{self, Sandbox as _};
use crate::{DockerCloud, NAME, PROJECT_DIR, service};
use plimsoll_plugin_probe::Checks;
use wasi::clocks::monotonic_clock::Instant;

/// Budget for the whole probe, inside the host's preflight limit.
const PROBE_MS: u64 = 90_000;
/// The cap the flood check uses.
const CAP: u32 = 4096;

impl wire::Startup for DockerCloud {
    fn config_keys() -> &'static [wire::config::Key] {
        crate::settings::KEYS
    }

    fn describe() -> Description {
        wire::adapter::hosted(
            NAME,
            Tier::Vm,
            format!("dockercloud:image={}", crate::settings::image()),
        )
    }

    fn preflight() -> Result<PreflightReport, String> {
        let service = service().map_err(|e| format!("{e:?}"))?;
        let deadline = wire::begin_call(PROBE_MS);
        let mut checks = Checks::default();
        match service.sweep(deadline) {
            Ok(n) => checks.note(format!(
                "the API lists sandboxes; swept {n} expired one(s) of ours"
            )),
            Err(e) => return Err(format!("listing sandboxes failed: {e}")),
        }
        let token = smoke::token();
        let sandbox = service
            .create(PROBE_MS / 1000, deadline)
            .map_err(|e| format!("creating the probe sandbox failed: {}", describe(&e)))?;
        let outcome = service
            .ready(&sandbox, deadline)
            .and_then(|credential| probe(&Endpoint::new(&sandbox, credential), &token, deadline));
        service.delete(&sandbox.uid);
        let (out, slept, flood) =
            outcome.map_err(|e| format!("the probe failed: {}", describe(&e)))?;
        checks.check(
            true,
            "the sandbox's network policy reads back deny-all, no allow rule",
        );
        let probe = smoke::step_checks(&mut checks, &out, PROJECT_DIR, "project", &token);
        checks.vm(&probe);
        checks.egress_and_node(&probe);
        checks.check(
            slept.timed_out && slept.exit_code == 124,
            "the wrapper ends a command at its time limit",
        );
        checks.check(
            flood.stdout.len() == CAP as usize && flood.stdout_truncated && flood.exit_code == 0,
            "the wrapper cuts output at exactly the cap, and the writer's exit status survives the cut",
        );
        Ok(smoke::report(&checks))
    }
}

type Probed = (ProcessOutput, ProcessOutput, ProcessOutput);

fn probe(sandbox: &Endpoint<'_>, token: &str, deadline: Instant) -> Result<Probed, RunError> {
    sandbox.make_dir(PROJECT_DIR, deadline)?;
    let lines = [smoke::VM_SIGNS, smoke::NODE_EGRESS];
    let out = smoke::step(sandbox, PROJECT_DIR, token, &lines, deadline)?;
    // A 1 s limit: the wrapper's seconds come from the budget left, so the
    // probe asks with a deadline 3 s away (2 s are kept back).
    let slept = sandbox.exec(
        &Command {
            argv: &["sleep", "30"],
            cwd: None,
            limit: CAP,
        },
        wire::after_ms(3_500).min(deadline),
    )?;
    // More than the cap, from a program that then exits 0 on its own.
    let flood = sandbox.exec(
        &Command {
            argv: &["head", "-c", "200000", "/dev/zero"],
            cwd: None,
            limit: CAP,
        },
        deadline,
    )?;
    Ok((out, slept, flood))
}
