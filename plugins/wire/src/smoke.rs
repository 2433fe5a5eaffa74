//! What the cloud adapters' startup smoke tests share: the probe step (a
//! token written into the directory a project would use, then the
//! adapter's probe script run there, printing `key=value` lines) and the
//! checks every probe step's output answers the same way. The adapter
//! makes and deletes the sandbox, and adds the checks of its own promises.

use plimsoll_plugin_probe::{Checks, Probe};
use wasi::clocks::monotonic_clock::Instant;

use crate::bindings::plimsoll::provider::types::{
    Language, PreflightReport, ProcessOutput, RunError,
};
use crate::sandbox::Sandbox;

/// The file the probe step writes the token to, in the step's directory;
/// each probe script prints it back as `file=`.
pub const PROBE_FILE: &str = "plimsoll-probe.txt";
/// The probe script's output kept.
const STEP_LIMIT: u32 = 64 << 10;

/// A fresh token for the probe file.
pub fn token() -> String {
    format!("{:016x}", wasi::random::random::get_random_u64())
}

/// The probe step: `token` written to `PROBE_FILE` in `dir` (which must be
/// there, or be made by the write), then `script` run in `dir` through the
/// sandbox's shell.
pub fn step<S: Sandbox>(
    sandbox: &S,
    dir: &str,
    token: &str,
    script: &str,
    deadline: Instant,
) -> Result<ProcessOutput, RunError> {
    sandbox.put_files(
        &[(format!("{dir}/{PROBE_FILE}"), token.as_bytes())],
        deadline,
    )?;
    sandbox.exec(&[S::SHELL, "-c", script], Some(dir), STEP_LIMIT, deadline)
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
