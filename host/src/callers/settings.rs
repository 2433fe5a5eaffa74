//! How callers authenticate, as the operator configures it.

use std::path::{Path, PathBuf};

use super::ClientsFile;
use crate::env_vars::{ConfigError, Env, Var, invalid, var};

pub const VARIABLES: &[Var] = &[
    var(
        "PLIMSOLL_CLIENTS_FILE",
        "(unset)",
        "callers: JSON with each caller's id, token SHA-256, scopes and optional paid_seconds_per_day (manage with `plimsoll callers`)",
    ),
    var(
        "PLIMSOLL_TOKEN",
        "(unset)",
        "one shared bearer token (at least 32 characters) when there is no clients file; the caller is `static`",
    ),
    var(
        "PLIMSOLL_INSECURE",
        "(unset)",
        "1 lets a provider that runs code start with no authentication (open development mode)",
    ),
];

/// How callers authenticate. The shared token is kept out of Debug output.
#[derive(Clone)]
pub enum Auth {
    Clients(PathBuf, ClientsFile),
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

/// Callers, and whether open mode was asked for.
#[derive(Debug, Clone)]
pub struct CallerSettings {
    pub auth: Auth,
    /// `PLIMSOLL_INSECURE=1`: open mode is what the operator means.
    pub insecure: bool,
}

impl CallerSettings {
    pub fn from_env(env: &Env) -> Result<CallerSettings, ConfigError> {
        let auth = match (env.get("PLIMSOLL_CLIENTS_FILE"), env.get("PLIMSOLL_TOKEN")) {
            (Some(path), _) => {
                let file = ClientsFile::read(Path::new(path))
                    .map_err(|why| invalid("PLIMSOLL_CLIENTS_FILE", why))?;
                if file.clients.is_empty() {
                    return Err(invalid(
                        "PLIMSOLL_CLIENTS_FILE",
                        "the file lists no callers",
                    ));
                }
                Auth::Clients(PathBuf::from(path), file)
            }
            (None, Some(token)) => {
                if !super::valid_token(token) {
                    return Err(invalid(
                        "PLIMSOLL_TOKEN",
                        "must be at least 32 visible ASCII characters",
                    ));
                }
                Auth::Shared(token.to_string())
            }
            (None, None) => Auth::Open,
        };
        let insecure = env.flag("PLIMSOLL_INSECURE")?;
        Ok(CallerSettings { auth, insecure })
    }
}
