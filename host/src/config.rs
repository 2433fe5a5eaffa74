//! Configuration: one closed list of environment variables, parsed in one
//! place into a typed struct.
//!
//! Nothing else in the daemon reads the environment. A variable with our
//! prefixes that is not on the list is almost always a typo of one that is
//! (and a typo in a security setting silently means its default), so it is
//! reported at start. `plimsolld -h` prints `VARIABLES`.

use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Every variable the daemon reads: name, default, meaning.
pub const VARIABLES: &[(&str, &str, &str)] = &[
    (
        "PLIMSOLL_ADDR",
        "127.0.0.1:8746",
        "API listener (Connect, /healthz, /readyz); host:port",
    ),
    ("PLIMSOLL_LOG_FORMAT", "json", "log format: json or text"),
    (
        "SANDBOX_PROVIDER",
        "(unset: disabled)",
        "provider: disabled or wasm; unset runs nothing, ever",
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
        "(unset)",
        "per-run CPUs; not enforceable by the wasm provider, which refuses it",
    ),
    (
        "SANDBOX_PIDS",
        "(unset)",
        "per-run process limit; not enforceable by the wasm provider, which refuses it",
    ),
    (
        "SANDBOX_DISK_MB",
        "(unset)",
        "per-run disk budget; not enforceable by the wasm provider, which refuses it",
    ),
];

/// Which provider runs the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// The default: refuses every run.
    Disabled,
    /// QuickJS as a Wasm component in this process (process tier).
    Wasm,
}

impl ProviderKind {
    pub const KNOWN: &'static [&'static str] = &["disabled", "wasm"];
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
    /// Variables with our prefixes that are not on the list.
    pub unknown: Vec<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{name}: {why}")]
    Invalid { name: &'static str, why: String },
    #[error("SANDBOX_PROVIDER={0:?} is not a provider; known providers: {known}", known = ProviderKind::KNOWN.join(", "))]
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

        if provider == ProviderKind::Wasm {
            for name in ["SANDBOX_CPUS", "SANDBOX_PIDS", "SANDBOX_DISK_MB"] {
                if get(name).is_some() {
                    return Err(ConfigError::Unenforceable(name, "wasm"));
                }
            }
        }

        let unknown = vars
            .keys()
            .filter(|k| k.starts_with("PLIMSOLL_") || k.starts_with("SANDBOX_"))
            .filter(|k| !VARIABLES.iter().any(|(name, _, _)| name == k))
            .cloned()
            .collect();

        Ok(Config {
            addr,
            log_format,
            provider,
            memory_mb,
            max_concurrent,
            unknown,
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn unset_provider_is_disabled() {
        let c = Config::from_map(&env(&[])).expect("valid");
        assert_eq!(c.provider, ProviderKind::Disabled);
        assert_eq!(c.addr.to_string(), "127.0.0.1:8746");
    }

    #[test]
    fn unknown_provider_lists_known_ones() {
        let e = Config::from_map(&env(&[("SANDBOX_PROVIDER", "dockr")])).expect_err("refused");
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
    fn bounds_are_checked() {
        assert!(Config::from_map(&env(&[("SANDBOX_MEMORY_MB", "0")])).is_err());
        assert!(Config::from_map(&env(&[("SANDBOX_MAX_CONCURRENT", "5000")])).is_err());
        assert!(Config::from_map(&env(&[("SANDBOX_MEMORY_MB", "-1")])).is_err());
    }
}
