//! Reading the document: bounded, JSON or YAML into one tree (so both
//! spellings of a document read the same), refused whole if it reaches
//! outside itself, then typed as OpenAPI 3.0; and the base path its first
//! server gives.

use openapiv3::OpenAPI;
use serde_json::Value;

use super::{Format, MAX_SPEC_BYTES};
use crate::grants::route;
use crate::text::sanitize;

/// The most reference errors listed one by one.
const MAX_LISTED: usize = 20;
/// The deepest `[`/`{` nesting a YAML document may have. The YAML scanner
/// takes time quadratic in it, so a hostile document of a few MiB could
/// hold the command for hours; OpenAPI documents nest a few levels.
const MAX_FLOW_DEPTH: usize = 64;

/// Refuses YAML whose flow collections (`[`, `{`) nest deeper than
/// MAX_FLOW_DEPTH, before the parser sees it. Quoted scalars and comments
/// are skipped; anything this misreads only makes it count too deep, and a
/// refusal is all that can come of it.
fn check_flow_depth(text: &str) -> Result<(), Vec<String>> {
    let (mut depth, mut quote, mut comment, mut prev) = (0usize, None, false, b'\n');
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match (quote, comment) {
            (_, true) => comment = b != b'\n',
            (Some(b'"'), _) if b == b'\\' => i += 1,
            (Some(q), _) if b == q => quote = None,
            (Some(_), _) => {}
            (None, _) => match b {
                b'#' if prev.is_ascii_whitespace() => comment = true,
                b'"' | b'\'' => quote = Some(b),
                b'[' | b'{' => {
                    depth += 1;
                    if depth > MAX_FLOW_DEPTH {
                        return Err(vec![format!(
                            "the document nests [ or {{ deeper than {MAX_FLOW_DEPTH} levels"
                        )]);
                    }
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        prev = b;
        i += 1;
    }
    Ok(())
}

/// Every key of `paths` is a path (it starts with `/`) or an extension
/// (`x-`): the typed document would drop any other key without a word.
fn check_path_keys(tree: &Value) -> Result<(), Vec<String>> {
    let Some(paths) = tree.get("paths").and_then(Value::as_object) else {
        return Ok(());
    };
    let wrong: Vec<String> = paths
        .keys()
        .filter(|k| !k.starts_with('/') && !k.starts_with("x-"))
        .take(MAX_LISTED)
        .map(|k| format!("paths: {:?} does not start with /", sanitize(k, 200)))
        .collect();
    if wrong.is_empty() { Ok(()) } else { Err(wrong) }
}

/// The typed document `text` holds.
pub(super) fn load(text: &str, format: Format) -> Result<OpenAPI, Vec<String>> {
    if text.len() > MAX_SPEC_BYTES {
        return Err(vec![format!(
            "the document is over {} MiB",
            MAX_SPEC_BYTES >> 20
        )]);
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // One tree for both formats: YAML read into serde_json's Value reads
    // every mapping key as a string, as JSON spells them.
    let mut tree: Value = match format {
        Format::Json => serde_json::from_str(text)
            .map_err(|e| vec![format!("the document is not JSON: {e}")])?,
        Format::Yaml => {
            check_flow_depth(text)?;
            yaml_serde::from_str(text).map_err(|e| {
                vec![format!(
                    "the document is not YAML: {}",
                    sanitize(&e.to_string(), 400)
                )]
            })?
        }
    };
    check_version(&tree)?;
    check_path_keys(&tree)?;
    stringify_scalars(&mut tree);
    let mut outside = Vec::new();
    let mut at = Vec::new();
    external_refs(&tree, &mut at, &mut outside);
    if !outside.is_empty() {
        let n = outside.len();
        outside.truncate(MAX_LISTED);
        if n > MAX_LISTED {
            outside.push(format!(
                "…and {} more references outside the document",
                n - MAX_LISTED
            ));
        }
        return Err(outside);
    }
    serde_json::from_value(tree).map_err(|e| {
        vec![format!(
            "the document is not OpenAPI 3.0 as this generator reads it: {}",
            sanitize(&e.to_string(), 400)
        )]
    })
}

fn check_version(tree: &Value) -> Result<(), Vec<String>> {
    if tree.get("swagger").is_some() {
        return Err(vec![
            "this is a Swagger 2.0 document; convert it to OpenAPI 3.0 first".to_string(),
        ]);
    }
    let version = match tree.get("openapi") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => {
            return Err(vec![
                "the document has no openapi version field".to_string(),
            ]);
        }
    };
    if version == "3.0" || version.starts_with("3.0.") {
        Ok(())
    } else {
        Err(vec![format!(
            "openapi {:?}: only OpenAPI 3.0 documents are read",
            sanitize(&version, 40)
        )])
    }
}

/// YAML reads `version: 1.0` as a number; the fields OpenAPI types as text
/// are made text again, as the document's author meant.
fn stringify_scalars(tree: &mut Value) {
    let Some(top) = tree.as_object_mut() else {
        return;
    };
    if let Some(v) = top.get_mut("openapi") {
        as_text(v);
    }
    if let Some(info) = top.get_mut("info").and_then(Value::as_object_mut) {
        for key in ["title", "version"] {
            if let Some(v) = info.get_mut(key) {
                as_text(v);
            }
        }
    }
}

fn as_text(v: &mut Value) {
    if v.is_number() || v.is_boolean() {
        *v = Value::String(v.to_string());
    }
}

/// Every `$ref` that does not start `#/`, by where it is. A path item's own
/// reference is left to `operations` (which `--skip-refs` can pass over).
/// Recursion is bounded by the parsers' own depth limit (128).
fn external_refs(v: &Value, at: &mut Vec<String>, found: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (key, child) in map {
                if key == "$ref" {
                    if let Value::String(r) = child {
                        let path_item = at.len() == 2 && at[0] == "paths";
                        if !r.starts_with("#/") && !path_item {
                            found.push(format!(
                                "the reference {:?} at {} points outside the document; only #/... references are read",
                                sanitize(r, 200),
                                pointer(at)
                            ));
                        }
                    }
                    continue;
                }
                at.push(key.clone());
                external_refs(child, at, found);
                at.pop();
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                at.push(i.to_string());
                external_refs(child, at, found);
                at.pop();
            }
        }
        _ => {}
    }
}

/// A JSON pointer to `at`, for a message.
fn pointer(at: &[String]) -> String {
    let mut out = String::from("#");
    for part in at {
        out.push('/');
        out.push_str(&part.replace('~', "~0").replace('/', "~1"));
    }
    sanitize(&out, 300)
}

/// The path every route starts with: the path of `servers[0].url`, absolute
/// (`https://host/v2`) or relative (`/v2`), without a trailing `/`; empty
/// without a server.
pub(super) fn base_path(doc: &OpenAPI) -> Result<String, String> {
    let Some(server) = doc.servers.first() else {
        return Ok(String::new());
    };
    let raw = server.url.trim();
    let shown = sanitize(raw, 200);
    if raw.contains(['{', '}']) {
        return Err(format!(
            "servers[0].url {shown:?} uses server variables; write the URL out in the document"
        ));
    }
    let path = if raw.starts_with('/') && !raw.starts_with("//") {
        if raw.contains(['?', '#']) {
            return Err(format!("servers[0].url {shown:?} has a query or fragment"));
        }
        raw.to_string()
    } else {
        let absolute = if raw.starts_with("//") {
            format!("https:{raw}")
        } else {
            raw.to_string()
        };
        let url = url::Url::parse(&absolute)
            .ok()
            .filter(|u| u.has_host())
            .ok_or_else(|| {
                format!(
                    "servers[0].url {shown:?} must be an absolute URL or a path starting with /"
                )
            })?;
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!("servers[0].url {shown:?} has a query or fragment"));
        }
        url.path().to_string()
    };
    let path = path.strip_suffix('/').unwrap_or(&path).to_string();
    if path.is_empty() {
        return Ok(path);
    }
    route::check_path(&path).map_err(|why| {
        format!("servers[0].url {shown:?}: its path cannot start a route ({why})")
    })?;
    Ok(path)
}
