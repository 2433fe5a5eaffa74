//! `RunStream`: `Run` as a Connect server-streaming call. The request is one
//! enveloped `RunRequest`; the answer is a sequence of enveloped messages,
//! each `{"output": {"stdout"|"stderr": <bytes>}}` as the run writes, then
//! `{"result": <RunResponse>}` (exactly what `Run` answers, record
//! included), then the end-of-stream message. Nothing about the run differs
//! from `Run`: the same checks, limits, record and audit line.
//!
//! A refusal that comes before any output (every refusal: nothing is sent
//! before dispatch) is answered at once, marked in the
//! `Plimsoll-Not-Dispatched` header, the end message's metadata and its
//! `plimsoll.v1.NotDispatched` detail. Headers wait for the first event, so
//! a refused stream never began as if it would run.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::NOT_DISPATCHED_HEADER;
use super::connect::error_value;
use super::watch::{Event, watch};
use crate::callers::Caller;
use crate::pipeline::{Daemon, RunError};
use crate::refusal::{Code, Refusal};
use crate::wire::{B64, RunRequest};

pub const CONTENT_TYPE: &str = "application/connect+json";
const FLAG_COMPRESSED: u8 = 0x01;
const FLAG_END: u8 = 0x02;

/// The one message of a server-streaming request, out of its envelope.
pub fn unframe(body: &[u8]) -> Result<&[u8], Refusal> {
    let Some((head, message)) = body.split_first_chunk::<5>() else {
        return Err(Refusal::request(
            "a RunStream request is one enveloped message",
        ));
    };
    if head[0] & FLAG_COMPRESSED != 0 {
        return Err(Refusal::request("compressed messages are not accepted"));
    }
    if head[0] != 0 {
        return Err(Refusal::request("a RunStream request message has no flags"));
    }
    let declared = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if declared != message.len() {
        return Err(Refusal::request(
            "a RunStream request is exactly one enveloped message",
        ));
    }
    Ok(message)
}

/// Runs `req`, streaming its output and then its answer.
pub async fn run_stream(daemon: &Arc<Daemon>, req: RunRequest, caller: Arc<Caller>) -> Response {
    let mut events = watch(daemon.clone(), req, caller);
    let first = events.recv().await;
    if let Some(Event::Done(Err(RunError::Refused(r)))) = &first {
        let mut resp = respond(Body::from(end(Some(r), None)));
        resp.headers_mut().insert(
            NOT_DISPATCHED_HEADER,
            HeaderValue::from_static(r.reason.as_str()),
        );
        return resp;
    }
    let state = (first, events);
    let frames = futures_util::stream::unfold(state, |(next, mut events)| async move {
        let event = match next {
            Some(e) => e,
            None => events.recv().await?,
        };
        let last = matches!(event, Event::Done(_));
        let bytes = encode(event);
        // After the answer, the stream ends.
        if last {
            events.close();
        }
        Some((Ok::<_, std::convert::Infallible>(bytes), (None, events)))
    });
    respond(Body::from_stream(frames))
}

fn respond(body: Body) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response()
}

/// One event as wire bytes: output, or the answer and the end message.
fn encode(event: Event) -> Bytes {
    match event {
        Event::Output(channel, bytes) => {
            let key = channel.name();
            frame(0, &json!({"output": {key: B64(bytes)}}))
        }
        Event::Done(Ok(answer)) => {
            let mut out = frame(0, &json!({"result": answer})).to_vec();
            out.extend_from_slice(&end(None, None));
            Bytes::from(out)
        }
        Event::Done(Err(RunError::Refused(r))) => end(Some(&r), None),
        Event::Done(Err(RunError::Internal { id, .. })) => {
            end(None, Some(&format!("internal error {id}")))
        }
    }
}

/// The end-of-stream message: success, a marked refusal, or an internal
/// error (unmarked: the run may have started).
fn end(refusal: Option<&Refusal>, internal: Option<&str>) -> Bytes {
    let body = match (refusal, internal) {
        (Some(r), _) => json!({
            "error": error_value(r.code, &r.message, Some(r.reason), Vec::new()),
            "metadata": {NOT_DISPATCHED_HEADER: [r.reason.as_str()]},
        }),
        (None, Some(message)) => json!({
            "error": error_value(Code::Internal, message, None, Vec::new()),
        }),
        (None, None) => json!({}),
    };
    frame(FLAG_END, &body)
}

fn frame(flags: u8, message: &Value) -> Bytes {
    let json = serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec());
    let mut out = Vec::with_capacity(5 + json.len());
    out.push(flags);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::Channel;

    #[test]
    fn a_request_is_exactly_one_uncompressed_message() {
        let msg = br#"{"protocol":4}"#;
        let mut body = vec![0u8];
        body.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        body.extend_from_slice(msg);
        assert_eq!(unframe(&body).expect("one message"), msg);
        let mut compressed = body.clone();
        compressed[0] = FLAG_COMPRESSED;
        assert!(unframe(&compressed).is_err());
        let mut two = body.clone();
        two.extend_from_slice(&body);
        assert!(unframe(&two).is_err(), "a second message is refused");
        assert!(unframe(&body[..4]).is_err());
        assert!(unframe(&body[..body.len() - 1]).is_err());
    }

    #[test]
    fn output_is_framed_with_its_stream_and_the_end_is_flagged() {
        let b = encode(Event::Output(Channel::Stderr, b"hi".to_vec()));
        assert_eq!(b[0], 0);
        let v: Value = serde_json::from_slice(&b[5..]).expect("json");
        assert_eq!(v, json!({"output": {"stderr": "aGk="}}));
        let e = end(Some(&Refusal::request("no")), None);
        assert_eq!(e[0], FLAG_END);
        let v: Value = serde_json::from_slice(&e[5..]).expect("json");
        assert_eq!(v["metadata"][NOT_DISPATCHED_HEADER][0], "request");
        assert_eq!(v["error"]["code"], "invalid_argument");
    }
}
