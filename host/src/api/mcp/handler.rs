//! The MCP server's handler: each tool call becomes the same request the
//! Connect API takes, parsed by the same parser (protocol gate included),
//! and goes through the same pipeline: admission, the floor checked
//! immediately before dispatch, limits, the record and the audit line.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CustomRequest, CustomResult,
    ErrorCode, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProgressToken,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Map, Value, json};

use super::results;
use super::tools;
use crate::api::connect::parse;
use crate::api::watch::{Event, watch};
use crate::callers::Caller;
use crate::live::{Channel, Text};
use crate::pipeline::session::SessionError;
use crate::pipeline::{Daemon, RunError};
use crate::refusal::Refusal;
use crate::wire::{PROTOCOL, Request};

#[derive(Clone)]
pub struct McpServer {
    pub daemon: Arc<Daemon>,
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(rmcp::model::Implementation::new(
                "plimsoll",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(tools::INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // Each caller is told the SDK methods of the profiles it may use,
        // and of no others: names it may not use stay unknown to it.
        let caller = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<Arc<Caller>>().cloned())
            .ok_or_else(|| ErrorData::internal_error("no authenticated caller", None))?;
        let profiles = self.daemon.javascript_profiles_for(&caller.id);
        let profiles: Vec<&crate::grants::Profile> = profiles.iter().map(|p| &**p).collect();
        let grants = crate::grants::describe::describe_all(&profiles);
        Ok(ListToolsResult::with_all_items(tools::list(
            self.daemon.has_sessions(),
            &grants,
        )))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // Set by the guard in front of this service, for every request that
        // reaches it; its absence is a wiring fault, not a caller's error.
        let caller = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<Arc<Caller>>().cloned())
            .ok_or_else(|| ErrorData::internal_error("no authenticated caller", None))?;
        let args = request.arguments.unwrap_or_default();
        let answer = match request.name.as_ref() {
            "describe" if !args.is_empty() => {
                results::refused(&Refusal::request("describe takes no arguments"))
            }
            "describe" => {
                let d = serde_json::to_value(self.daemon.describe()).unwrap_or(Value::Null);
                let summary = format!(
                    "provider {}, isolation {}",
                    d["sandbox"].as_str().unwrap_or_default(),
                    d["isolation"].as_str().unwrap_or_default()
                );
                results::value(d, summary)
            }
            "run_javascript" | "run_project" => {
                self.run(&request.name, args, caller, &context).await
            }
            "open_session" | "session_run" | "run_cell" | "close_session"
                if self.daemon.has_sessions() =>
            {
                let slots = context
                    .extensions
                    .get::<http::request::Parts>()
                    .and_then(|p| p.extensions.get::<super::relay::RelaySlots>().cloned());
                self.session(&request.name, args, caller, slots.as_ref())
                    .await
            }
            // The name is not repeated: an answer carries nothing the
            // caller chose beyond the JSON-RPC id.
            _ => return Err(ErrorData::invalid_params("no such tool", None)),
        };
        Ok(answer.into())
    }

    /// A method MCP does not define. The SDK's default answer repeats the
    /// method's name; this one is fixed.
    async fn on_custom_request(
        &self,
        _request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            "Method not found",
            None,
        ))
    }
}

impl McpServer {
    async fn run(
        &self,
        tool: &str,
        args: Map<String, Value>,
        caller: Arc<Caller>,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let req = match request_body(tool, args).and_then(|b| parse(Request::Run, "RunRequest", &b))
        {
            Ok(r) => r,
            Err(r) => return results::refused(&r),
        };
        let token = context.meta.get_progress_token();
        let mut events = watch(self.daemon.clone(), req, caller);
        let mut progress = Progress::default();
        while let Some(event) = events.recv().await {
            match event {
                Event::Output(channel, bytes) => {
                    if let Some(token) = &token {
                        progress.send(context, token, channel, &bytes).await;
                    }
                }
                Event::Done(Ok(resp)) => {
                    if let Some(token) = &token {
                        progress.finish(context, token).await;
                    }
                    return results::answered(&resp);
                }
                Event::Done(Err(RunError::Refused(r))) => return results::refused(&r),
                Event::Done(Err(RunError::Internal { id, .. })) => {
                    return results::failed(&format!("internal error {id}"));
                }
            }
        }
        results::failed("the run's answer was lost")
    }

    async fn session(
        &self,
        tool: &str,
        args: Map<String, Value>,
        caller: Arc<Caller>,
        slots: Option<&super::relay::RelaySlots>,
    ) -> CallToolResult {
        let body = match request_body(tool, args) {
            Ok(b) => b,
            Err(r) => return results::refused(&r),
        };
        // A session another replica holds: the tool runs there.
        if let Some(result) =
            super::relay::elsewhere(&self.daemon, tool, &body, &caller, slots).await
        {
            return result;
        }
        session_tool(&self.daemon, tool, &body, caller).await
    }
}

/// A session tool run here, on its Connect body: for a call from an MCP
/// client, or one another replica forwarded (`relay`).
pub(crate) async fn session_tool(
    daemon: &Arc<Daemon>,
    tool: &str,
    body: &[u8],
    caller: Arc<Caller>,
) -> CallToolResult {
    let answer = match tool {
        "open_session" => match parse(Request::OpenSession, "OpenSessionRequest", body) {
            // MCP's open names no owner: its sessions join no owner's
            // set, so nothing here is forwarded.
            Ok(r) => daemon.open_session(r, caller, None).await.map(|o| {
                let v = serde_json::to_value(&o).unwrap_or(Value::Null);
                let summary = format!(
                    "session {} open: provider {}, isolation {}",
                    o.session_id, o.sandbox, o.isolation
                );
                results::value(v, summary)
            }),
            Err(r) => return results::refused(&r),
        },
        "close_session" => match parse(Request::CloseSession, "CloseSessionRequest", body) {
            Ok(r) => daemon.close_session(r, caller).await.map(|c| {
                let v = serde_json::to_value(&c).unwrap_or(Value::Null);
                results::value(v, format!("session closed after {} calls", c.calls.0))
            }),
            Err(r) => return results::refused(&r),
        },
        _ => match parse(Request::SessionRun, "SessionRunRequest", body) {
            Ok(r) => daemon.session_run(r, caller).await.map(|a| {
                let mut result = results::answered(&a.run);
                if let Some(Value::Object(v)) = result.structured_content.as_mut()
                    && !a.ended.is_open()
                {
                    v.insert("sessionEnded".into(), json!(a.ended.name()));
                }
                result
            }),
            Err(r) => return results::refused(&r),
        },
    };
    match answer {
        Ok(r) => r,
        Err(SessionError::Refused { refusal, ended }) => {
            let mut r = results::refused(&refusal);
            if let (Some(e), Some(Value::Object(v))) = (ended, r.structured_content.as_mut()) {
                v.insert("sessionEnded".into(), json!(e.reason.name()));
            }
            r
        }
        Err(SessionError::Unanswered { id, record, .. }) => {
            // The call may have run: its record took its place in the
            // session's chain, and the agent gets its digest to check it.
            let mut r = results::failed(&format!("internal error {id}"));
            if let Some(Value::Object(v)) = r.structured_content.as_mut() {
                v.insert("recordSha256".into(), json!(record.record_sha256));
            }
            r
        }
        Err(SessionError::Internal { id }) => results::failed(&format!("internal error {id}")),
    }
}

/// Output sent as progress notifications: the progress value is the count
/// of bytes passed on so far (it only grows), the message the text.
#[derive(Default)]
struct Progress {
    sent: u64,
    stdout: Text,
    stderr: Text,
}

impl Progress {
    async fn send(
        &mut self,
        context: &RequestContext<RoleServer>,
        token: &ProgressToken,
        channel: Channel,
        bytes: &[u8],
    ) {
        let text = match channel {
            Channel::Stdout => self.stdout.push(bytes),
            Channel::Stderr => self.stderr.push(bytes),
        };
        self.sent += bytes.len() as u64;
        self.notify(context, token, channel, text).await;
    }

    /// What an unfinished character left at the end of either stream.
    async fn finish(&mut self, context: &RequestContext<RoleServer>, token: &ProgressToken) {
        let (out, err) = (self.stdout.finish(), self.stderr.finish());
        self.notify(context, token, Channel::Stdout, out).await;
        self.notify(context, token, Channel::Stderr, err).await;
    }

    async fn notify(
        &self,
        context: &RequestContext<RoleServer>,
        token: &ProgressToken,
        channel: Channel,
        text: String,
    ) {
        if text.is_empty() {
            return;
        }
        let message = match channel {
            Channel::Stdout => text,
            Channel::Stderr => format!("[stderr] {text}"),
        };
        // A client that stopped listening does not stop the run.
        let _ = context
            .peer
            .notify_progress(
                ProgressNotificationParam::new(token.clone(), self.sent as f64)
                    .with_message(message),
            )
            .await;
    }
}

/// A tool's arguments as the Connect request they stand for. Only the
/// arguments the tool's schema names are taken; anything else is refused,
/// as the API refuses unknown fields.
fn request_body(tool: &str, args: Map<String, Value>) -> Result<Vec<u8>, Refusal> {
    let payload = match tool {
        "run_javascript" | "session_run" => Some("javascript"),
        "run_project" => Some("project"),
        "run_cell" => Some("cell"),
        _ => None,
    };
    let mut top = Map::new();
    top.insert("protocol".into(), json!(PROTOCOL));
    let mut inner = Map::new();
    for (name, value) in args {
        let (into_payload, field) = match name.as_str() {
            "minimum_isolation" => (false, "minimumIsolation"),
            "timeout_ms" => (false, "timeoutMs"),
            "session_id" => (false, "sessionId"),
            "lifetime_ms" => (false, "lifetimeMs"),
            "idle_timeout_ms" => (false, "idleTimeoutMs"),
            "code" => (true, "code"),
            "grant_profile" => (true, "grantProfile"),
            "files" => (true, "files"),
            "steps" => (true, "steps"),
            "artifacts" => (true, "artifacts"),
            "language" => (true, "language"),
            _ => return Err(unknown_argument()),
        };
        if into_payload {
            if payload.is_none() {
                return Err(unknown_argument());
            }
            inner.insert(field.into(), value);
        } else {
            top.insert(field.into(), value);
        }
    }
    if let Some(p) = payload {
        top.insert(p.into(), Value::Object(inner));
    }
    serde_json::to_vec(&top).map_err(|e| Refusal::request(format!("arguments: {e}")))
}

/// Names no argument: the answer repeats nothing the caller chose, and the
/// tool's input schema lists what it takes.
fn unknown_argument() -> Refusal {
    Refusal::request(
        "an argument this tool does not take: its input schema names every one it does",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_become_the_api_request_and_nothing_else() {
        let args = json!({"code": "1", "minimum_isolation": "vm", "timeout_ms": 5});
        let Value::Object(args) = args else { panic!() };
        let b = request_body("run_javascript", args).expect("body");
        let v: Value = serde_json::from_slice(&b).expect("json");
        assert_eq!(v["javascript"]["code"], "1");
        assert_eq!(v["minimumIsolation"], "vm");
        assert_eq!(v["protocol"], PROTOCOL);
        let Value::Object(bad) = json!({"code": "1", "protocol": 3}) else {
            panic!()
        };
        assert!(request_body("run_javascript", bad).is_err());
        let Value::Object(stray) = json!({"code": "1"}) else {
            panic!()
        };
        assert!(request_body("close_session", stray).is_err());
    }
}
