//! The endpoint's two multipart shapes: an upload is `multipart/form-data`
//! with a `metadata` part (JSON `{path, mode}`) then a `content` part per
//! file; a download answers `multipart/mixed` with `metadata` + `content`
//! per file, `error` for a path it could not read, and `stream-error` when
//! the whole answer failed. Only the closing delimiter proves it whole.

use serde_json::{Value, json};

/// The upload body and its content type.
pub fn form(files: &[(String, &[u8])], boundary: &str) -> (Vec<u8>, String) {
    let mut body = Vec::new();
    for (path, content) in files {
        let meta = json!({"path": path, "mode": 420}).to_string();
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"\r\nContent-Type: application/json\r\n\r\n{meta}\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"content\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(content);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (body, format!("multipart/form-data; boundary={boundary}"))
}

/// One part of a download answer.
pub struct Part {
    pub name: String,
    pub body: Vec<u8>,
}

/// The boundary a `multipart/mixed` content type names.
pub fn boundary(content_type: &str) -> Option<String> {
    let mut params = content_type.split(';');
    if !params
        .next()?
        .trim()
        .eq_ignore_ascii_case("multipart/mixed")
    {
        return None;
    }
    params
        .filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim().trim_matches('"').to_string())
        .filter(|b| !b.is_empty() && b.len() <= 70)
}

/// Splits a whole download body into its parts; an answer without its
/// closing delimiter is refused (the stream was cut).
pub fn parts(body: &[u8], boundary: &str) -> Result<Vec<Part>, String> {
    let delimiter = format!("--{boundary}");
    let d = delimiter.as_bytes();
    let mut at = find(body, d, 0).ok_or("the download answer has no parts")?;
    let mut out = Vec::new();
    loop {
        let after = at + d.len();
        if body[after..].starts_with(b"--") {
            return Ok(out);
        }
        let head_start = after
            + if body[after..].starts_with(b"\r\n") {
                2
            } else {
                return Err("a download part is malformed".into());
            };
        let head_end =
            find(body, b"\r\n\r\n", head_start).ok_or("a download part's headers do not end")?;
        let head = std::str::from_utf8(&body[head_start..head_end])
            .map_err(|_| "a download part's headers are not text")?;
        let name = head
            .split("\r\n")
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition"))
            .and_then(|(_, v)| {
                v.split(';')
                    .filter_map(|p| p.trim().split_once('='))
                    .find_map(|(k, v)| {
                        k.trim()
                            .eq_ignore_ascii_case("name")
                            .then(|| v.trim().trim_matches('"').to_string())
                    })
            })
            .ok_or("a download part has no name")?;
        let content_start = head_end + 4;
        let mut marker = b"\r\n".to_vec();
        marker.extend_from_slice(d);
        let next = find(body, &marker, content_start)
            .ok_or("the download answer was cut before its closing delimiter")?;
        out.push(Part {
            name,
            body: body[content_start..next].to_vec(),
        });
        at = next + 2;
    }
}

/// A JSON part, parsed (null when it is not JSON).
pub fn json(part: &Part) -> Value {
    serde_json::from_slice(&part.body).unwrap_or(Value::Null)
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if from > hay.len() {
        return None;
    }
    hay[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}
