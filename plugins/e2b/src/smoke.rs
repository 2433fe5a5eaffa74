//! The startup smoke test: one real sandbox of the kind runs use, made the
//! way runs make it, proving from inside what the tier and SECURITY.md rest
//! on. It receives a project file, runs a step in the project directory,
//! shows a virtual machine's signs rather than a container's, and cannot
//! open a connection out. Leftovers of any instance past their labelled
//! deadline are swept first.
//!
//! This is observation, not attestation: a service that lied about what it
//! runs could show all of this. docs/providers/e2b.md says what it rests on.

use crate::bindings::plimsoll::provider::types::{Language, PreflightReport, RunError};
use crate::control::Service;
use crate::envd::{Command, Envd};
use crate::project::PROJECT_DIR;
use crate::wire;
use plimsoll_plugin_probe::{Checks, Probe};

/// Budget for the whole probe, inside the host's preflight limit.
const PROBE_MS: u64 = 60_000;
const PROBE_FILE: &str = "plimsoll-probe.txt";

/// One step; each line is `key=value` for the checks below. Egress is tried
/// twice, to addresses that answer on the open internet, with a short
/// timeout each (a connect that hangs counts as denied).
const PROBE_STEP: &str = r#"echo "cwd=$(pwd)"
echo "file=$(cat plimsoll-probe.txt 2>/dev/null)"
if grep -qw hypervisor /proc/cpuinfo; then echo hypervisor=yes; else echo hypervisor=no; fi
if [ -e /.dockerenv ] || [ -e /run/.containerenv ]; then echo container=yes; else echo container=no; fi
for target in 1.1.1.1/443 8.8.8.8/53; do
  if timeout 3 bash -c "exec 3<>/dev/tcp/$target" 2>/dev/null; then echo "egress=open"; else echo "egress=closed"; fi
done
echo "node=$(node --version 2>/dev/null)"
"#;

pub fn preflight(service: &Service) -> Result<PreflightReport, String> {
    let mut checks = Checks::default();
    match service.sweep() {
        Ok(n) => checks.note(format!("swept {n} expired sandbox(es) of ours")),
        Err(e) => return Err(format!("listing sandboxes failed: {e}")),
    }
    let deadline = wire::after_ms(PROBE_MS);
    wire::set_call_deadline(deadline);
    let token = format!("{:016x}", wasi::random::random::get_random_u64());
    let sandbox = service
        .create(PROBE_MS / 1000, deadline)
        .map_err(|e| format!("creating the probe sandbox failed: {}", describe(&e)))?;
    let envd = Envd::for_run(service, &sandbox);
    let file = format!("{PROJECT_DIR}/{PROBE_FILE}");
    // The directory is made on its own, so a lost upload shows as a missing
    // file rather than a step that cannot start.
    let ran = envd
        .make_dir(PROJECT_DIR, deadline)
        .and_then(|()| envd.upload(&[(file, token.as_bytes())], deadline))
        .and_then(|()| {
            envd.run(
                &Command {
                    cmd: "/bin/sh",
                    args: &["-c", PROBE_STEP],
                    cwd: PROJECT_DIR,
                },
                64 << 10,
                deadline,
            )
        });
    service.delete(&sandbox.id);
    let out = ran.map_err(|e| format!("the probe step failed: {}", describe(&e)))?;
    let probe = Probe::new(&out.stdout);
    checks.check(out.exit_code == 0 && !out.timed_out, "probe step exit 0");
    checks.check(
        probe.is("cwd", PROJECT_DIR),
        "the step ran in the project directory",
    );
    checks.check(probe.is("file", &token), "the project file arrived intact");
    checks.check(probe.is("hypervisor", "yes"), "the CPU is virtual (a VM)");
    checks.check(
        probe.is("container", "no"),
        "no container runtime marker (a VM, not a container)",
    );
    checks.egress_and_node(&probe);
    Ok(PreflightReport {
        passed: checks.passed(),
        checks: checks.report(),
        languages: vec![Language::Javascript],
    })
}

fn describe(e: &RunError) -> String {
    match e {
        RunError::NotDispatched(r) => format!("{r:?}"),
        RunError::MayHaveRun(s) => s.clone(),
    }
}
