//! Sessions: one container per session, kept by the host, whose main
//! process is the session agent (`session/agent.js`, under node, with the
//! cell kernels for node and python). The host binds the container to the
//! session and ends it; this adapter only starts it (`start-session`, in
//! the call that opens the session) and talks to the agent, one JSON line
//! per request and JSON lines back (`exchange`).
//!
//! Every reply is read between `{"begin":id}` and `{"done":id}` with a
//! fresh random id, so a reply is never mistaken for another call's. What
//! the agent says is untrusted like a runner's report: a project's lines
//! are checked against its plan, and anything that does not parse is a
//! protocol error, never a result.

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::bindings::plimsoll::provider::container_engine::{
    self as engine, ContainerSpec, EngineEnvironment, EngineError,
};
use crate::bindings::plimsoll::provider::log::{self, Level};
use crate::bindings::plimsoll::provider::types::{
    CellResult, Language, Payload, ProcessOutput, Refusal, RunError, RunRequest, RunResult,
    SessionAnswer, SessionEndReason, SessionEnded, SessionFailure, SessionOptions,
};
use crate::project::{ARTIFACT_BYTES, read_report};
use crate::{REPORT_LIMIT, REPORT_MARGIN_MS, base_spec, report};

const AGENT: &str = include_str!("session/agent.js");
const KERNEL_JS: &str = include_str!("session/kernel.js");
const KERNEL_PY: &str = include_str!("session/kernel.py");
/// The agent runs under a shell that stays PID 1 and reaps what the calls
/// leave behind; the agent and both kernels' sources are its arguments.
const LAUNCH: &str = r#"node -e "$1" "$2" "$3"; exit $?"#;
/// Most a hello may take, on top of what the open has.
const HELLO_LIMIT: u32 = 64 << 10;
/// How long past a call's budget the agent may take to answer: it stops
/// the call at the budget, and a process that holds its pipes open can
/// delay the answer by a second or so. Past this the host ends the session.
const ANSWER_SLACK_MS: u32 = 1_500;

/// The spec every session container is started from (and kept warm as).
pub fn spec(env: &EngineEnvironment) -> ContainerSpec {
    base_spec(
        env,
        vec![
            "/bin/sh".into(),
            "-c".into(),
            LAUNCH.into(),
            "plimsoll-session".into(),
            AGENT.into(),
            KERNEL_JS.into(),
            KERNEL_PY.into(),
        ],
    )
}

fn nonce() -> String {
    let (a, b) = (
        wasi::random::random::get_random_u64(),
        wasi::random::random::get_random_u64(),
    );
    format!("{a:016x}{b:016x}")
}

/// Why an exchange failed, for the call's answer.
enum Failed {
    /// The container was gone before the request was written: nothing ran.
    Gone,
    /// The host ended the container after the request was written.
    Ended,
    /// The agent's reply does not read.
    Garbled(&'static str),
}

/// One request to the agent, and the lines of its reply.
fn exchange(mut request: Value, timeout_ms: u32, limit: u32) -> Result<Vec<Value>, Failed> {
    let id = nonce();
    request["id"] = Value::String(id.clone());
    let mut line = serde_json::to_vec(&request).map_err(|_| Failed::Garbled("request"))?;
    line.push(b'\n');
    let until = format!("{{\"done\":\"{id}\"}}\n");
    let reply =
        engine::exchange(&line, until.as_bytes(), timeout_ms, limit).map_err(|e| match e {
            EngineError::NotStarted(_) | EngineError::OutOfTime(_) | EngineError::Forbidden(_) => {
                Failed::Gone
            }
            EngineError::Engine(_) => Failed::Ended,
        })?;
    let begin = format!("{{\"begin\":\"{id}\"}}");
    let mut lines = Vec::new();
    let mut begun = false;
    for raw in reply.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        if !begun {
            // Anything before this call's begin belongs to no call.
            begun = raw == begin.as_bytes();
            continue;
        }
        lines.push(serde_json::from_slice::<Value>(raw).map_err(|_| Failed::Garbled("line"))?);
    }
    if !begun {
        return Err(Failed::Garbled("begin"));
    }
    Ok(lines)
}

fn ended(detail: &str) -> SessionEnded {
    SessionEnded {
        reason: SessionEndReason::MainProcessEnded,
        detail: detail.to_string(),
    }
}

fn language_name(l: Language) -> &'static str {
    match l {
        Language::Javascript => "javascript",
        Language::Python => "python",
    }
}

/// Starts the session's container and greets its agent.
pub fn open(options: SessionOptions) -> Result<String, RunError> {
    let env = engine::environment();
    engine::start_session(&spec(&env)).map_err(crate::run_error)?;
    let languages: Vec<&str> = options
        .languages
        .iter()
        .map(|l| language_name(*l))
        .collect();
    let hello = exchange(
        json!({"kind": "hello", "languages": languages}),
        options.timeout_ms,
        HELLO_LIMIT,
    );
    match hello {
        Ok(lines) if lines.iter().any(|l| l.get("hello").is_some()) => Ok(String::new()),
        _ => Err(RunError::MayHaveRun(
            "the session's agent did not answer its greeting".into(),
        )),
    }
}

fn files_json(files: &[crate::bindings::plimsoll::provider::types::ProjectFile]) -> Value {
    Value::Array(
        files
            .iter()
            .map(|f| json!({"path": f.path, "content": f.content}))
            .collect(),
    )
}

#[derive(Deserialize)]
struct Process {
    stdout: String,
    stderr: String,
    exit_code: i32,
    timed_out: bool,
    stdout_truncated: bool,
    stderr_truncated: bool,
}

#[derive(Deserialize)]
struct Cell {
    #[serde(flatten)]
    process: Process,
    interpreter_started: bool,
    interpreter_ended: bool,
}

#[derive(Deserialize)]
struct CellRefused {
    why: String,
    #[serde(default)]
    detail: String,
}

fn output_of(p: Process, limit: usize) -> Option<ProcessOutput> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let (stdout, stderr) = (b64.decode(p.stdout).ok()?, b64.decode(p.stderr).ok()?);
    if stdout.len() > limit || stderr.len() > limit {
        return None;
    }
    Some(ProcessOutput {
        stdout,
        stderr,
        exit_code: p.exit_code,
        timed_out: p.timed_out,
        stdout_truncated: p.stdout_truncated,
        stderr_truncated: p.stderr_truncated,
    })
}

fn failure(error: RunError, end: Option<&str>) -> SessionFailure {
    SessionFailure {
        error,
        ended: end.map(ended),
    }
}

/// The one line of kind `key` in a reply, parsed. Two are none: the agent
/// writes one, so a second was written by something else in the container
/// (code that reached the agent's output), and neither can be believed.
fn line_of<T: for<'de> Deserialize<'de>>(lines: &[Value], key: &str) -> Option<T> {
    let mut found = lines.iter().filter_map(|l| l.get(key));
    let first = found.next()?;
    if found.next().is_some() {
        return None;
    }
    serde_json::from_value(first.clone()).ok()
}

/// One call of the session.
pub fn run(request: RunRequest) -> Result<SessionAnswer, SessionFailure> {
    let limit = request.output_limit as usize;
    let budget = request.timeout_ms.saturating_sub(REPORT_MARGIN_MS);
    let grant = engine::grant_env();
    let ask = match &request.payload {
        Payload::Javascript(code) => json!({"kind": "snippet", "code": code, "budget_ms": budget,
                   "output_limit": limit, "env": grant}),
        Payload::Project(p) => json!({"kind": "project", "files": files_json(&p.files),
                   "steps": p.steps, "artifacts": p.artifacts, "budget_ms": budget,
                   "output_limit": limit, "artifact_bytes": ARTIFACT_BYTES, "env": grant}),
        Payload::Cell(c) => json!({"kind": "cell", "language": language_name(c.language),
                   "code": c.code, "files": files_json(&c.files), "budget_ms": budget,
                   "output_limit": limit}),
    };
    let lines = match exchange(
        ask,
        request.timeout_ms.saturating_add(ANSWER_SLACK_MS),
        REPORT_LIMIT,
    ) {
        Ok(lines) => lines,
        Err(Failed::Gone) => {
            return Err(failure(
                RunError::NotDispatched(Refusal::Environment(
                    "the session's container has ended".into(),
                )),
                Some("the session's container ended"),
            ));
        }
        Err(Failed::Ended) => {
            return Err(failure(
                RunError::MayHaveRun("the session's agent did not answer in time".into()),
                Some("the session's agent did not answer within the call's time"),
            ));
        }
        Err(Failed::Garbled(what)) => {
            log::write(
                Level::Warn,
                &format!("the session's agent answered unreadably (its {what})"),
            );
            return Err(failure(
                RunError::MayHaveRun("the session's agent answered unreadably".into()),
                None,
            ));
        }
    };
    let garbled = || {
        failure(
            RunError::MayHaveRun("the session's agent answered unreadably".into()),
            None,
        )
    };
    let outcome = match &request.payload {
        Payload::Javascript(_) => {
            let p: Process = line_of(&lines, "process").ok_or_else(garbled)?;
            RunResult::Javascript(output_of(p, limit).ok_or_else(garbled)?)
        }
        Payload::Project(p) => {
            // The project's own lines, as a runner prints them.
            let mut stdout = Vec::new();
            for l in lines.iter().filter(|l| {
                ["start", "step", "artifact", "end"]
                    .iter()
                    .any(|k| l.get(*k).is_some())
            }) {
                stdout.extend(serde_json::to_vec(l).map_err(|_| garbled())?);
                stdout.push(b'\n');
            }
            let out = ProcessOutput {
                stdout,
                stderr: vec![],
                exit_code: 0,
                timed_out: false,
                stdout_truncated: false,
                stderr_truncated: false,
            };
            RunResult::Project(report(read_report(p, &out, limit)))
        }
        Payload::Cell(_) => {
            // A cell line means the cell ran, whatever else the reply holds.
            let ran = lines.iter().any(|l| l.get("cell").is_some());
            if let Some(r) = line_of::<CellRefused>(&lines, "cell_refused").filter(|_| !ran) {
                let why = match r.why.as_str() {
                    "files" => Refusal::Request(format!(
                        "a cell's file could not be written: {}",
                        r.detail
                    )),
                    _ => Refusal::Environment(format!(
                        "the cell's interpreter could not start: {}",
                        r.detail
                    )),
                };
                return Err(failure(RunError::NotDispatched(why), None));
            }
            let c: Cell = line_of(&lines, "cell").ok_or_else(garbled)?;
            RunResult::Cell(CellResult {
                output: output_of(c.process, limit).ok_or_else(garbled)?,
                interpreter_started: c.interpreter_started,
                interpreter_ended: c.interpreter_ended,
            })
        }
    };
    // A process the agent could not stop may still run: the session cannot
    // keep its promise that nothing a call starts outlives it, so it ends.
    let unswept = lines
        .iter()
        .any(|l| l.get("swept").and_then(Value::as_bool) == Some(false));
    Ok(SessionAnswer {
        outcome,
        ended: unswept.then(|| ended("a process the call started could not be stopped")),
    })
}
