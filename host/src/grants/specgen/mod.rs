//! `plimsoll grants from-openapi`: an operator's OpenAPI 3.0 document turned
//! into a grant profile, the JavaScript SDK its preamble loads, and the tool
//! description a model is shown.
//!
//! Offline and at the operator's hand: nothing here reaches a network or
//! runs in the daemon. The output is a starting point the operator reads:
//! every operation becomes an allow entry, so a document listing a
//! dangerous route grants it. What cannot be granted exactly (a parameter
//! inside a segment, a required query, a non-JSON body) is skipped with a
//! warning, never approximated; what would make a wrong profile (an
//! external reference, a method name two operations share) is an error and
//! nothing is written.
//!
//! The same document gives byte-identical output every time, in JSON or
//! in YAML: everything is ordered by the routes, never by a hash.

mod document;
mod emit;
mod hooks;
mod inputs;
mod naming;
mod operations;
mod order;
mod sdk;
#[cfg(test)]
mod tests;
mod verdict;

use std::collections::BTreeMap;
use std::path::Path;

use super::names::{valid_js_identifier, valid_name};
use super::profile::parse_origin;

/// The largest document read, in bytes.
pub const MAX_SPEC_BYTES: usize = 8 << 20;

/// What the operator chose on the command line.
#[derive(Debug, Clone)]
pub struct Options {
    /// The API's origin (`https://host[:port]`); the document's servers
    /// give only the base path.
    pub base_url: String,
    /// The profile's name, and the stem of the files written.
    pub profile: String,
    /// The client's JavaScript global (default `host`).
    pub global: String,
    /// The callers that may name the profile; at least one.
    pub callers: Vec<String>,
    /// operationId (or `METHOD /path` for an operation without one) →
    /// method name.
    pub renames: BTreeMap<String, String>,
    /// The operation the breaker probes, as an operationId.
    pub health_check: Option<String>,
    /// A batch operation → the per-item operations it replaces.
    pub batches: BTreeMap<String, Vec<String>>,
    /// A path item that is a `$ref` is skipped with a warning instead of
    /// being an error.
    pub skip_refs: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            base_url: String::new(),
            profile: String::new(),
            global: "host".to_string(),
            callers: Vec::new(),
            renames: BTreeMap::new(),
            health_check: None,
            batches: BTreeMap::new(),
            skip_refs: false,
        }
    }
}

/// How the document is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
}

/// The format a file's name says (`.json`, `.yaml`, `.yml`), else JSON
/// when its first non-blank character is `{`, else YAML.
pub fn sniff(path: &Path, text: &str) -> Format {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("json") => Format::Json,
        Some("yaml" | "yml") => Format::Yaml,
        _ if text
            .trim_start_matches('\u{feff}')
            .trim_start()
            .starts_with('{') =>
        {
            Format::Json
        }
        _ => Format::Yaml,
    }
}

/// What the generator made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// A grants file holding the one profile (pretty JSON, ending in a
    /// newline), its preamble named as `<profile>.sdk.js`.
    pub profile_json: String,
    /// The SDK, to be written as `<profile>.sdk.js` beside the grants file.
    pub sdk_js: String,
    /// The tool description (`describe::describe_sdk` of the profile).
    pub tool_txt: String,
    /// One `warning: ...` line per operation skipped or left reachable.
    pub warnings: Vec<String>,
}

/// The profile, SDK and description `text` gives, or every error found.
pub fn generate(text: &str, format: Format, opts: &Options) -> Result<Generated, Vec<String>> {
    let mut errors = check_options(opts);
    let doc = match document::load(text, format) {
        Ok(doc) => doc,
        Err(why) => {
            errors.extend(why);
            return Err(errors);
        }
    };
    let base = match document::base_path(&doc) {
        Ok(base) => base,
        Err(why) => {
            errors.push(why);
            String::new()
        }
    };
    let mut found = operations::collect(&doc, &base, opts.skip_refs);
    errors.append(&mut found.errors);
    errors.extend(naming::assign(&mut found.ops, &opts.renames, &found.keys));
    let hooks = hooks::resolve(&found, opts);
    let hooks = match hooks {
        Ok(hooks) if errors.is_empty() => hooks,
        Ok(_) => return Err(errors),
        Err(why) => {
            errors.extend(why);
            return Err(errors);
        }
    };
    emit::finish(&doc.info, opts, found, hooks)
}

fn check_options(opts: &Options) -> Vec<String> {
    let mut errors = Vec::new();
    if !valid_name(&opts.profile) {
        errors.push(format!(
            "the profile name {:?} must be 1-128 of letters, digits, '.', '_', '-'",
            crate::text::sanitize(&opts.profile, 200)
        ));
    }
    if let Err(why) = parse_origin(&opts.base_url) {
        errors.push(crate::text::sanitize(&why, 400));
    }
    if opts.callers.is_empty() {
        errors.push("name at least one caller that may use the profile (--caller)".to_string());
    }
    if !valid_js_identifier(&opts.global) || naming::JS_RESERVED.contains(&opts.global.as_str()) {
        errors.push(format!(
            "the global {:?} is not a usable JavaScript name",
            crate::text::sanitize(&opts.global, 200)
        ));
    }
    errors
}
