//! The configured store, built once at start: its counters go to the
//! quotas, and a shared store also to the replicas, which keep their
//! session holders and nonces in it.

use std::sync::Arc;

use super::StateSettings;
use super::counters::Counters;
use super::embedded::Embedded;
use super::paid_file::PaidFile;
use super::redis_store::RedisStore;

/// The configured store, built once.
pub struct Opened {
    pub counters: Arc<dyn Counters>,
    /// The store the replicas share, when there is one.
    pub shared: Option<Arc<RedisStore>>,
}

/// Opens the configured store. The embedded store keeps a file only on a
/// metered provider (nothing else it counts outlives a restart); a shared
/// store connects on first use.
pub fn open(state: &StateSettings, metered: bool) -> Result<Opened, String> {
    Ok(match state {
        StateSettings::Embedded { dir } if metered => {
            let file = PaidFile::open(dir)
                .map_err(|e| format!("PLIMSOLL_STATE_DIR {}: {e}", dir.display()))?;
            let embedded = Embedded::with_file(file)
                .map_err(|e| format!("PLIMSOLL_STATE_DIR {}: {e}", dir.display()))?;
            Opened {
                counters: embedded,
                shared: None,
            }
        }
        StateSettings::Embedded { .. } => Opened {
            counters: Embedded::in_memory(),
            shared: None,
        },
        StateSettings::Redis { url, lease } => {
            let store = RedisStore::connect(url, *lease)?;
            Opened {
                counters: store.clone(),
                shared: Some(store),
            }
        }
    })
}
