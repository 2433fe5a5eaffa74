//! One open session, as the registry keeps it.
//!
//! Two locks, with different jobs. The *turn* (an async mutex) is held for
//! a whole call: calls run one at a time in the order they took it, so the
//! chain numbers them as they ran, and whatever holds the turn owns the
//! sandbox. The *status* (a plain mutex, never held across an await) is
//! what the registry and the reaper read without waiting for a call: the
//! end, when the session was last used, its place in the LRU order.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard, OwnedSemaphorePermit};

use crate::job::Ended;
use crate::metrics::Metrics;
use crate::providers::{Evidence, ProviderSession, SessionOffer};
use crate::quota::{SessionPlace, Slot};
use crate::replicas::HolderRecord;
use crate::tier::Tier;
use crate::wire::{SessionEnd, SoftwareRule};

/// The chain a session's records form: the calls that may have executed,
/// answered or not, and the last record's digest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    pub calls: u64,
    pub last: String,
}

/// What an open session holds of the daemon's capacity, given back when
/// its sandbox is closed.
pub struct Holds {
    pub daemon_slot: OwnedSemaphorePermit,
    /// The caller's place, with the paid seconds booked at open (the whole
    /// lifetime) on a metered provider, settled against the session's real
    /// life at the end.
    pub caller_slot: Slot,
    /// The caller's session place across the fleet, with a shared store.
    pub fleet_place: Option<SessionPlace>,
    /// The session's place among its owner's, with replicas: it keeps the
    /// owner's sessions on this replica while it lives.
    pub owner_place: Option<SessionPlace>,
}

impl Holds {
    /// Gives back the paid seconds booked at open beyond `lived` (rounded
    /// up to whole seconds by the slot); the slots go back when `self`
    /// drops.
    pub async fn settle(self, lived: Duration) {
        self.caller_slot.settle(lived).await;
        if let Some(p) = self.fleet_place {
            p.give_back().await;
        }
        if let Some(p) = self.owner_place {
            p.give_back().await;
        }
    }
}

/// What the turn guards: the chain and the sandbox.
pub struct Turn {
    pub chain: Chain,
    /// `None` once the sandbox is closed.
    pub sandbox: Option<Box<dyn ProviderSession>>,
    holds: Option<Holds>,
    /// The record naming this replica as the session's holder, with
    /// replicas. Not among the holds: it outlives the sandbox while this
    /// replica still answers for a session that ended by itself (its
    /// summary, until collected or dropped), and goes when nobody can
    /// reach the session through it any more (dropped with the entry at
    /// the latest).
    holder: Option<HolderRecord>,
}

#[derive(Debug, Clone)]
struct Status {
    ended: Option<Ended>,
    ended_at: Option<Instant>,
    last_active: Instant,
    /// The registry's clock when the session was opened or last finished
    /// a call: the per-owner cap replaces the smallest.
    used_tick: u64,
}

pub struct Entry {
    /// SHA-256 of the session ID: the only name logs, metrics and records
    /// carry. The ID itself is not kept.
    pub fingerprint: String,
    pub caller: String,
    /// The owner digest the client sent, if any.
    pub owner: Option<String>,
    /// The evidence that held when the session opened: every call runs
    /// under it, or not at all.
    pub evidence: Evidence,
    pub floor: Option<Tier>,
    pub rule: Option<SoftwareRule>,
    pub offer: SessionOffer,
    pub opened: Instant,
    pub expires_at: Instant,
    pub expires_unix_ms: i64,
    /// Zero: the session never idles out.
    pub idle_timeout: Duration,
    turn: Arc<AsyncMutex<Turn>>,
    waiting: AtomicU32,
    status: Mutex<Status>,
}

/// The parts of an entry fixed at open.
pub struct Opened {
    pub fingerprint: String,
    pub caller: String,
    pub owner: Option<String>,
    pub evidence: Evidence,
    pub floor: Option<Tier>,
    pub rule: Option<SoftwareRule>,
    pub offer: SessionOffer,
    pub lifetime: Duration,
    pub expires_unix_ms: i64,
    pub idle_timeout: Duration,
    /// The session's holder record, when replicas share sessions; written
    /// before the entry is committed, so that every end finds it.
    pub holder: Option<HolderRecord>,
}

impl Entry {
    pub fn new(
        o: Opened,
        sandbox: Box<dyn ProviderSession>,
        holds: Holds,
        tick: u64,
    ) -> Arc<Entry> {
        let now = Instant::now();
        Arc::new(Entry {
            fingerprint: o.fingerprint,
            caller: o.caller,
            owner: o.owner,
            evidence: o.evidence,
            floor: o.floor,
            rule: o.rule,
            offer: o.offer,
            opened: now,
            expires_at: now + o.lifetime,
            expires_unix_ms: o.expires_unix_ms,
            idle_timeout: o.idle_timeout,
            turn: Arc::new(AsyncMutex::new(Turn {
                chain: Chain::default(),
                sandbox: Some(sandbox),
                holds: Some(holds),
                holder: o.holder,
            })),
            waiting: AtomicU32::new(0),
            status: Mutex::new(Status {
                ended: None,
                ended_at: None,
                last_active: now,
                used_tick: tick,
            }),
        })
    }

    fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        // A panic while holding this plain mutex cannot leave it torn (every
        // write is a single assignment), so a poisoned lock is still read.
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How the session ended, once it has.
    pub fn ended(&self) -> Option<Ended> {
        self.status().ended.clone()
    }

    /// Marks the session ended; the first end wins. True if this call
    /// ended it.
    pub fn mark_ended(&self, reason: SessionEnd, detail: impl Into<String>) -> bool {
        let mut s = self.status();
        if s.ended.is_some() {
            return false;
        }
        s.ended = Some(Ended {
            reason,
            detail: detail.into(),
        });
        s.ended_at = Some(Instant::now());
        true
    }

    /// When the session ended, for the tombstone's expiry.
    pub fn ended_at(&self) -> Option<Instant> {
        self.status().ended_at
    }

    /// A call finished (answered or not): the idle clock and the LRU order
    /// move on. A refused call moves neither.
    pub fn touch(&self, tick: u64) {
        let mut s = self.status();
        s.last_active = Instant::now();
        s.used_tick = tick;
    }

    pub fn used_tick(&self) -> u64 {
        self.status().used_tick
    }

    pub fn idle_for(&self) -> Duration {
        self.status().last_active.elapsed()
    }

    /// Takes the turn now, or `None` if a call (or a close) holds it.
    pub fn try_turn(&self) -> Option<OwnedMutexGuard<Turn>> {
        self.turn.clone().try_lock_owned().ok()
    }

    /// Waits for the turn. At most one call waits behind the one running:
    /// a second waiter is refused at once (`None`), so callers racing on
    /// one session cannot queue unbounded work behind it.
    pub async fn wait_turn(&self) -> Option<OwnedMutexGuard<Turn>> {
        if let Some(t) = self.try_turn() {
            return Some(t);
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= 1 {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        struct Waiting<'a>(&'a AtomicU32);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _w = Waiting(&self.waiting);
        Some(self.turn.clone().lock_owned().await)
    }

    /// Waits for the turn however many wait (a close, the reaper, shutdown:
    /// the daemon's own ends, which must not be refused).
    pub async fn turn(&self) -> OwnedMutexGuard<Turn> {
        self.turn.clone().lock_owned().await
    }
}

impl Turn {
    /// The caller's fleet-wide session place, taken out of what the
    /// session holds: an open that replaces this session inherits it, so
    /// no other open can take it in between.
    pub fn take_fleet_place(&mut self) -> Option<SessionPlace> {
        self.holds.as_mut().and_then(|h| h.fleet_place.take())
    }

    /// Deletes the session's holder record now, if this replica wrote one:
    /// the session is closed and its summary collected, or the replica is
    /// stopping.
    pub async fn delete_holder(&mut self) {
        if let Some(h) = self.holder.take() {
            h.delete().await;
        }
    }

    /// Closes the sandbox and gives back what the session held, once. The
    /// caller holds the turn, so no call is running in the sandbox. Every
    /// end of a session comes through here, and so does what becomes of
    /// its holder record.
    pub async fn finish(&mut self, entry: &Entry, metrics: &Metrics) {
        if let Some(sandbox) = self.sandbox.take() {
            sandbox.close().await;
        }
        if let Some(h) = self.holds.take() {
            h.settle(entry.opened.elapsed()).await;
            let reason = entry.ended().map_or(SessionEnd::Closed, |e| e.reason);
            match reason {
                // Nobody will reach this session through another replica
                // again: its caller closed it (the close collects its
                // summary here and now), its caller left before it had the
                // ID, or this replica is stopping and takes it along.
                SessionEnd::Closed | SessionEnd::Shutdown => self.delete_holder().await,
                // It ended by itself (its time, its sandbox, a newer
                // session of its owner): this replica keeps its summary
                // for the tombstone's time so its caller's close can still
                // collect it, through any replica while the record lasts;
                // the record lasts no longer than that.
                _ => {
                    if let Some(r) = &self.holder {
                        r.expire_within(super::reaper::TOMBSTONE_TTL).await;
                    }
                }
            }
            metrics.sessions_open.dec();
            metrics
                .sessions_ended
                .with_label_values(&[reason.label()])
                .inc();
            tracing::info!(
                target: "plimsoll::audit",
                op = "session_end",
                caller = entry.caller.as_str(),
                session = entry.fingerprint.as_str(),
                sandbox = entry.evidence.sandbox.as_str(),
                calls = self.chain.calls,
                end = reason.label(),
                lived_ms = entry.opened.elapsed().as_millis() as u64,
                "session ended"
            );
        }
    }
}
