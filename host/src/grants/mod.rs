//! Grant profiles: which operator API a run may call, on which routes, with
//! which credential, within which budgets.
//!
//! Loaded once from `PLIMSOLL_GRANTS_FILE` and frozen: a profile cannot change
//! while the daemon runs, and every run gets the same view of it. The file is
//! strict JSON: an unknown field, a duplicate route or trailing data is a
//! startup error, because a typo in a security setting must not silently
//! mean its default.

pub mod broker;
pub mod mint;
pub mod route;
pub mod socket;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use crate::env_vars::{ConfigError, Env, Var, invalid, var};
use route::Route;

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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileShape {
    base_url: String,
    #[serde(default)]
    allow: Vec<String>,
    allowed_callers: Vec<String>,
    #[serde(default)]
    scopes: Vec<String>,
    #[serde(default)]
    token: Option<TokenShape>,
    #[serde(default)]
    global: Option<String>,
    #[serde(default)]
    max_calls: Option<u32>,
    #[serde(default)]
    route_max_calls: BTreeMap<String, u32>,
    #[serde(default)]
    allow_in_sessions: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, tag = "type", rename_all = "lowercase")]
enum TokenShape {
    Static {
        env: String,
    },
    Jwt {
        secret_env: String,
        #[serde(default)]
        ttl_sec: Option<u32>,
        #[serde(default)]
        issuer: Option<String>,
        audience: String,
        #[serde(default)]
        key_id: Option<String>,
    },
}

/// One frozen profile.
#[derive(Debug)]
pub struct Profile {
    pub name: String,
    /// `scheme://host:port`, no path.
    pub base_url: url::Url,
    pub allow: Vec<Route>,
    pub allowed_callers: Vec<String>,
    pub scopes: Vec<String>,
    pub token: mint::Token,
    /// The JavaScript global the client is installed as.
    pub global: String,
    pub max_calls: u32,
    /// Per-route caps, keyed by the allow entry's template.
    pub route_max_calls: BTreeMap<String, u32>,
    pub allow_in_sessions: bool,
}

impl Profile {
    /// Whether `caller` may name this profile.
    pub fn permits(&self, caller: &str) -> bool {
        self.allowed_callers.iter().any(|c| c == "*" || c == caller)
    }
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
        Grants::parse(&text, &lookup).map_err(|why| invalid("PLIMSOLL_GRANTS_FILE", why))
    }

    /// Parses and validates a grants file. `env` resolves the variables
    /// tokens name (read now: a missing secret is a startup error).
    pub fn parse(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Grants, String> {
        let mut de = serde_json::Deserializer::from_str(text);
        let shape = FileShape::deserialize(&mut de).map_err(|e| format!("grants file: {e}"))?;
        de.end()
            .map_err(|_| "grants file: trailing data after the JSON document".to_string())?;
        let mut profiles = BTreeMap::new();
        for (name, p) in shape.profiles {
            let profile = validate(&name, p, env).map_err(|e| format!("profile {name:?}: {e}"))?;
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

    /// Profiles that let every caller in, for a start-up warning.
    pub fn open_to_all(&self) -> Vec<&str> {
        self.profiles
            .values()
            .filter(|p| p.allowed_callers.iter().any(|c| c == "*"))
            .map(|p| p.name.as_str())
            .collect()
    }
}

fn valid_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

fn valid_js_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_' || b == b'$')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$')
        && s.len() <= 64
        // Names the runtime itself needs.
        && !matches!(
            s,
            "globalThis" | "console" | "Object" | "Function" | "Promise" | "JSON" | "Math" | "Error"
                | "process" | "require" | "module" | "exports" | "Array" | "String" | "Symbol"
        )
}

fn validate(
    name: &str,
    p: ProfileShape,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Profile, String> {
    if !valid_name(name) {
        return Err("the name must be 1-128 of letters, digits, '.', '_', '-'".into());
    }
    let base_url = parse_origin(&p.base_url)?;
    let mut allow = Vec::with_capacity(p.allow.len());
    for entry in &p.allow {
        let route = Route::parse(entry)?;
        if allow
            .iter()
            .any(|r: &Route| r.template() == route.template())
        {
            return Err(format!("the route {entry:?} is listed twice"));
        }
        allow.push(route);
    }
    if p.allowed_callers.is_empty() {
        return Err("allowed_callers is required (use [\"*\"] for every caller)".into());
    }
    for c in &p.allowed_callers {
        if c.is_empty() || c.len() > 128 || c.chars().any(char::is_control) {
            return Err("an allowed caller is empty, too long or has control characters".into());
        }
    }
    for s in &p.scopes {
        if s.is_empty()
            || s.len() > 128
            || s.chars().any(char::is_whitespace)
            || s == "*"
            || s == "code:run"
        {
            return Err(format!("the scope {s:?} is not allowed"));
        }
    }
    let global = p.global.unwrap_or_else(|| "host".to_string());
    if !valid_js_identifier(&global) {
        return Err(format!("global {global:?} is not a usable JavaScript name"));
    }
    let max_calls = p.max_calls.unwrap_or(DEFAULT_MAX_CALLS);
    if max_calls == 0 || max_calls > MAX_CALLS_CEILING {
        return Err(format!("max_calls must be 1 to {MAX_CALLS_CEILING}"));
    }
    let mut route_max_calls = BTreeMap::new();
    for (entry, cap) in p.route_max_calls {
        let route = Route::parse(&entry)?;
        let Some(granted) = allow.iter().find(|r| r.template() == route.template()) else {
            return Err(format!(
                "route_max_calls names {entry:?}, which allow does not"
            ));
        };
        route_max_calls.insert(granted.template().to_string(), cap);
    }
    let token = match p.token {
        None => mint::Token::None,
        Some(TokenShape::Static { env: var }) => {
            let value = env(&var).ok_or_else(|| format!("the token variable {var} is unset"))?;
            mint::Token::static_bearer(&value)?
        }
        Some(TokenShape::Jwt {
            secret_env,
            ttl_sec,
            issuer,
            audience,
            key_id,
        }) => {
            let secret = env(&secret_env)
                .ok_or_else(|| format!("the secret variable {secret_env} is unset"))?;
            mint::Token::jwt(mint::JwtSettings {
                secret: secret.into_bytes(),
                ttl_sec: ttl_sec.unwrap_or(60),
                issuer,
                audience,
                key_id,
            })?
        }
    };
    Ok(Profile {
        name: name.to_string(),
        base_url,
        allow,
        allowed_callers: p.allowed_callers,
        scopes: p.scopes,
        token,
        global,
        max_calls,
        route_max_calls,
        allow_in_sessions: p.allow_in_sessions,
    })
}

/// An origin only: scheme, host, port. https unless the host is a loopback
/// IP (an API on this machine), and no userinfo, path, query or fragment.
fn parse_origin(s: &str) -> Result<url::Url, String> {
    let u = url::Url::parse(s).map_err(|e| format!("base_url {s:?}: {e}"))?;
    let loopback = match u.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        _ => false,
    };
    let scheme_ok = u.scheme() == "https" || (u.scheme() == "http" && loopback);
    if !scheme_ok {
        return Err(format!(
            "base_url {s:?} must be https (http only for a loopback IP)"
        ));
    }
    if !u.username().is_empty()
        || u.password().is_some()
        || u.query().is_some()
        || u.fragment().is_some()
        || u.path() != "/"
    {
        return Err(format!(
            "base_url {s:?} must be an origin only (no user, path, query or fragment)"
        ));
    }
    Ok(u)
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
        Grants::parse(text, &env)
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
    fn mistakes_are_startup_errors() {
        let with = |from: &str, to: &str| GOOD.replacen(from, to, 1);
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
        ];
        for (name, text) in cases {
            assert!(parse(&text).is_err(), "{name} was accepted");
        }
    }
}
