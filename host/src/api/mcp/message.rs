//! An MCP message, weighed before the MCP SDK parses it, and the answers
//! to one that is refused.
//!
//! The SDK (rmcp) turns a message into a tree of values and, on its way to
//! a typed request, buffers that tree and reads it again for each kind of
//! message and request the message might be. Its cost follows the number
//! of values, not the bytes: 8 MiB of `[],` is millions of values and cost
//! over 500 MiB and a second of CPU. The Connect path refuses such a body
//! cheaply (its shape pass allocates nothing per value), and `/mcp` must
//! do no worse.
//!
//! A message this server takes is small in values however large its
//! strings: a `run_project` call at the project bounds (200 files, 20
//! steps, 100 artifacts) is about 1,200 values, an `initialize` a few
//! dozen. So one pass that allocates nothing per value refuses, before
//! the SDK sees the body, anything that is not JSON, is not one JSON
//! object, is nested deeper than `MAX_DEPTH` or holds more than
//! `MAX_VALUES` values (object keys count). What the SDK then builds is
//! bounded by those numbers and the body cap.
//!
//! Every answer written here names nothing from the request: no method,
//! no value, no serde message (serde's messages quote what they found).

use std::fmt;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserializer;
use serde::de;
use serde_json::error::Category;

use crate::api::NOT_DISPATCHED_HEADER;
use crate::refusal::Reason;

/// Containers (objects and arrays) nested in a message, the message
/// itself included. MCP's messages nest about six deep.
pub const MAX_DEPTH: usize = 32;
/// Values in a message, object keys included: over three times the
/// largest call the tools take (see the module comment).
pub const MAX_VALUES: usize = 4096;

/// Why a body is not a message this server will hand to the SDK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfit {
    /// Not JSON at all (JSON-RPC's parse error).
    NotJson,
    /// JSON, but not one object within the bounds (an invalid request).
    NotAMessage,
}

/// One pass over `body`: well-formed JSON, one object, within `MAX_DEPTH`
/// and `MAX_VALUES`. Stops at the first value past a bound, so the cost
/// of a refused body is at most the cost of reading it.
pub fn weigh(body: &[u8]) -> Result<(), Unfit> {
    scan(body).map_err(|e| match e.classify() {
        Category::Data => Unfit::NotAMessage,
        Category::Syntax | Category::Eof | Category::Io => Unfit::NotJson,
    })
}

fn scan(body: &[u8]) -> Result<(), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let mut left = MAX_VALUES;
    de::DeserializeSeed::deserialize(Message { left: &mut left }, &mut de)?;
    de.end()
}

const TOO_DEEP: &str = "nested too deep";
const TOO_MANY: &str = "too many values";

/// Counts one value against the budget.
fn take<E: de::Error>(left: &mut usize) -> Result<(), E> {
    *left = left.checked_sub(1).ok_or_else(|| E::custom(TOO_MANY))?;
    Ok(())
}

/// The whole message: a JSON object.
struct Message<'a> {
    left: &'a mut usize,
}

impl<'de> de::DeserializeSeed<'de> for Message<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        take::<D::Error>(self.left)?;
        d.deserialize_map(Value {
            left: self.left,
            depth: MAX_DEPTH,
        })
    }
}

/// Any value inside it, skipped without being kept: serde_json hands a
/// string over borrowed from the body, or from one scratch buffer it
/// reuses, so nothing here allocates per value.
struct Value<'a> {
    left: &'a mut usize,
    /// Containers that may still be opened here, this one included.
    depth: usize,
}

impl Value<'_> {
    /// The depth left for what this container holds.
    fn inner<E: de::Error>(&self) -> Result<usize, E> {
        self.depth.checked_sub(1).ok_or_else(|| E::custom(TOO_DEEP))
    }
}

impl<'de> de::DeserializeSeed<'de> for Value<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        take::<D::Error>(self.left)?;
        d.deserialize_any(self)
    }
}

impl<'de> de::Visitor<'de> for Value<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON-RPC message")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let depth = self.inner::<A::Error>()?;
        while seq
            .next_element_seed(Value {
                left: &mut *self.left,
                depth,
            })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let depth = self.inner::<A::Error>()?;
        // A key is a string: depth 0 lets it be nothing else.
        while map
            .next_key_seed(Value {
                left: &mut *self.left,
                depth: 0,
            })?
            .is_some()
        {
            map.next_value_seed(Value {
                left: &mut *self.left,
                depth,
            })?;
        }
        Ok(())
    }
}

/// The answer to a body `weigh` refused: 400 with a JSON-RPC error (id
/// null: the message's own id was never read), marked `request`. Nothing
/// ran: the SDK never saw the body.
pub fn refused(unfit: Unfit) -> Response {
    let (code, message) = match unfit {
        Unfit::NotJson => (-32700, "Parse error: the body is not JSON".to_string()),
        Unfit::NotAMessage => (
            -32600,
            format!(
                "Invalid Request: a message here is one JSON object, nested at most {MAX_DEPTH} deep, of at most {MAX_VALUES} values"
            ),
        ),
    };
    let mut r = error(code, &message);
    r.headers_mut().insert(
        NOT_DISPATCHED_HEADER,
        HeaderValue::from_static(Reason::Request.as_str()),
    );
    r
}

/// The SDK's own refusal of a message, in place of what it wrote. Its
/// 400s can quote what was sent (a protocol version, a header, an
/// initialize's version) and its 415, which after the guard's
/// Content-Type check means its typed parse failed, quotes serde's
/// message. Both become this fixed answer with the status JSON-RPC over
/// HTTP gives a bad request. Unmarked: the path is the SDK's, and what it
/// did before refusing is not this code's to vouch for.
pub fn without_echo(answer: Response) -> Response {
    match answer.status() {
        StatusCode::BAD_REQUEST | StatusCode::UNSUPPORTED_MEDIA_TYPE => error(
            -32600,
            "Invalid Request: not a message this server takes (its form, its MCP headers or its protocol version)",
        ),
        _ => answer,
    }
}

/// 400 with a JSON-RPC error object.
fn error(code: i32, message: &str) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": code, "message": message},
    });
    (
        StatusCode::BAD_REQUEST,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value as Json, json};

    #[test]
    fn the_largest_call_the_tools_take_fits() {
        let files: Vec<Json> = (0..crate::admission::MAX_PROJECT_FILES)
            .map(|i| json!({"path": format!("d/f{i}.txt"), "content": "x"}))
            .collect();
        let steps: Vec<String> = (0..20).map(|i| format!("echo {i}")).collect();
        let artifacts: Vec<String> = (0..100).map(|i| format!("a{i}")).collect();
        let call = json!({
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {
                "name": "run_project",
                "arguments": {"files": files, "steps": steps, "artifacts": artifacts,
                              "minimum_isolation": "kernel", "timeout_ms": 60000,
                              "grant_profile": "p"},
                "_meta": {"progressToken": 7},
            },
        });
        assert_eq!(weigh(call.to_string().as_bytes()), Ok(()));
        let init = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18",
                       "capabilities": {"roots": {"listChanged": true}, "sampling": {},
                                        "experimental": {"a": {"b": {"c": [1, 2, {"d": null}]}}}},
                       "clientInfo": {"name": "c", "version": "1"}},
        });
        assert_eq!(weigh(init.to_string().as_bytes()), Ok(()));
    }

    #[test]
    fn bounds_hold_exactly() {
        // MAX_DEPTH containers nested: the message and MAX_DEPTH - 1 arrays.
        let nest = |n: usize| format!("{{\"a\":{}{}}}", "[".repeat(n - 1), "]".repeat(n - 1));
        assert_eq!(weigh(nest(MAX_DEPTH).as_bytes()), Ok(()));
        assert_eq!(
            weigh(nest(MAX_DEPTH + 1).as_bytes()),
            Err(Unfit::NotAMessage)
        );
        // The message, its one key and the array are three values, so
        // the array may hold MAX_VALUES - 3 more.
        let wide = |n: usize| format!("{{\"a\":[{}]}}", vec!["0"; n].join(","));
        assert_eq!(weigh(wide(MAX_VALUES - 3).as_bytes()), Ok(()));
        assert_eq!(
            weigh(wide(MAX_VALUES - 2).as_bytes()),
            Err(Unfit::NotAMessage)
        );
    }

    #[test]
    fn what_is_refused_and_how() {
        let cases: [(&[u8], Unfit); 7] = [
            (b"", Unfit::NotJson),
            (b"{\"jsonrpc\":\"2.0\",", Unfit::NotJson),
            (b"{} {}", Unfit::NotJson),
            (b"{\"a\":\"\\ud800\"}", Unfit::NotJson),
            (b"[]", Unfit::NotAMessage),
            (b"\"x\"", Unfit::NotAMessage),
            (b"null", Unfit::NotAMessage),
        ];
        for (body, want) in cases {
            assert_eq!(weigh(body), Err(want), "{}", String::from_utf8_lossy(body));
        }
        // 8 MiB of `[` stops at the first bracket, of `[],` at the budget.
        let deep = vec![b'['; 8 << 20];
        assert_eq!(weigh(&deep), Err(Unfit::NotAMessage));
        let mut wide = b"{\"a\":[".to_vec();
        while wide.len() < 8 << 20 {
            wide.extend_from_slice(b"[],");
        }
        assert_eq!(weigh(&wide), Err(Unfit::NotAMessage));
    }

    #[test]
    fn refusals_repeat_nothing_and_are_marked() {
        for unfit in [Unfit::NotJson, Unfit::NotAMessage] {
            let r = refused(unfit);
            assert_eq!(r.status(), StatusCode::BAD_REQUEST);
            assert_eq!(
                r.headers()
                    .get(NOT_DISPATCHED_HEADER)
                    .map(HeaderValue::as_bytes),
                Some(&b"request"[..])
            );
        }
        let sdk = (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "fail to deserialize: canary",
        )
            .into_response();
        assert_eq!(without_echo(sdk).status(), StatusCode::BAD_REQUEST);
        let fine = (StatusCode::OK, "x").into_response();
        assert_eq!(without_echo(fine).status(), StatusCode::OK);
    }
}
