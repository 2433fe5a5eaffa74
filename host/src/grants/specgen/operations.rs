//! Each operation of the document as a route a grant can name exactly, or
//! the reason it cannot be.
//!
//! A reason that only loses an operation (a required query parameter, a
//! parameter inside a segment, a form body) skips it with a warning; one
//! that would make the profile wrong (a reference not followed, an
//! operationId used twice) is an error.

use std::collections::BTreeSet;

use openapiv3::{OpenAPI, Operation, PathItem, ReferenceOr};
use serde_json::Value;

use super::inputs::{is_json, parameters, resolve_body};
pub(super) use super::verdict::{Refusal, shown};
use crate::grants::catalog::MAX_SUMMARY_CHARS;
use crate::grants::route::{self, Route};
use crate::text::sanitize;

pub(super) const HEALTH_CHECK_EXT: &str = "x-plimsoll-health-check";
pub(super) const BATCH_OF_EXT: &str = "x-plimsoll-batch-of";

/// One operation that becomes an SDK method and an allow entry.
#[derive(Debug, Clone)]
pub(super) struct Op {
    /// How messages name it: `GET /pets/{petId} (getPet)`.
    pub label: String,
    /// How the operator names it: the operationId, else `METHOD /path`.
    pub key: String,
    pub operation_id: Option<String>,
    pub method: &'static str,
    /// The path as the document writes it (without the base path).
    pub doc_path: String,
    /// `METHOD /base/path/*`.
    pub template: String,
    /// The full path around its parameters: one more piece than parameters.
    pub pieces: Vec<String>,
    /// The path parameters' names in the document, in path order.
    pub path_params: Vec<String>,
    /// Their JavaScript names (set by `naming`).
    pub params: Vec<String>,
    pub body: bool,
    pub summary: String,
    /// The method name (set by `naming`).
    pub name: String,
    pub health_check: bool,
    pub batch_of: Option<Vec<String>>,
}

/// One operation skipped with a warning.
#[derive(Debug, Clone)]
pub(super) struct Skipped {
    pub label: String,
    pub method: Option<&'static str>,
    /// The full path when it has no parameter and is canonical: a wildcard
    /// route of another operation may still reach it.
    pub path: Option<String>,
    /// Its warning's index in `Collected::warnings`.
    pub warning: usize,
}

#[derive(Debug, Default)]
pub(super) struct Collected {
    pub ops: Vec<Op>,
    pub skipped: Vec<Skipped>,
    pub warnings: Vec<String>,
    pub errors: Vec<String>,
    /// Every operation's key, skipped or not.
    pub keys: BTreeSet<String>,
}

/// The document's operations, by path (in the order the parsed tree keeps
/// them, the same for JSON and YAML) and method.
pub(super) fn collect(doc: &OpenAPI, base: &str, skip_refs: bool) -> Collected {
    let mut c = Collected::default();
    for (doc_path, item) in doc.paths.iter() {
        let item = match item {
            ReferenceOr::Item(item) => item,
            ReferenceOr::Reference { reference } => {
                let what = format!(
                    "{}: the path item is a reference ({}), which is not followed",
                    shown(doc_path),
                    shown(reference)
                );
                if skip_refs {
                    c.warnings.push(format!("warning: {what}; skipped"));
                } else {
                    c.errors.push(format!(
                        "{what}; inline it, or pass --skip-refs to leave it out"
                    ));
                }
                continue;
            }
        };
        for (lower, op) in item.iter() {
            let upper = lower.to_ascii_uppercase();
            let (key, label) = match &op.operation_id {
                Some(id) => (
                    id.clone(),
                    format!("{upper} {} ({})", shown(doc_path), shown(id)),
                ),
                None => (
                    format!("{upper} {doc_path}"),
                    format!("{upper} {}", shown(doc_path)),
                ),
            };
            if !c.keys.insert(key.clone()) {
                c.errors.push(format!(
                    "{label}: another operation has the same operationId"
                ));
                continue;
            }
            let method = route::canonical_method(&upper);
            let outcome = match method {
                Some(m) => shape(doc, base, doc_path, item, op, m),
                None => Err(Refusal::Skip(format!(
                    "a grant cannot name {upper} (only {})",
                    route::METHODS.join(", ")
                ))),
            };
            match outcome {
                Ok(mut shaped) => {
                    shaped.key = key;
                    shaped.label = label;
                    shaped.operation_id = op.operation_id.clone();
                    c.ops.push(shaped);
                }
                Err(Refusal::Fatal(why)) => c.errors.push(format!("{label}: {why}")),
                Err(Refusal::Skip(why)) => {
                    let literal = !doc_path.contains(['{', '}']);
                    let full = join(base, doc_path);
                    c.skipped.push(Skipped {
                        label: label.clone(),
                        method,
                        path: (literal && route::check_path(&full).is_ok()).then_some(full),
                        warning: c.warnings.len(),
                    });
                    c.warnings.push(format!("warning: {label}: {why}; skipped"));
                }
            }
        }
    }
    c
}

/// The base path and the document's path as one.
fn join(base: &str, doc_path: &str) -> String {
    if doc_path == "/" && !base.is_empty() {
        base.to_string()
    } else {
        format!("{base}{doc_path}")
    }
}

fn shape(
    doc: &OpenAPI,
    base: &str,
    doc_path: &str,
    item: &PathItem,
    op: &Operation,
    method: &'static str,
) -> Result<Op, Refusal> {
    let health_check = match op.extensions.get(HEALTH_CHECK_EXT) {
        None | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(_) => {
            return Err(Refusal::Fatal(format!(
                "{HEALTH_CHECK_EXT} must be true or false"
            )));
        }
    };
    let batch_of = match op.extensions.get(BATCH_OF_EXT) {
        None => None,
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<String>>>()
                .ok_or_else(|| Refusal::Fatal(format!("{BATCH_OF_EXT} must list operationIds")))?,
        ),
        Some(_) => {
            return Err(Refusal::Fatal(format!(
                "{BATCH_OF_EXT} must list operationIds"
            )));
        }
    };
    let call = call_shape(doc, base, doc_path, item, op, method).map_err(|r| match r {
        Refusal::Skip(why) if health_check || batch_of.is_some() => Refusal::Fatal(format!(
            "it is marked {} but cannot be granted: {why}",
            if health_check {
                HEALTH_CHECK_EXT
            } else {
                BATCH_OF_EXT
            }
        )),
        other => other,
    })?;
    Ok(Op {
        label: String::new(),
        key: String::new(),
        operation_id: None,
        method,
        doc_path: doc_path.to_string(),
        template: call.template,
        pieces: call.pieces,
        path_params: call.path_params,
        params: Vec::new(),
        body: call.body,
        summary: summary(op),
        name: String::new(),
        health_check,
        batch_of,
    })
}

struct Call {
    template: String,
    pieces: Vec<String>,
    path_params: Vec<String>,
    body: bool,
}

fn call_shape(
    doc: &OpenAPI,
    base: &str,
    doc_path: &str,
    item: &PathItem,
    op: &Operation,
    method: &'static str,
) -> Result<Call, Refusal> {
    if !item.servers.is_empty() || !op.servers.is_empty() {
        return Err(Refusal::Skip(
            "it names servers of its own, which the profile's base URL would not reach".into(),
        ));
    }
    let full = join(base, doc_path);
    let mut names: Vec<String> = Vec::new();
    let mut pieces: Vec<String> = Vec::new();
    let mut template = String::new();
    let mut literal = String::new();
    let mut piece = String::new();
    for segment in full.split('/').skip(1) {
        template.push('/');
        literal.push('/');
        piece.push('/');
        if segment.contains(['{', '}']) {
            let name = segment
                .strip_prefix('{')
                .and_then(|s| s.strip_suffix('}'))
                .filter(|n| !n.is_empty() && !n.contains(['{', '}']))
                .ok_or_else(|| {
                    Refusal::Skip(format!(
                        "the parameter in segment {:?} is not a whole segment",
                        shown(segment)
                    ))
                })?;
            if names.iter().any(|n| n == name) {
                return Err(Refusal::Skip(format!(
                    "the path names parameter {} twice",
                    shown(name)
                )));
            }
            names.push(name.to_string());
            template.push('*');
            literal.push('x');
            pieces.push(std::mem::take(&mut piece));
        } else if segment.contains('*') {
            return Err(Refusal::Skip(format!(
                "segment {:?} holds *, which a route reads as a wildcard",
                shown(segment)
            )));
        } else {
            template.push_str(segment);
            literal.push_str(segment);
            piece.push_str(segment);
        }
    }
    pieces.push(piece);
    route::check_path(&literal)
        .map_err(|why| Refusal::Skip(format!("a grant cannot name this path exactly ({why})")))?;
    let template = format!("{method} {template}");
    Route::parse(&template).map_err(|why| Refusal::Skip(shown(&why)))?;

    let declared = parameters(doc, item, op)?;
    for name in &names {
        if !declared.iter().any(|d| d == name) {
            return Err(Refusal::Skip(format!(
                "path parameter {} is not declared with in: path",
                shown(name)
            )));
        }
    }
    let body = match &op.request_body {
        None => false,
        Some(r) => {
            let body = resolve_body(doc, r)?;
            if !body.content.is_empty() && !body.content.keys().any(|t| is_json(t)) {
                let types: Vec<String> = body.content.keys().map(|t| shown(t)).collect();
                return Err(Refusal::Skip(format!(
                    "its request body is {}, not JSON",
                    sanitize(&types.join(", "), 200)
                )));
            }
            true
        }
    };
    Ok(Call {
        template,
        pieces,
        path_params: names,
        body,
    })
}

/// The operation's summary, else its description's first line; control
/// and invisible characters gone, whitespace collapsed, at most
/// `MAX_SUMMARY_CHARS` characters.
fn summary(op: &Operation) -> String {
    let text = op
        .summary
        .as_deref()
        .filter(|s| !s.trim().is_empty())
        .or_else(|| {
            op.description
                .as_deref()
                .and_then(|d| d.lines().map(str::trim).find(|l| !l.is_empty()))
        })
        .unwrap_or("");
    clean_summary(text)
}

pub(super) fn clean_summary(raw: &str) -> String {
    let spaced = sanitize(raw, raw.len());
    let collapsed = spaced.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.chars().count() <= MAX_SUMMARY_CHARS {
        return collapsed;
    }
    let mut cut: String = collapsed.chars().take(MAX_SUMMARY_CHARS - 1).collect();
    cut.truncate(cut.trim_end().len());
    cut.push('…');
    cut
}
