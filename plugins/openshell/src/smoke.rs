//! The startup smoke test: the gateway's one docker driver with limits, a
//! sweep of our expired leftovers, and one real sandbox made as runs make
//! it (read back, its policy checked), proving from inside what the tier
//! and SECURITY.md rest on: a file arrives, a step runs in the work
//! directory, node is present, nothing outside `/tmp` is writable, and no
//! connection leaves. Any promise broken and the daemon does not start,
//! naming it. Observation, not attestation: docs/providers/openshell.md
//! says what it rests on.

use crate::bindings::plimsoll::provider::types::PreflightReport;
use crate::gateway::Gateway;
use crate::project::{Target, WORK_DIR};
use crate::wire;
use crate::wire::smoke::{self, describe};
use plimsoll_plugin_probe::Checks;

const PROBE_MS: u64 = 60_000;

const PROBE_STEP: &str = r#"echo "cwd=$(pwd)"
echo "file=$(cat plimsoll-probe.txt 2>/dev/null)"
for dir in /etc /usr /bin /root; do
  if ( : > "$dir/.plimsoll-write-probe" ) 2>/dev/null; then echo "writable=$dir"; rm -f "$dir/.plimsoll-write-probe"; fi
done
echo "writable-done=yes"
for target in 1.1.1.1:443 8.8.8.8:53; do
  if timeout 3 node -e 'const [h,p]=process.argv[1].split(":");require("net").connect(+p,h).on("connect",()=>process.exit(0)).on("error",()=>process.exit(1))' "$target" 2>/dev/null; then echo "egress=open"; else echo "egress=closed"; fi
done
echo "node=$(node --version 2>/dev/null)"
"#;

pub fn preflight(gw: &Gateway) -> Result<PreflightReport, String> {
    let deadline = wire::after_ms(PROBE_MS);
    wire::set_call_deadline(deadline);
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
        .create(PROBE_MS / 1000, deadline)
        .map_err(|e| format!("the probe sandbox failed its checks: {}", describe(&e)))?;
    checks.check(
        true,
        "the sandbox reads back as created (its main process the one asked for), its own policy in force and admitted, proposals off",
    );
    let token = smoke::token();
    let target = Target {
        gw,
        name: &made.name,
    };
    // The file's own write makes the work directory.
    let ran = smoke::step(&target, WORK_DIR, &token, PROBE_STEP, deadline);
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
