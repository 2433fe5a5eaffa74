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
        Ok(ListenerSettings {
            addr,
            tls,
            metrics_addr,
        })
    }
}
