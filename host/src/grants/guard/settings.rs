//! Where the guard listens, what hosted sandboxes dial to reach it, and
//! with which TLS material.
//!
//! The address it binds and the URL sandboxes dial are separate settings:
//! a hosted sandbox reaches the daemon from the internet, through whatever
//! name and port the operator publishes, rarely the bind address itself.
//! The URL is always https: the token in each request is worth a run's
//! grant, and it crosses networks the operator does not own. The guard
//! itself speaks plain HTTP only on loopback, where something in front of
//! it (a TLS proxy the operator runs) must be what the URL names.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::env_vars::{ConfigError, Env, Var, invalid, var};

pub const VARIABLES: &[Var] = &[
    var(
        "PLIMSOLL_GUARD_ADDR",
        "(unset: off)",
        "where the guard listens (ip:port): hosted sandboxes (e2b, openshell) reach a granted run's broker there",
    ),
    var(
        "PLIMSOLL_GUARD_URL",
        "(unset)",
        "what hosted sandboxes dial to reach the guard: https://host[:port], reachable from the vendor's sandboxes",
    ),
    var(
        "PLIMSOLL_GUARD_TLS_CERT",
        "(unset)",
        "PEM certificate chain the guard serves (with PLIMSOLL_GUARD_TLS_KEY); required unless it listens on loopback",
    ),
    var(
        "PLIMSOLL_GUARD_TLS_KEY",
        "(unset)",
        "PEM private key for PLIMSOLL_GUARD_TLS_CERT",
    ),
    var(
        "PLIMSOLL_GUARD_CA_FILE",
        "(unset: the sandbox's own roots)",
        "PEM file handed into each granted hosted sandbox as the only authority its client trusts for the guard",
    ),
];

/// Longest CA file read: a few certificates, never a whole store.
const MAX_CA_BYTES: usize = 64 << 10;

#[derive(Debug, Clone)]
pub struct GuardSettings {
    pub addr: SocketAddr,
    /// What sandboxes dial, as configured (https, a host, maybe a port).
    pub url: url::Url,
    /// The host and port a sandbox's egress rule must open.
    pub host: String,
    pub port: u16,
    /// PEM certificate and key paths.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// The CA's PEM text, read at start.
    pub ca_pem: Option<String>,
}

impl GuardSettings {
    /// None when the guard is off (neither address nor URL set).
    pub fn from_env(env: &Env) -> Result<Option<GuardSettings>, ConfigError> {
        let (addr, url) = match (
            env.get("PLIMSOLL_GUARD_ADDR"),
            env.get("PLIMSOLL_GUARD_URL"),
        ) {
            (None, None) => return Ok(None),
            (Some(a), Some(u)) => (a, u),
            _ => {
                return Err(invalid(
                    "PLIMSOLL_GUARD_ADDR",
                    "PLIMSOLL_GUARD_ADDR and PLIMSOLL_GUARD_URL go together: set both or neither",
                ));
            }
        };
        let addr: SocketAddr = addr.parse().map_err(|_| {
            invalid(
                "PLIMSOLL_GUARD_ADDR",
                "must be an IP address and port, e.g. 127.0.0.1:8747",
            )
        })?;
        let (url, host, port) = parse_url(url)?;
        let tls = match (
            env.get("PLIMSOLL_GUARD_TLS_CERT"),
            env.get("PLIMSOLL_GUARD_TLS_KEY"),
        ) {
            (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
            (None, None) => None,
            _ => {
                return Err(invalid(
                    "PLIMSOLL_GUARD_TLS_CERT",
                    "PLIMSOLL_GUARD_TLS_CERT and PLIMSOLL_GUARD_TLS_KEY go together: set both or neither",
                ));
            }
        };
        if tls.is_none() && !addr.ip().is_loopback() {
            return Err(invalid(
                "PLIMSOLL_GUARD_TLS_CERT",
                "the guard listens beyond loopback, where its tokens would cross the network in clear: give it PLIMSOLL_GUARD_TLS_CERT and PLIMSOLL_GUARD_TLS_KEY",
            ));
        }
        let ca_pem = env.get("PLIMSOLL_GUARD_CA_FILE").map(read_ca).transpose()?;
        Ok(Some(GuardSettings {
            addr,
            url,
            host,
            port,
            tls,
            ca_pem,
        }))
    }
}

/// An https origin with nothing else: no credentials, path, query or
/// fragment, so what a sandbox dials is exactly the origin its egress rule
/// opens.
fn parse_url(text: &str) -> Result<(url::Url, String, u16), ConfigError> {
    let bad = |why: &str| invalid("PLIMSOLL_GUARD_URL", why.to_string());
    let url =
        url::Url::parse(text).map_err(|_| bad("must be a URL, e.g. https://guard.example.com"))?;
    if url.scheme() != "https" {
        return Err(bad(
            "must be https: the token in each request is worth a run's grant",
        ));
    }
    if !url.username().is_empty()
        || url.password().is_some()
        || url.path() != "/"
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(bad(
            "must be an origin only (https://host[:port]): no credentials, path, query or fragment",
        ));
    }
    let host = match url.host() {
        Some(url::Host::Domain(d)) => d.to_string(),
        Some(url::Host::Ipv4(ip)) => ip.to_string(),
        Some(url::Host::Ipv6(_)) | None => {
            return Err(bad("must name a host by DNS name or IPv4 address"));
        }
    };
    let port = url.port_or_known_default().unwrap_or(443);
    if port == 0 {
        return Err(bad("must name a port sandboxes can dial, not 0"));
    }
    Ok((url, host, port))
}

fn read_ca(path: &str) -> Result<String, ConfigError> {
    let bad = |why: String| invalid("PLIMSOLL_GUARD_CA_FILE", why);
    use crate::bounded_read::{Unread, read_regular};
    let bytes = match read_regular(std::path::Path::new(path), MAX_CA_BYTES as u64) {
        Ok((b, _)) => b,
        Err(Unread::Io(e)) => return Err(bad(format!("{path}: {e}"))),
        Err(Unread::NotAFile) => return Err(bad(format!("{path}: not a regular file"))),
        Err(Unread::TooLarge) => return Err(bad(format!("{path}: over 64 KiB"))),
    };
    let text = String::from_utf8(bytes).map_err(|_| bad(format!("{path}: not PEM text")))?;
    if !text.contains("-----BEGIN CERTIFICATE-----") {
        return Err(bad(format!("{path}: holds no PEM certificate")));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn parse(pairs: &[(&str, &str)]) -> Result<Option<GuardSettings>, ConfigError> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        GuardSettings::from_env(&Env::new(&map))
    }

    #[test]
    fn off_unless_both_are_set() {
        assert!(parse(&[]).unwrap().is_none());
        assert!(parse(&[("PLIMSOLL_GUARD_ADDR", "127.0.0.1:1")]).is_err());
        assert!(parse(&[("PLIMSOLL_GUARD_URL", "https://g.example")]).is_err());
    }

    #[test]
    fn the_url_is_an_https_origin_and_names_the_egress_rule() {
        let ok = |u: &str| {
            parse(&[
                ("PLIMSOLL_GUARD_ADDR", "127.0.0.1:1"),
                ("PLIMSOLL_GUARD_URL", u),
            ])
            .map(|s| s.map(|s| (s.host, s.port)))
        };
        assert_eq!(
            ok("https://guard.example.com").unwrap(),
            Some(("guard.example.com".into(), 443))
        );
        assert_eq!(
            ok("https://203.0.113.7:8443/").unwrap(),
            Some(("203.0.113.7".into(), 8443))
        );
        for bad in [
            "http://guard.example.com",
            "https://u:p@guard.example.com",
            "https://guard.example.com/v1",
            "https://guard.example.com/?a=1",
            "https://[::1]:443",
            "https://guard.example.com:0",
            "guard.example.com",
        ] {
            assert!(ok(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn beyond_loopback_it_needs_tls() {
        let got = parse(&[
            ("PLIMSOLL_GUARD_ADDR", "0.0.0.0:8747"),
            ("PLIMSOLL_GUARD_URL", "https://guard.example.com"),
        ]);
        assert!(got.is_err());
    }
}
