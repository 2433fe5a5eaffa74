//! The one interface the per-caller limits are counted through.
//!
//! `quota::Quotas` asks a `Counters` and never which store it is. The two
//! stores' implementations are here, each a thin face over the store's own
//! methods (`embedded.rs`, `redis_store.rs`); `opened.rs` builds the
//! configured one.

use std::sync::Arc;

use futures_util::future::{BoxFuture, ready};

use super::embedded::Embedded;
use super::redis_store::RedisStore;
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
    fn persist(self: Arc<Self>) -> BoxFuture<'static, std::io::Result<()>>;

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

impl Counters for Embedded {
    fn label(&self) -> &'static str {
        "embedded"
    }

    fn remote(&self) -> bool {
        false
    }

    fn admit<'a>(
        self: Arc<Self>,
        settings: &'a QuotaSettings,
        ask: &'a Ask<'a>,
    ) -> BoxFuture<'a, Result<Booked, Shed>> {
        Box::pin(ready(Embedded::admit(&self, settings, ask)))
    }

    fn persist(self: Arc<Self>) -> BoxFuture<'static, std::io::Result<()>> {
        Box::pin(async move { Embedded::persist(&self).await })
    }

    fn charge<'a>(
        &'a self,
        settings: &'a QuotaSettings,
        caller: &'a str,
    ) -> BoxFuture<'a, Result<(), Shed>> {
        Box::pin(ready(Embedded::charge(self, settings, caller)))
    }

    fn release<'a>(
        self: Arc<Self>,
        caller: &'a str,
        booked: &'a Booked,
        refund: u64,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            Embedded::release(&self, caller, booked, refund);
            if refund > 0
                && let Err(err) = Embedded::persist(&self).await
            {
                // The refund is lost on a restart: the caller keeps having
                // used more, never less.
                tracing::warn!(error = %err, "the paid seconds' file could not take a refund");
            }
        })
    }

    fn abandon(self: Arc<Self>, caller: String, booked: Booked) {
        Embedded::release(&self, &caller, &booked, 0);
    }

    fn check_ready(&self) -> BoxFuture<'_, Result<(), NotReady>> {
        Box::pin(ready(Ok(())))
    }

    fn paid_today(&self, caller: &str) -> Option<(u64, u64)> {
        Some(Embedded::paid_today(self, caller))
    }
}

impl Counters for RedisStore {
    fn label(&self) -> &'static str {
        "redis"
    }

    fn remote(&self) -> bool {
        true
    }

    fn admit<'a>(
        self: Arc<Self>,
        settings: &'a QuotaSettings,
        ask: &'a Ask<'a>,
    ) -> BoxFuture<'a, Result<Booked, Shed>> {
        Box::pin(async move { RedisStore::admit(&self, settings, ask).await })
    }

    /// Each booking is in the store once the script answers.
    fn persist(self: Arc<Self>) -> BoxFuture<'static, std::io::Result<()>> {
        Box::pin(async { Ok(()) })
    }

    fn charge<'a>(
        &'a self,
        settings: &'a QuotaSettings,
        caller: &'a str,
    ) -> BoxFuture<'a, Result<(), Shed>> {
        Box::pin(RedisStore::charge(self, settings, caller))
    }

    fn release<'a>(
        self: Arc<Self>,
        caller: &'a str,
        booked: &'a Booked,
        refund: u64,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move { RedisStore::release(&self, caller, booked, refund).await })
    }

    fn abandon(self: Arc<Self>, caller: String, booked: Booked) {
        // Not renewed from here on; without a runtime to tell the store,
        // the lease expires.
        self.forget(&booked);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { RedisStore::release(&self, &caller, &booked, 0).await });
        }
    }

    fn check_ready(&self) -> BoxFuture<'_, Result<(), NotReady>> {
        Box::pin(async move {
            self.ping()
                .await
                .map_err(|e| NotReady::new("state_store_unreachable", e.to_string()))
        })
    }
}
