//! MCP's session tools for a session another replica holds. MCP here is
//! stateless, so a balancer may send a session's tool calls to any
//! replica; the call goes to the holder as a session call does (signed
//! with the replicas' secret, never with the caller's token), under an
//! internal procedure the holder takes only when forwarded. The holder
//! runs the tool on its own session and answers with the tool's result,
//! relayed as it is.

use std::sync::Arc;

use bytes::Bytes;
use rmcp::model::CallToolResult;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::results;
use crate::api::NOT_DISPATCHED_HEADER;
use crate::api::body::CallerBodies;
use crate::api::connect::parse;
use crate::callers::Caller;
use crate::pipeline::Daemon;
use crate::quota::Shed;
use crate::refusal::{Code, Reason, Refusal};
use crate::replicas::{Forwarded, Holder};
use crate::wire::{CloseSessionRequest, Request, SessionRunRequest};

/// The API's body slots, handed to MCP's tools by its guard: a forwarded
/// call holds a caller's slot and a daemon slot until its answer is in, as
/// a forwarded API call does, so how many forwards one caller has in
/// flight is bounded the same way.
#[derive(Clone)]
pub struct RelaySlots {
    pub caller_bodies: Arc<CallerBodies>,
    pub body_slots: Arc<Semaphore>,
}

/// Each forwarded tool and the internal procedure it travels under.
const PROCEDURES: [(&str, &str); 3] = [
    ("session_run", "McpSessionRun"),
    ("run_cell", "McpRunCell"),
    ("close_session", "McpCloseSession"),
];

/// The tool an internal procedure stands for, if it is one.
pub fn tool_of(procedure: &str) -> Option<&'static str> {
    PROCEDURES
        .iter()
        .find(|(_, p)| *p == procedure)
        .map(|(t, _)| *t)
}

/// The holder's result for a session tool call on a session another
/// replica holds; None means answer it here.
/// Long on purpose: find the holder, check, sign, forward and relay, in
/// the order a forwarded call must take them.
pub async fn elsewhere(
    daemon: &Daemon,
    tool: &str,
    body: &[u8],
    caller: &Caller,
    slots: Option<&RelaySlots>,
) -> Option<CallToolResult> {
    let replicas = daemon.replicas()?;
    let procedure = PROCEDURES.iter().find(|(t, _)| *t == tool)?.1;
    // Checked here as the holder would, so a malformed call is refused for
    // what it is (and never sent).
    let session_id = match tool {
        "close_session" => {
            parse::<CloseSessionRequest>(Request::CloseSession, "CloseSessionRequest", body)
                .map(|r| r.session_id)
        }
        _ => parse::<SessionRunRequest>(Request::SessionRun, "SessionRunRequest", body)
            .map(|r| r.session_id),
    };
    let session_id = match session_id {
        Ok(id) => id,
        Err(r) => return Some(results::refused(&r)),
    };
    if daemon.holds_session(&session_id, &caller.id) {
        return None;
    }
    let fingerprint = crate::sessions::fingerprint(&session_id);
    let holder = match replicas.holder(&fingerprint).await {
        Holder::Elsewhere(url) => url,
        Holder::NoneElsewhere => return None,
        Holder::Unknown => return Some(results::refused(&daemon.shed_for(Shed::StoreUnavailable))),
    };
    let Some(slots) = slots else {
        return Some(results::failed("no body slots for a forwarded call"));
    };
    let _held =
        match crate::api::take_body_slots(&slots.caller_bodies, &slots.body_slots, &caller.id) {
            Ok(held) => held,
            Err(r) => return Some(results::refused(&r)),
        };
    let forwarded = replicas
        .forward(&holder, procedure, &caller.id, Bytes::copy_from_slice(body))
        .await;
    Some(match forwarded {
        Forwarded::Answer {
            status: 200, body, ..
        } => {
            serde_json::from_slice::<CallToolResult>(&body).unwrap_or_else(|_| {
                // It was taken there and may have run.
                results::failed(
                    "the replica holding this session gave an answer that is not a tool result",
                )
            })
        }
        Forwarded::Answer {
            status,
            headers,
            body,
        } => {
            let mark = headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(NOT_DISPATCHED_HEADER))
                .and_then(|(_, v)| std::str::from_utf8(v).ok())
                .and_then(Reason::from_name);
            // A 401 is the holder not taking the forward (every failed
            // forward is answered so), a 404 a holder of another version
            // (without the internal procedures); a 403 is its own refusal
            // of the call.
            if status == 401 || status == 404 {
                tracing::error!(
                    status,
                    "the replica holding a session refused a forwarded call; check that every replica runs the same version with the same secret, clients file and clock"
                );
                results::refused(&Refusal::environment(format!(
                    "the replica holding this session refused the forwarded call ({status})"
                )))
            } else if let Some(reason) = mark {
                // Refused there before anything ran, for this reason, with
                // the holder's code and words.
                let said = serde_json::from_slice::<Value>(&body).unwrap_or_default();
                let code = said["code"].as_str().and_then(Code::from_name);
                let message = said["message"].as_str().unwrap_or_default();
                results::refused(&Refusal::new(
                    code.unwrap_or(match reason {
                        Reason::Capacity => Code::ResourceExhausted,
                        Reason::Request => Code::InvalidArgument,
                        Reason::Permission => Code::PermissionDenied,
                        Reason::Unsupported => Code::Unimplemented,
                        _ => Code::FailedPrecondition,
                    }),
                    reason,
                    format!(
                        "the replica holding this session refused the call ({status}): {message}"
                    ),
                ))
            } else {
                results::failed(&format!(
                    "the replica holding this session answered {status}"
                ))
            }
        }
        Forwarded::Gone => {
            // Nothing was sent. As for a session call over the API: the
            // session went with its replica.
            replicas.forget(&fingerprint).await;
            let mut r = results::refused(&Refusal::environment(
                "the replica holding this session is gone",
            ));
            if let Some(Value::Object(v)) = r.structured_content.as_mut() {
                v.insert(
                    "sessionEnded".into(),
                    json!(crate::wire::SessionEnd::Shutdown.name()),
                );
            }
            r
        }
        Forwarded::Unreachable(detail) => {
            tracing::warn!(detail = %detail, "the replica holding a session could not be reached");
            results::refused(&Refusal::environment(
                "the replica holding this session could not be reached; retry",
            ))
        }
        Forwarded::Lost(detail) => {
            let id = crate::pipeline::internal_id(&detail);
            tracing::error!(error_id = %id, detail = %detail, "a forwarded session call got no answer");
            results::failed(&format!("internal error {id}"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_internal_procedures_name_a_tool() {
        assert_eq!(tool_of("McpSessionRun"), Some("session_run"));
        assert_eq!(tool_of("McpRunCell"), Some("run_cell"));
        assert_eq!(tool_of("McpCloseSession"), Some("close_session"));
        for other in ["SessionRun", "Run", "McpOpenSession", "mcpsessionrun", ""] {
            assert_eq!(tool_of(other), None, "{other}");
        }
    }
}
