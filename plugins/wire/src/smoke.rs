//! What the cloud adapters' startup smoke tests share: the probe step (a
//! token written into the directory a project would use, then a probe
//! script run there, printing `key=value` lines, its shared lines here and
//! the adapter's own between them) and the checks every probe step's
//! output answers the same way. The adapter makes and deletes the sandbox,
//! and adds the checks of its own promises.

use plimsoll_plugin_probe::{Checks, Probe};
use wasi::clocks::monotonic_clock::Instant;

use crate::bindings::plimsoll::provider::types::{
    Language, PreflightReport, ProcessOutput, RunError,
};
use crate::sandbox::{Command, Sandbox};

/// The file the probe step writes the token to, in the step's directory;
/// each probe script prints it back as `file=`.
pub const PROBE_FILE: &str = "plimsoll-probe.txt";
/// The probe script's output kept.
const STEP_LIMIT: u32 = 64 << 10;

/// What every probe script prints first: where it ran, and what the probe
/// file holds (`step_checks` reads both).
const SCRIPT_HEAD: &str = r#"echo "cwd=$(pwd)"
echo "file=$(cat plimsoll-probe.txt 2>/dev/null)"
"#;
/// What every probe script prints last: node's version
/// (`Checks::egress_and_node` reads it).
const SCRIPT_TAIL: &str = r#"echo "node=$(node --version 2>/dev/null)"
"#;

/// A virtual machine's two signs rather than a container's, as
/// `Checks::vm` reads them: a virtual CPU, and no container runtime's
/// marker.
pub const VM_SIGNS: &str = r#"if grep -qw hypervisor /proc/cpuinfo; then echo hypervisor=yes; else echo hypervisor=no; fi
if [ -e /.dockerenv ] || [ -e /run/.containerenv ]; then echo container=yes; else echo container=no; fi
"#;

/// Egress tried with node (for a shell with no `/dev/tcp`) to two
/// addresses that answer on the open internet, a short timeout each: a
/// connect that hangs counts as closed (`Checks::egress_and_node` reads
/// both).
pub const NODE_EGRESS: &str = r#"for target in 1.1.1.1:443 8.8.8.8:53; do
  if timeout 3 node -e 'const [h,p]=process.argv[1].split(":");require("net").connect(+p,h).on("connect",()=>process.exit(0)).on("error",()=>process.exit(1))' "$target" 2>/dev/null; then echo "egress=open"; else echo "egress=closed"; fi
done
"#;

/// A fresh token for the probe file.
pub fn token() -> String {
    format!("{:016x}", wasi::random::random::get_random_u64())
}

/// The probe step: `token` written to `PROBE_FILE` in `dir` (which must be
/// there, or be made by the write), then the probe script run in `dir`
/// through the sandbox's shell: `SCRIPT_HEAD`, the adapter's `lines` (its
/// own, `VM_SIGNS`, `NODE_EGRESS`), then `SCRIPT_TAIL`.
pub fn step<S: Sandbox>(
    sandbox: &S,
    dir: &str,
    token: &str,
    lines: &[&str],
    deadline: Instant,
) -> Result<ProcessOutput, RunError> {
    sandbox.put_files(
        &[(format!("{dir}/{PROBE_FILE}"), token.as_bytes())],
        deadline,
    )?;
    let script = format!("{SCRIPT_HEAD}{}{SCRIPT_TAIL}", lines.concat());
    let argv = [S::SHELL, "-c", script.as_str()];
    let command = Command {
        argv: &argv,
        cwd: Some(dir),
        limit: STEP_LIMIT,
    };
    sandbox.exec(&command, deadline)
}

/// The checks every probe step's output answers: it exited 0, it ran in
/// `dir` (named "the {dir_name} directory" in the report) and the token
/// arrived. Returns the output read as `key=value` lines, for the
/// adapter's own checks.
pub fn step_checks(
    checks: &mut Checks,
    out: &ProcessOutput,
    dir: &str,
    dir_name: &str,
    token: &str,
) -> Probe {
    let probe = Probe::new(&out.stdout);
    checks.check(out.exit_code == 0 && !out.timed_out, "probe step exit 0");
    checks.check(
        probe.is("cwd", dir),
        &format!("the step ran in the {dir_name} directory"),
    );
    checks.check(probe.is("file", token), "the project file arrived intact");
    probe
}

/// The report: every check, passed only when none failed; the probe
/// proved node present.
pub fn report(checks: &Checks) -> PreflightReport {
    PreflightReport {
        passed: checks.passed(),
        checks: checks.report(),
        languages: vec![Language::Javascript],
    }
}

/// A failure that stopped the smoke test, for the operator's log.
pub fn describe(e: &RunError) -> String {
    match e {
        RunError::NotDispatched(r) => format!("{r:?}"),
        RunError::MayHaveRun(s) => s.clone(),
    }
}
