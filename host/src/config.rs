//! Configuration: one closed list of environment variables, parsed in one
//! place into a typed struct.
//!
//! Nothing else in the daemon reads the environment. A variable with our
//! prefixes that is not on the list is almost always a typo of one that is
//! (and a typo in a security setting silently means its default), so it is
//! reported at start. `plimsolld -h` prints `VARIABLES`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::plugins::engine::{MIN_WORK_MB, SHM_MB, Settings as EngineSettings, TMP_MB};
use crate::plugins::http::{HttpGrant, Origin};
use crate::tier::Tier;

/// Every variable the daemon reads: name, default, meaning.
pub const VARIABLES: &[(&str, &str, &str)] = &[
    (
        "PLIMSOLL_ADDR",
        "127.0.0.1:8746",
        "API listener (Connect, /healthz, /readyz); host:port",
    ),
    ("PLIMSOLL_LOG_FORMAT", "json", "log format: json or text"),
    (
        "PLIMSOLL_CLIENTS_FILE",
        "(unset)",
        "callers: JSON with each caller's id, token SHA-256, scopes and optional paid_seconds_per_day (manage with `plimsoll callers`)",
    ),
    (
        "PLIMSOLL_TOKEN",
        "(unset)",
        "one shared bearer token (at least 32 characters) when there is no clients file; the caller is `static`",
    ),
    (
        "PLIMSOLL_INSECURE",
        "(unset)",
        "1 lets a provider that runs code start with no authentication (open development mode)",
    ),
    (
        "PLIMSOLL_TLS_CERT",
        "(unset)",
        "PEM certificate chain for TLS on the API and metrics listeners (with PLIMSOLL_TLS_KEY)",
    ),
    (
        "PLIMSOLL_TLS_KEY",
        "(unset)",
        "PEM private key for PLIMSOLL_TLS_CERT",
    ),
    (
        "PLIMSOLL_METRICS_ADDR",
        "127.0.0.1:9464",
        "the /metrics listener (host:port), or off",
    ),
    (
        "PLIMSOLL_HARDENED",
        "(unset)",
        "1 refuses to start unless every production safeguard holds (docs/hardened-mode.md)",
    ),
    (
        "SANDBOX_PER_KEY_CONCURRENT",
        "0 (no cap)",
        "runs one caller may have in flight at once",
    ),
    (
        "SANDBOX_RATE_PER_MIN",
        "0 (no limit)",
        "runs per minute per caller (token bucket)",
    ),
    (
        "SANDBOX_RATE_BURST",
        "(the per-minute rate)",
        "the bucket's size: runs a caller may send at once",
    ),
    (
        "SANDBOX_PLUGIN_METERED",
        "0",
        "1 states that the plugin's service bills by the second: daily paid-second allowances apply",
    ),
    (
        "SANDBOX_PAID_SECONDS_PER_DAY",
        "0 (no cap)",
        "paid seconds the whole daemon may use per UTC day on a metered provider",
    ),
    (
        "PLIMSOLL_GRANTS_FILE",
        "(unset: no grants)",
        "grant profiles (JSON, see docs/grants.md): the operator APIs runs may call through the broker",
    ),
    (
        "SANDBOX_PROVIDER",
        "(unset: disabled)",
        "provider: disabled, wasm, docker, or the name of a plugin in PLIMSOLL_PLUGIN_DIR; unset runs nothing, ever",
    ),
    (
        "PLIMSOLL_PLUGIN_DIR",
        "(target/plugins beside the build's target/release)",
        "where provider plugins (<name>.wasm) are loaded from",
    ),
    (
        "SANDBOX_PLUGIN_SHA256",
        "(unset)",
        "pins the selected plugin: its SHA-256 must equal this or the daemon does not start",
    ),
    (
        "SANDBOX_PLUGIN_MAX_TIER",
        "process",
        "strongest tier the selected plugin may report: process, container, kernel or vm",
    ),
    (
        "SANDBOX_PLUGIN_HTTP_ORIGINS",
        "(unset: no network)",
        "grants the plugin the http capability for these origins (comma-separated https://host[:port]; http only on loopback IPs)",
    ),
    (
        "SANDBOX_PLUGIN_API_KEY_ENV",
        "(unset)",
        "name of the variable holding the provider's API key, which the host adds to the plugin's requests",
    ),
    (
        "SANDBOX_PLUGIN_API_KEY_HEADER",
        "authorization",
        "header carrying that key (authorization sends Bearer <key>; any other sends the key as is)",
    ),
    (
        "SANDBOX_PLUGIN_CONTAINER_ENGINE",
        "0",
        "1 grants the plugin the container-engine capability (policed by the host)",
    ),
    (
        "SANDBOX_DOCKER_RUNTIME",
        "(unset: runc)",
        "the only OCI runtime containers may use: unset (runc, container tier) or runsc (gVisor, kernel tier once verified)",
    ),
    (
        "SANDBOX_DOCKER_IMAGE",
        "plimsoll/sandbox:bookworm",
        "guest image (tag or ID), resolved to its ID at start; runs use that ID, and a tag re-pointed later makes runs refused",
    ),
    (
        "SANDBOX_DOCKER_SECCOMP",
        "(unset: the shipped profile)",
        "seccomp profile applied under runc: a JSON file's path, or engine-default for the engine's own",
    ),
    (
        "SANDBOX_DOCKER_POOL",
        "2",
        "warm containers kept started for single JavaScript runs, 0-32; each serves one run",
    ),
    (
        "SANDBOX_DOCKER_SOCKET",
        "/var/run/docker.sock",
        "the docker engine's Unix socket (DOCKER_HOST is never read)",
    ),
    (
        "SANDBOX_GUEST_UID",
        "61000",
        "uid and gid of every container's processes; refused if uid or uid+1 is in this host's /etc/passwd or /etc/group",
    ),
    (
        "SANDBOX_MEMORY_MB",
        "256",
        "per-run memory cap in MiB (wasm: linear memory, hard trap on growth past it)",
    ),
    (
        "SANDBOX_MAX_CONCURRENT",
        "8",
        "runs in flight at once, 1-1024; more are refused as capacity",
    ),
    (
        "SANDBOX_CPUS",
        "1",
        "per-container CPUs (docker); the wasm provider refuses it",
    ),
    (
        "SANDBOX_PIDS",
        "256",
        "per-container process limit (docker; under runsc it counts gVisor's own ~40 tasks); the wasm provider refuses it",
    ),
    (
        "SANDBOX_DISK_MB",
        "160",
        "per-container writable budget in MiB (docker): /tmp 16 + /dev/shm 16 + the rest for /work; the wasm provider refuses it",
    ),
];

/// Which provider runs the code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderKind {
    /// The default: refuses every run.
    Disabled,
    /// QuickJS as a Wasm component in this process (process tier).
    Wasm,
    /// The docker adapter shipped inside the daemon, driving the local
    /// engine (container tier under runc, kernel under verified runsc).
    Docker,
    /// A provider plugin of this name, from the plugin directory.
    Plugin(String),
}

/// What the operator configured for a plugin provider.
#[derive(Debug, Clone, Default)]
pub struct PluginSettings {
    pub dir: Option<PathBuf>,
    pub sha256: Option<String>,
    pub max_tier: Option<Tier>,
    pub http: Option<HttpGrant>,
    /// Whether the operator granted the plugin the container engine.
    pub container_engine: bool,
}

impl ProviderKind {
    pub const KNOWN: &'static [&'static str] = &["disabled", "wasm", "docker"];
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub addr: SocketAddr,
    pub log_format: LogFormat,
    pub provider: ProviderKind,
    pub memory_mb: u32,
    pub max_concurrent: u32,
    pub plugin: PluginSettings,
    /// The container engine's settings, when the provider uses one.
    pub engine: Option<EngineSettings>,
    /// Grant profiles, frozen.
    pub grants: std::sync::Arc<crate::grants::Grants>,
    pub auth: Auth,
    pub insecure: bool,
    /// PEM certificate and key paths.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// None: /metrics is off.
    pub metrics_addr: Option<SocketAddr>,
    pub hardened: bool,
    pub quotas: crate::quota::QuotaSettings,
    /// The variables that were set (non-empty), for hardened mode's
    /// "explicit" checks.
    pub set: std::collections::BTreeSet<String>,
    /// Variables with our prefixes that are not on the list.
    pub unknown: Vec<String>,
}

/// How callers authenticate. The shared token is kept out of Debug output.
#[derive(Clone)]
pub enum Auth {
    Clients(PathBuf, crate::callers::ClientsFile),
    Shared(String),
    Open,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Clients(p, file) => write!(
                f,
                "Clients({}, {} callers)",
                p.display(),
                file.clients.len()
            ),
            Auth::Shared(_) => f.write_str("Shared(..)"),
            Auth::Open => f.write_str("Open"),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{name}: {why}")]
    Invalid { name: &'static str, why: String },
    #[error("SANDBOX_PROVIDER={0:?} is neither a built-in provider ({known}) nor a valid plugin name ([a-z0-9-]{{1,32}})", known = ProviderKind::KNOWN.join(", "))]
    UnknownProvider(String),
    #[error("{0} is not valid UTF-8 text")]
    NotText(String),
    #[error(
        "{0} is set, but the {1} provider cannot enforce it; unset it rather than believe it holds"
    )]
    Unenforceable(&'static str, &'static str),
}

const DEFAULT_MEMORY_MB: u32 = 256;
/// The wasm32 address space is 4 GiB; anything near it is a mistake.
const MAX_MEMORY_MB: u32 = 4095;

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        let mut vars = BTreeMap::new();
        for (k, v) in std::env::vars_os() {
            let Ok(k) = k.into_string() else { continue };
            match v.into_string() {
                Ok(v) => {
                    vars.insert(k, v);
                }
                // Reading a non-UTF-8 value as "unset" could silently drop a
                // limit; one of ours that is not text is an error instead.
                Err(_) if k.starts_with("PLIMSOLL_") || k.starts_with("SANDBOX_") => {
                    return Err(ConfigError::NotText(k));
                }
                Err(_) => {}
            }
        }
        Config::from_map(&vars)
    }

    /// Parses a given environment; separate from `from_env` so it is testable.
    pub fn from_map(vars: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
        let get = |name: &str| vars.get(name).map(|s| s.trim()).filter(|s| !s.is_empty());

        let addr = match get("PLIMSOLL_ADDR") {
            None => SocketAddr::from(([127, 0, 0, 1], 8746)),
            Some(s) => s.parse().map_err(|_| ConfigError::Invalid {
                name: "PLIMSOLL_ADDR",
                why: "must be an IP address and port, e.g. 127.0.0.1:8746".into(),
            })?,
        };
        let log_format = match get("PLIMSOLL_LOG_FORMAT") {
            None | Some("json") => LogFormat::Json,
            Some("text") => LogFormat::Text,
            Some(_) => {
                return Err(ConfigError::Invalid {
                    name: "PLIMSOLL_LOG_FORMAT",
                    why: "must be json or text".into(),
                });
            }
        };
        let provider = match get("SANDBOX_PROVIDER")
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("disabled") => ProviderKind::Disabled,
            Some("wasm") => ProviderKind::Wasm,
            Some("docker") => ProviderKind::Docker,
            Some(name) if valid_plugin_name(name) => ProviderKind::Plugin(name.to_string()),
            Some(other) => return Err(ConfigError::UnknownProvider(other.to_string())),
        };
        let memory_mb = parse_u32(
            get("SANDBOX_MEMORY_MB"),
            "SANDBOX_MEMORY_MB",
            1,
            MAX_MEMORY_MB,
        )?
        .unwrap_or(DEFAULT_MEMORY_MB);
        let max_concurrent = parse_u32(
            get("SANDBOX_MAX_CONCURRENT"),
            "SANDBOX_MAX_CONCURRENT",
            1,
            1024,
        )?
        .unwrap_or(8);

        let plugin = plugin_settings(&get, vars)?;
        let plugin_vars_set = plugin.sha256.is_some()
            || plugin.max_tier.is_some()
            || plugin.http.is_some()
            || plugin.container_engine;
        if plugin_vars_set && !matches!(provider, ProviderKind::Plugin(_)) {
            return Err(ConfigError::Invalid {
                name: "SANDBOX_PLUGIN_*",
                why: "plugin settings are set but SANDBOX_PROVIDER does not name a plugin".into(),
            });
        }

        let uses_engine = provider == ProviderKind::Docker
            || (matches!(provider, ProviderKind::Plugin(_)) && plugin.container_engine);
        // A container setting that would not take effect is refused rather
        // than ignored: an operator who sets a limit must get it.
        let engine_vars = [
            "SANDBOX_CPUS",
            "SANDBOX_PIDS",
            "SANDBOX_DISK_MB",
            "SANDBOX_DOCKER_RUNTIME",
            "SANDBOX_DOCKER_IMAGE",
            "SANDBOX_DOCKER_SECCOMP",
            "SANDBOX_DOCKER_POOL",
            "SANDBOX_DOCKER_SOCKET",
            "SANDBOX_GUEST_UID",
        ];
        let engine = if uses_engine {
            Some(engine_settings(&get, memory_mb)?)
        } else {
            let label = match &provider {
                ProviderKind::Wasm => "wasm",
                ProviderKind::Disabled => "disabled",
                _ => "plugin",
            };
            for name in engine_vars {
                if get(name).is_some() {
                    return Err(ConfigError::Unenforceable(name, label));
                }
            }
            None
        };

        // The variable an operator named to hold the API key is read, not
        // unknown, whatever its name.
        let key_var = get("SANDBOX_PLUGIN_API_KEY_ENV");
        let unknown = vars
            .keys()
            .filter(|k| k.starts_with("PLIMSOLL_") || k.starts_with("SANDBOX_"))
            .filter(|k| !VARIABLES.iter().any(|(name, _, _)| name == k))
            .filter(|k| Some(k.as_str()) != key_var)
            .cloned()
            .collect();

        let grants = match get("PLIMSOLL_GRANTS_FILE") {
            None => crate::grants::Grants::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Invalid {
                    name: "PLIMSOLL_GRANTS_FILE",
                    why: format!("reading {path}: {e}"),
                })?;
                let lookup = |name: &str| vars.get(name).cloned();
                crate::grants::Grants::parse(&text, &lookup).map_err(|why| {
                    ConfigError::Invalid {
                        name: "PLIMSOLL_GRANTS_FILE",
                        why,
                    }
                })?
            }
        };
        if !grants.is_empty() && !matches!(provider, ProviderKind::Wasm | ProviderKind::Docker) {
            return Err(ConfigError::Invalid {
                name: "PLIMSOLL_GRANTS_FILE",
                why: "grant profiles are configured, but this provider has no way to carry a grant (wasm and docker do)".into(),
            });
        }

        let auth = match (get("PLIMSOLL_CLIENTS_FILE"), get("PLIMSOLL_TOKEN")) {
            (Some(path), _) => {
                let file = crate::callers::ClientsFile::read(std::path::Path::new(path)).map_err(
                    |why| ConfigError::Invalid {
                        name: "PLIMSOLL_CLIENTS_FILE",
                        why,
                    },
                )?;
                if file.clients.is_empty() {
                    return Err(ConfigError::Invalid {
                        name: "PLIMSOLL_CLIENTS_FILE",
                        why: "the file lists no callers".into(),
                    });
                }
                Auth::Clients(PathBuf::from(path), file)
            }
            (None, Some(token)) => {
                if !crate::callers::valid_token(token) {
                    return Err(ConfigError::Invalid {
                        name: "PLIMSOLL_TOKEN",
                        why: "must be at least 32 visible ASCII characters".into(),
                    });
                }
                Auth::Shared(token.to_string())
            }
            (None, None) => Auth::Open,
        };
        let insecure = match get("PLIMSOLL_INSECURE") {
            None | Some("0") => false,
            Some("1") => true,
            Some(_) => {
                return Err(ConfigError::Invalid {
                    name: "PLIMSOLL_INSECURE",
                    why: "must be 0 or 1".into(),
                });
            }
        };
        // In hardened mode this is one of the violations it names together.
        let hardened_asked = matches!(get("PLIMSOLL_HARDENED"), Some("1"));
        if matches!(auth, Auth::Open)
            && provider != ProviderKind::Disabled
            && !insecure
            && !hardened_asked
        {
            return Err(ConfigError::Invalid {
                name: "PLIMSOLL_CLIENTS_FILE",
                why: "no authentication is configured (no clients file, no PLIMSOLL_TOKEN), and this provider runs code: configure callers, or set PLIMSOLL_INSECURE=1 for development on loopback".into(),
            });
        }
        let tls = match (get("PLIMSOLL_TLS_CERT"), get("PLIMSOLL_TLS_KEY")) {
            (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
            (None, None) => None,
            _ => {
                return Err(ConfigError::Invalid {
                    name: "PLIMSOLL_TLS_CERT",
                    why: "PLIMSOLL_TLS_CERT and PLIMSOLL_TLS_KEY go together: set both or neither"
                        .into(),
                });
            }
        };
        let metrics_addr = match get("PLIMSOLL_METRICS_ADDR") {
            None => Some(SocketAddr::from(([127, 0, 0, 1], 9464))),
            Some("off") => None,
            Some(a) => Some(a.parse().map_err(|_| ConfigError::Invalid {
                name: "PLIMSOLL_METRICS_ADDR",
                why: "must be ip:port or off".into(),
            })?),
        };
        let flag = |name: &'static str| -> Result<bool, ConfigError> {
            match get(name) {
                None | Some("0") => Ok(false),
                Some("1") => Ok(true),
                Some(_) => Err(ConfigError::Invalid {
                    name,
                    why: "must be 0 or 1".into(),
                }),
            }
        };
        let hardened = flag("PLIMSOLL_HARDENED")?;
        let metered = flag("SANDBOX_PLUGIN_METERED")?;
        if metered && !matches!(provider, ProviderKind::Plugin(_)) {
            return Err(ConfigError::Invalid {
                name: "SANDBOX_PLUGIN_METERED",
                why: "only a plugin provider's service can be metered".into(),
            });
        }
        let rate_per_min = parse_u32(
            get("SANDBOX_RATE_PER_MIN"),
            "SANDBOX_RATE_PER_MIN",
            0,
            1_000_000,
        )?
        .unwrap_or(0);
        let burst = parse_u32(
            get("SANDBOX_RATE_BURST"),
            "SANDBOX_RATE_BURST",
            1,
            1_000_000,
        )?
        .unwrap_or(rate_per_min);
        let quotas = crate::quota::QuotaSettings {
            per_caller_concurrency: parse_u32(
                get("SANDBOX_PER_KEY_CONCURRENT"),
                "SANDBOX_PER_KEY_CONCURRENT",
                0,
                1024,
            )?
            .unwrap_or(0),
            rate_per_min,
            burst,
            metered,
            daemon_paid_seconds_per_day: get("SANDBOX_PAID_SECONDS_PER_DAY")
                .map(|v| {
                    v.parse::<u64>().map_err(|_| ConfigError::Invalid {
                        name: "SANDBOX_PAID_SECONDS_PER_DAY",
                        why: "must be a whole number of seconds".into(),
                    })
                })
                .transpose()?
                .unwrap_or(0),
        };
        // Settings that would do nothing are refused, not ignored.
        if get("SANDBOX_RATE_BURST").is_some() && rate_per_min == 0 {
            return Err(ConfigError::Invalid {
                name: "SANDBOX_RATE_BURST",
                why: "a burst needs SANDBOX_RATE_PER_MIN".into(),
            });
        }
        if get("SANDBOX_PAID_SECONDS_PER_DAY").is_some() && !metered {
            return Err(ConfigError::Invalid {
                name: "SANDBOX_PAID_SECONDS_PER_DAY",
                why: "paid seconds are counted only for a provider declared metered (SANDBOX_PLUGIN_METERED=1)".into(),
            });
        }
        let set = vars
            .iter()
            .filter(|(_, v)| !v.trim().is_empty())
            .map(|(k, _)| k.clone())
            .collect();

        Ok(Config {
            auth,
            insecure,
            tls,
            metrics_addr,
            hardened,
            quotas,
            set,
            grants: std::sync::Arc::new(grants),
            addr,
            log_format,
            provider,
            memory_mb,
            max_concurrent,
            plugin,
            engine,
            unknown,
        })
    }
}

fn valid_plugin_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn plugin_settings<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    vars: &'a BTreeMap<String, String>,
) -> Result<PluginSettings, ConfigError> {
    let invalid = |name: &'static str, why: String| ConfigError::Invalid { name, why };
    let sha256 = match get("SANDBOX_PLUGIN_SHA256") {
        None => None,
        Some(s) if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Some(s.to_ascii_lowercase())
        }
        Some(_) => {
            return Err(invalid(
                "SANDBOX_PLUGIN_SHA256",
                "must be 64 hex digits".into(),
            ));
        }
    };
    let max_tier = match get("SANDBOX_PLUGIN_MAX_TIER") {
        None => None,
        Some(s) => match Tier::parse_floor(s) {
            Ok(Some(t)) => Some(t),
            _ => {
                return Err(invalid(
                    "SANDBOX_PLUGIN_MAX_TIER",
                    "must be process, container, kernel or vm".into(),
                ));
            }
        },
    };
    let http = match get("SANDBOX_PLUGIN_HTTP_ORIGINS") {
        None => None,
        Some(list) => {
            let origins = list
                .split(',')
                .map(str::trim)
                .filter(|o| !o.is_empty())
                .map(Origin::parse)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|why| invalid("SANDBOX_PLUGIN_HTTP_ORIGINS", why))?;
            let api_key = api_key(get, vars)?;
            if api_key.is_some() && origins.iter().any(|o| !o.is_https()) {
                return Err(invalid(
                    "SANDBOX_PLUGIN_API_KEY_ENV",
                    "an API key is only ever sent over https; remove the plain-http origins".into(),
                ));
            }
            Some(HttpGrant { origins, api_key })
        }
    };
    if http.is_none() && get("SANDBOX_PLUGIN_API_KEY_ENV").is_some() {
        return Err(invalid(
            "SANDBOX_PLUGIN_API_KEY_ENV",
            "an API key needs SANDBOX_PLUGIN_HTTP_ORIGINS to be sent anywhere".into(),
        ));
    }
    let container_engine = match get("SANDBOX_PLUGIN_CONTAINER_ENGINE") {
        None | Some("0") => false,
        Some("1") => true,
        Some(_) => {
            return Err(invalid(
                "SANDBOX_PLUGIN_CONTAINER_ENGINE",
                "must be 0 or 1".into(),
            ));
        }
    };
    Ok(PluginSettings {
        dir: get("PLIMSOLL_PLUGIN_DIR").map(PathBuf::from),
        sha256,
        max_tier,
        http,
        container_engine,
    })
}

/// The header the host adds to a plugin's requests, from the variable the
/// operator named. The value is marked sensitive so no debug output of a
/// header map ever prints it.
fn api_key<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    vars: &'a BTreeMap<String, String>,
) -> Result<Option<(axum::http::HeaderName, axum::http::HeaderValue)>, ConfigError> {
    let Some(var) = get("SANDBOX_PLUGIN_API_KEY_ENV") else {
        return Ok(None);
    };
    let invalid = |why: &str| ConfigError::Invalid {
        name: "SANDBOX_PLUGIN_API_KEY_ENV",
        why: why.to_string(),
    };
    let key = vars
        .get(var)
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| invalid("names a variable that is unset or empty"))?;
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid("names a variable whose value is not visible ASCII"));
    }
    let header = get("SANDBOX_PLUGIN_API_KEY_HEADER")
        .unwrap_or("authorization")
        .to_ascii_lowercase();
    let name = axum::http::HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
        ConfigError::Invalid {
            name: "SANDBOX_PLUGIN_API_KEY_HEADER",
            why: "is not a valid header name".into(),
        }
    })?;
    let text = if name == axum::http::header::AUTHORIZATION {
        format!("Bearer {key}")
    } else {
        key.to_string()
    };
    let mut value = axum::http::HeaderValue::from_str(&text)
        .map_err(|_| invalid("the key is not a valid header value"))?;
    value.set_sensitive(true);
    Ok(Some((name, value)))
}

fn parse_u32(
    v: Option<&str>,
    name: &'static str,
    min: u32,
    max: u32,
) -> Result<Option<u32>, ConfigError> {
    let Some(v) = v else { return Ok(None) };
    let n: u32 = v.parse().map_err(|_| ConfigError::Invalid {
        name,
        why: format!("must be a whole number from {min} to {max}"),
    })?;
    if n < min || n > max {
        return Err(ConfigError::Invalid {
            name,
            why: format!("must be from {min} to {max}"),
        });
    }
    Ok(Some(n))
}

/// The text `plimsolld -h` prints.
pub fn help_text() -> String {
    let mut s = String::from(
        "plimsolld: runs code that AI agents wrote inside a sandbox, and states the isolation tier that held.\n\n\
         Usage: plimsolld        (configuration comes only from the environment)\n       \
         plimsolld -h     (this text)\n\nEnvironment variables:\n",
    );
    for (name, default, meaning) in VARIABLES {
        s.push_str(&format!(
            "  {name:<24} default {default}\n  {:<24} {meaning}\n",
            ""
        ));
    }
    s
}

/// The shipped seccomp profile, applied under runc unless the operator names
/// another (see docs/isolation-tiers.md).
pub const SHIPPED_SECCOMP: &str = include_str!("../../plugins/docker/seccomp.json");

fn engine_settings<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    memory_mb: u32,
) -> Result<EngineSettings, ConfigError> {
    let invalid = |name: &'static str, why: String| ConfigError::Invalid { name, why };
    let runtime = match get("SANDBOX_DOCKER_RUNTIME") {
        None | Some("runc") => String::new(),
        Some("runsc") => "runsc".to_string(),
        Some(_) => {
            return Err(invalid(
                "SANDBOX_DOCKER_RUNTIME",
                "must be unset (runc) or runsc: those are the runtimes plimsoll verifies".into(),
            ));
        }
    };
    let image = get("SANDBOX_DOCKER_IMAGE")
        .unwrap_or("plimsoll/sandbox:bookworm")
        .to_string();
    if image.len() > 256 || !image.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(
            "SANDBOX_DOCKER_IMAGE",
            "must be an image tag or ID".into(),
        ));
    }
    let seccomp = match get("SANDBOX_DOCKER_SECCOMP") {
        None => Some(SHIPPED_SECCOMP.to_string()),
        Some("engine-default") => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| invalid("SANDBOX_DOCKER_SECCOMP", format!("reading {path}: {e}")))?;
            Some(text)
        }
    };
    if let Some(text) = &seccomp {
        let v: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| invalid("SANDBOX_DOCKER_SECCOMP", format!("not a JSON profile: {e}")))?;
        if v.get("defaultAction").and_then(|a| a.as_str()).is_none() {
            return Err(invalid(
                "SANDBOX_DOCKER_SECCOMP",
                "the profile has no defaultAction".into(),
            ));
        }
    }
    let pool = parse_u32(get("SANDBOX_DOCKER_POOL"), "SANDBOX_DOCKER_POOL", 0, 32)?.unwrap_or(2);
    let socket = PathBuf::from(get("SANDBOX_DOCKER_SOCKET").unwrap_or("/var/run/docker.sock"));
    if !socket.is_absolute() {
        return Err(invalid(
            "SANDBOX_DOCKER_SOCKET",
            "must be an absolute path to a Unix socket".into(),
        ));
    }
    let guest_uid = parse_u32(
        get("SANDBOX_GUEST_UID"),
        "SANDBOX_GUEST_UID",
        1000,
        (1 << 31) - 2,
    )?
    .unwrap_or(61000);
    let nano_cpus = match get("SANDBOX_CPUS") {
        None => 1_000_000_000,
        Some(s) => match s.parse::<f64>() {
            Ok(c) if c.is_finite() && (0.01..=64.0).contains(&c) => (c * 1e9) as i64,
            _ => {
                return Err(invalid(
                    "SANDBOX_CPUS",
                    "must be a number of CPUs from 0.01 to 64".into(),
                ));
            }
        },
    };
    // gVisor's own tasks count against the limit under runsc.
    let pids = parse_u32(get("SANDBOX_PIDS"), "SANDBOX_PIDS", 64, 65536)?.unwrap_or(256);
    let min_disk = TMP_MB + SHM_MB + MIN_WORK_MB;
    let disk_mb = parse_u32(get("SANDBOX_DISK_MB"), "SANDBOX_DISK_MB", min_disk, 1 << 20)?
        .unwrap_or(TMP_MB + SHM_MB + 128);
    Ok(EngineSettings {
        socket,
        image,
        runtime,
        guest_uid,
        memory_mb,
        nano_cpus,
        pids: i64::from(pids),
        disk_mb,
        seccomp,
        pool,
    })
}

/// The guest uid must belong to nobody on this host: a container process
/// with a host account's uid could use that account's files through any
/// mount or leak, and uid+1 is refused too so an off-by-one elsewhere cannot
/// land on a real account.
pub fn check_guest_uid(uid: u32, passwd: &str, group: &str) -> Result<(), String> {
    let taken = |table: &str, id: u32| {
        table.lines().any(|l| {
            l.split(':')
                .nth(2)
                .and_then(|f| f.parse::<u32>().ok())
                .is_some_and(|n| n == id)
        })
    };
    for id in [uid, uid + 1] {
        if taken(passwd, id) {
            return Err(format!(
                "SANDBOX_GUEST_UID={uid}: {id} is a user in this host's /etc/passwd"
            ));
        }
        if taken(group, id) {
            return Err(format!(
                "SANDBOX_GUEST_UID={uid}: {id} is a group in this host's /etc/group"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An environment in open development mode unless the test sets
    /// authentication itself.
    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut m: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let auth = [
            "PLIMSOLL_TOKEN",
            "PLIMSOLL_CLIENTS_FILE",
            "PLIMSOLL_INSECURE",
        ];
        if !auth.iter().any(|k| m.contains_key(*k)) {
            m.insert("PLIMSOLL_INSECURE".into(), "1".into());
        }
        m
    }

    #[test]
    fn a_provider_that_runs_code_needs_callers_or_an_explicit_opt_in() {
        let open = |extra: &[(&str, &str)]| {
            let mut m = env(extra);
            m.remove("PLIMSOLL_INSECURE");
            Config::from_map(&m)
        };
        assert!(open(&[("SANDBOX_PROVIDER", "wasm")]).is_err());
        assert!(open(&[]).is_ok(), "disabled needs nothing");
        assert!(
            open(&[
                ("SANDBOX_PROVIDER", "wasm"),
                ("PLIMSOLL_TOKEN", &"t".repeat(32))
            ])
            .is_ok()
        );
        assert!(
            open(&[("SANDBOX_PROVIDER", "wasm"), ("PLIMSOLL_TOKEN", "short")]).is_err(),
            "a short shared token"
        );
        assert!(
            open(&[("PLIMSOLL_TLS_CERT", "/x")]).is_err(),
            "cert without key"
        );
        assert!(open(&[("PLIMSOLL_METRICS_ADDR", "nowhere")]).is_err());
        let c = open(&[("PLIMSOLL_METRICS_ADDR", "off")]).expect("off");
        assert_eq!(c.metrics_addr, None);
        // The shared token never shows in debug output.
        let c = open(&[
            ("SANDBOX_PROVIDER", "wasm"),
            ("PLIMSOLL_TOKEN", &"s".repeat(40)),
        ])
        .expect("token");
        assert!(!format!("{:?}", c.auth).contains("sss"));
    }

    #[test]
    fn unset_provider_is_disabled() {
        let c = Config::from_map(&env(&[])).expect("valid");
        assert_eq!(c.provider, ProviderKind::Disabled);
        assert_eq!(c.addr.to_string(), "127.0.0.1:8746");
    }

    #[test]
    fn unknown_provider_lists_known_ones() {
        let e = Config::from_map(&env(&[("SANDBOX_PROVIDER", "Dock r")])).expect_err("refused");
        let text = e.to_string();
        assert!(text.contains("disabled") && text.contains("wasm"), "{text}");
    }

    #[test]
    fn wasm_refuses_limits_it_cannot_enforce() {
        for name in ["SANDBOX_CPUS", "SANDBOX_PIDS", "SANDBOX_DISK_MB"] {
            let e = Config::from_map(&env(&[("SANDBOX_PROVIDER", "wasm"), (name, "1")]))
                .expect_err("refused");
            assert_eq!(e, ConfigError::Unenforceable(name, "wasm"));
        }
    }

    #[test]
    fn unknown_prefixed_variables_are_collected() {
        let c = Config::from_map(&env(&[("SANDBOX_PROVDER", "wasm"), ("HOME", "/root")]))
            .expect("valid");
        assert_eq!(c.unknown, vec!["SANDBOX_PROVDER".to_string()]);
    }

    #[test]
    fn plugin_settings_are_checked() {
        let base = [
            ("SANDBOX_PROVIDER", "remote-plimsoll"),
            ("KEY", "secret-value"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            Config::from_map(&env(&v))
        };
        // A key is never sent over plain http.
        assert!(
            with(&[
                ("SANDBOX_PLUGIN_HTTP_ORIGINS", "http://127.0.0.1:9"),
                ("SANDBOX_PLUGIN_API_KEY_ENV", "KEY")
            ])
            .is_err()
        );
        let c = with(&[
            ("SANDBOX_PLUGIN_HTTP_ORIGINS", "https://api.example.com"),
            ("SANDBOX_PLUGIN_API_KEY_ENV", "KEY"),
        ])
        .expect("valid");
        let (name, value) = c.plugin.http.expect("grant").api_key.expect("key");
        assert_eq!(name, "authorization");
        assert!(value.is_sensitive());
        // A key with nowhere to go, an unset key variable, limits a plugin
        // cannot enforce, and plugin settings without a plugin.
        assert!(with(&[("SANDBOX_PLUGIN_API_KEY_ENV", "KEY")]).is_err());
        assert!(
            with(&[
                ("SANDBOX_PLUGIN_HTTP_ORIGINS", "https://a.example"),
                ("SANDBOX_PLUGIN_API_KEY_ENV", "NOPE")
            ])
            .is_err()
        );
        assert!(with(&[("SANDBOX_PIDS", "10")]).is_err());
        assert!(
            Config::from_map(&env(&[
                ("SANDBOX_PROVIDER", "wasm"),
                ("SANDBOX_PLUGIN_MAX_TIER", "vm")
            ]))
            .is_err()
        );
        // A key variable with our prefix is read, so not reported as unknown.
        let c = Config::from_map(&env(&[
            ("SANDBOX_PROVIDER", "remote-plimsoll"),
            ("SANDBOX_PLUGIN_HTTP_ORIGINS", "https://a.example"),
            ("SANDBOX_PLUGIN_API_KEY_ENV", "PLIMSOLL_UPSTREAM_KEY"),
            ("PLIMSOLL_UPSTREAM_KEY", "k"),
        ]))
        .expect("valid");
        assert!(c.unknown.is_empty(), "{:?}", c.unknown);
        // The debug form of the whole configuration never shows the key.
        let shown = format!(
            "{:?}",
            with(&[
                ("SANDBOX_PLUGIN_HTTP_ORIGINS", "https://a.example"),
                ("SANDBOX_PLUGIN_API_KEY_ENV", "KEY")
            ])
        );
        assert!(!shown.contains("secret-value"), "{shown}");
    }

    #[test]
    fn bounds_are_checked() {
        assert!(Config::from_map(&env(&[("SANDBOX_MEMORY_MB", "0")])).is_err());
        assert!(Config::from_map(&env(&[("SANDBOX_MAX_CONCURRENT", "5000")])).is_err());
        assert!(Config::from_map(&env(&[("SANDBOX_MEMORY_MB", "-1")])).is_err());
    }

    #[test]
    fn a_guest_uid_that_is_a_host_account_is_refused() {
        let passwd = "root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/usr/sbin/nologin\n";
        let group = "root:x:0:\nstaff:x:61001:\n";
        assert!(check_guest_uid(61010, passwd, group).is_ok());
        assert!(check_guest_uid(65534, passwd, group).is_err());
        assert!(
            check_guest_uid(65533, passwd, group).is_err(),
            "uid+1 is nobody"
        );
        assert!(
            check_guest_uid(61000, passwd, group).is_err(),
            "uid+1 is a group"
        );
    }
}
