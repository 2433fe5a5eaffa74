//! Where the daemon listens, and with which TLS material.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::env_vars::{ConfigError, Env, Var, invalid, var};

pub const VARIABLES: &[Var] = &[
    var(
        "PLIMSOLL_ADDR",
        "127.0.0.1:8746",
        "API listener (Connect, /healthz, /readyz); host:port",
    ),
    var(
        "PLIMSOLL_TLS_CERT",
        "(unset)",
        "PEM certificate chain for TLS on the API and metrics listeners (with PLIMSOLL_TLS_KEY)",
    ),
    var(
        "PLIMSOLL_TLS_KEY",
        "(unset)",
        "PEM private key for PLIMSOLL_TLS_CERT",
    ),
    var(
        "PLIMSOLL_MAX_CONNECTIONS",
        "(from the open-file limit, at most 16384)",
        "connections the API listener holds at once; at the cap, the oldest connection that carried no authenticated request is closed",
    ),
    var(
        "PLIMSOLL_MAX_CONNECTIONS_PER_PEER",
        "128",
        "connections one peer address may hold at once (same rule at the cap)",
    ),
    var(
        "PLIMSOLL_METRICS_ADDR",
        "127.0.0.1:9464",
        "the /metrics listener (host:port), or off",
    ),
];

#[derive(Debug, Clone)]
pub struct ListenerSettings {
    pub addr: SocketAddr,
    /// PEM certificate and key paths.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// None: /metrics is off.
    pub metrics_addr: Option<SocketAddr>,
    /// None: sized from the open-file limit at start.
    pub max_connections: Option<u32>,
    pub max_connections_per_peer: u32,
}

impl ListenerSettings {
    pub fn from_env(env: &Env) -> Result<ListenerSettings, ConfigError> {
        let addr = match env.get("PLIMSOLL_ADDR") {
            None => SocketAddr::from(([127, 0, 0, 1], 8746)),
            Some(s) => s.parse().map_err(|_| {
                invalid(
                    "PLIMSOLL_ADDR",
                    "must be an IP address and port, e.g. 127.0.0.1:8746",
                )
            })?,
        };
        let tls = match (env.get("PLIMSOLL_TLS_CERT"), env.get("PLIMSOLL_TLS_KEY")) {
            (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
            (None, None) => None,
            _ => {
                return Err(invalid(
                    "PLIMSOLL_TLS_CERT",
                    "PLIMSOLL_TLS_CERT and PLIMSOLL_TLS_KEY go together: set both or neither",
                ));
            }
        };
        let metrics_addr = match env.get("PLIMSOLL_METRICS_ADDR") {
            None => Some(SocketAddr::from(([127, 0, 0, 1], 9464))),
            Some("off") => None,
            Some(a) => Some(
                a.parse()
                    .map_err(|_| invalid("PLIMSOLL_METRICS_ADDR", "must be ip:port or off"))?,
            ),
        };
        let max_connections = env.u32_in("PLIMSOLL_MAX_CONNECTIONS", 16, 1 << 20)?;
        let max_connections_per_peer = env
            .u32_in("PLIMSOLL_MAX_CONNECTIONS_PER_PEER", 1, 1 << 20)?
            .unwrap_or(128);
        Ok(ListenerSettings {
            addr,
            tls,
            metrics_addr,
            max_connections,
            max_connections_per_peer,
        })
    }
}
