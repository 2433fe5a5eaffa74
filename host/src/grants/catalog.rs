//! What a profile says about its API beyond what it grants: the catalog of
//! operations an SDK offers (shown to the model, used by advice), the health
//! check the breaker probes, the batch routes advice suggests, and whether
//! advice is given at all.
//!
//! None of it widens a grant. The catalog may list routes `allow` does not
//! (advice can then tell the operator what granting one would save), and the
//! broker decides every call from `allow` alone.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::names::valid_js_identifier;
use super::route::Route;

/// The most operations one profile's catalog lists.
pub const MAX_CATALOG: usize = 10_000;
/// The longest summary, in characters.
pub const MAX_SUMMARY_CHARS: usize = 200;
/// Names an SDK method cannot take: the client's own methods, what every
/// object inherits, and what makes an object a thenable (`await host` would
/// then call it).
pub const RESERVED_METHOD_NAMES: &[&str] = &[
    "call",
    "get",
    "put",
    "post",
    "patch",
    "del",
    "delete",
    "constructor",
    "hasOwnProperty",
    "isPrototypeOf",
    "propertyIsEnumerable",
    "toLocaleString",
    "toString",
    "valueOf",
    "__proto__",
    "__defineGetter__",
    "__defineSetter__",
    "__lookupGetter__",
    "__lookupSetter__",
    "then",
    "catch",
    "finally",
    "toJSON",
];

/// One catalog entry as the file spells it.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CatalogShape {
    pub route: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub summary: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub body: bool,
}

/// One operation of the API, as an SDK method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    pub route: Route,
    pub name: String,
    pub summary: String,
    /// The path parameters, in the order the method takes them.
    pub params: Vec<String>,
    /// Whether the method takes a JSON body after its parameters.
    pub body: bool,
}

/// Whether advice is worked out after a granted run, and who sees it.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AdviceMode {
    #[default]
    Off,
    /// In the audit stream and metrics only.
    Operator,
    /// Also in the caller's answer.
    Caller,
}

/// What the audit stream keeps of advice.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Retention {
    #[default]
    None,
    /// Counts only.
    Aggregate,
    /// Counts and each finding's route templates.
    Detailed,
}

/// A route that fetches many items at once, and the allow entries (by
/// index) of the per-item routes it replaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub route: Route,
    /// Whether `allow` grants the batch route, so the agent can use it.
    pub granted: bool,
    pub items: Vec<usize>,
}

pub fn entries(shapes: Vec<CatalogShape>) -> Result<Vec<CatalogEntry>, String> {
    if shapes.len() > MAX_CATALOG {
        return Err(format!("the catalog lists over {MAX_CATALOG} operations"));
    }
    let mut out: Vec<CatalogEntry> = Vec::with_capacity(shapes.len());
    for s in shapes {
        let route = Route::parse(&s.route).map_err(|e| format!("catalog: {e}"))?;
        if !valid_js_identifier(&s.name) || RESERVED_METHOD_NAMES.contains(&s.name.as_str()) {
            return Err(format!("catalog: {:?} is not a usable method name", s.name));
        }
        if out.iter().any(|e| e.name == s.name) {
            return Err(format!("catalog: the name {:?} is used twice", s.name));
        }
        // Shown to a model: no control, bidirectional or invisible
        // character (what `text::sanitize` would replace) may hide in it.
        if s.summary.chars().count() > MAX_SUMMARY_CHARS
            || crate::text::sanitize(&s.summary, s.summary.len()) != s.summary
        {
            return Err(format!(
                "catalog: {:?}'s summary must be at most {MAX_SUMMARY_CHARS} characters, none of them a control or invisible one",
                s.name
            ));
        }
        let wildcards = route
            .path_template()
            .split('/')
            .filter(|p| *p == "*")
            .count();
        if s.params.len() != wildcards || s.params.iter().any(|p| !valid_js_identifier(p)) {
            return Err(format!(
                "catalog: {:?} must name one parameter, a JavaScript name, per * of its route",
                s.name
            ));
        }
        out.push(CatalogEntry {
            route,
            name: s.name,
            summary: s.summary,
            params: s.params,
            body: s.body,
        });
    }
    Ok(out)
}

/// A health check: one concrete GET, which `allow` grants. The probe goes
/// out with the run's credential, so it is held to the grant as any call
/// is: the broker sends nothing the operator did not allow.
pub fn health_check(entry: &str, allow: &[Route]) -> Result<Route, String> {
    let route = Route::parse(entry).map_err(|e| format!("health_check: {e}"))?;
    if route.method != "GET" || route.path_template().split('/').any(|s| s == "*") {
        return Err(format!(
            "health_check {entry:?} must be a GET of one concrete path"
        ));
    }
    if super::route::find(allow, "GET", route.path_template()).is_err() {
        return Err(format!(
            "health_check {entry:?} must be a route allow grants"
        ));
    }
    Ok(route)
}

pub fn batches(
    shape: &BTreeMap<String, Vec<String>>,
    allow: &[Route],
    catalog: &[CatalogEntry],
) -> Result<Vec<Batch>, String> {
    let granted = |r: &Route| allow.iter().position(|a| a.template() == r.template());
    let mut out: Vec<Batch> = Vec::new();
    for (key, items) in shape {
        let route = Route::parse(key).map_err(|e| format!("batch_of: {e}"))?;
        let in_catalog = catalog
            .iter()
            .any(|e| e.route.template() == route.template());
        let is_granted = granted(&route).is_some();
        if route.method != "GET" || !(is_granted || in_catalog) {
            return Err(format!(
                "batch_of: {key:?} must be a GET that allow or the catalog lists"
            ));
        }
        if items.is_empty() {
            return Err(format!("batch_of: {key:?} replaces no route"));
        }
        let mut indices = Vec::with_capacity(items.len());
        for item in items {
            let r = Route::parse(item).map_err(|e| format!("batch_of: {e}"))?;
            let Some(i) = granted(&r).filter(|_| r.method == "GET") else {
                return Err(format!("batch_of: {item:?} must be a GET that allow lists"));
            };
            if out.iter().any(|b| b.items.contains(&i)) || indices.contains(&i) {
                return Err(format!(
                    "batch_of: {item:?} is listed under two batch routes"
                ));
            }
            indices.push(i);
        }
        out.push(Batch {
            route,
            granted: is_granted,
            items: indices,
        });
    }
    Ok(out)
}

/// The retention a profile's advice setting allows: none without advice,
/// aggregate counts unless the operator asks for detail.
pub fn retention(advice: AdviceMode, asked: Option<Retention>) -> Result<Retention, String> {
    match (advice, asked) {
        (AdviceMode::Off, None | Some(Retention::None)) => Ok(Retention::None),
        (AdviceMode::Off, Some(_)) => Err("advice_retention needs advice on".into()),
        (_, None) => Ok(Retention::Aggregate),
        (_, Some(r)) => Ok(r),
    }
}
