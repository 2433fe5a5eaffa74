//! remote-plimsoll: an example provider plugin that runs JavaScript on
//! another plimsolld, reached over standard `wasi:http` (the host polices
//! every request; `allowed-origins` from the `http` interface says where).
//!
//! It is small on purpose; copy it to start an adapter of your own. What it
//! shows:
//! - `describe` asks the upstream what it is and claims the upstream's tier
//!   (the host caps the claim with `SANDBOX_PLUGIN_MAX_TIER`);
//! - `preflight` proves the path end to end with a real snippet;
//! - `run` forwards the snippet with a floor equal to the tier it claimed, so
//!   an upstream that got weaker since start refuses instead of running;
//! - errors are mapped honestly: an upstream refusal it can prove is a
//!   `not-dispatched`, anything else `may-have-run`. (The host still answers
//!   unmarked once a request has gone out; see docs/plugins.md.)
//! - sessions are forwarded (`session`): the upstream's session ID is the
//!   session's state, which the host keeps and hands back with each call;
//! - the world's bindings and the traits an adapter implements come from
//!   the kit, `plugins/wire`: `Startup` (describe, preflight),
//!   `CloudAdapter` (run) and `Sessions` (none unless an adapter says
//!   otherwise; here in `session`).
//!
//! Configuration: the first origin the operator allowed
//! (`SANDBOX_PLUGIN_HTTP_ORIGINS`) is the upstream. The upstream's token, if
//! it needs one, is the API key the host adds (`SANDBOX_PLUGIN_API_KEY_ENV`);
//! this plugin never sees it.

mod session;
mod transport;

use base64::Engine as _;
use serde_json::{Value, json};

/// The cloud adapters' kit: the `cloud-adapter` world's bindings, generated
/// once there, and what adapters share (here, the traits an adapter
/// implements, and how a `wasi:http` request is built and its errors read).
use plimsoll_plugin_wire as wire;
use wire::bindings;

use bindings::plimsoll::provider::http;
use bindings::plimsoll::provider::log::{self, Level};
use bindings::plimsoll::provider::types::{
    Description, Language, PayloadKind, PreflightReport, ProcessOutput, Refusal, RunError,
    RunRequest, RunResult, Tier,
};

const NAME: &str = "remote-plimsoll";
/// The protocol number of the upstream API this plugin speaks.
const PROTOCOL: u32 = 4;

struct RemotePlimsoll;

impl wire::Startup for RemotePlimsoll {
    fn describe() -> Description {
        // describe cannot fail; an unreachable upstream claims the weakest
        // tier, and preflight then refuses to start.
        let (tier, environment, sessions) = match call("Describe", &json!({})) {
            Ok(Answer::Ok(d)) => (
                parse_tier(d["isolation"].as_str().unwrap_or("")),
                format!(
                    "remote:{}",
                    d["javascriptEnvironment"]["identity"]
                        .as_str()
                        .unwrap_or("unknown")
                ),
                session::support(&d),
            ),
            _ => (Tier::Process, "remote:unreachable".to_string(), None),
        };
        Description {
            name: NAME.to_string(),
            tier,
            payloads: vec![PayloadKind::Javascript],
            environment,
            sessions,
        }
    }

    fn preflight() -> Result<PreflightReport, String> {
        let mut checks = Vec::new();
        let upstream = upstream()?;
        checks.push(format!("upstream origin {upstream}"));
        let out = run_snippet("console.log(6 * 7)", 5_000, 1024, None)
            .map_err(|e| format!("probe run failed: {e:?}"))?;
        let passed = out.exit_code == 0 && out.stdout == b"42\n";
        checks.push(format!(
            "probe snippet exit {} ({})",
            out.exit_code,
            if passed { "ok" } else { "unexpected output" }
        ));
        Ok(PreflightReport {
            passed,
            checks: checks.join("\n"),
            languages: vec![Language::Javascript],
        })
    }
}

impl wire::CloudAdapter for RemotePlimsoll {
    fn run(request: RunRequest) -> Result<RunResult, RunError> {
        let code = match request.payload {
            bindings::plimsoll::provider::types::Payload::Javascript(code) => code,
            _ => {
                return Err(RunError::NotDispatched(Refusal::Unsupported(
                    "remote-plimsoll runs snippets only".into(),
                )));
            }
        };
        let floor = match call("Describe", &json!({})) {
            Ok(Answer::Ok(d)) => d["isolation"].as_str().map(str::to_string),
            _ => None,
        };
        run_snippet(
            &code,
            request.timeout_ms,
            request.output_limit,
            floor.as_deref(),
        )
        .map(RunResult::Javascript)
    }
}

bindings::export!(RemotePlimsoll);

fn upstream() -> Result<String, String> {
    http::allowed_origins()
        .into_iter()
        .next()
        .ok_or_else(|| "no origin is allowed: set SANDBOX_PLUGIN_HTTP_ORIGINS".to_string())
}

fn parse_tier(s: &str) -> Tier {
    match s {
        "vm" => Tier::Vm,
        "kernel" => Tier::Kernel,
        "container" => Tier::Container,
        _ => Tier::Process,
    }
}

enum Answer {
    Ok(Value),
    /// The upstream refused, marked: nothing ran there.
    Refused(String, String),
    /// Any other failure: the upstream may have run the code.
    Failed(String),
}

/// Whether an upstream error answer carries the session-ended detail.
fn says_ended(parsed: &Value) -> bool {
    parsed["details"].as_array().is_some_and(|ds| {
        ds.iter().any(|d| {
            d["type"]
                .as_str()
                .is_some_and(|t| t.ends_with("plimsoll.v1.SessionEnded"))
        })
    })
}

/// One Connect JSON call to the upstream.
fn call(procedure: &str, body: &Value) -> Result<Answer, String> {
    call_full(procedure, body).map(|(a, _)| a)
}

/// One call, and whether an error answer said the upstream session ended.
fn call_full(procedure: &str, body: &Value) -> Result<(Answer, bool), String> {
    let url = format!("{}/plimsoll.v1.SandboxService/{procedure}", upstream()?);
    let response = match transport::post_json(&url, body.to_string().as_bytes()) {
        Ok(r) => r,
        Err(wire::Failure::Refused(why)) => {
            return Err(format!("the host refused the request: {why}"));
        }
        Err(wire::Failure::Transport(why)) => {
            return Ok((Answer::Failed(format!("transport: {why}")), false));
        }
        // This client sets no deadline and reads a bounded answer itself,
        // so neither comes back from it; were one to, the request may have
        // left, as with any transport failure.
        Err(other @ (wire::Failure::Deadline | wire::Failure::TooLarge)) => {
            return Ok((Answer::Failed(format!("transport: {other:?}")), false));
        }
    };
    let parsed: Value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
    if response.status == 200 {
        return Ok((Answer::Ok(parsed), false));
    }
    let ended = says_ended(&parsed);
    let mark = response
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("plimsoll-not-dispatched"))
        .map(|(_, v)| v.clone());
    let message = parsed["message"].as_str().unwrap_or("").to_string();
    let answer = match mark {
        Some(reason) => Answer::Refused(reason, message),
        None => Answer::Failed(format!("upstream status {}: {message}", response.status)),
    };
    Ok((answer, ended))
}

fn run_snippet(
    code: &str,
    timeout_ms: u32,
    output_limit: u32,
    floor: Option<&str>,
) -> Result<ProcessOutput, RunError> {
    let mut body =
        json!({"protocol": PROTOCOL, "timeoutMs": timeout_ms, "javascript": {"code": code}});
    if let Some(floor) = floor {
        body["minimumIsolation"] = json!(floor);
    }
    let answer =
        call("Run", &body).map_err(|e| RunError::NotDispatched(Refusal::Environment(e)))?;
    let resp = match answer {
        Answer::Ok(v) => v,
        Answer::Refused(reason, message) => {
            log::write(Level::Info, &format!("upstream refused the run ({reason})"));
            return Err(RunError::NotDispatched(refusal(&reason, message)));
        }
        Answer::Failed(why) => return Err(RunError::MayHaveRun(why)),
    };
    Ok(process_output(&resp["javascript"], output_limit))
}

/// A snippet's (or a cell's) output as the upstream answered it.
fn process_output(js: &Value, output_limit: u32) -> ProcessOutput {
    let bytes = |field: &str| -> Vec<u8> {
        let mut b = base64::engine::general_purpose::STANDARD
            .decode(js[field].as_str().unwrap_or(""))
            .unwrap_or_default();
        b.truncate(output_limit as usize);
        b
    };
    let flag = |field: &str| js[field].as_bool().unwrap_or(false);
    ProcessOutput {
        stdout: bytes("stdout"),
        stderr: bytes("stderr"),
        exit_code: js["exitCode"]
            .as_i64()
            .and_then(|c| i32::try_from(c).ok())
            .unwrap_or(0),
        timed_out: flag("timedOut"),
        stdout_truncated: flag("stdoutTruncated"),
        stderr_truncated: flag("stderrTruncated"),
    }
}

fn refusal(reason: &str, message: String) -> Refusal {
    let message = format!("upstream: {message}");
    match reason {
        "request" => Refusal::Request(message),
        "permission" => Refusal::Permission(message),
        "unsupported" | "protocol" => Refusal::Unsupported(message),
        "isolation" => Refusal::Isolation(message),
        "capacity" => Refusal::Capacity(message),
        _ => Refusal::Environment(message),
    }
}
