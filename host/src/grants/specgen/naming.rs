//! SDK names: a method name per operation, from its operationId (or the
//! operator's `--rename`, or its method and path), and a JavaScript name per
//! path parameter.
//!
//! A name that cannot be used (a keyword, one the client or every object
//! already has, one two operations would share) is an error naming the
//! operations and the `--rename` that settles it: renaming silently would
//! give the model a method the operator never saw.

use std::collections::{BTreeMap, BTreeSet};

use super::operations::Op;
use crate::grants::catalog::RESERVED_METHOD_NAMES;
use crate::grants::names::valid_js_identifier;

/// JavaScript's reserved words, strict mode's included, and the two names
/// strict code cannot bind.
pub(crate) const JS_RESERVED: &[&str] = &[
    "break",
    "case",
    "catch",
    "class",
    "const",
    "continue",
    "debugger",
    "default",
    "delete",
    "do",
    "else",
    "export",
    "extends",
    "false",
    "finally",
    "for",
    "function",
    "if",
    "import",
    "in",
    "instanceof",
    "new",
    "null",
    "return",
    "super",
    "switch",
    "this",
    "throw",
    "true",
    "try",
    "typeof",
    "var",
    "void",
    "while",
    "with",
    "yield",
    "let",
    "static",
    "enum",
    "await",
    "implements",
    "package",
    "protected",
    "interface",
    "private",
    "public",
    "arguments",
    "eval",
];

/// `get-stations` → `getStations`: split on `-`, `_`, space, `.` and `/`;
/// the first word's leading capitals lowered (`HTTPGet` → `httpGet`), each
/// later word's first letter raised.
pub(super) fn lower_camel(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let words = raw
        .split(['-', '_', ' ', '.', '/'])
        .filter(|w| !w.is_empty());
    for (i, word) in words.enumerate() {
        if i == 0 {
            out.push_str(&lower_lead(word));
        } else {
            out.push_str(&upper_first(word));
        }
    }
    out
}

/// The leading run of capitals lowered, but for the last of a run of
/// several that starts the next word (`HTTPGet` → `httpGet`, `URL` → `url`).
fn lower_lead(word: &str) -> String {
    let chars: Vec<char> = word.chars().collect();
    let run = chars.iter().take_while(|c| c.is_ascii_uppercase()).count();
    let next_lower = chars.get(run).is_some_and(|c| c.is_ascii_lowercase());
    let lowered = if run > 1 && next_lower { run - 1 } else { run };
    chars
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if i < lowered {
                c.to_ascii_lowercase()
            } else {
                *c
            }
        })
        .collect()
}

fn upper_first(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// Each run of letters and digits with its first letter raised:
/// `find-by_status` → `FindByStatus`.
fn pascal(text: &str) -> String {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .map(upper_first)
        .collect()
}

/// A name for an operation without an operationId: its method, its
/// literal segments and its parameters (`GET /pet/{petId}` →
/// `getPetByPetId`, `PUT /a/{x}/b/{y}` → `putABByXAndY`).
pub(super) fn fallback_name(method: &str, doc_path: &str) -> String {
    let mut out = method.to_ascii_lowercase();
    let mut params = Vec::new();
    for segment in doc_path.split('/').filter(|s| !s.is_empty()) {
        match segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            Some(param) => params.push(pascal(param)),
            None => out.push_str(&pascal(segment)),
        }
    }
    if !params.is_empty() {
        out.push_str("By");
        out.push_str(&params.join("And"));
    }
    out
}

/// `^[A-Za-z_$][A-Za-z0-9_$]{0,63}$`.
fn identifier_shaped(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=64).contains(&b.len())
        && (b[0].is_ascii_alphabetic() || b[0] == b'_' || b[0] == b'$')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'$')
}

/// Why `name` cannot name an SDK method, if it cannot.
pub(super) fn unusable_method_name(name: &str) -> Option<&'static str> {
    if !identifier_shaped(name) {
        Some("is not a JavaScript name of at most 64 letters, digits, _ and $")
    } else if JS_RESERVED.contains(&name) {
        Some("is a JavaScript reserved word")
    } else if RESERVED_METHOD_NAMES.contains(&name) {
        Some("is taken by the grant client or by every JavaScript object")
    } else if !valid_js_identifier(name) {
        Some("is a name the runtime itself needs")
    } else {
        None
    }
}

/// A path parameter's JavaScript name: its name in lowerCamelCase, with
/// `Param` added when that is a name the runtime needs (`process`).
pub(super) fn param_name(raw: &str) -> Option<String> {
    let name = lower_camel(raw);
    if !identifier_shaped(&name) {
        return None;
    }
    if valid_js_identifier(&name) {
        return Some(name);
    }
    let suffixed = format!("{name}Param");
    valid_js_identifier(&suffixed).then_some(suffixed)
}

/// Names every operation and its parameters; the errors, if any. `keys`
/// holds every operation's key, so a `--rename` naming none is caught.
pub(super) fn assign(
    ops: &mut [Op],
    renames: &BTreeMap<String, String>,
    keys: &BTreeSet<String>,
) -> Vec<String> {
    let mut errors = Vec::new();
    for key in renames.keys() {
        if !keys.contains(key) {
            errors.push(format!(
                "--rename {}: no operation has this operationId (or METHOD /path)",
                super::operations::shown(key)
            ));
        }
    }
    let mut taken: BTreeMap<String, usize> = BTreeMap::new();
    let mut chosen: Vec<Option<(String, Vec<String>)>> = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let (name, from) = match (renames.get(&op.key), &op.operation_id) {
            (Some(name), _) => (name.clone(), "--rename"),
            (None, Some(id)) => (lower_camel(id), "its operationId"),
            (None, None) => (
                fallback_name(op.method, &op.doc_path),
                "its method and path",
            ),
        };
        let shown_name = super::operations::shown(&name);
        if let Some(why) = unusable_method_name(&name) {
            errors.push(format!(
                "{}: the method name {shown_name:?} (from {from}) {why}; choose one with --rename '{}=NAME'",
                op.label,
                super::operations::shown(&op.key)
            ));
            chosen.push(None);
            continue;
        }
        if let Some(&first) = taken.get(&name) {
            errors.push(format!(
                "{} and {} would both be the method {shown_name:?}; name one with --rename OP=NAME",
                ops[first].label, op.label
            ));
            chosen.push(None);
            continue;
        }
        let mut params = Vec::with_capacity(op.path_params.len());
        for raw in &op.path_params {
            match param_name(raw) {
                Some(p) if params.contains(&p) => errors.push(format!(
                    "{}: two path parameters are both {p:?} in JavaScript",
                    op.label
                )),
                Some(p) => params.push(p),
                None => errors.push(format!(
                    "{}: the path parameter {:?} has no JavaScript name",
                    op.label,
                    super::operations::shown(raw)
                )),
            }
        }
        taken.insert(name.clone(), i);
        chosen.push(Some((name, params)));
    }
    for (op, pick) in ops.iter_mut().zip(chosen) {
        if let Some((name, params)) = pick {
            op.name = name;
            op.params = params;
        }
    }
    errors
}
