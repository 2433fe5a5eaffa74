//! Tool results: a run's answer, a refusal or a failure, each as
//! structured content (the `run_result` schema in `tools`) and as text an
//! agent can read. A refusal is a tool error naming its not-dispatched
//! reason, so the agent knows nothing ran; a failure after dispatch is a
//! tool error that says the run may have started.

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Map, Value, json};

use crate::refusal::Refusal;
use crate::wire::{ProjectOutcome, RunResponse};

/// A run that ended, with its answer.
pub fn answered(resp: &RunResponse) -> CallToolResult {
    let mut v = Map::new();
    v.insert("outcome".into(), json!("completed"));
    v.insert("provider".into(), json!(resp.sandbox));
    v.insert("isolation".into(), json!(resp.isolation));
    v.insert("durationMs".into(), json!(resp.duration_ms.0));
    v.insert("recordSha256".into(), json!(resp.record.record_sha256));
    v.insert("resultSha256".into(), json!(resp.record.result_sha256));
    v.insert("requestSha256".into(), json!(resp.record.request_sha256));
    let (stdout, stderr, exit, timed_out, out_cut, err_cut) = if let Some(js) = &resp.javascript {
        (
            text(&js.stdout.0),
            text(&js.stderr.0),
            js.exit_code,
            js.timed_out,
            js.stdout_truncated,
            js.stderr_truncated,
        )
    } else if let Some(cell) = &resp.cell {
        (
            text(&cell.stdout.0),
            text(&cell.stderr.0),
            cell.exit_code,
            cell.timed_out,
            cell.stdout_truncated,
            cell.stderr_truncated,
        )
    } else if let Some(p) = &resp.project {
        let steps: Vec<Value> = p
            .steps
            .iter()
            .map(|s| {
                json!({
                    "command": s.command,
                    "stdout": text(&s.stdout.0),
                    "stderr": text(&s.stderr.0),
                    "exitCode": s.exit_code,
                    "timedOut": s.timed_out,
                    "durationMs": s.duration_ms.0,
                    "stdoutTruncated": s.stdout_truncated,
                    "stderrTruncated": s.stderr_truncated,
                })
            })
            .collect();
        let artifacts: Vec<Value> = p
            .artifacts
            .iter()
            .map(|a| json!({"path": a.path, "content": text(&a.content.0)}))
            .collect();
        v.insert("steps".into(), Value::Array(steps));
        v.insert("artifacts".into(), Value::Array(artifacts));
        v.insert("projectOutcome".into(), json!(project_outcome(p.outcome)));
        // The project's own flags: its last step's exit code, any step cut
        // or timed out.
        let last = p.steps.last();
        (
            String::new(),
            String::new(),
            last.map_or(0, |s| s.exit_code),
            p.steps.iter().any(|s| s.timed_out) || p.outcome == ProjectOutcome::TimedOut,
            p.steps.iter().any(|s| s.stdout_truncated),
            p.steps.iter().any(|s| s.stderr_truncated),
        )
    } else {
        (String::new(), String::new(), 0, false, false, false)
    };
    v.insert("exitCode".into(), json!(exit));
    v.insert("timedOut".into(), json!(timed_out));
    v.insert("stdoutTruncated".into(), json!(out_cut));
    v.insert("stderrTruncated".into(), json!(err_cut));
    let readable = readable(&v, &stdout, &stderr);
    if resp.project.is_none() {
        v.insert("stdout".into(), json!(stdout));
        v.insert("stderr".into(), json!(stderr));
    }
    let mut r = CallToolResult::success(vec![ContentBlock::text(readable)]);
    r.structured_content = Some(Value::Object(v));
    r
}

/// Nothing ran: a tool error with the reason.
pub fn refused(r: &Refusal) -> CallToolResult {
    let v = json!({
        "outcome": "not_dispatched",
        "notDispatched": r.reason.as_str(),
        "code": r.code.as_str(),
        "message": r.message,
    });
    error(
        format!(
            "Not run (not dispatched: {}): {}",
            r.reason.as_str(),
            r.message
        ),
        v,
    )
}

/// The run may have started and has no result.
pub fn failed(message: &str) -> CallToolResult {
    let v = json!({"outcome": "failed", "code": "internal", "message": message});
    error(
        format!("The run failed after it may have started ({message}); it has no result."),
        v,
    )
}

/// A session tool's answer (open, close): the API's own JSON.
pub fn value(v: Value, summary: String) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(summary)]);
    r.structured_content = Some(v);
    r
}

fn error(text: String, v: Value) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(text)]);
    r.structured_content = Some(v);
    r
}

fn readable(v: &Map<String, Value>, stdout: &str, stderr: &str) -> String {
    let mut s = String::new();
    if let Some(Value::Array(steps)) = v.get("steps") {
        for step in steps {
            s.push_str(&format!(
                "$ {}\n{}{}[exit {}]\n",
                step["command"].as_str().unwrap_or_default(),
                step["stdout"].as_str().unwrap_or_default(),
                step["stderr"].as_str().unwrap_or_default(),
                step["exitCode"]
            ));
        }
    }
    s.push_str(stdout);
    if !stderr.is_empty() {
        s.push_str("\n[stderr]\n");
        s.push_str(stderr);
    }
    let flag = |k: &str, say: &str| {
        if v.get(k) == Some(&Value::Bool(true)) {
            format!(", {say}")
        } else {
            String::new()
        }
    };
    s.push_str(&format!(
        "\n[plimsoll: provider {}, isolation {}, exit code {}, {} ms{}{}{}, record sha256 {}]",
        v["provider"].as_str().unwrap_or_default(),
        v["isolation"].as_str().unwrap_or_default(),
        v["exitCode"],
        v["durationMs"],
        flag("timedOut", "timed out"),
        flag("stdoutTruncated", "stdout truncated"),
        flag("stderrTruncated", "stderr truncated"),
        v["recordSha256"].as_str().unwrap_or_default(),
    ));
    s
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn project_outcome(o: ProjectOutcome) -> &'static str {
    match o {
        ProjectOutcome::Completed => "completed",
        ProjectOutcome::SetupFailed => "setup_failed",
        ProjectOutcome::TimedOut => "timed_out",
        ProjectOutcome::ProtocolError => "protocol_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_a_tool_error_that_names_its_reason() {
        let r = refused(&Refusal::request("no"));
        assert_eq!(r.is_error, Some(true));
        let v = r.structured_content.expect("structured");
        assert_eq!(v["outcome"], "not_dispatched");
        assert_eq!(v["notDispatched"], "request");
    }

    #[test]
    fn a_failure_never_claims_nothing_ran() {
        let v = failed("internal error x").structured_content.expect("v");
        assert_eq!(v["outcome"], "failed");
        assert!(v.get("notDispatched").is_none());
    }
}
