//! The reaper: ends sessions past their lifetime or idle timeout, and
//! sessions whose sandbox ended by itself, and frees what they hold. An
//! ended session stays collectable for `TOMBSTONE_TTL`, so its caller's
//! CloseSession still gets the final count of calls and the last record.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::OwnedMutexGuard;

use super::{Entry, Registry, Turn};
use crate::metrics::Metrics;
use crate::wire::SessionEnd;

/// How long a session that ended without being closed stays collectable.
/// It only has to outlast the gap between the end and a running client's
/// close; the caps bound how many can pile up meanwhile.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(600);
/// How often the reaper looks. An expiry is late by at most this.
const EVERY: Duration = Duration::from_millis(250);

/// Ends `entry` for `reason` if nothing ended it first, then closes its
/// sandbox once the turn is free (a call in progress finishes first; its
/// own deadline bounds the wait). True if this ended it.
pub fn end(
    entry: &Arc<Entry>,
    reason: SessionEnd,
    detail: impl Into<String>,
    metrics: &Arc<Metrics>,
    turn: Option<OwnedMutexGuard<Turn>>,
) -> bool {
    if !entry.mark_ended(reason, detail) {
        return false;
    }
    let (entry, metrics) = (entry.clone(), metrics.clone());
    tokio::spawn(async move {
        let mut turn = match turn {
            Some(t) => t,
            None => entry.turn().await,
        };
        turn.finish(&entry, &metrics).await;
    });
    true
}

/// Runs the reaper for the daemon's life.
pub fn spawn(registry: Arc<Registry>, metrics: Arc<Metrics>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            sweep(&registry, &metrics, Instant::now());
        }
    })
}

/// One look at every session.
pub fn sweep(registry: &Registry, metrics: &Arc<Metrics>, now: Instant) {
    for e in registry.all() {
        if let Some(at) = e.ended_at() {
            if now.saturating_duration_since(at) >= TOMBSTONE_TTL {
                // Its holder record, if one is left, is deleted as the
                // entry drops (its expiry was cut to this moment at the end).
                registry.remove(&e.fingerprint);
            }
            continue;
        }
        if now >= e.expires_at {
            end(
                &e,
                SessionEnd::Expired,
                "the session reached the end of its lifetime",
                metrics,
                None,
            );
            continue;
        }
        // Only a session with no call running or waiting can be idle, and
        // taking its turn here means none can start while it ends.
        let Some(turn) = e.try_turn() else { continue };
        if !e.idle_timeout.is_zero() && e.idle_for() >= e.idle_timeout {
            let detail = format!(
                "the session had no call for its idle timeout of {} ms",
                e.idle_timeout.as_millis()
            );
            end(&e, SessionEnd::Expired, detail, metrics, Some(turn));
            continue;
        }
        if let Some(ended) = turn.sandbox.as_ref().and_then(|s| s.ended()) {
            end(&e, ended.reason, ended.detail, metrics, Some(turn));
        }
    }
}
