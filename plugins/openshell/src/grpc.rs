//! gRPC over the host's `wasi:http` (HTTP/2 over TLS, which the host
//! negotiates; mutual TLS or a bearer token are the host's, never this
//! plugin's): length-prefixed protobuf messages in, the same out, the call's
//! status from `grpc-status` in the trailers (or the head, for an answer
//! with no body).

use prost::Message;
use wasi::clocks::monotonic_clock::Instant;
use wasi::http::types::Method;

use crate::wire::{self, Failure, Response};

/// Largest message this plugin accepts from the gateway.
const MAX_MESSAGE: usize = 4 << 20;

pub const NOT_FOUND: u32 = 5;
pub const PERMISSION_DENIED: u32 = 7;
pub const RESOURCE_EXHAUSTED: u32 = 8;
pub const FAILED_PRECONDITION: u32 = 9;
pub const UNAUTHENTICATED: u32 = 16;

/// How a call failed.
#[derive(Debug)]
pub enum CallError {
    /// The request never left (the host refused it) or the wire failed.
    Wire(Failure),
    /// The gateway answered with a non-OK status (code, bounded message).
    Status(u32, String),
    /// The answer was not gRPC as this plugin reads it.
    Malformed(&'static str),
}

impl CallError {
    pub fn say(&self) -> String {
        match self {
            CallError::Wire(Failure::Refused(w) | Failure::Transport(w)) => w.clone(),
            CallError::Wire(Failure::Deadline) => "the gateway did not answer in time".into(),
            CallError::Wire(Failure::TooLarge) => "the gateway's answer was too large".into(),
            CallError::Status(code, msg) => format!("gRPC status {code}: {msg}"),
            CallError::Malformed(why) => (*why).into(),
        }
    }
}

/// Frames each message (no compression).
pub fn frame(messages: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in messages {
        out.push(0);
        out.extend_from_slice(&(m.len() as u32).to_be_bytes());
        out.extend_from_slice(m);
    }
    out
}

/// Starts a call to `method` with `body` (already framed); returns the
/// answer once its head arrived, or the status a head-only answer carries.
pub fn start(
    origin: &str,
    method: &str,
    body: &[u8],
    deadline: Instant,
) -> Result<Response, CallError> {
    let timeout = format!("{}m", wire::remaining_ms(deadline).max(1));
    let r = wire::send_to(
        origin,
        Method::Post,
        &format!("/openshell.v1.OpenShell/{method}"),
        vec![
            ("content-type", b"application/grpc".to_vec()),
            ("te", b"trailers".to_vec()),
            ("grpc-timeout", timeout.into_bytes()),
        ],
        body,
        deadline,
    )
    .map_err(CallError::Wire)?;
    if r.status != 200 {
        return Err(CallError::Malformed(
            "the gateway answered a non-200 HTTP status",
        ));
    }
    if let Some(code) = r
        .header("grpc-status")
        .and_then(|c| c.trim().parse::<u32>().ok())
        && code != 0
    {
        return Err(CallError::Status(code, message(r.header("grpc-message"))));
    }
    Ok(r)
}

/// One unary call.
pub fn unary<Req: Message, Resp: Message + Default>(
    origin: &str,
    method: &str,
    request: &Req,
    deadline: Instant,
) -> Result<Resp, CallError> {
    let mut r = start(origin, method, &frame(&[request.encode_to_vec()]), deadline)?;
    let mut reader = Frames::default();
    let mut answer = None;
    while let Some(chunk) = r.next_chunk(deadline).map_err(CallError::Wire)? {
        reader.push(&chunk)?;
        while let Some(m) = reader.next()? {
            if answer.is_some() {
                return Err(CallError::Malformed("a unary call answered two messages"));
            }
            answer = Some(m);
        }
    }
    finish(&mut r, deadline)?;
    let bytes = answer.ok_or(CallError::Malformed("the call answered no message"))?;
    Resp::decode(bytes.as_slice()).map_err(|_| CallError::Malformed("the answer does not decode"))
}

/// The call's status, from the trailers, once the body ended.
pub fn finish(r: &mut Response, deadline: Instant) -> Result<(), CallError> {
    let head = r
        .header("grpc-status")
        .map(|s| (s.to_string(), r.header("grpc-message").map(str::to_string)));
    let trailers = r.trailers(deadline).map_err(CallError::Wire)?;
    let find = |name: &str| {
        trailers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok().map(str::to_string))
    };
    let (code, msg) = match (find("grpc-status"), head) {
        (Some(code), _) => (code, find("grpc-message")),
        (None, Some((code, msg))) => (code, msg),
        (None, None) => return Err(CallError::Malformed("the call ended without a status")),
    };
    match code.trim().parse::<u32>() {
        Ok(0) => Ok(()),
        Ok(c) => Err(CallError::Status(c, message(msg.as_deref()))),
        Err(_) => Err(CallError::Malformed("the call's status is not a number")),
    }
}

/// A gRPC message text, percent-decoded loosely and bounded.
fn message(m: Option<&str>) -> String {
    m.unwrap_or("")
        .replace("%20", " ")
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect()
}

/// Messages out of a stream of chunks.
#[derive(Default)]
pub struct Frames {
    buf: Vec<u8>,
}

impl Frames {
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), CallError> {
        self.buf.extend_from_slice(chunk);
        if self.buf.len() > MAX_MESSAGE + 5 + (64 << 10) {
            return Err(CallError::Malformed("a message is too large"));
        }
        Ok(())
    }

    pub fn next(&mut self) -> Result<Option<Vec<u8>>, CallError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        if self.buf[0] != 0 {
            return Err(CallError::Malformed(
                "a compressed message (none was asked for)",
            ));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_MESSAGE {
            return Err(CallError::Malformed("a message is too large"));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let m = self.buf[5..5 + len].to_vec();
        self.buf.drain(..5 + len);
        Ok(Some(m))
    }
}
