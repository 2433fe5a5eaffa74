//! One POST to the upstream over standard `wasi:http`, the interface any
//! WASI HTTP library targets. The host polices it (the allowlist, reserved
//! headers, its key added, budgets); this side only builds the request and
//! reads a bounded answer.

use wasi::http::outgoing_handler;
use wasi::http::types::{Method, OutgoingBody};
use wasi::io::streams::StreamError;

// What failed, read the way every adapter reads it: a refusal by the host
// is the one error that proves nothing left. Only `Refused` and
// `Transport` come back from here. The request itself is built as the
// kit's client builds its own.
use crate::wire::{Failure, Naming, failure, outgoing};

/// How the refusals of a request the host would not take name it.
const UPSTREAM: Naming = Naming {
    no_scheme: "the upstream URL has no scheme",
    header: "",
    parts: "the upstream URL's",
};

/// Most of an answer this plugin keeps; a Connect JSON answer carrying
/// 64 KiB of each stream base64-encoded fits with room to spare.
const MAX_ANSWER: usize = 8 << 20;

pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// POSTs `body` as JSON to `url` (`scheme://host:port/path`).
pub fn post_json(url: &str, body: &[u8]) -> Result<Response, Failure> {
    let headers = [("content-type", b"application/json".to_vec())];
    let req = outgoing(&Method::Post, url, &headers, &UPSTREAM)?;

    let out = req.body().map_err(|()| UPSTREAM.invalid("body"))?;
    let future = outgoing_handler::handle(req, None).map_err(failure)?;
    {
        let stream = out.write().map_err(|()| UPSTREAM.invalid("body"))?;
        for chunk in body.chunks(4096) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|_| Failure::Transport("the request body could not be sent".into()))?;
        }
    }
    OutgoingBody::finish(out, None).map_err(failure)?;

    future.subscribe().block();
    let resp = match future.get() {
        Some(Ok(Ok(r))) => r,
        Some(Ok(Err(e))) => return Err(failure(e)),
        _ => return Err(Failure::Transport("no answer".into())),
    };
    let status = resp.status();
    let headers = resp
        .headers()
        .entries()
        .into_iter()
        .filter_map(|(k, v)| Some((k, String::from_utf8(v).ok()?)))
        .collect();
    let incoming = resp
        .consume()
        .map_err(|()| Failure::Transport("the answer has no body".into()))?;
    let mut body = Vec::new();
    {
        let stream = incoming
            .stream()
            .map_err(|()| Failure::Transport("the answer has no body".into()))?;
        loop {
            match stream.blocking_read(64 << 10) {
                Ok(bytes) => {
                    if body.len() + bytes.len() > MAX_ANSWER {
                        return Err(Failure::Transport("the answer was too large".into()));
                    }
                    body.extend_from_slice(&bytes);
                }
                Err(StreamError::Closed) => break,
                Err(StreamError::LastOperationFailed(_)) => {
                    return Err(Failure::Transport("the answer's body failed".into()));
                }
            }
        }
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}
