//! What an operation takes: its parameters (the path item's and its own,
//! references to `#/components/parameters` followed one level) and its
//! request body (`#/components/requestBodies` likewise). A required
//! parameter the SDK cannot send skips the operation.

use openapiv3::{OpenAPI, Operation, Parameter, PathItem, PathStyle, ReferenceOr, RequestBody};

use super::verdict::{Refusal, shown};

/// The path-item's parameters overridden by the operation's (by name and
/// place); refuses a required one the SDK cannot send. The names declared
/// `in: path` are returned.
pub(super) fn parameters(
    doc: &OpenAPI,
    item: &PathItem,
    op: &Operation,
) -> Result<Vec<String>, Refusal> {
    let mut merged: Vec<&Parameter> = Vec::new();
    for p in item.parameters.iter().chain(op.parameters.iter()) {
        let p = resolve_parameter(doc, p)?;
        let name = &p.parameter_data_ref().name;
        let same = merged
            .iter()
            .position(|q| q.parameter_data_ref().name == *name && place(q) == place(p));
        match same {
            Some(i) => merged[i] = p,
            None => merged.push(p),
        }
    }
    let mut path = Vec::new();
    for p in merged {
        let data = p.parameter_data_ref();
        match p {
            Parameter::Path { style, .. } => {
                if !matches!(style, PathStyle::Simple) {
                    return Err(Refusal::Skip(format!(
                        "path parameter {} is not in the simple style",
                        shown(&data.name)
                    )));
                }
                path.push(data.name.clone());
            }
            // OpenAPI says these three are not parameters; the broker and
            // the client set them.
            Parameter::Header { .. }
                if ["accept", "content-type", "authorization"]
                    .iter()
                    .any(|h| data.name.eq_ignore_ascii_case(h)) => {}
            _ if data.required => {
                return Err(Refusal::Skip(format!(
                    "required {} parameter {}",
                    place(p),
                    shown(&data.name)
                )));
            }
            // An optional one is left out: the SDK sends none.
            _ => {}
        }
    }
    Ok(path)
}

fn place(p: &Parameter) -> &'static str {
    match p {
        Parameter::Query { .. } => "query",
        Parameter::Header { .. } => "header",
        Parameter::Path { .. } => "path",
        Parameter::Cookie { .. } => "cookie",
    }
}

/// `#/components/<kind>/<name>` → name, unescaped.
fn component(reference: &str, kind: &str) -> Option<String> {
    let name = reference
        .strip_prefix("#/components/")?
        .strip_prefix(kind)?
        .strip_prefix('/')?;
    (!name.is_empty() && !name.contains('/')).then(|| name.replace("~1", "/").replace("~0", "~"))
}

fn resolve_parameter<'a>(
    doc: &'a OpenAPI,
    p: &'a ReferenceOr<Parameter>,
) -> Result<&'a Parameter, Refusal> {
    let reference = match p {
        ReferenceOr::Item(p) => return Ok(p),
        ReferenceOr::Reference { reference } => reference,
    };
    let target = component(reference, "parameters")
        .and_then(|name| doc.components.as_ref()?.parameters.get(name.as_str()));
    match target {
        Some(ReferenceOr::Item(p)) => Ok(p),
        Some(ReferenceOr::Reference { .. }) => Err(Refusal::Fatal(format!(
            "the parameter reference {} leads to another reference, which is not followed",
            shown(reference)
        ))),
        None => Err(Refusal::Fatal(format!(
            "the parameter reference {} names no #/components/parameters entry",
            shown(reference)
        ))),
    }
}

pub(super) fn resolve_body<'a>(
    doc: &'a OpenAPI,
    r: &'a ReferenceOr<RequestBody>,
) -> Result<&'a RequestBody, Refusal> {
    let reference = match r {
        ReferenceOr::Item(b) => return Ok(b),
        ReferenceOr::Reference { reference } => reference,
    };
    let target = component(reference, "requestBodies")
        .and_then(|name| doc.components.as_ref()?.request_bodies.get(name.as_str()));
    match target {
        Some(ReferenceOr::Item(b)) => Ok(b),
        Some(ReferenceOr::Reference { .. }) => Err(Refusal::Fatal(format!(
            "the request body reference {} leads to another reference, which is not followed",
            shown(reference)
        ))),
        None => Err(Refusal::Fatal(format!(
            "the request body reference {} names no #/components/requestBodies entry",
            shown(reference)
        ))),
    }
}

/// `application/json`, or any `type/subtype+json`, parameters aside.
pub(super) fn is_json(media_type: &str) -> bool {
    let t = media_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    t == "application/json" || (t.ends_with("+json") && t.contains('/'))
}
