//! One grant profile: its file shape and the checks that turn it into the
//! frozen `Profile` every run of it shares.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use super::catalog::{self, AdviceMode, Batch, CatalogEntry, CatalogShape, Retention};
use super::names::{valid_js_identifier, valid_name};
use super::route::Route;
use super::{DEFAULT_MAX_CALLS, MAX_CALLS_CEILING, mint, preamble};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ProfileShape {
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
    #[serde(default)]
    preamble: Option<String>,
    #[serde(default)]
    preamble_file: Option<String>,
    #[serde(default)]
    catalog: Vec<CatalogShape>,
    #[serde(default)]
    health_check: Option<String>,
    #[serde(default)]
    batch_of: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    advice: AdviceMode,
    #[serde(default)]
    advice_retention: Option<Retention>,
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
    /// JavaScript run after the client is installed and before the snippet
    /// (a generated SDK, say). It holds no credential: every call it makes
    /// goes through the same broker checks as the snippet's own.
    pub preamble: Option<Arc<str>>,
    /// What the operator's API offers, for the tool description and advice.
    /// It grants nothing: only `allow` does.
    pub catalog: Vec<CatalogEntry>,
    /// A GET the breaker sends to learn whether a 503-ing API is back.
    pub health_check: Option<Route>,
    /// Routes that fetch many items at once, by the per-item routes they
    /// replace.
    pub batch_of: Vec<Batch>,
    pub advice: AdviceMode,
    pub retention: Retention,
}

impl Profile {
    /// Whether `caller` may name this profile.
    pub fn permits(&self, caller: &str) -> bool {
        self.allowed_callers.iter().any(|c| c == "*" || c == caller)
    }
}

/// A profile's name: also the stem of the files `plimsoll grants
/// from-openapi` writes, so never a path separator.
/// `dir` is the grants file's directory, the only place a `preamble_file`
/// may be read from.
pub(super) fn validate(
    name: &str,
    p: ProfileShape,
    env: &dyn Fn(&str) -> Option<String>,
    dir: Option<&Path>,
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
    let preamble = preamble::load(p.preamble, p.preamble_file.as_deref(), dir)?;
    let catalog = catalog::entries(p.catalog)?;
    let health_check = p
        .health_check
        .as_deref()
        .map(|h| catalog::health_check(h, &allow))
        .transpose()?;
    let batch_of = catalog::batches(&p.batch_of, &allow, &catalog)?;
    let retention = catalog::retention(p.advice, p.advice_retention)?;
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
        preamble,
        catalog,
        health_check,
        batch_of,
        advice: p.advice,
        retention,
    })
}

/// An origin only: scheme, host, port. https unless the host is a loopback
/// IP (an API on this machine), and no userinfo, path, query or fragment.
pub(super) fn parse_origin(s: &str) -> Result<url::Url, String> {
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
