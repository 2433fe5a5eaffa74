//! What the operator configures for a plugin provider: where plugins are,
//! the pin, the tier cap, and which capabilities the plugin is granted.

use std::path::PathBuf;
use std::sync::Arc;

use super::config_file::OperatorValues;

use super::capabilities::http::policy::{ExchangeSettings, HttpAllowance, HttpTls, Origin};
use crate::env_vars::{ConfigError, Env, Var, invalid, var};
use crate::tier::Tier;

pub const VARIABLES: &[Var] = &[
    var(
        "PLIMSOLL_PLUGIN_DIR",
        "(target/plugins beside the build's target/release)",
        "where provider plugins (<name>.wasm) are loaded from",
    ),
    var(
        "SANDBOX_PLUGIN_SHA256",
        "(unset)",
        "pins the selected plugin: its SHA-256 must equal this or the daemon does not start",
    ),
    var(
        "SANDBOX_PLUGIN_MAX_TIER",
        "process",
        "strongest tier the selected plugin may report: process, container, kernel or vm",
    ),
    var(
        "SANDBOX_PLUGIN_HTTP_ORIGINS",
        "(unset: no network)",
        "grants the plugin the http capability for these origins (comma-separated https://host[:port]; http only on loopback IPs)",
    ),
    var(
        "SANDBOX_PLUGIN_API_KEY_ENV",
        "(unset)",
        "name of the variable holding the provider's API key, which the host adds to the plugin's requests",
    ),
    var(
        "SANDBOX_PLUGIN_API_KEY_HEADER",
        "authorization",
        "header carrying that key (authorization sends Bearer <key>; any other sends the key as is)",
    ),
    var(
        "SANDBOX_PLUGIN_API_KEY_ORIGINS",
        "(unset: every origin listed)",
        "the origins, among SANDBOX_PLUGIN_HTTP_ORIGINS, that receive the API key (comma-separated); the others never see it",
    ),
    var(
        "SANDBOX_PLUGIN_KEY_EXCHANGE_URL",
        "(unset: the key is sent as is)",
        "https URL where the host trades the API key for an access token (Docker Hub's shape: POST {identifier, secret} -> {access_token}) and sends Authorization: Bearer <token> instead; the key goes only here",
    ),
    var(
        "SANDBOX_PLUGIN_KEY_EXCHANGE_CA",
        "(unset: the system's roots only)",
        "PEM file of CA certificates the exchange URL may also be verified against (the plugin's own extra CAs never apply to it)",
    ),
    var(
        "SANDBOX_PLUGIN_KEY_EXCHANGE_IDENTIFIER",
        "(unset)",
        "the account name sent beside the key in that trade (required with SANDBOX_PLUGIN_KEY_EXCHANGE_URL)",
    ),
    var(
        "SANDBOX_PLUGIN_HTTP_CA",
        "(unset: the system's roots only)",
        "PEM file of CA certificates the plugin's https origins may also be verified against",
    ),
    var(
        "SANDBOX_PLUGIN_HTTP_CLIENT_CERT",
        "(unset)",
        "PEM client certificate chain the host presents on the plugin's wasi:http requests (mutual TLS; with SANDBOX_PLUGIN_HTTP_CLIENT_KEY); the plugin never holds it",
    ),
    var(
        "SANDBOX_PLUGIN_HTTP_CLIENT_KEY",
        "(unset)",
        "PEM private key for SANDBOX_PLUGIN_HTTP_CLIENT_CERT",
    ),
    var(
        "SANDBOX_PLUGIN_CONFIG_FILE",
        "(unset: every key at its default)",
        "JSON object of strings: the values of the keys the selected plugin declares (`plimsoll plugin describe` lists them); an unknown, missing or refused key stops the start",
    ),
    var(
        "SANDBOX_PLUGIN_CONTAINER_ENGINE",
        "0",
        "1 grants the plugin the container-engine capability (policed by the host)",
    ),
];

/// What the operator configured for a plugin provider.
#[derive(Debug, Clone, Default)]
pub struct PluginSettings {
    pub dir: Option<PathBuf>,
    pub sha256: Option<String>,
    pub max_tier: Option<Tier>,
    pub http: Option<HttpAllowance>,
    /// Whether the operator granted the plugin the container engine.
    pub container_engine: bool,
    /// The values of the plugin's configuration keys, when a file is named.
    pub config: Option<Arc<OperatorValues>>,
}

impl PluginSettings {
    /// Whether any plugin setting is made (they need a plugin provider).
    pub fn any_set(&self) -> bool {
        self.sha256.is_some()
            || self.max_tier.is_some()
            || self.http.is_some()
            || self.container_engine
            || self.config.is_some()
    }

    /// The variable the operator named to hold the API key: read, so not
    /// unknown, whatever its name.
    pub fn key_variable<'a>(env: &Env<'a>) -> Option<&'a str> {
        env.get("SANDBOX_PLUGIN_API_KEY_ENV")
    }

    pub fn from_env(env: &Env) -> Result<PluginSettings, ConfigError> {
        let sha256 = match env.get("SANDBOX_PLUGIN_SHA256") {
            None => None,
            Some(s) if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Some(s.to_ascii_lowercase())
            }
            Some(_) => return Err(invalid("SANDBOX_PLUGIN_SHA256", "must be 64 hex digits")),
        };
        let max_tier = match env.get("SANDBOX_PLUGIN_MAX_TIER") {
            None => None,
            Some(s) => match Tier::parse_floor(s) {
                Ok(Some(t)) => Some(t),
                _ => {
                    return Err(invalid(
                        "SANDBOX_PLUGIN_MAX_TIER",
                        "must be process, container, kernel or vm",
                    ));
                }
            },
        };
        let http = match env.get("SANDBOX_PLUGIN_HTTP_ORIGINS") {
            None => None,
            Some(list) => {
                let origins = origin_list(list, "SANDBOX_PLUGIN_HTTP_ORIGINS")?;
                let exchange = exchange(env)?;
                // The plugin never reaches the exchange: with the traded
                // token on its requests there, it could mint credentials of
                // its own.
                if let Some(e) = &exchange
                    && origins.iter().any(|o| o.matches_url(&e.url))
                {
                    return Err(invalid(
                        "SANDBOX_PLUGIN_KEY_EXCHANGE_URL",
                        "its origin is one of SANDBOX_PLUGIN_HTTP_ORIGINS; the plugin must not reach the exchange",
                    ));
                }
                // A traded key is never sent as is.
                let api_key = match exchange {
                    Some(_) => None,
                    None => api_key(env)?,
                };
                if (api_key.is_some() || exchange.is_some())
                    && origins.iter().any(|o| !o.is_https())
                {
                    return Err(invalid(
                        "SANDBOX_PLUGIN_API_KEY_ENV",
                        "an API key is only ever sent over https; remove the plain-http origins",
                    ));
                }
                let key_origins =
                    key_origins(env, &origins, api_key.is_some() || exchange.is_some())?;
                Some(HttpAllowance {
                    origins,
                    api_key,
                    key_origins,
                    tls: http_tls(env)?,
                    exchange,
                })
            }
        };
        for tls_var in [
            "SANDBOX_PLUGIN_KEY_EXCHANGE_URL",
            "SANDBOX_PLUGIN_KEY_EXCHANGE_IDENTIFIER",
            "SANDBOX_PLUGIN_KEY_EXCHANGE_CA",
            "SANDBOX_PLUGIN_HTTP_CA",
            "SANDBOX_PLUGIN_HTTP_CLIENT_CERT",
            "SANDBOX_PLUGIN_HTTP_CLIENT_KEY",
        ] {
            if http.is_none() && env.is_set(tls_var) {
                return Err(invalid(
                    tls_var,
                    "applies to the plugin's requests: set SANDBOX_PLUGIN_HTTP_ORIGINS too",
                ));
            }
        }
        if http.is_none() && env.is_set("SANDBOX_PLUGIN_API_KEY_ENV") {
            return Err(invalid(
                "SANDBOX_PLUGIN_API_KEY_ENV",
                "an API key needs SANDBOX_PLUGIN_HTTP_ORIGINS to be sent anywhere",
            ));
        }
        let container_engine = env.flag("SANDBOX_PLUGIN_CONTAINER_ENGINE")?;
        let config = match env.get("SANDBOX_PLUGIN_CONFIG_FILE") {
            None => None,
            Some(path) => Some(Arc::new(
                OperatorValues::read(std::path::Path::new(path))
                    .map_err(|why| invalid("SANDBOX_PLUGIN_CONFIG_FILE", &why))?,
            )),
        };
        Ok(PluginSettings {
            dir: env.get("PLIMSOLL_PLUGIN_DIR").map(PathBuf::from),
            sha256,
            max_tier,
            http,
            container_engine,
            config,
        })
    }
}

/// Which of the allowed origins get the key: each must be one of them.
fn key_origins(env: &Env, origins: &[Origin], has_key: bool) -> Result<Vec<Origin>, ConfigError> {
    let Some(list) = env.get("SANDBOX_PLUGIN_API_KEY_ORIGINS") else {
        return Ok(vec![]);
    };
    let bad = |why: &str| invalid("SANDBOX_PLUGIN_API_KEY_ORIGINS", why);
    if !has_key {
        return Err(bad(
            "names where an API key goes: set SANDBOX_PLUGIN_API_KEY_ENV too",
        ));
    }
    let chosen = origin_list(list, "SANDBOX_PLUGIN_API_KEY_ORIGINS")?;
    if chosen.is_empty() {
        return Err(bad("is empty: unset it to send the key to every origin"));
    }
    if let Some(o) = chosen.iter().find(|o| !origins.contains(o)) {
        return Err(bad(&format!(
            "{} is not one of SANDBOX_PLUGIN_HTTP_ORIGINS",
            o.display()
        )));
    }
    Ok(chosen)
}

/// A comma-separated list of origins, as the operator wrote it in `var`.
fn origin_list(list: &str, var: &'static str) -> Result<Vec<Origin>, ConfigError> {
    list.split(',')
        .map(str::trim)
        .filter(|o| !o.is_empty())
        .map(Origin::parse)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|why| invalid(var, why))
}

/// The key exchange, if the operator asked for one: an https URL, the
/// account name, and the key from the variable named for it.
fn exchange(env: &Env) -> Result<Option<ExchangeSettings>, ConfigError> {
    let Some(url) = env.get("SANDBOX_PLUGIN_KEY_EXCHANGE_URL") else {
        for var in [
            "SANDBOX_PLUGIN_KEY_EXCHANGE_IDENTIFIER",
            "SANDBOX_PLUGIN_KEY_EXCHANGE_CA",
        ] {
            if env.is_set(var) {
                return Err(invalid(
                    var,
                    "belongs to a key exchange: set SANDBOX_PLUGIN_KEY_EXCHANGE_URL too",
                ));
            }
        }
        return Ok(None);
    };
    let bad = |why: &str| invalid("SANDBOX_PLUGIN_KEY_EXCHANGE_URL", why);
    let parsed = reqwest::Url::parse(url).map_err(|_| bad("is not a URL"))?;
    if parsed.scheme() != "https"
        || !parsed.username().is_empty()
        || parsed.password().is_some()
        || parsed.host_str().is_none()
    {
        return Err(bad(
            "must be an https URL without credentials (the key is sent to it)",
        ));
    }
    let identifier = env
        .get("SANDBOX_PLUGIN_KEY_EXCHANGE_IDENTIFIER")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            invalid(
                "SANDBOX_PLUGIN_KEY_EXCHANGE_IDENTIFIER",
                "is required with SANDBOX_PLUGIN_KEY_EXCHANGE_URL (the account name)",
            )
        })?;
    if let Some(header) = env.get("SANDBOX_PLUGIN_API_KEY_HEADER")
        && !header.eq_ignore_ascii_case("authorization")
    {
        return Err(invalid(
            "SANDBOX_PLUGIN_API_KEY_HEADER",
            "a traded key is always sent as Authorization: Bearer; unset it",
        ));
    }
    let Some(name_var) = env.get("SANDBOX_PLUGIN_API_KEY_ENV") else {
        return Err(bad(
            "trades the API key: set SANDBOX_PLUGIN_API_KEY_ENV too",
        ));
    };
    let secret = env
        .named(name_var)
        .map(|s| s.trim())
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| {
            invalid(
                "SANDBOX_PLUGIN_API_KEY_ENV",
                "names a variable that is unset, empty or not visible ASCII",
            )
        })?;
    Ok(Some(ExchangeSettings {
        url: parsed,
        identifier: identifier.to_string(),
        secret: secret.to_string(),
        ca: env.get("SANDBOX_PLUGIN_KEY_EXCHANGE_CA").map(PathBuf::from),
    }))
}

/// The TLS files the operator named; read when the capability is built.
fn http_tls(env: &Env) -> Result<HttpTls, ConfigError> {
    let client = match (
        env.get("SANDBOX_PLUGIN_HTTP_CLIENT_CERT"),
        env.get("SANDBOX_PLUGIN_HTTP_CLIENT_KEY"),
    ) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some((PathBuf::from(cert), PathBuf::from(key))),
        _ => {
            return Err(invalid(
                "SANDBOX_PLUGIN_HTTP_CLIENT_CERT",
                "SANDBOX_PLUGIN_HTTP_CLIENT_CERT and SANDBOX_PLUGIN_HTTP_CLIENT_KEY go together: set both or neither",
            ));
        }
    };
    Ok(HttpTls {
        ca: env.get("SANDBOX_PLUGIN_HTTP_CA").map(PathBuf::from),
        client,
    })
}

/// The header the host adds to a plugin's requests, from the variable the
/// operator named. The value is marked sensitive so no debug output of a
/// header map ever prints it.
fn api_key(
    env: &Env,
) -> Result<Option<(axum::http::HeaderName, axum::http::HeaderValue)>, ConfigError> {
    let Some(name_var) = env.get("SANDBOX_PLUGIN_API_KEY_ENV") else {
        return Ok(None);
    };
    let bad = |why: &str| invalid("SANDBOX_PLUGIN_API_KEY_ENV", why);
    let key = env
        .named(name_var)
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad("names a variable that is unset or empty"))?;
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad("names a variable whose value is not visible ASCII"));
    }
    let header = env
        .get("SANDBOX_PLUGIN_API_KEY_HEADER")
        .unwrap_or("authorization")
        .to_ascii_lowercase();
    let name = axum::http::HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
        invalid(
            "SANDBOX_PLUGIN_API_KEY_HEADER",
            "is not a valid header name",
        )
    })?;
    let text = if name == axum::http::header::AUTHORIZATION {
        format!("Bearer {key}")
    } else {
        key.to_string()
    };
    let mut value = axum::http::HeaderValue::from_str(&text)
        .map_err(|_| bad("the key is not a valid header value"))?;
    value.set_sensitive(true);
    Ok(Some((name, value)))
}
