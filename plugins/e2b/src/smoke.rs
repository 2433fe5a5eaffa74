//! What the adapter states (a vm tier, from provider identity) and the
//! startup smoke test: one real sandbox of the kind runs use, made the
//! way runs make it, proving from inside what the tier and SECURITY.md rest
//! on. It receives a project file, runs a step in the project directory,
//! shows a virtual machine's signs rather than a container's, and cannot
//! open a connection out. Leftovers of any instance past their labelled
//! deadline are swept first.
//!
//! This is observation, not attestation: a service that lied about what it
//! runs could show all of this. docs/providers/e2b.md says what it rests on.

use crate::bindings::plimsoll::provider::types::{Description, PreflightReport, Tier};
use crate::envd::Envd;
use crate::wire::smoke::{self, describe};
use crate::wire::{self, Sandbox as _};
use crate::{E2b, NAME, PROJECT_DIR, service};
use plimsoll_plugin_probe::Checks;

/// Budget for the whole probe, inside the host's preflight limit.
const PROBE_MS: u64 = 60_000;

/// The probe step's egress check, through bash's `/dev/tcp`: tried twice,
/// to addresses that answer on the open internet, with a short timeout
/// each (a connect that hangs counts as denied).
const EGRESS: &str = r#"for target in 1.1.1.1/443 8.8.8.8/53; do
  if timeout 3 bash -c "exec 3<>/dev/tcp/$target" 2>/dev/null; then echo "egress=open"; else echo "egress=closed"; fi
done
"#;

impl wire::Startup for E2b {
    fn config_keys() -> &'static [wire::config::Key] {
        crate::settings::KEYS
    }

    fn describe() -> Description {
        wire::adapter::hosted(
            NAME,
            Tier::Vm,
            format!("e2b:template={}", crate::settings::template()),
        )
    }

    fn preflight() -> Result<PreflightReport, String> {
        let service = service().map_err(|e| format!("{e:?}"))?;
        let mut checks = Checks::default();
        match service.sweep() {
            Ok(n) => checks.note(format!("swept {n} expired sandbox(es) of ours")),
            Err(e) => return Err(format!("listing sandboxes failed: {e}")),
        }
        let deadline = wire::begin_call(PROBE_MS);
        let token = smoke::token();
        let sandbox = service
            .create(PROBE_MS / 1000, deadline, None)
            .map_err(|e| format!("creating the probe sandbox failed: {}", describe(&e)))?;
        let envd = Envd::for_run(&service, &sandbox);
        // The directory is made on its own, so a lost upload shows as a
        // missing file rather than a step that cannot start.
        let lines = [smoke::VM_SIGNS, EGRESS];
        let ran = envd
            .make_dir(PROJECT_DIR, deadline)
            .and_then(|()| smoke::step(&envd, PROJECT_DIR, &token, &lines, deadline));
        service.delete(&sandbox.id);
        let out = ran.map_err(|e| format!("the probe step failed: {}", describe(&e)))?;
        let probe = smoke::step_checks(&mut checks, &out, PROJECT_DIR, "project", &token);
        checks.vm(&probe);
        checks.egress_and_node(&probe);
        Ok(smoke::report(&checks))
    }
}
