//! Per-caller limits: concurrency, a token-bucket rate, and a daily
//! allowance of paid seconds on metered providers. Each one, when hit, is a
//! marked `capacity` refusal: nothing ran, and the caller may retry later.
//! The daemon-wide concurrency cap lives in `service` (one semaphore).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::env_vars::{ConfigError, Env, Var, invalid, var};

pub const VARIABLES: &[Var] = &[
    var(
        "SANDBOX_PER_KEY_CONCURRENT",
        "0 (no cap)",
        "runs one caller may have in flight at once",
    ),
    var(
        "SANDBOX_RATE_PER_MIN",
        "0 (no limit)",
        "runs per minute per caller (token bucket)",
    ),
    var(
        "SANDBOX_RATE_BURST",
        "(the per-minute rate)",
        "the bucket's size: runs a caller may send at once",
    ),
    var(
        "SANDBOX_PLUGIN_METERED",
        "0",
        "1 states that the plugin's service bills by the second: daily paid-second allowances apply",
    ),
    var(
        "SANDBOX_PAID_SECONDS_PER_DAY",
        "0 (no cap)",
        "paid seconds the whole daemon may use per UTC day on a metered provider",
    ),
];

/// What the operator configured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QuotaSettings {
    /// Runs one caller may have in flight; 0 is no per-caller cap.
    pub per_caller_concurrency: u32,
    /// Runs per minute per caller; 0 is no rate limit.
    pub rate_per_min: u32,
    /// Bucket size; defaults to the per-minute rate.
    pub burst: u32,
    /// Whether the provider bills by the second (paid allowances apply).
    pub metered: bool,
    /// Paid seconds the whole daemon may use per UTC day; 0 is no cap.
    pub daemon_paid_seconds_per_day: u64,
}

impl QuotaSettings {
    /// Parses the quota variables. Settings that would do nothing are
    /// refused, not ignored.
    pub fn from_env(env: &Env) -> Result<QuotaSettings, ConfigError> {
        let metered = env.flag("SANDBOX_PLUGIN_METERED")?;
        let rate_per_min = env
            .u32_in("SANDBOX_RATE_PER_MIN", 0, 1_000_000)?
            .unwrap_or(0);
        let burst = env
            .u32_in("SANDBOX_RATE_BURST", 1, 1_000_000)?
            .unwrap_or(rate_per_min);
        let per_caller_concurrency = env
            .u32_in("SANDBOX_PER_KEY_CONCURRENT", 0, 1024)?
            .unwrap_or(0);
        let daemon_paid_seconds_per_day = env
            .get("SANDBOX_PAID_SECONDS_PER_DAY")
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    invalid(
                        "SANDBOX_PAID_SECONDS_PER_DAY",
                        "must be a whole number of seconds",
                    )
                })
            })
            .transpose()?
            .unwrap_or(0);
        if env.is_set("SANDBOX_RATE_BURST") && rate_per_min == 0 {
            return Err(invalid(
                "SANDBOX_RATE_BURST",
                "a burst needs SANDBOX_RATE_PER_MIN",
            ));
        }
        if env.is_set("SANDBOX_PAID_SECONDS_PER_DAY") && !metered {
            return Err(invalid(
                "SANDBOX_PAID_SECONDS_PER_DAY",
                "paid seconds are counted only for a provider declared metered (SANDBOX_PLUGIN_METERED=1)",
            ));
        }
        Ok(QuotaSettings {
            per_caller_concurrency,
            rate_per_min,
            burst,
            metered,
            daemon_paid_seconds_per_day,
        })
    }
}

/// Which limit refused a run (the metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shed {
    AtCapacity,
    PerKey,
    Rate,
    PaidCaller,
    PaidDaemon,
}

impl Shed {
    pub fn label(self) -> &'static str {
        match self {
            Shed::AtCapacity => "at_capacity",
            Shed::PerKey => "per_key",
            Shed::Rate => "rate",
            Shed::PaidCaller => "paid_caller",
            Shed::PaidDaemon => "paid_daemon",
        }
    }

    pub fn text(self) -> &'static str {
        match self {
            Shed::AtCapacity => "the daemon is running as many runs as it is configured for",
            Shed::PerKey => "this caller is running as many runs as it may at once",
            Shed::Rate => "this caller has used its rate of runs; retry shortly",
            Shed::PaidCaller => "this caller has used its paid seconds for today",
            Shed::PaidDaemon => "this daemon has used its paid seconds for today",
        }
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Default)]
struct State {
    in_flight: HashMap<String, u32>,
    buckets: HashMap<String, Bucket>,
    /// (UTC day, seconds) per caller, and for the daemon.
    paid: HashMap<String, (u64, u64)>,
    daemon_paid: (u64, u64),
}

pub struct Quotas {
    settings: QuotaSettings,
    state: Mutex<State>,
}

/// A caller's slot; released when dropped.
pub struct Slot {
    quotas: Arc<Quotas>,
    caller: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut s) = self.quotas.state.lock()
            && let Some(n) = s.in_flight.get_mut(&self.caller)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.in_flight.remove(&self.caller);
            }
        }
    }
}

fn utc_day() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400)
}

impl Quotas {
    pub fn new(settings: QuotaSettings) -> Arc<Quotas> {
        Arc::new(Quotas {
            settings,
            state: Mutex::new(State::default()),
        })
    }

    /// Takes a concurrency slot and charges the rate bucket, or says which
    /// limit refused. On a metered provider, `reserve` paid seconds (the
    /// run's whole budget) are booked now, so concurrent runs cannot
    /// together overshoot an allowance by more than one budget; `settle`
    /// refunds what the run did not use.
    pub fn admit(
        self: &Arc<Self>,
        caller: &str,
        paid_allowance: Option<u64>,
        reserve: u64,
    ) -> Result<Slot, Shed> {
        let Ok(mut s) = self.state.lock() else {
            return Err(Shed::AtCapacity);
        };
        let day = utc_day();
        if self.settings.metered {
            if let Some(allow) = paid_allowance {
                let used = s
                    .paid
                    .get(caller)
                    .filter(|(d, _)| *d == day)
                    .map_or(0, |(_, u)| *u);
                if used >= allow {
                    return Err(Shed::PaidCaller);
                }
            }
            let cap = self.settings.daemon_paid_seconds_per_day;
            if cap > 0 && s.daemon_paid.0 == day && s.daemon_paid.1 >= cap {
                return Err(Shed::PaidDaemon);
            }
        }
        let per_key = self.settings.per_caller_concurrency;
        if per_key > 0 && s.in_flight.get(caller).copied().unwrap_or(0) >= per_key {
            return Err(Shed::PerKey);
        }
        self.take_token(&mut s, caller)?;
        *s.in_flight.entry(caller.to_string()).or_insert(0) += 1;
        if self.settings.metered {
            let e = s.paid.entry(caller.to_string()).or_insert((day, 0));
            if e.0 != day {
                *e = (day, 0);
            }
            e.1 += reserve;
            if s.daemon_paid.0 != day {
                s.daemon_paid = (day, 0);
            }
            s.daemon_paid.1 += reserve;
        }
        Ok(Slot {
            quotas: self.clone(),
            caller: caller.to_string(),
        })
    }

    /// Charges one run to the caller's rate, and nothing else: a session
    /// call, whose session already holds the caller's concurrency slot and
    /// its paid seconds.
    pub fn charge(&self, caller: &str) -> Result<(), Shed> {
        let Ok(mut s) = self.state.lock() else {
            return Err(Shed::AtCapacity);
        };
        self.take_token(&mut s, caller)
    }

    fn take_token(&self, s: &mut State, caller: &str) -> Result<(), Shed> {
        if self.settings.rate_per_min > 0 {
            let rate = f64::from(self.settings.rate_per_min) / 60.0;
            let burst = f64::from(self.settings.burst.max(1));
            let now = Instant::now();
            let b = s.buckets.entry(caller.to_string()).or_insert(Bucket {
                tokens: burst,
                at: now,
            });
            b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(burst);
            b.at = now;
            if b.tokens < 1.0 {
                return Err(Shed::Rate);
            }
            b.tokens -= 1.0;
        }
        Ok(())
    }

    /// Settles a metered run: `used` of the `reserved` seconds stand, the
    /// rest is refunded (a run refused before it ran uses 0).
    pub fn settle(&self, caller: &str, reserved: u64, used: u64) {
        if !self.settings.metered || used >= reserved {
            return;
        }
        let refund = reserved - used;
        if let Ok(mut s) = self.state.lock() {
            if let Some(e) = s.paid.get_mut(caller) {
                e.1 = e.1.saturating_sub(refund);
            }
            s.daemon_paid.1 = s.daemon_paid.1.saturating_sub(refund);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_caller_concurrency_is_exact_and_released() {
        let q = Quotas::new(QuotaSettings {
            per_caller_concurrency: 2,
            ..Default::default()
        });
        let a = q.admit("a", None, 0).expect("1");
        let _b = q.admit("a", None, 0).expect("2");
        assert_eq!(q.admit("a", None, 0).err(), Some(Shed::PerKey));
        assert!(
            q.admit("b", None, 0).is_ok(),
            "another caller is not affected"
        );
        drop(a);
        assert!(q.admit("a", None, 0).is_ok());
    }

    #[test]
    fn the_bucket_allows_the_burst_then_refuses() {
        let q = Quotas::new(QuotaSettings {
            rate_per_min: 60,
            burst: 3,
            ..Default::default()
        });
        for _ in 0..3 {
            drop(q.admit("a", None, 0).expect("burst"));
        }
        assert_eq!(q.admit("a", None, 0).err(), Some(Shed::Rate));
        assert!(q.admit("b", None, 0).is_ok());
    }

    #[test]
    fn paid_seconds_are_counted_per_caller_and_daemon() {
        let q = Quotas::new(QuotaSettings {
            metered: true,
            daemon_paid_seconds_per_day: 10,
            ..Default::default()
        });
        // Reserved at admission: a second concurrent run sees the first's
        // whole budget as spent.
        let first = q.admit("a", Some(5), 5).expect("fresh");
        assert_eq!(q.admit("a", Some(5), 5).err(), Some(Shed::PaidCaller));
        drop(first);
        q.settle("a", 5, 1);
        // Refunded to 1 used: there is allowance again.
        drop(q.admit("a", Some(5), 4).expect("refunded"));
        q.settle("a", 4, 4);
        assert_eq!(q.admit("a", Some(5), 1).err(), Some(Shed::PaidCaller));
        drop(
            q.admit("b", None, 5)
                .expect("b has no allowance of its own"),
        );
        q.settle("b", 5, 5);
        assert_eq!(q.admit("c", None, 1).err(), Some(Shed::PaidDaemon));
    }
}
