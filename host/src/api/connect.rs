//! The Connect protocol's unary JSON forms: parsing a Run body (protocol
//! number first) and writing answers and errors. Every refusal carries the
//! not-dispatched mark twice: the `Plimsoll-Not-Dispatched` header and the
//! `plimsoll.v1.NotDispatched` error detail.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Serialize;

use super::NOT_DISPATCHED_HEADER;
use crate::refusal::{Code, Reason, Refusal};
use crate::wire::{self, ProtocolMismatch, Request, RunRequest};

/// Parses a Run body. The protocol number is checked before anything in the
/// payload counts: a request from a client of another protocol is refused as
/// `protocol` even when its payload would not parse here.
pub fn parse_run(body: &[u8]) -> Result<RunRequest, Refusal> {
    parse(Request::Run, "RunRequest", body)
}

/// Parses any request that states a protocol number: the shape pass, the
/// protocol gate, then the typed parse.
pub fn parse<T: serde::de::DeserializeOwned>(
    request: Request,
    name: &str,
    body: &[u8],
) -> Result<T, Refusal> {
    let stated =
        wire::shape_of(request, body).map_err(|e| Refusal::request(malformed(name, &e)))?;
    if let Err(mismatch) = wire::protocol_gate(stated) {
        let code = match mismatch {
            ProtocolMismatch::Other(_) => Code::Unimplemented,
            ProtocolMismatch::Unstated | ProtocolMismatch::Invalid(_) => Code::InvalidArgument,
        };
        return Err(Refusal::new(code, Reason::Protocol, mismatch.to_string()));
    }
    serde_json::from_slice::<T>(body).map_err(|e| Refusal::request(malformed(name, &e)))
}

/// "malformed {name}: {why}", where `why` is the parser's account with every
/// quoted piece of the caller's JSON left out: a value or key the caller
/// sent never comes back (an 8 MiB string came back twice in one answer),
/// while the names the parser expected, which are the API's own, stay.
pub(super) fn malformed(name: &str, e: &impl std::fmt::Display) -> String {
    let why = e.to_string();
    // A missing or duplicate field's name is the schema's, and so is all
    // that follows "expected" outside quotes; any other quoted piece is the
    // caller's.
    if why.starts_with("missing field") || why.starts_with("duplicate field") {
        return format!("malformed {name}: {why}");
    }
    let mut out = String::with_capacity(why.len().min(512));
    let mut quote: Option<char> = None;
    for (i, c) in why.char_indices() {
        match quote {
            Some(q) if c == q => {
                out.push('…');
                out.push(c);
                quote = None;
            }
            Some(_) => {}
            None if why[i..].starts_with("expected") => {
                out.push_str(&why[i..]);
                return format!("malformed {name}: {out}");
            }
            None => {
                out.push(c);
                if c == '`' || c == '"' {
                    quote = Some(c);
                }
            }
        }
    }
    if quote.is_some() {
        out.push('…');
    }
    format!("malformed {name}: {out}")
}

pub(super) fn json_ok<T: Serialize>(v: &T) -> Response {
    match serde_json::to_vec(v) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(_) => connect_error(
            Code::Internal,
            "internal error: encoding the answer failed",
            None,
        ),
    }
}

pub(super) fn refusal_from(r: &Refusal) -> Response {
    let status = StatusCode::from_u16(r.code.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    refusal_response(status, r)
}

/// A marked refusal: the header and the Connect detail both say nothing ran.
pub fn refusal_response(status: StatusCode, r: &Refusal) -> Response {
    let mut resp = connect_error(r.code, &r.message, Some(r.reason));
    *resp.status_mut() = status;
    resp
}

#[derive(Serialize)]
struct ConnectError<'a> {
    code: &'a str,
    message: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    details: Vec<ConnectDetail>,
}

#[derive(Serialize)]
pub(super) struct ConnectDetail {
    #[serde(rename = "type")]
    type_: &'static str,
    value: String,
}

pub(super) fn connect_error(code: Code, message: &str, reason: Option<Reason>) -> Response {
    connect_error_with(code, message, reason, Vec::new())
}

/// A Connect error detail: a `plimsoll.v1` message's type and its
/// protobuf bytes.
pub(super) fn detail(type_: &'static str, bytes: &[u8]) -> ConnectDetail {
    ConnectDetail {
        type_,
        value: base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes),
    }
}

/// A Connect error with the not-dispatched mark (when `reason` is given)
/// and any further details.
pub(super) fn connect_error_with(
    code: Code,
    message: &str,
    reason: Option<Reason>,
    extra: Vec<ConnectDetail>,
) -> Response {
    let body = serde_json::to_vec(&error_value(code, message, reason, extra))
        .unwrap_or_else(|_| br#"{"code":"internal"}"#.to_vec());
    let status =
        StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    if let Some(r) = reason {
        resp.headers_mut()
            .insert(NOT_DISPATCHED_HEADER, HeaderValue::from_static(r.as_str()));
    }
    resp
}

/// A Connect error as JSON (the unary body, or the `error` of a stream's
/// end message), with the `plimsoll.v1.NotDispatched` detail when `reason`
/// is given.
pub(super) fn error_value(
    code: Code,
    message: &str,
    reason: Option<Reason>,
    extra: Vec<ConnectDetail>,
) -> serde_json::Value {
    let mut details: Vec<ConnectDetail> = reason
        .map(|r| vec![detail("plimsoll.v1.NotDispatched", &r.detail_bytes())])
        .unwrap_or_default();
    details.extend(extra);
    serde_json::to_value(ConnectError {
        code: code.as_str(),
        message,
        details,
    })
    .unwrap_or_else(|_| serde_json::json!({"code": "internal"}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_is_checked_before_payload() {
        let r = parse_run(br#"{"protocol":3,"javascript":{"code":1,"junk":true}}"#)
            .expect_err("refused");
        assert_eq!(r.reason, Reason::Protocol);
        assert_eq!(r.code, Code::Unimplemented);
        let r = parse_run(br#"{"javascript":{"code":"1"}}"#).expect_err("refused");
        assert_eq!(
            (r.reason, r.code),
            (Reason::Protocol, Code::InvalidArgument)
        );
        let r = parse_run(br#"{"protocol":4,"javascript":{"code":"1","junk":true}}"#)
            .expect_err("refused");
        assert_eq!(r.reason, Reason::Request);
        assert!(parse_run(br#"{"protocol":4,"javascript":{"code":"1"}}"#).is_ok());
        let r = parse_run(b"[1,2]").expect_err("refused");
        assert_eq!(r.reason, Reason::Request);
        let r = parse_run(br#"[4,"","",0,null,{"code":"1"}]"#).expect_err("refused");
        assert_eq!(r.reason, Reason::Request);
    }

    #[test]
    fn a_parse_error_names_what_was_expected_and_nothing_that_was_sent() {
        let canary = "CANARYzq-expected-`x`";
        for body in [
            format!(r#"{{"protocol":4,"javascript":{{"code":"1","{canary}":1}}}}"#),
            format!(
                r#"{{"protocol":4,"project":{{"steps":["x"],"files":"CANARY{}"}}}}"#,
                "y".repeat(100_000)
            ),
            format!(r#"{{"protocol":4,"project":{{"steps":["x"],"files":["{canary}"]}}}}"#),
        ] {
            let r = parse_run(body.as_bytes()).expect_err("refused");
            assert!(!r.message.contains("CANARY"), "{}", r.message);
            assert!(r.message.len() < 400, "{} bytes", r.message.len());
            assert!(
                r.message.starts_with("malformed RunRequest: "),
                "{}",
                r.message
            );
        }
        let r =
            parse_run(br#"{"protocol":4,"javascript":{"code":"1","cod":1}}"#).expect_err("refused");
        assert!(r.message.contains("expected one of"), "{}", r.message);
        assert!(
            r.message.contains("`code`"),
            "the schema's names stay: {}",
            r.message
        );
    }
}
