//! Where the per-caller counters live: the embedded store (a single daemon)
//! or a Redis shared by several replicas.

use std::path::PathBuf;
use std::time::Duration;

use crate::env_vars::{ConfigError, Env, Var, invalid, var};

pub const VARIABLES: &[Var] = &[
    var(
        "PLIMSOLL_STATE_URL",
        "(unset: the embedded store)",
        "redis://[:password@]host:port[/db] or rediss:// (TLS): the store several replicas share their limits through",
    ),
    var(
        "PLIMSOLL_STATE_DIR",
        DEFAULT_DIR,
        "the embedded store's directory (owned by the daemon, mode 0700); written only on a metered provider",
    ),
    var(
        "PLIMSOLL_STATE_LEASE_SECONDS",
        "30",
        "with a shared store: how long a replica's run keeps its concurrency place without renewal (a dead replica's places free themselves after this)",
    ),
];

const DEFAULT_DIR: &str = "/var/lib/plimsoll";

/// Which store, as configured.
#[derive(Clone, PartialEq)]
pub enum StateSettings {
    /// This daemon's memory, with the day's paid seconds kept in a file in
    /// `dir` (on a metered provider only).
    Embedded { dir: PathBuf },
    /// A Redis every replica shares. The URL may hold a password, so it is
    /// never printed (see the Debug impl).
    Redis { url: String, lease: Duration },
}

impl std::fmt::Debug for StateSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateSettings::Embedded { dir } => write!(f, "Embedded({})", dir.display()),
            StateSettings::Redis { url, lease } => write!(
                f,
                "Redis({}, lease {}s)",
                if url.starts_with("rediss://") {
                    "TLS"
                } else {
                    "plain"
                },
                lease.as_secs()
            ),
        }
    }
}

impl Default for StateSettings {
    fn default() -> Self {
        StateSettings::Embedded {
            dir: PathBuf::from(DEFAULT_DIR),
        }
    }
}

/// Whether a URL names this machine: a loopback address, or `localhost`.
/// Shared by the store's and the replicas' clear-text rules.
pub fn loopback_host(u: &url::Url) -> bool {
    match u.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        // A non-special scheme's host (redis://) is opaque to the URL
        // parser: an IPv4 address arrives as a name.
        Some(url::Host::Domain(d)) => {
            d == "localhost"
                || d.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        None => false,
    }
}

impl StateSettings {
    pub fn from_env(env: &Env) -> Result<StateSettings, ConfigError> {
        let lease = env
            .u32_in("PLIMSOLL_STATE_LEASE_SECONDS", 2, 3600)?
            .map(|s| Duration::from_secs(u64::from(s)));
        match env.get("PLIMSOLL_STATE_URL") {
            Some(url) => {
                if env.is_set("PLIMSOLL_STATE_DIR") {
                    return Err(invalid(
                        "PLIMSOLL_STATE_DIR",
                        "the embedded store's directory does nothing with PLIMSOLL_STATE_URL set; unset one",
                    ));
                }
                // The value is never echoed: it may carry the password.
                let parsed = url::Url::parse(url).ok();
                let scheme_ok = parsed
                    .as_ref()
                    .is_some_and(|u| matches!(u.scheme(), "redis" | "rediss"));
                let host_ok = parsed
                    .as_ref()
                    .and_then(|u| u.host_str())
                    .is_some_and(|h| !h.is_empty());
                if !scheme_ok || !host_ok || redis::Client::open(url).is_err() {
                    return Err(invalid(
                        "PLIMSOLL_STATE_URL",
                        "must be a redis:// or rediss:// URL with a host",
                    ));
                }
                Ok(StateSettings::Redis {
                    url: url.to_string(),
                    lease: lease.unwrap_or(Duration::from_secs(30)),
                })
            }
            None => {
                if lease.is_some() {
                    return Err(invalid(
                        "PLIMSOLL_STATE_LEASE_SECONDS",
                        "leases expire only in a shared store; set PLIMSOLL_STATE_URL or unset this",
                    ));
                }
                let dir = PathBuf::from(env.get("PLIMSOLL_STATE_DIR").unwrap_or(DEFAULT_DIR));
                if !dir.is_absolute() {
                    return Err(invalid("PLIMSOLL_STATE_DIR", "must be an absolute path"));
                }
                Ok(StateSettings::Embedded { dir })
            }
        }
    }

    /// A shared store reached in clear text on a host other than this one:
    /// its password and every count would cross the network readable.
    pub fn plaintext_off_host(&self) -> bool {
        let StateSettings::Redis { url, .. } = self else {
            return false;
        };
        let Ok(u) = url::Url::parse(url) else {
            return true;
        };
        u.scheme() != "rediss" && !loopback_host(&u)
    }

    /// Whether the store is shared with other replicas.
    pub fn shared(&self) -> bool {
        matches!(self, StateSettings::Redis { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn parse(pairs: &[(&str, &str)]) -> Result<StateSettings, ConfigError> {
        let vars: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        StateSettings::from_env(&Env::new(&vars))
    }

    #[test]
    fn the_embedded_store_is_the_default() {
        assert_eq!(parse(&[]).expect("default"), StateSettings::default());
        assert!(parse(&[("PLIMSOLL_STATE_DIR", "relative")]).is_err());
        assert!(parse(&[("PLIMSOLL_STATE_LEASE_SECONDS", "5")]).is_err());
    }

    #[test]
    fn a_redis_url_is_checked_and_never_echoed() {
        let s = parse(&[(
            "PLIMSOLL_STATE_URL",
            "redis://:hunter2-canary@127.0.0.1:6379/0",
        )])
        .expect("redis");
        assert!(s.shared());
        assert!(!format!("{s:?}").contains("hunter2-canary"));
        for bad in ["http://127.0.0.1", "hunter2-canary", "redis://"] {
            let e = parse(&[("PLIMSOLL_STATE_URL", bad)]).expect_err(bad);
            assert!(!e.to_string().contains("hunter2-canary"), "{e}");
        }
        for (url, clear_off_host) in [
            ("redis://127.0.0.1:6379", false),
            ("redis://[::1]:6379", false),
            ("redis://localhost", false),
            ("redis://redis.internal:6379", true),
            ("redis://10.0.0.5", true),
            ("rediss://redis.internal:6380", false),
        ] {
            let s = parse(&[("PLIMSOLL_STATE_URL", url)]).expect(url);
            assert_eq!(s.plaintext_off_host(), clear_off_host, "{url}");
        }
        assert!(!StateSettings::default().plaintext_off_host());
        assert!(
            parse(&[
                ("PLIMSOLL_STATE_URL", "redis://127.0.0.1"),
                ("PLIMSOLL_STATE_DIR", "/tmp/x")
            ])
            .is_err()
        );
        assert!(
            parse(&[
                ("PLIMSOLL_STATE_URL", "redis://127.0.0.1"),
                ("PLIMSOLL_STATE_LEASE_SECONDS", "1")
            ])
            .is_err(),
            "a lease shorter than two seconds could expire between renewals"
        );
    }
}
