//! Grant profiles: which operator API a run may call, on which routes, with
//! which credential, within which budgets.
//!
//! Loaded once from `PLIMSOLL_GRANTS_FILE` and frozen: a profile cannot change
//! while the daemon runs, and every run gets the same view of it. The file is
//! strict JSON: an unknown field, a duplicate route or trailing data is a
//! startup error, because a typo in a security setting must not silently
//! mean its default.

pub mod advice;
mod answer;
pub mod broker;
pub mod catalog;
mod clients;
pub mod describe;
pub mod guard;
pub mod mint;
pub mod names;
mod preamble;
mod profile;
pub mod route;
pub mod socket;
pub mod specgen;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use crate::env_vars::{ConfigError, Env, Var, invalid, var};
pub use profile::Profile;
use profile::{ProfileShape, validate};

pub const VARIABLES: &[Var] = &[var(
    "PLIMSOLL_GRANTS_FILE",
    "(unset: no grants)",
    "grant profiles (JSON, see docs/grants.md): the operator APIs runs may call through the broker",
)];

/// Per-run call budget when a profile sets none.
pub const DEFAULT_MAX_CALLS: u32 = 256;
/// The most calls any profile may allow one run.
pub const MAX_CALLS_CEILING: u32 = 100_000;
/// The caller every request is until callers and tokens exist (issue 6):
/// a profile must name it, or `*`, to be usable.
pub const ANONYMOUS: &str = "anonymous";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileShape {
    profiles: BTreeMap<String, ProfileShape>,
}

/// Every profile, frozen after load.
#[derive(Debug, Default)]
pub struct Grants {
    profiles: BTreeMap<String, Arc<Profile>>,
}

impl Grants {
    /// The grants file the operator named, if any, read and frozen.
    pub fn from_env(env: &Env) -> Result<Grants, ConfigError> {
        let Some(path) = env.get("PLIMSOLL_GRANTS_FILE") else {
            return Ok(Grants::default());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| invalid("PLIMSOLL_GRANTS_FILE", format!("reading {path}: {e}")))?;
        let lookup = |name: &str| env.named(name).cloned();
        let dir = Path::new(path)
            .parent()
            .filter(|d| !d.as_os_str().is_empty());
        Grants::parse(&text, &lookup, Some(dir.unwrap_or(Path::new("."))))
            .map_err(|why| invalid("PLIMSOLL_GRANTS_FILE", why))
    }

    /// Parses and validates a grants file. `env` resolves the variables
    /// tokens name (read now: a missing secret is a startup error). `dir` is
    /// the file's directory, where `preamble_file`s are read from; without
    /// one, a profile naming a file is refused.
    pub fn parse(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
        dir: Option<&Path>,
    ) -> Result<Grants, String> {
        let mut de = serde_json::Deserializer::from_str(text);
        let shape = FileShape::deserialize(&mut de).map_err(|e| format!("grants file: {e}"))?;
        de.end()
            .map_err(|_| "grants file: trailing data after the JSON document".to_string())?;
        let mut profiles = BTreeMap::new();
        for (name, p) in shape.profiles {
            let profile =
                validate(&name, p, env, dir).map_err(|e| format!("profile {name:?}: {e}"))?;
            profiles.insert(name, Arc::new(profile));
        }
        Ok(Grants { profiles })
    }

    pub fn is_empty(&self) -> bool {
        self.profiles.is_empty()
    }

    pub fn len(&self) -> usize {
        self.profiles.len()
    }

    /// The profile `name` if `caller` may use it. An unknown profile and a
    /// forbidden one are the same answer, so a caller cannot probe names.
    pub fn for_caller(&self, name: &str, caller: &str) -> Option<Arc<Profile>> {
        self.profiles
            .get(name)
            .filter(|p| p.permits(caller))
            .cloned()
    }

    /// Every profile, by name.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Profile>> {
        self.profiles.values()
    }

    /// Every profile `caller` may use, by name.
    pub fn all_for_caller(&self, caller: &str) -> Vec<Arc<Profile>> {
        self.profiles
            .values()
            .filter(|p| p.permits(caller))
            .cloned()
            .collect()
    }

    /// Profiles that let every caller in, for a start-up warning.
    pub fn open_to_all(&self) -> Vec<&str> {
        self.profiles
            .values()
            .filter(|p| p.allowed_callers.iter().any(|c| c == "*"))
            .map(|p| p.name.as_str())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("canary-static-token".into()),
            "SECRET" => Some("x".repeat(32)),
            "SHORT" => Some("short".into()),
            _ => None,
        }
    }

    fn parse(text: &str) -> Result<Grants, String> {
        Grants::parse(text, &env, None)
    }

    const GOOD: &str = r#"{"profiles": {"inventory": {
        "base_url": "http://127.0.0.1:9000",
        "allow": ["GET /items/*", "POST /items"],
        "allowed_callers": ["anonymous"],
        "token": {"type": "jwt", "secret_env": "SECRET", "audience": "inventory-api"},
        "route_max_calls": {"post /items": 2}
    }}}"#;

    #[test]
    fn a_good_file_loads() {
        let g = parse(GOOD).expect("loads");
        let p = g.for_caller("inventory", ANONYMOUS).expect("permitted");
        assert_eq!(p.global, "host");
        assert_eq!(p.max_calls, DEFAULT_MAX_CALLS);
        assert_eq!(p.route_max_calls.get("POST /items"), Some(&2));
        assert!(g.for_caller("inventory", "someone-else").is_none());
        assert!(g.for_caller("nope", ANONYMOUS).is_none());
    }

    #[test]
    fn every_optional_field_loads() {
        let text = GOOD.replacen(
            "\"allowed_callers\"",
            r#""preamble": "globalThis.host.x = 1;",
               "catalog": [{"route": "GET /items/*", "name": "getItem", "summary": "One item", "params": ["id"]},
                           {"route": "GET /items", "name": "listItems"}],
               "health_check": "GET /items/1",
               "batch_of": {"GET /items": ["GET /items/*"]},
               "advice": "caller",
               "allowed_callers""#,
            1,
        );
        let g = parse(&text).expect("loads");
        let p = g.for_caller("inventory", ANONYMOUS).expect("permitted");
        assert_eq!(p.preamble.as_deref(), Some("globalThis.host.x = 1;"));
        assert_eq!(p.catalog.len(), 2);
        assert_eq!(
            p.health_check.as_ref().map(|r| r.template()),
            Some("GET /items/1")
        );
        assert_eq!(p.batch_of.len(), 1);
        assert!(!p.batch_of[0].granted, "GET /items is only in the catalog");
        assert_eq!(p.batch_of[0].items, vec![0]);
        assert_eq!(p.advice, catalog::AdviceMode::Caller);
        assert_eq!(p.retention, catalog::Retention::Aggregate);
    }

    #[test]
    fn mistakes_are_startup_errors() {
        let with = |from: &str, to: &str| GOOD.replacen(from, to, 1);
        let extra = |field: &str| {
            with(
                "\"allowed_callers\"",
                &format!("{field}, \"allowed_callers\""),
            )
        };
        let cases = [
            ("unknown field", with("\"allow\"", "\"alow\"")),
            ("trailing data", format!("{GOOD} {{}}")),
            (
                "plain http off loopback",
                with("http://127.0.0.1:9000", "http://api.example.com"),
            ),
            (
                "a path in base_url",
                with("http://127.0.0.1:9000", "http://127.0.0.1:9000/v1"),
            ),
            (
                "userinfo",
                with("http://127.0.0.1:9000", "http://u:p@127.0.0.1:9000"),
            ),
            (
                "query",
                with("http://127.0.0.1:9000", "http://127.0.0.1:9000?x=1"),
            ),
            ("bad route", with("GET /items/*", "GET /items/../x")),
            ("HEAD", with("GET /items/*", "HEAD /items/*")),
            (
                "duplicate route",
                with("\"POST /items\"", "\"POST /items\", \"post /items\""),
            ),
            ("no callers", with("[\"anonymous\"]", "[]")),
            ("missing secret", with("\"SECRET\"", "\"UNSET\"")),
            ("short secret", with("\"SECRET\"", "\"SHORT\"")),
            (
                "cap on ungranted route",
                with("post /items", "DELETE /items"),
            ),
            (
                "bad global",
                with(
                    "\"allowed_callers\"",
                    "\"global\": \"con sole\", \"allowed_callers\"",
                ),
            ),
            (
                "zero calls",
                with(
                    "\"allowed_callers\"",
                    "\"max_calls\": 0, \"allowed_callers\"",
                ),
            ),
            (
                "too many calls",
                with(
                    "\"allowed_callers\"",
                    "\"max_calls\": 100001, \"allowed_callers\"",
                ),
            ),
            (
                "scope *",
                with(
                    "\"allowed_callers\"",
                    "\"scopes\": [\"*\"], \"allowed_callers\"",
                ),
            ),
            (
                "bad name",
                GOOD.replacen("\"inventory\"", "\"in ventory\"", 1),
            ),
            (
                "a preamble file with no directory",
                extra(r#""preamble_file": "sdk.js""#),
            ),
            (
                "both preambles",
                extra(r#""preamble": "1", "preamble_file": "sdk.js""#),
            ),
            (
                "a POST health check",
                extra(r#""health_check": "POST /health""#),
            ),
            (
                "a wildcard health check",
                extra(r#""health_check": "GET /items/*""#),
            ),
            (
                "a non-canonical health check",
                extra(r#""health_check": "GET /a//b""#),
            ),
            (
                "a health check allow does not grant",
                extra(r#""health_check": "GET /health""#),
            ),
            (
                "an invisible character in a summary",
                extra(
                    r#""catalog": [{"route": "GET /a", "name": "a", "summary": "fine\u202etxt.exe"}]"#,
                ),
            ),
            (
                "a batch of a POST",
                extra(r#""batch_of": {"GET /items": ["POST /items"]}"#),
            ),
            (
                "a batch route nobody lists",
                extra(r#""batch_of": {"GET /all": ["GET /items/*"]}"#),
            ),
            (
                "a batch of an ungranted route",
                extra(
                    r#""catalog": [{"route": "GET /items", "name": "list"}], "batch_of": {"GET /items": ["GET /other/*"]}"#,
                ),
            ),
            (
                "retention without advice",
                extra(r#""advice_retention": "detailed""#),
            ),
            ("an unknown advice mode", extra(r#""advice": "always""#)),
            (
                "a catalog name used twice",
                extra(
                    r#""catalog": [{"route": "GET /a", "name": "a"}, {"route": "GET /b", "name": "a"}]"#,
                ),
            ),
            (
                "a catalog name the client owns",
                extra(r#""catalog": [{"route": "GET /a", "name": "post"}]"#),
            ),
            (
                "a thenable catalog name",
                extra(r#""catalog": [{"route": "GET /a", "name": "then"}]"#),
            ),
            (
                "a parameter per wildcard",
                extra(r#""catalog": [{"route": "GET /a/*", "name": "a"}]"#),
            ),
            (
                "a control character in a summary",
                extra(r#""catalog": [{"route": "GET /a", "name": "a", "summary": "x\u001b[2J"}]"#),
            ),
        ];
        for (name, text) in cases {
            assert!(parse(&text).is_err(), "{name} was accepted");
        }
    }
}
