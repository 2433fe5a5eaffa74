//! Per-caller limits: concurrency, a token-bucket rate, and a daily
//! allowance of paid seconds on metered providers. Each one, when hit, is a
//! marked `capacity` refusal: nothing ran, and the caller may retry later.
//! The daemon-wide concurrency cap lives in `pipeline` (one semaphore);
//! where the counters are kept is `state`'s concern.

use std::sync::Arc;
use std::time::Duration;

use crate::outcome::NotReady;
use crate::state::counters::Counters;
use crate::state::embedded::Embedded;
use crate::state::opened::Opened;
use crate::state::redis_store::RedisStore;
use crate::state::{Ask, Booked};

pub use crate::limits::{QuotaSettings, Shed, VARIABLES};

pub struct Quotas {
    settings: QuotaSettings,
    counters: Arc<dyn Counters>,
    /// The store the replicas share, for the fleet's session places.
    shared: Option<Arc<RedisStore>>,
}

/// A caller's admission: its place among the runs in flight and the paid
/// seconds it booked. `settle` ends it; dropped unsettled (a run task that
/// panicked), the place is given back and the booked seconds stand.
pub struct Slot {
    quotas: Arc<Quotas>,
    caller: String,
    booked: Option<Booked>,
}

impl Slot {
    /// Ends the admission: the time `used` stands, in whole seconds rounded
    /// up, so any time at all costs a second (a run of half a millisecond
    /// is not free); the rest of the booked seconds is refunded. A run
    /// refused before it ran uses `Duration::ZERO`.
    pub async fn settle(mut self, used: Duration) {
        let Some(b) = self.booked.take() else { return };
        let used = u64::try_from(used.as_nanos().div_ceil(1_000_000_000)).unwrap_or(u64::MAX);
        let refund = b.reserved.saturating_sub(used);
        let counters = self.quotas.counters.clone();
        counters.release(&self.caller, &b, refund).await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(b) = self.booked.take() else { return };
        let counters = self.quotas.counters.clone();
        counters.abandon(std::mem::take(&mut self.caller), b);
    }
}

/// A session's place in a count the fleet shares (a shared store only):
/// among its caller's sessions, or its owner's. Given back when the
/// session ends; dropped without that, it stops being renewed and expires.
pub struct SessionPlace {
    store: Arc<RedisStore>,
    /// The sorted set the place is in.
    set: String,
    id: Option<String>,
}

impl SessionPlace {
    pub fn new(store: Arc<RedisStore>, set: String, id: String) -> SessionPlace {
        SessionPlace {
            store,
            set,
            id: Some(id),
        }
    }

    pub async fn give_back(mut self) {
        if let Some(id) = self.id.take() {
            self.store.give_back_place(&self.set, &id).await;
        }
    }
}

impl Drop for SessionPlace {
    /// Not renewed from here on; given back in the background where there
    /// is a runtime, else it expires within one lease period.
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.store.forget_place(&id);
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let (store, set) = (self.store.clone(), self.set.clone());
                rt.spawn(async move { store.give_back_place(&set, &id).await });
            }
        }
    }
}

impl Quotas {
    /// Counters in this process's memory only.
    pub fn new(settings: QuotaSettings) -> Arc<Quotas> {
        Quotas::with(
            settings,
            Opened {
                counters: Embedded::in_memory(),
                shared: None,
            },
        )
    }

    /// Counters in a store opened at start (`state::counters::open`).
    pub fn with(settings: QuotaSettings, store: Opened) -> Arc<Quotas> {
        Arc::new(Quotas {
            settings,
            counters: store.counters,
            shared: store.shared,
        })
    }

    /// Whether any limit is configured: with none, a shared store is not
    /// asked at all.
    fn counts_anything(&self) -> bool {
        let s = &self.settings;
        s.per_caller_concurrency > 0 || s.rate_per_min > 0 || s.metered
    }

    /// Takes a concurrency place and charges the rate bucket, or says which
    /// limit refused. On a metered provider, `reserve` paid seconds (the
    /// run's whole budget) are booked now, so concurrent runs cannot
    /// together overshoot an allowance by more than one budget; `settle`
    /// refunds what the run did not use.
    ///
    /// The admission runs to its end in a task of its own: a caller that
    /// stops waiting (a client gone mid-request) cannot leave a booking
    /// made and never given back; the slot it would have had is dropped,
    /// which gives the place back.
    pub async fn admit(
        self: &Arc<Self>,
        caller: &str,
        paid_allowance: Option<u64>,
        reserve: u64,
    ) -> Result<Slot, Shed> {
        let (me, caller) = (self.clone(), caller.to_string());
        tokio::spawn(async move { me.admit_to_end(caller, paid_allowance, reserve).await })
            .await
            .unwrap_or(Err(Shed::StoreUnavailable))
    }

    async fn admit_to_end(
        self: Arc<Self>,
        caller: String,
        paid_allowance: Option<u64>,
        reserve: u64,
    ) -> Result<Slot, Shed> {
        let ask = Ask {
            caller: &caller,
            paid_allowance,
            reserve,
        };
        let booked = if self.counters.remote() && !self.counts_anything() {
            Booked {
                id: None,
                leased: false,
                day: 0,
                reserved: 0,
            }
        } else {
            self.counters.clone().admit(&self.settings, &ask).await?
        };
        let slot = Slot {
            quotas: self.clone(),
            caller: caller.clone(),
            booked: Some(booked),
        };
        // The booking is durable (the embedded store's file) before the
        // run is dispatched; if it cannot be, the run is refused and
        // refunded.
        if slot.booked.as_ref().is_some_and(|b| b.reserved > 0)
            && let Err(err) = self.counters.clone().persist().await
        {
            tracing::error!(error = %err, "the paid seconds' file could not be written; the run is refused");
            slot.settle(Duration::ZERO).await;
            return Err(Shed::StoreUnavailable);
        }
        Ok(slot)
    }

    /// Charges one run to the caller's rate, and nothing else: a session
    /// call, whose session already holds the caller's concurrency slot and
    /// its paid seconds.
    pub async fn charge(&self, caller: &str) -> Result<(), Shed> {
        self.counters.charge(&self.settings, caller).await
    }

    /// Whether runs can be counted: a shared store must answer.
    pub async fn check_ready(&self) -> Result<(), NotReady> {
        self.counters.check_ready().await
    }

    /// With a shared store, one of the caller's `cap` session places across
    /// every replica (each replica's own registry still applies its caps
    /// locally). `Ok(None)`: no shared store or no cap; `Err(None)`: the
    /// caller is at the cap; `Err(Some(shed))`: the store did not answer.
    pub async fn take_session_place(
        &self,
        caller: &str,
        cap: u32,
    ) -> Result<Option<SessionPlace>, Option<Shed>> {
        let Some(r) = &self.shared else {
            return Ok(None);
        };
        if cap == 0 {
            return Ok(None);
        }
        // To its end in a task of its own, as an admission, and made a
        // `SessionPlace` there: an opener who leaves cannot strand a place
        // the store gave (the task's result is dropped, which gives it
        // back).
        let (r2, who) = (r.clone(), caller.to_string());
        let taken = tokio::spawn(async move {
            r2.take_session_place(&who, cap)
                .await
                .map(|p| p.map(|(set, id)| SessionPlace::new(r2.clone(), set, id)))
        })
        .await
        .unwrap_or(Err(Shed::StoreUnavailable));
        match taken {
            Ok(Some(place)) => Ok(Some(place)),
            Ok(None) => Err(None),
            Err(shed) => Err(Some(shed)),
        }
    }

    /// Which store counts, for the start-up log line.
    pub fn store_label(&self) -> &'static str {
        self.counters.label()
    }

    /// Paid seconds counted today in the embedded store, (caller, daemon).
    pub fn embedded_paid_today(&self, caller: &str) -> Option<(u64, u64)> {
        self.counters.paid_today(caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn per_caller_concurrency_is_exact_and_released() {
        let q = Quotas::new(QuotaSettings {
            per_caller_concurrency: 2,
            ..Default::default()
        });
        let a = q.admit("a", None, 0).await.expect("1");
        let _b = q.admit("a", None, 0).await.expect("2");
        assert_eq!(q.admit("a", None, 0).await.err(), Some(Shed::PerKey));
        assert!(
            q.admit("b", None, 0).await.is_ok(),
            "another caller is not affected"
        );
        drop(a);
        assert!(q.admit("a", None, 0).await.is_ok());
    }

    #[tokio::test]
    async fn the_bucket_allows_the_burst_then_refuses() {
        let q = Quotas::new(QuotaSettings {
            rate_per_min: 60,
            burst: 3,
            ..Default::default()
        });
        for _ in 0..3 {
            drop(q.admit("a", None, 0).await.expect("burst"));
        }
        assert_eq!(q.admit("a", None, 0).await.err(), Some(Shed::Rate));
        assert!(q.admit("b", None, 0).await.is_ok());
    }

    #[tokio::test]
    async fn paid_seconds_are_counted_per_caller_and_daemon() {
        let q = Quotas::new(QuotaSettings {
            metered: true,
            daemon_paid_seconds_per_day: 10,
            ..Default::default()
        });
        // Reserved at admission: a second concurrent run sees the first's
        // whole budget as spent.
        let first = q.admit("a", Some(5), 5).await.expect("fresh");
        assert_eq!(q.admit("a", Some(5), 5).await.err(), Some(Shed::PaidCaller));
        // Refunded to 1 used: there is allowance again.
        first.settle(Duration::from_secs(1)).await;
        q.admit("a", Some(5), 4)
            .await
            .expect("refunded")
            .settle(Duration::from_secs(4))
            .await;
        assert_eq!(q.admit("a", Some(5), 1).await.err(), Some(Shed::PaidCaller));
        q.admit("b", None, 5)
            .await
            .expect("b has no allowance of its own")
            .settle(Duration::from_secs(5))
            .await;
        assert_eq!(q.admit("c", None, 1).await.err(), Some(Shed::PaidDaemon));
    }

    /// A run over in under a millisecond was free: its caller counted its
    /// time in whole milliseconds before rounding to seconds, so 0.5 ms
    /// became 0 s and the whole reservation was refunded (the embedded
    /// store's restart test let a third run through a 2 s allowance, now
    /// and then). Any time at all costs a second.
    #[tokio::test]
    async fn any_time_at_all_costs_a_paid_second() {
        let metered = || {
            Quotas::new(QuotaSettings {
                metered: true,
                ..Default::default()
            })
        };
        for (used, paid) in [
            (Duration::from_micros(500), 1),
            (Duration::from_millis(1000), 1),
            (Duration::from_millis(1001), 2),
        ] {
            let q = metered();
            q.admit("a", Some(10), 5)
                .await
                .expect("fresh")
                .settle(used)
                .await;
            assert_eq!(q.embedded_paid_today("a"), Some((paid, paid)), "{used:?}");
        }
        let q = metered();
        q.admit("a", Some(10), 5)
            .await
            .expect("fresh")
            .settle(Duration::ZERO)
            .await;
        assert_eq!(q.embedded_paid_today("a"), Some((0, 0)), "refused: nothing");
    }

    #[tokio::test]
    async fn a_slot_dropped_unsettled_gives_back_its_place_and_keeps_its_seconds() {
        let q = Quotas::new(QuotaSettings {
            per_caller_concurrency: 1,
            metered: true,
            ..Default::default()
        });
        drop(q.admit("a", Some(10), 6).await.expect("first"));
        let second = q
            .admit("a", Some(10), 4)
            .await
            .expect("the place is free again");
        assert_eq!(q.embedded_paid_today("a"), Some((10, 10)));
        second.settle(Duration::ZERO).await;
        assert_eq!(q.embedded_paid_today("a"), Some((6, 6)));
    }
}
