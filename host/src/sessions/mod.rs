//! Sessions: the registry of open sessions, their caps, and the reaper.
//!
//! A session ID is a capability: 128 random bits, handed to the caller once
//! and never kept. The registry keys sessions by the ID's SHA-256 (the
//! `session` fingerprint records carry), so a lookup hashes what was
//! presented and nothing compares secrets. A session belongs to the caller
//! that opened it; an unknown ID and another caller's ID get one answer.
//!
//! Places are reserved before a sandbox is created, under one lock that
//! counts open sessions and opens under way, so two opens cannot both take
//! the last place. At the per-owner cap the owner's least recently used
//! session whose turn is free is replaced: marked ended while its turn is
//! held, so no call can slip in between the choice and the end.

mod entry;
pub mod reaper;
pub mod settings;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tokio::sync::OwnedMutexGuard;

pub use entry::{Chain, Entry, Holds, Opened, Turn};
pub use settings::SessionSettings;

use crate::wire::SessionEnd;

/// The SHA-256 of a session ID, as records carry it.
pub fn fingerprint(id: &str) -> String {
    hex::encode(Sha256::digest(id.as_bytes()))
}

/// A fresh session ID: 16 random bytes, hex.
pub fn new_id() -> Result<String, getrandom::Error> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b)?;
    Ok(hex::encode(b))
}

/// An owner as clients send it: their HMAC digest, or any short name in
/// the characters a digest or an ID uses.
pub fn valid_owner(owner: &str) -> bool {
    !owner.is_empty()
        && owner.len() <= 64
        && owner
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

/// Which cap refused an open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    Daemon(u32),
    Caller(u32),
    /// The owner is at its cap and every one of its sessions has a call in
    /// progress: none can be replaced.
    Owner(u32),
    /// The daemon is stopping: no session opens any more.
    Stopping,
}

impl Full {
    pub fn text(self) -> String {
        match self {
            Full::Daemon(n) => format!("{n} sessions are open, the most this daemon keeps"),
            Full::Caller(n) => format!("this caller holds {n} open sessions, the most it may"),
            Full::Owner(n) => format!(
                "this owner holds {n} open sessions, the most it may, and each has a call in progress"
            ),
            Full::Stopping => "the daemon is shutting down".to_string(),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Full::Daemon(_) => "sessions",
            Full::Caller(_) => "sessions_per_caller",
            Full::Owner(_) => "sessions_per_owner",
            // Never counted: stopping is not a limit.
            Full::Stopping => "stopping",
        }
    }
}

#[derive(Default)]
struct Places {
    by_fingerprint: HashMap<String, Arc<Entry>>,
    /// Opens under way, counted against every cap until they finish.
    opening: Vec<(String, Option<String>)>,
    /// Set when the daemon starts to stop: nothing more is reserved, so
    /// once the opens under way have finished, `all` holds every session
    /// the stop has to end.
    closed: bool,
}

impl Places {
    fn live(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.by_fingerprint.values().filter(|e| e.ended().is_none())
    }

    fn opening_for(&self, caller: &str, owner: Option<&str>) -> usize {
        self.opening
            .iter()
            .filter(|(c, o)| c == caller && (owner.is_none() || o.as_deref() == owner))
            .count()
    }
}

pub struct Registry {
    pub settings: SessionSettings,
    places: Mutex<Places>,
    /// Ticks at every open and every finished call: the LRU order.
    clock: AtomicU64,
}

/// A place for an open under way; given back if dropped uncommitted.
pub struct Reservation {
    registry: Arc<Registry>,
    key: Option<(String, Option<String>)>,
    /// Sessions of the same owner replaced to make room, with their turns
    /// held: the open closes them once it is admitted.
    pub replaced: Vec<(Arc<Entry>, OwnedMutexGuard<Turn>)>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let mut p = self.registry.places();
            if let Some(i) = p.opening.iter().position(|k| *k == key) {
                p.opening.swap_remove(i);
            }
        }
    }
}

impl Registry {
    pub fn new(settings: SessionSettings) -> Arc<Registry> {
        Arc::new(Registry {
            settings,
            places: Mutex::new(Places::default()),
            clock: AtomicU64::new(0),
        })
    }

    fn places(&self) -> std::sync::MutexGuard<'_, Places> {
        self.places.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Reserves a place for `caller` (and `owner`), replacing the owner's
    /// least recently used idle sessions if the per-owner cap requires it.
    pub fn reserve(
        self: &Arc<Self>,
        caller: &str,
        owner: Option<&str>,
    ) -> Result<Reservation, Full> {
        let s = &self.settings;
        let mut p = self.places();
        if p.closed {
            return Err(Full::Stopping);
        }
        let mut replaced = Vec::new();
        if let Some(owner) = owner
            && s.max_per_owner > 0
        {
            let mine: Vec<&Arc<Entry>> = p
                .live()
                .filter(|e| e.caller == caller && e.owner.as_deref() == Some(owner))
                .collect();
            let held = mine.len() + p.opening_for(caller, Some(owner));
            let need = (held + 1).saturating_sub(s.max_per_owner as usize);
            if need > 0 {
                let mut candidates = mine;
                candidates.sort_by_key(|e| e.used_tick());
                for e in candidates {
                    if replaced.len() == need {
                        break;
                    }
                    // A free turn means no call is running or waiting to
                    // run; holding it, the end below cannot race a call.
                    if let Some(turn) = e.try_turn() {
                        replaced.push((e.clone(), turn));
                    }
                }
                if replaced.len() < need {
                    return Err(Full::Owner(s.max_per_owner));
                }
            }
        }
        let freed = replaced.len();
        let live_total = p.live().count() + p.opening.len() - freed;
        if live_total >= s.max_sessions as usize {
            return Err(Full::Daemon(s.max_sessions));
        }
        if s.max_per_caller > 0 {
            let mine = p.live().filter(|e| e.caller == caller).count()
                + p.opening_for(caller, None)
                - freed;
            if mine >= s.max_per_caller as usize {
                return Err(Full::Caller(s.max_per_caller));
            }
        }
        for (e, _) in &replaced {
            e.mark_ended(
                SessionEnd::Replaced,
                "the daemon closed it for a newer session of the same owner",
            );
        }
        let key = (caller.to_string(), owner.map(str::to_string));
        p.opening.push(key.clone());
        Ok(Reservation {
            registry: self.clone(),
            key: Some(key),
            replaced,
        })
    }

    /// Turns a reservation into the open session it was for.
    pub fn commit(&self, mut r: Reservation, entry: Arc<Entry>) {
        let mut p = self.places();
        if let Some(key) = r.key.take()
            && let Some(i) = p.opening.iter().position(|k| *k == key)
        {
            p.opening.swap_remove(i);
        }
        p.by_fingerprint.insert(entry.fingerprint.clone(), entry);
    }

    /// The caller's session named by `id`, ended or not.
    pub fn get(&self, id: &str, caller: &str) -> Option<Arc<Entry>> {
        let fp = fingerprint(id);
        self.places()
            .by_fingerprint
            .get(&fp)
            .filter(|e| e.caller == caller)
            .cloned()
    }

    pub fn remove(&self, fingerprint: &str) {
        self.places().by_fingerprint.remove(fingerprint);
    }

    /// Refuses every later reservation (the daemon is stopping).
    pub fn close(&self) {
        self.places().closed = true;
    }

    /// Whether `close` has been called.
    pub fn is_closed(&self) -> bool {
        self.places().closed
    }

    /// Opens reserved and not yet committed or given back.
    pub fn opening(&self) -> usize {
        self.places().opening.len()
    }

    /// Every session the registry holds, ended or not.
    pub fn all(&self) -> Vec<Arc<Entry>> {
        self.places().by_fingerprint.values().cloned().collect()
    }

    pub fn open_count(&self) -> usize {
        self.places().live().count()
    }
}

#[cfg(test)]
mod tests;
