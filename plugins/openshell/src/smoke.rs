//! What the adapter states (a container tier: the sandbox user and the
//! rest of the runtime are the gateway's choice) and the startup smoke
//! test: the gateway's one docker driver with limits, a
//! sweep of our expired leftovers, and one real sandbox made as runs make
//! it (read back, its policy checked), proving from inside what the tier
//! and SECURITY.md rest on: a file arrives, a step runs in the work
//! directory, node is present, nothing outside `/tmp` is writable, and no
//! connection leaves. Any promise broken and the daemon does not start,
//! naming it. Observation, not attestation: docs/providers/openshell.md
//! says what it rests on.

use crate::OpenShell;
use crate::bindings::plimsoll::provider::http;
use crate::bindings::plimsoll::provider::types::{Description, PreflightReport, Tier};
use crate::gateway::Gateway;
use crate::project::{Target, WORK_DIR};
use crate::wire;
use crate::wire::smoke::{self, describe};
use plimsoll_plugin_probe::Checks;

const PROBE_MS: u64 = 60_000;

/// Nothing outside `/tmp` is writable: each directory is tried, and the
/// end is marked so a cut script does not pass.
const WRITABLE: &str = r#"for dir in /etc /usr /bin /root; do
  if ( : > "$dir/.plimsoll-write-probe" ) 2>/dev/null; then echo "writable=$dir"; rm -f "$dir/.plimsoll-write-probe"; fi
done
echo "writable-done=yes"
"#;

impl wire::Startup for OpenShell {
    fn config_keys() -> &'static [wire::config::Key] {
        crate::settings::KEYS
    }

    fn describe() -> Description {
        wire::adapter::hosted(
            "openshell",
            Tier::Container,
            format!("openshell:image={}", crate::settings::image()),
        )
    }

    fn preflight() -> Result<PreflightReport, String> {
        let gw = Gateway::configured(http::allowed_origins())?;
        let deadline = wire::begin_call(PROBE_MS);
        let mut checks = Checks::default();
        gw.check_driver(deadline).map_err(|e| describe(&e))?;
        checks.check(
            true,
            "one compute driver, docker, with memory and CPU limits",
        );
        let n = gw
            .sweep(deadline)
            .map_err(|e| format!("listing sandboxes failed: {e}"))?;
        checks.note(format!("swept {n} expired sandbox(es) of ours"));
        let made = gw
            .create(PROBE_MS / 1000, deadline, None)
            .map_err(|e| format!("the probe sandbox failed its checks: {}", describe(&e)))?;
        checks.check(
            true,
            "the sandbox reads back as created (its main process the one asked for), its own policy in force and admitted, proposals off",
        );
        let token = smoke::token();
        let target = Target {
            gw: &gw,
            name: &made.name,
            env: &[],
        };
        // The file's own write makes the work directory.
        let lines = [WRITABLE, smoke::NODE_EGRESS];
        let ran = smoke::step(&target, WORK_DIR, &token, &lines, deadline);
        gw.delete(&made.name);
        let out = ran.map_err(|e| format!("the probe failed: {}", describe(&e)))?;
        let probe = smoke::step_checks(&mut checks, &out, WORK_DIR, "work", &token);
        checks.check(
            probe.is("writable-done", "yes") && probe.values("writable").is_empty(),
            "nothing outside /tmp is writable",
        );
        checks.egress_and_node(&probe);
        Ok(smoke::report(&checks))
    }
}
