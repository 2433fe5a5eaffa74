//! The MCP tools plimsoll offers: names, what each description tells an
//! agent, and the schemas of their arguments and structured results. The
//! descriptions say what the tier means and that a floor can be demanded,
//! because an agent decides from them alone.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};

/// Told to an agent at initialization.
pub const INSTRUCTIONS: &str = "plimsoll runs code in a sandbox and states the isolation tier that \
held for each run: process < container < kernel < vm. Pass minimum_isolation to demand a floor; \
a run below it is not dispatched, and the tool error says so. Output arrives as progress \
notifications while a run runs when the call carries a progress token.";

const TIERS: &str = "Isolation tiers, weakest first: process (a WebAssembly sandbox inside the \
daemon's process), container (a container sharing the host's kernel), kernel (a container behind \
a kernel of its own, gVisor), vm (a virtual machine). Set minimum_isolation to refuse anything \
weaker: below the floor nothing runs, and the result is a tool error whose notDispatched names \
the reason.";

const RESULT: &str = "The result states the provider, the isolation tier that held, the exit \
code, whether the run timed out or its output was truncated, and the SHA-256 of its run record. \
A tool error with outcome not_dispatched means nothing ran.";

/// Long on purpose: the tools' schemas are data, written out.
/// `grants` describes the SDKs of the profiles this caller may use (empty
/// for none): it is added to the JavaScript tools' descriptions, so an agent
/// knows what it may call without a tool per operation.
pub fn list(sessions: bool, grants: &str) -> Vec<Tool> {
    let with_grants = |text: String| {
        if grants.is_empty() {
            text
        } else {
            format!("{text}\n\nGrants you may pass as grant_profile, and their SDKs:\n{grants}")
        }
    };
    let mut tools = vec![
        tool(
            "describe",
            "What this daemon runs: its provider, the isolation tier it can stand behind now, \
             the payloads it takes, its limits and grant profiles. Runs nothing.",
            json!({"type": "object", "properties": {}, "additionalProperties": false}),
            json!({"type": "object"}),
        )
        .annotate(ToolAnnotations::new().read_only(true)),
        tool(
            "run_javascript",
            &with_grants(format!(
                "Runs a JavaScript snippet to completion and returns what it printed. {TIERS} \
                 {RESULT}"
            )),
            object(
                json!({
                    "code": {"type": "string", "description": "The snippet. console.log writes stdout; console.error writes stderr."},
                    "minimum_isolation": floor(),
                    "timeout_ms": timeout(),
                    "grant_profile": grant(),
                }),
                &["code"],
            ),
            run_result(),
        ),
        tool(
            "run_project",
            &format!(
                "Writes files into a fresh sandbox, runs shell steps in order (stopping at the \
                 first that fails) and returns each step's output and the artifacts asked for. \
                 {TIERS} {RESULT}"
            ),
            object(
                json!({
                    "files": files(),
                    "steps": {"type": "array", "items": {"type": "string"}, "description": "Shell commands, run in order in the project's directory."},
                    "artifacts": {"type": "array", "items": {"type": "string"}, "description": "Paths of files to bring back after the steps."},
                    "minimum_isolation": floor(),
                    "timeout_ms": timeout(),
                    "grant_profile": grant(),
                }),
                &["steps"],
            ),
            run_result(),
        ),
    ];
    if sessions {
        tools.extend([
            tool(
                "open_session",
                &format!(
                    "Opens a session: a sandbox kept for a series of calls that share its state \
                     (variables, files). Returns its session_id. {TIERS}"
                ),
                object(
                    json!({
                        "minimum_isolation": floor(),
                        "lifetime_ms": {"type": "integer", "minimum": 1, "description": "How long the session may live."},
                        "idle_timeout_ms": {"type": "integer", "minimum": 1, "description": "How long it may sit unused."},
                    }),
                    &[],
                ),
                json!({"type": "object"}),
            ),
            tool(
                "session_run",
                &format!("Runs a JavaScript snippet in an open session. {TIERS} {RESULT}"),
                object(
                    json!({
                        "session_id": session_id(),
                        "code": {"type": "string"},
                        "minimum_isolation": floor(),
                        "timeout_ms": timeout(),
                    }),
                    &["session_id", "code"],
                ),
                run_result(),
            ),
            tool(
                "run_cell",
                &format!(
                    "Runs a cell (code in a language the session's interpreter takes, with \
                     files to write first) in an open session; state carries over between \
                     cells. {TIERS} {RESULT}"
                ),
                object(
                    json!({
                        "session_id": session_id(),
                        "language": {"type": "string", "description": "The cell's language, e.g. python or javascript."},
                        "code": {"type": "string"},
                        "files": files(),
                        "minimum_isolation": floor(),
                        "timeout_ms": timeout(),
                    }),
                    &["session_id", "language", "code"],
                ),
                run_result(),
            ),
            tool(
                "close_session",
                "Closes a session and frees its sandbox. Returns how many calls it served.",
                object(json!({"session_id": session_id()}), &["session_id"]),
                json!({"type": "object"}),
            ),
        ]);
    }
    tools
}

/// The structured result of every tool that runs code.
fn run_result() -> Value {
    json!({
        "type": "object",
        "required": ["outcome"],
        "properties": {
            "outcome": {"type": "string", "enum": ["completed", "not_dispatched", "failed"],
                "description": "completed: the run ended and this is its result; not_dispatched: nothing ran; failed: the run may have started and has no result."},
            "notDispatched": {"type": "string", "description": "Why nothing ran (floor, request, capacity, ...)."},
            "code": {"type": "string"},
            "message": {"type": "string"},
            "provider": {"type": "string"},
            "isolation": {"type": "string", "enum": ["process", "container", "kernel", "vm"]},
            "exitCode": {"type": "integer"},
            "timedOut": {"type": "boolean"},
            "stdoutTruncated": {"type": "boolean"},
            "stderrTruncated": {"type": "boolean"},
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "durationMs": {"type": "integer"},
            "recordSha256": {"type": "string", "description": "SHA-256 of the run's record, which covers the request, the whole output and the tier."},
            "resultSha256": {"type": "string", "description": "SHA-256 of the run's result."},
            "requestSha256": {"type": "string"},
            "steps": {"type": "array", "items": {"type": "object"}},
            "projectOutcome": {"type": "string"},
            "artifacts": {"type": "array", "items": {"type": "object"}},
        },
    })
}

fn floor() -> Value {
    json!({"type": "string", "enum": ["process", "container", "kernel", "vm"],
        "description": "The weakest isolation tier the run may have; below it nothing runs."})
}

fn timeout() -> Value {
    json!({"type": "integer", "minimum": 1, "description": "Milliseconds the run may take; the daemon's default when absent."})
}

fn grant() -> Value {
    json!({"type": "string", "description": "A grant profile the operator configured: the run may call that API without holding its credential."})
}

fn session_id() -> Value {
    json!({"type": "string", "description": "What open_session returned."})
}

fn files() -> Value {
    json!({"type": "array", "items": {"type": "object", "required": ["path", "content"],
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "additionalProperties": false}})
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required,
        "additionalProperties": false})
}

fn tool(name: &'static str, description: &str, input: Value, output: Value) -> Tool {
    Tool::new(name, description.to_string(), schema(input)).with_raw_output_schema(schema(output))
}

fn schema(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(JsonObject::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_tools_are_listed_only_where_sessions_exist() {
        let names = |s| list(s, "").into_iter().map(|t| t.name).collect::<Vec<_>>();
        assert_eq!(names(false), ["describe", "run_javascript", "run_project"]);
        assert_eq!(names(true).len(), 7);
    }

    #[test]
    fn only_the_javascript_tool_carries_the_grants_text_and_none_without_grants() {
        let sdk = "grant_profile \"petstore\" (global petstore): ...";
        for t in list(true, sdk) {
            let d = t.description.as_deref().unwrap_or_default();
            assert_eq!(d.contains(sdk), t.name == "run_javascript", "{}", t.name);
        }
        for (with, without) in list(true, sdk).into_iter().zip(list(true, "")) {
            if with.name != "run_javascript" {
                assert_eq!(with.description, without.description);
            } else {
                assert!(
                    !without
                        .description
                        .unwrap_or_default()
                        .contains("grant_profile \"")
                );
            }
        }
    }

    #[test]
    fn every_running_tool_says_what_the_tier_means_and_that_a_floor_can_be_demanded() {
        for t in list(true, "") {
            if t.name == "describe" || t.name == "close_session" {
                continue;
            }
            let d = t.description.as_deref().unwrap_or_default();
            assert!(
                d.contains("minimum_isolation") && d.contains("vm"),
                "{}",
                t.name
            );
        }
    }
}
