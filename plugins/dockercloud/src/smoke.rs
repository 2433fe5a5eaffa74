//! The startup smoke test: one real sandbox made the way runs make it,
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

use crate::PROJECT_DIR;
use crate::api::Service;
use crate::bindings::plimsoll::provider::types::{PreflightReport, ProcessOutput, RunError};
use crate::endpoint::Endpoint;
use crate::wire::smoke::{self, describe};
use crate::wire::{self, Sandbox as _};
use plimsoll_plugin_probe::Checks;
use wasi::clocks::monotonic_clock::Instant;

/// Budget for the whole probe, inside the host's preflight limit.
const PROBE_MS: u64 = 90_000;
/// The cap the flood check uses.
const CAP: u32 = 4096;

/// One step; each line is `key=value` for the checks below. Egress is
/// tried to two addresses that answer on the open internet, a short
/// timeout each (a connect that hangs counts as closed).
const PROBE_STEP: &str = r#"echo "cwd=$(pwd)"
echo "file=$(cat plimsoll-probe.txt 2>/dev/null)"
if grep -qw hypervisor /proc/cpuinfo; then echo hypervisor=yes; else echo hypervisor=no; fi
if [ -e /.dockerenv ] || [ -e /run/.containerenv ]; then echo container=yes; else echo container=no; fi
for target in 1.1.1.1:443 8.8.8.8:53; do
  if timeout 3 node -e 'const [h,p]=process.argv[1].split(":");require("net").connect(+p,h).on("connect",()=>process.exit(0)).on("error",()=>process.exit(1))' "$target" 2>/dev/null; then echo "egress=open"; else echo "egress=closed"; fi
done
echo "node=$(node --version 2>/dev/null)"
"#;

pub fn preflight(service: &Service) -> Result<PreflightReport, String> {
    let deadline = wire::after_ms(PROBE_MS);
    wire::set_call_deadline(deadline);
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
    let (out, slept, flood) = outcome.map_err(|e| format!("the probe failed: {}", describe(&e)))?;
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

type Probed = (ProcessOutput, ProcessOutput, ProcessOutput);

fn probe(sandbox: &Endpoint<'_>, token: &str, deadline: Instant) -> Result<Probed, RunError> {
    sandbox.make_dir(PROJECT_DIR, deadline)?;
    let out = smoke::step(sandbox, PROJECT_DIR, token, PROBE_STEP, deadline)?;
    // A 1 s limit: the wrapper's seconds come from the budget left, so the
    // probe asks with a deadline 3 s away (2 s are kept back).
    let slept = sandbox.exec(
        &["sleep", "30"],
        None,
        CAP,
        wire::after_ms(3_500).min(deadline),
    )?;
    // More than the cap, from a program that then exits 0 on its own.
    let flood = sandbox.exec(&["head", "-c", "200000", "/dev/zero"], None, CAP, deadline)?;
    Ok((out, slept, flood))
}
