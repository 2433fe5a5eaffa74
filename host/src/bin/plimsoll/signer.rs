//! The signer `plimsoll attest run` and `plimsoll run --bundle` share: a
//! bundle and the key that signs runs into it, both checked before a run
//! is sent.

use std::path::{Path, PathBuf};

use clap::Args;

use plimsoll::attest::bundle::{self, Appender, Durability, Sharing};
use plimsoll::attest::keys::SigningKey;
use serde_json::Value;

/// Where a signing key may come from instead of a file: its PEM text.
const KEY_VAR: &str = "PLIMSOLL_ATTEST_KEY";

/// Where `plimsoll attest run` and `attest session` sign to, and with what.
#[derive(Args)]
pub struct SignerArgs {
    /// The bundle to append to (created owner-only if absent).
    #[arg(long)]
    pub bundle: PathBuf,
    /// The signing key (default: the PEM text in PLIMSOLL_ATTEST_KEY).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Accept a bundle others may read.
    #[arg(long)]
    pub shared_bundle: bool,
    /// The daemon (default PLIMSOLL_URL, else http://127.0.0.1:8746); the
    /// caller's token is read from PLIMSOLL_TOKEN.
    #[arg(long)]
    pub url: Option<String>,
}

/// A bundle and the key that signs runs into it, checked before any run is
/// sent (`plimsoll attest run`, and `plimsoll run --bundle`).
pub struct Signer {
    bundle: PathBuf,
    key: SigningKey,
    sharing: Sharing,
}

impl Signer {
    pub fn new(bundle: PathBuf, key: Option<&Path>, shared: bool) -> Result<Signer, String> {
        let signer = Signer {
            bundle,
            key: signing_key(key)?,
            sharing: if shared {
                Sharing::Shared
            } else {
                Sharing::Private
            },
        };
        // A bundle that exists is checked now, before the run is sent: one
        // this signer would refuse to extend refuses the run instead of
        // letting it happen unrecorded. (The append checks again.)
        if std::fs::symlink_metadata(&signer.bundle).is_ok() {
            Appender::open(
                &signer.bundle,
                &signer.key,
                signer.sharing,
                Durability::Synced,
            )
            .map_err(|e| format!("{}: {e}", signer.bundle.display()))?;
        }
        Ok(signer)
    }

    /// Appends the run, if its record checks against the request.
    pub fn record(&self, request: &Value, answer: &Value) -> Result<(), String> {
        bundle::append_run(&self.bundle, &self.key, self.sharing, request, answer)
            .map_err(|e| format!("not recorded: {e}"))
    }
}

/// The signing key: the file given, or the PEM text in PLIMSOLL_ATTEST_KEY.
pub fn signing_key(file: Option<&Path>) -> Result<SigningKey, String> {
    match file {
        Some(path) => SigningKey::load(path).map_err(|e| e.to_string()),
        None => match std::env::var(KEY_VAR) {
            Ok(pem) if !pem.is_empty() => {
                SigningKey::from_pkcs8_pem(pem.as_bytes()).map_err(|e| format!("{KEY_VAR}: {e}"))
            }
            _ => Err(format!("no signing key: give --key FILE or set {KEY_VAR}")),
        },
    }
}
