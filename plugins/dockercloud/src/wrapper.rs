//! Every command runs inside the VM under a small POSIX shell wrapper: the
//! service's exec takes no time limit and no output limit, so the wrapper
//! brings both. It runs the command under `timeout -s KILL <secs>`, passes
//! each stream through its own `head -c <cap>` and throws away the rest
//! inside the VM (so the answer never carries more than the cap, and a
//! program that prints past it is not killed by SIGPIPE: its exit status is
//! its own, as on every other tier). The readers get the time limit and one
//! second more (so a command ended at its limit closes their input first),
//! so a process that leaves the command's process group and keeps the
//! pipes open cannot hold the exec past it. Since POSIX sh has no pipefail,
//! the command's status comes out through a file (125 when none was
//! written).
//!
//! In a session the command alone carries the session's mark in its
//! environment, and once it ends the wrapper kills every process holding
//! the mark (the shared sweep, passed in): what the command left running
//! would otherwise keep the pipes open and the exec waiting until the time
//! limit, losing the output. The wrapper and its readers carry no mark.

use base64::Engine;
use serde_json::Value;

use crate::bindings::plimsoll::provider::types::ProcessOutput;
use crate::wire::capture::{EXIT_FLOODED, EXIT_TIMED_OUT};

/// `sh -c WRAPPER plimsoll-exec <secs> <cap> <mark> <sweep> argv...`, the
/// mark (`NAME=value`) and sweep empty outside a session.
///
/// fd 3 is the outer pipe (to the stdout `head`); inside, the command's
/// stderr goes to the inner pipe (to the stderr `head`, written to the real
/// stderr) and its stdout to fd 3.
pub const SCRIPT: &str = r#"limit=$1; cap=$2; mark=$3; sweep=$4; shift 4
status=/tmp/.plimsoll-status.$$
rm -f "$status"
drain() { timeout -s KILL "$((limit + 1))" sh -c 'head -c "$0"; exec cat >/dev/null' "$cap"; }
run() {
  if [ -z "$mark" ]; then timeout -s KILL "$limit" "$@"; echo $? >"$status"; return; fi
  timeout -s KILL "$limit" env "$mark" "$@"; echo $? >"$status"
  timeout -s KILL 3 sh -c "$sweep" plimsoll-sweep "$mark" >/dev/null 2>&1
}
{ { run "$@"; } 2>&1 1>&3 3>&- | drain 1>&2; } 3>&1 | drain
if [ -s "$status" ]; then code=$(cat "$status"); rm -f "$status"; exit "$code"; fi
exit 125"#;

/// Seconds kept back from the budget for the answer to come home.
const MARGIN_S: u64 = 2;

/// The argv that runs `argv` under the wrapper with `secs` and room for one
/// byte past `limit` (the byte that proves a stream was cut); in a session,
/// with its mark (`NAME=value`) and the sweep of what carries it.
pub fn wrap(argv: &[&str], secs: u64, limit: u32, mark: Option<(&str, &str)>) -> Vec<String> {
    let (mark, sweep) = mark.unwrap_or(("", ""));
    let mut out = vec![
        "sh".to_string(),
        "-c".to_string(),
        SCRIPT.to_string(),
        "plimsoll-exec".to_string(),
        secs.to_string(),
        (u64::from(limit) + 1).to_string(),
        mark.to_string(),
        sweep.to_string(),
    ];
    out.extend(argv.iter().map(|s| s.to_string()));
    out
}

/// Whole seconds the command may take, from the milliseconds left.
pub fn seconds_for(remaining_ms: u64) -> u64 {
    (remaining_ms / 1000).saturating_sub(MARGIN_S).max(1)
}

/// The exec answer as the API reports a process: each stream cut to
/// `limit` with its flag; a timeout only when the status says killed (137)
/// or timed out (124) and the time limit really passed.
pub fn output(v: &Value, limit: u32, secs: u64, elapsed_ms: u64) -> Result<ProcessOutput, String> {
    if v["incomplete"].as_bool() == Some(true) {
        return Ok(flooded());
    }
    let decode = |key: &str| -> Result<Vec<u8>, String> {
        match &v[key] {
            Value::Null => Ok(Vec::new()),
            Value::String(s) => base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(|_| format!("the exec answer's {key} is not base64")),
            _ => Err(format!("the exec answer's {key} is not a string")),
        }
    };
    let (mut stdout, mut stderr) = (decode("stdout")?, decode("stderr")?);
    // Absent means 0 (the service leaves zero values out).
    let code = match &v["exitCode"] {
        Value::Null => 0,
        n => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or("the exec answer's exitCode is not a 32-bit integer")?,
    };
    let limit = limit as usize;
    let stdout_truncated = stdout.len() > limit;
    let stderr_truncated = stderr.len() > limit;
    stdout.truncate(limit);
    stderr.truncate(limit);
    let timed_out = (code == 137 || code == 124) && elapsed_ms >= secs * 1000;
    Ok(ProcessOutput {
        stdout,
        stderr,
        exit_code: if timed_out { EXIT_TIMED_OUT } else { code },
        timed_out,
        stdout_truncated,
        stderr_truncated,
    })
}

/// A process whose output could not be carried whole (the service's own
/// capture cap, or an answer past what the plugin reads): both streams
/// flagged, nothing kept, as the reference reports it.
pub fn flooded() -> ProcessOutput {
    ProcessOutput {
        stdout: Vec::new(),
        stderr: Vec::new(),
        exit_code: EXIT_FLOODED,
        timed_out: false,
        stdout_truncated: true,
        stderr_truncated: true,
    }
}
