//! How replicas reach one another for sessions: this replica's address as
//! its peers dial it, and the secret they share.

use std::path::PathBuf;

use crate::env_vars::{ConfigError, Env, Var, invalid, var};

pub const VARIABLES: &[Var] = &[
    var(
        "PLIMSOLL_REPLICA_URL",
        "(unset: sessions stay on the replica that opened them)",
        "this replica's API as the other replicas reach it (https://, or http:// on loopback); needs PLIMSOLL_STATE_URL",
    ),
    var(
        "PLIMSOLL_REPLICA_SECRET_FILE",
        "(none)",
        "a file (mode 0600 or stricter) with the secret every replica shares, at least 32 characters",
    ),
];

#[derive(Clone, PartialEq)]
pub struct ReplicaSettings {
    /// This replica's base URL, without a trailing slash.
    pub url: String,
    pub secret_file: PathBuf,
}

impl std::fmt::Debug for ReplicaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReplicaSettings({})", self.url)
    }
}

impl ReplicaSettings {
    /// None when forwarding is off; both variables or neither.
    pub fn from_env(env: &Env) -> Result<Option<ReplicaSettings>, ConfigError> {
        let (url, file) = match (
            env.get("PLIMSOLL_REPLICA_URL"),
            env.get("PLIMSOLL_REPLICA_SECRET_FILE"),
        ) {
            (None, None) => return Ok(None),
            (Some(u), Some(f)) => (u, f),
            (Some(_), None) => {
                return Err(invalid(
                    "PLIMSOLL_REPLICA_SECRET_FILE",
                    "replicas that forward sessions must share a secret",
                ));
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "PLIMSOLL_REPLICA_URL",
                    "a shared secret does nothing without this replica's address",
                ));
            }
        };
        if !env.is_set("PLIMSOLL_STATE_URL") {
            return Err(invalid(
                "PLIMSOLL_REPLICA_URL",
                "replicas find one another's sessions through the shared store; set PLIMSOLL_STATE_URL",
            ));
        }
        if !dialable(url) {
            return Err(invalid(
                "PLIMSOLL_REPLICA_URL",
                "must be https://host[:port], or http:// to a loopback address, with no path",
            ));
        }
        let secret_file = PathBuf::from(file);
        if !secret_file.is_absolute() {
            return Err(invalid(
                "PLIMSOLL_REPLICA_SECRET_FILE",
                "must be an absolute path",
            ));
        }
        Ok(Some(ReplicaSettings {
            url: url.trim_end_matches('/').to_string(),
            secret_file,
        }))
    }
}

/// A peer's address the daemon will send a session call to: TLS, or clear
/// text that never leaves this machine. Used for this replica's own
/// setting and again for every address read back from the store.
pub fn dialable(url: &str) -> bool {
    let Ok(u) = url::Url::parse(url) else {
        return false;
    };
    let path_ok = matches!(u.path(), "" | "/") && u.query().is_none() && u.fragment().is_none();
    let loopback = crate::state::settings::loopback_host(&u);
    let userinfo = !u.username().is_empty() || u.password().is_some();
    path_ok
        && !userinfo
        && u.host().is_some()
        && (u.scheme() == "https" || (u.scheme() == "http" && loopback))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<Option<ReplicaSettings>, ConfigError> {
        let vars: std::collections::BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ReplicaSettings::from_env(&Env::new(&vars))
    }

    #[test]
    fn both_or_neither_and_only_with_a_shared_store() {
        assert_eq!(parse(&[]).expect("off"), None);
        let store = ("PLIMSOLL_STATE_URL", "redis://127.0.0.1");
        let url = ("PLIMSOLL_REPLICA_URL", "http://127.0.0.1:8080/");
        let secret = (
            "PLIMSOLL_REPLICA_SECRET_FILE",
            "/etc/plimsoll/replica-secret",
        );
        let on = parse(&[store, url, secret]).expect("on").expect("some");
        assert_eq!(on.url, "http://127.0.0.1:8080");
        assert!(parse(&[store, url]).is_err(), "no secret");
        assert!(parse(&[store, secret]).is_err(), "no address");
        assert!(parse(&[url, secret]).is_err(), "no shared store");
        assert!(
            parse(&[
                store,
                ("PLIMSOLL_REPLICA_URL", "http://10.0.0.2:8080"),
                secret
            ])
            .is_err(),
            "clear text off this machine"
        );
        assert!(parse(&[store, url, ("PLIMSOLL_REPLICA_SECRET_FILE", "relative")]).is_err());
    }

    #[test]
    fn only_tls_or_loopback_peers_are_dialled() {
        for (url, ok) in [
            ("http://127.0.0.1:8080", true),
            ("http://[::1]:8080/", true),
            ("https://replica-2.internal:8443", true),
            ("http://replica-2.internal:8080", false),
            ("http://10.0.0.2:8080", false),
            ("https://replica-2.internal/path", false),
            ("https://user:pw@replica-2.internal", false),
            ("ftp://127.0.0.1", false),
            ("nonsense", false),
        ] {
            assert_eq!(dialable(url), ok, "{url}");
        }
    }
}
