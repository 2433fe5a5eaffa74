//! Sessions, forwarded: each of our sessions is one session on the
//! upstream, and the upstream's session ID is its state. The upstream
//! keeps the sandbox, serializes the calls and chains its own records; the
//! host here chains ours over the answers.

use serde_json::{Value, json};

use crate::bindings::plimsoll::provider::types::{
    CellResult, Language, Payload, PayloadKind, Refusal, RunError, RunRequest, RunResult,
    SessionAnswer, SessionEndReason, SessionEnded, SessionFailure, SessionOptions, SessionSupport,
};
use crate::{Answer, PROTOCOL, RemotePlimsoll, call, call_full, process_output, refusal, wire};

/// What the upstream's sessions run, from its Describe: snippets, and
/// cells in the languages it names.
pub fn support(d: &Value) -> Option<SessionSupport> {
    if !d["supportsSessions"].as_bool().unwrap_or(false) {
        return None;
    }
    let languages = d["sessionEnvironment"]["languages"]
        .as_array()
        .map(|ls| {
            ls.iter()
                .filter_map(|l| match l.as_str() {
                    Some("javascript") => Some(Language::Javascript),
                    Some("python") => Some(Language::Python),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Some(SessionSupport {
        payloads: vec![PayloadKind::Javascript],
        cell_languages: languages,
    })
}

fn language(l: Language) -> &'static str {
    match l {
        Language::Javascript => "javascript",
        Language::Python => "python",
    }
}

fn ended(reason: &str) -> Option<SessionEnded> {
    let reason = match reason {
        "" | "SESSION_END_UNSPECIFIED" => return None,
        "SESSION_END_EXPIRED" => SessionEndReason::Expired,
        "SESSION_END_SANDBOX_CHANGED" => SessionEndReason::SandboxChanged,
        _ => SessionEndReason::MainProcessEnded,
    };
    Some(SessionEnded {
        reason,
        detail: "the upstream session ended".into(),
    })
}

impl wire::Sessions for RemotePlimsoll {
    /// Opens the upstream session, holding it to the tier the upstream states
    /// now, so a weaker upstream refuses rather than opens.
    fn open_session(options: SessionOptions) -> Result<String, RunError> {
        let floor = match call("Describe", &json!({})) {
            Ok(Answer::Ok(d)) => d["isolation"].as_str().map(str::to_string),
            _ => None,
        };
        let mut body = json!({
            "protocol": PROTOCOL,
            "lifetimeMs": options.lifetime_ms,
            "languages": options.languages.iter().map(|l| language(*l)).collect::<Vec<_>>(),
        });
        if let Some(floor) = floor {
            body["minimumIsolation"] = json!(floor);
        }
        match call("OpenSession", &body)
            .map_err(|e| RunError::NotDispatched(Refusal::Environment(e)))?
        {
            Answer::Ok(v) => v["sessionId"]
                .as_str()
                .filter(|id| !id.is_empty() && id.len() <= 128)
                .map(str::to_string)
                .ok_or_else(|| {
                    RunError::MayHaveRun("the upstream opened no usable session".into())
                }),
            Answer::Refused(reason, message) => {
                Err(RunError::NotDispatched(refusal(&reason, message)))
            }
            Answer::Failed(why) => Err(RunError::MayHaveRun(why)),
        }
    }

    fn session_run(state: String, request: RunRequest) -> Result<SessionAnswer, SessionFailure> {
        let fail = |error: RunError, end: bool| SessionFailure {
            error,
            ended: if end {
                ended("SESSION_END_MAIN_PROCESS_ENDED")
            } else {
                None
            },
        };
        let mut body =
            json!({"protocol": PROTOCOL, "sessionId": state, "timeoutMs": request.timeout_ms});
        let cell = match &request.payload {
            Payload::Javascript(code) => {
                body["javascript"] = json!({"code": code});
                false
            }
            Payload::Cell(c) => {
                let files: Vec<Value> = c
                    .files
                    .iter()
                    .map(|f| json!({"path": f.path, "content": f.content}))
                    .collect();
                body["cell"] =
                    json!({"language": language(c.language), "code": c.code, "files": files});
                true
            }
            Payload::Project(_) => {
                return Err(fail(
                    RunError::NotDispatched(Refusal::Unsupported(
                        "remote-plimsoll runs snippets and cells only".into(),
                    )),
                    false,
                ));
            }
        };
        let (answer, upstream_ended) = call_full("SessionRun", &body)
            .map_err(|e| fail(RunError::NotDispatched(Refusal::Environment(e)), false))?;
        let resp = match answer {
            Answer::Ok(v) => v,
            Answer::Refused(reason, message) => {
                return Err(fail(
                    RunError::NotDispatched(refusal(&reason, message)),
                    upstream_ended,
                ));
            }
            Answer::Failed(why) => return Err(fail(RunError::MayHaveRun(why), upstream_ended)),
        };
        let run = &resp["run"];
        let outcome = if cell {
            let c = &run["cell"];
            RunResult::Cell(CellResult {
                output: process_output(c, request.output_limit),
                interpreter_started: c["interpreterStarted"].as_bool().unwrap_or(false),
                interpreter_ended: c["interpreterEnded"].as_bool().unwrap_or(false),
            })
        } else {
            RunResult::Javascript(process_output(&run["javascript"], request.output_limit))
        };
        Ok(SessionAnswer {
            outcome,
            ended: ended(resp["ended"].as_str().unwrap_or("")),
        })
    }

    /// Closes the upstream session; an upstream that already ended it is fine.
    fn close_session(state: String) {
        let _ = call(
            "CloseSession",
            &json!({"protocol": PROTOCOL, "sessionId": state}),
        );
    }
}
