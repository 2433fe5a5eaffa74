//! The one interface the per-caller limits are counted through.
//!
//! `quota::Quotas` asks a `Counters` and never which store it is; each store
//! implements it beside its own code (`embedded.rs`, `redis_store.rs`), and
//! `opened.rs` builds the configured one.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::{Ask, Booked};
use crate::limits::{QuotaSettings, Shed};
use crate::outcome::NotReady;

/// Where the per-caller counts are kept.
pub trait Counters: Send + Sync {
    /// Which store counts, for the start-up log line.
    fn label(&self) -> &'static str;

    /// Whether asking costs a round trip to another process; such a store
    /// is not asked at all when no limit is configured.
    fn remote(&self) -> bool;

    /// Checks every limit and books the run, as one atomic step.
    fn admit<'a>(
        self: Arc<Self>,
        settings: &'a QuotaSettings,
        ask: &'a Ask<'a>,
    ) -> BoxFuture<'a, Result<Booked, Shed>>;

    /// Makes the paid seconds booked so far durable, before a run that
    /// booked some is dispatched; an error refuses that run.
    fn persist(self: Arc<Self>) -> BoxFuture<'static, Result<(), String>>;

    /// Charges the rate bucket only (a session call).
    fn charge<'a>(
        &'a self,
        settings: &'a QuotaSettings,
        caller: &'a str,
    ) -> BoxFuture<'a, Result<(), Shed>>;

    /// Gives back a booking's place and `refund` of its paid seconds.
    fn release<'a>(
        self: Arc<Self>,
        caller: &'a str,
        booked: &'a Booked,
        refund: u64,
    ) -> BoxFuture<'a, ()>;

    /// A booking dropped unsettled (a run task that panicked): its place
    /// given back without waiting, its paid seconds kept.
    fn abandon(self: Arc<Self>, caller: String, booked: Booked);

    /// Whether runs can be counted now.
    fn check_ready(&self) -> BoxFuture<'_, Result<(), NotReady>>;

    /// Paid seconds counted today, (caller, daemon), where this process
    /// holds them.
    fn paid_today(&self, _caller: &str) -> Option<(u64, u64)> {
        None
    }
}
