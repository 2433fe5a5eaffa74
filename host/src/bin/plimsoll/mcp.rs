//! `plimsoll mcp`: the daemon's MCP server for an agent that launches its
//! tools as processes. A transport bridge, not a second server: each
//! JSON-RPC message read on stdin (one per line) is POSTed to the daemon's
//! `/mcp` with the caller's token, and every message of the answer (one
//! JSON body, or the events of an SSE stream: progress notifications, then
//! the result) is written to stdout as a line as it arrives. The tools, their
//! checks and their results are the daemon's, so the bridge and the HTTP
//! endpoint cannot drift apart.
//!
//! stdout carries MCP messages only; anything the bridge has to say goes to
//! stderr. A request the daemon refused at the HTTP level (a bad token, a
//! full daemon) is answered with a JSON-RPC error of its own, so the agent
//! is never left waiting.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::client::Api;

/// Larger lines are refused rather than buffered: the daemon takes at most
/// 8 MiB per request anyway.
const MAX_LINE: usize = 8 << 20;
/// A JSON-RPC "server error" code for failures of the bridge's own hop.
const BRIDGE_ERROR: i64 = -32000;

#[derive(clap::Args)]
pub struct McpArgs {
    /// The daemon (default PLIMSOLL_URL, else http://127.0.0.1:8746). The
    /// caller's token is read from PLIMSOLL_TOKEN.
    #[arg(long)]
    url: Option<String>,
}

pub fn run(args: McpArgs) -> ExitCode {
    let api = match Api::new(args.url) {
        Ok(a) => Arc::new(a),
        Err(e) => {
            eprintln!("plimsoll mcp: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("plimsoll mcp: runtime: {e}");
            return ExitCode::from(1);
        }
    };
    rt.block_on(bridge(api));
    ExitCode::SUCCESS
}

async fn bridge(api: Arc<Api>) {
    let (lines, mut out) = mpsc::unbounded_channel::<String>();
    // One writer, so messages from concurrent requests never interleave.
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = out.recv().await {
            if stdout.write_all(line.as_bytes()).await.is_err()
                || stdout.write_all(b"\n").await.is_err()
                || stdout.flush().await.is_err()
            {
                break;
            }
        }
    });
    // The protocol version the daemon agreed to, sent with every later
    // request as the streamable HTTP transport requires.
    let version: Arc<Mutex<Option<String>>> = Arc::default();
    let mut calls = tokio::task::JoinSet::new();
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let mut line = Vec::new();
    loop {
        // Finished relays are let go as the bridge goes.
        while calls.try_join_next().is_some() {}
        line.clear();
        match (&mut stdin)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if line.len() > MAX_LINE {
            // The rest of the line is read and dropped, never kept.
            let mut rest = Vec::new();
            while !line.ends_with(b"\n") && !rest.ends_with(b"\n") {
                rest.clear();
                match (&mut stdin)
                    .take(64 << 10)
                    .read_until(b'\n', &mut rest)
                    .await
                {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            let _ = lines.send(error(Value::Null, -32600, "message too large"));
            continue;
        }
        let Ok(text) = std::str::from_utf8(&line) else {
            let _ = lines.send(error(Value::Null, -32700, "parse error: not UTF-8"));
            continue;
        };
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        let Ok(message) = serde_json::from_str::<Value>(text) else {
            let _ = lines.send(error(Value::Null, -32700, "parse error"));
            continue;
        };
        calls.spawn(forward(
            api.clone(),
            text.to_string(),
            message,
            lines.clone(),
            version.clone(),
        ));
    }
    // stdin closed: the agent is done. Answers still on their way are
    // delivered before the bridge exits.
    while calls.join_next().await.is_some() {}
    drop(lines);
    let _ = writer.await;
}

/// Sends one message and writes every message of its answer.
async fn forward(
    api: Arc<Api>,
    body: String,
    message: Value,
    lines: mpsc::UnboundedSender<String>,
    version: Arc<Mutex<Option<String>>>,
) {
    let id = message.get("id").cloned();
    let initialize = message["method"].as_str() == Some("initialize");
    let mut req = api
        .post("/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body);
    if let Some(v) = version.lock().ok().and_then(|v| v.clone()) {
        req = req.header("mcp-protocol-version", v);
    }
    let reply = |text: String| {
        // A notification gets no answer, whatever happened to it.
        if let Some(id) = &id {
            let _ = lines.send(error(id.clone(), BRIDGE_ERROR, &text));
        }
    };
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => return reply(format!("no answer from {}: {e}", api.base())),
    };
    let status = resp.status();
    if status == reqwest::StatusCode::ACCEPTED {
        return;
    }
    if !status.is_success() {
        let said: Value = resp.json().await.unwrap_or(Value::Null);
        let why = said["message"]
            .as_str()
            .or_else(|| said["error"]["message"].as_str())
            .unwrap_or("");
        return reply(format!(
            "plimsolld refused the request (HTTP {status}): {why}"
        ));
    }
    let keep = |m: &Value| {
        if initialize
            && let Some(v) = m["result"]["protocolVersion"].as_str()
            && let Ok(mut slot) = version.lock()
        {
            *slot = Some(v.to_string());
        }
    };
    let event_stream = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !event_stream {
        match resp.json::<Value>().await {
            Ok(m) => {
                keep(&m);
                let _ = lines.send(m.to_string());
            }
            Err(e) => reply(format!("the answer is not JSON: {e}")),
        }
        return;
    }
    let chunks = futures_util::stream::unfold(resp, |mut resp| async move {
        match resp.chunk().await {
            Ok(Some(c)) => Some((Ok(c), resp)),
            Ok(None) => None,
            Err(e) => Some((Err(e), resp)),
        }
    });
    let mut events = std::pin::pin!(sse_stream::SseStream::from_bytes_stream(chunks));
    let mut answered = false;
    while let Some(event) = events.next().await {
        let Ok(event) = event else { break };
        let Some(data) = event.data.filter(|d| !d.trim().is_empty()) else {
            continue;
        };
        match serde_json::from_str::<Value>(&data) {
            Ok(m) => {
                keep(&m);
                answered |= m.get("id").is_some() && m.get("method").is_none();
                let _ = lines.send(m.to_string());
            }
            Err(_) => continue,
        }
    }
    if !answered {
        reply("the daemon's answer stream ended without a result".into());
    }
}

fn error(id: Value, code: i64, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}
