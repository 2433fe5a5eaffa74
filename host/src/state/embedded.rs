//! The embedded store: one daemon's counters in its own memory, and, on a
//! metered provider, the day's paid seconds in a file (`paid_file`) so they
//! survive a restart. In-flight counts and rate buckets are not kept: a
//! restart ends every run they counted, and a bucket starting full again
//! gives a caller at most one burst more.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::paid_file::{PaidDay, PaidFile};
use super::{Ask, Booked, utc_day};
use crate::limits::{QuotaSettings, Shed};

struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Default)]
struct State {
    in_flight: HashMap<String, u32>,
    buckets: HashMap<String, Bucket>,
    paid: PaidDay,
    /// Bumped at every change to `paid`: what the file has caught up to.
    version: u64,
}

impl State {
    /// The counts, reset when the UTC day has turned since the last change.
    fn paid_today(&mut self, today: u64) -> &mut PaidDay {
        if self.paid.day != today {
            self.paid = PaidDay {
                day: today,
                ..Default::default()
            };
        }
        &mut self.paid
    }
}

pub struct Embedded {
    state: Mutex<State>,
    file: Option<PaidFile>,
    /// The version last written; held across a write (into the blocking
    /// task that writes, so a caller that stops waiting does not let a
    /// second write start beside it) so writes land in order and a later
    /// one is never overwritten by an earlier one.
    written: Arc<tokio::sync::Mutex<u64>>,
}

impl Embedded {
    /// Counters in memory only (no metered provider, or a test).
    pub fn in_memory() -> Arc<Embedded> {
        Arc::new(Embedded {
            state: Mutex::new(State::default()),
            file: None,
            written: Arc::new(tokio::sync::Mutex::new(0)),
        })
    }

    /// Counters with the day's paid seconds read from, and kept in, `file`.
    pub fn with_file(file: PaidFile) -> io::Result<Arc<Embedded>> {
        let paid = file.load(utc_day())?;
        Ok(Arc::new(Embedded {
            state: Mutex::new(State {
                paid,
                ..Default::default()
            }),
            file: Some(file),
            written: Arc::new(tokio::sync::Mutex::new(0)),
        }))
    }

    /// Checks every limit and books the run in one step under the lock.
    pub fn admit(&self, settings: &QuotaSettings, ask: &Ask) -> Result<Booked, Shed> {
        let Ok(mut s) = self.state.lock() else {
            return Err(Shed::StoreUnavailable);
        };
        let day = utc_day();
        if settings.metered {
            let paid = s.paid_today(day);
            if let Some(allow) = ask.paid_allowance
                && paid.callers.get(ask.caller).copied().unwrap_or(0) >= allow
            {
                return Err(Shed::PaidCaller);
            }
            let cap = settings.daemon_paid_seconds_per_day;
            if cap > 0 && paid.daemon >= cap {
                return Err(Shed::PaidDaemon);
            }
        }
        let per_key = settings.per_caller_concurrency;
        if per_key > 0 && s.in_flight.get(ask.caller).copied().unwrap_or(0) >= per_key {
            return Err(Shed::PerKey);
        }
        take_token(&mut s, settings, ask.caller)?;
        *s.in_flight.entry(ask.caller.to_string()).or_insert(0) += 1;
        let reserved = if settings.metered { ask.reserve } else { 0 };
        if reserved > 0 {
            let paid = s.paid_today(day);
            *paid.callers.entry(ask.caller.to_string()).or_insert(0) += reserved;
            paid.daemon += reserved;
            s.version += 1;
        }
        Ok(Booked {
            id: None,
            leased: false,
            day,
            reserved,
        })
    }

    /// Charges the rate bucket only (a session call).
    pub fn charge(&self, settings: &QuotaSettings, caller: &str) -> Result<(), Shed> {
        let Ok(mut s) = self.state.lock() else {
            return Err(Shed::StoreUnavailable);
        };
        take_token(&mut s, settings, caller)
    }

    /// Gives back the run's place and `refund` of its reserved seconds, to
    /// the day they were booked on.
    pub fn release(&self, caller: &str, booked: &Booked, refund: u64) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        if let Some(n) = s.in_flight.get_mut(caller) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.in_flight.remove(caller);
            }
        }
        let refund = refund.min(booked.reserved);
        if refund > 0 && s.paid.day == booked.day {
            if let Some(n) = s.paid.callers.get_mut(caller) {
                *n = n.saturating_sub(refund);
            }
            s.paid.daemon = s.paid.daemon.saturating_sub(refund);
            s.version += 1;
        }
    }

    /// Writes the paid seconds to the file, if they changed since it was
    /// last written, and returns once they are on disk.
    pub async fn persist(self: &Arc<Self>) -> io::Result<()> {
        if self.file.is_none() {
            return Ok(());
        }
        let mut written = self.written.clone().lock_owned().await;
        let (version, snapshot) = {
            let s = self
                .state
                .lock()
                .map_err(|_| io::Error::other("the counters' lock is poisoned"))?;
            (s.version, s.paid.clone())
        };
        if version <= *written {
            return Ok(());
        }
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            if let Some(f) = &me.file {
                f.write(&snapshot)?;
            }
            *written = version;
            Ok(())
        })
        .await
        .map_err(io::Error::other)?
    }

    /// The paid seconds counted today (tests and the docs' examples).
    pub fn paid_today(&self, caller: &str) -> (u64, u64) {
        let Ok(mut s) = self.state.lock() else {
            return (0, 0);
        };
        let paid = s.paid_today(utc_day());
        (paid.callers.get(caller).copied().unwrap_or(0), paid.daemon)
    }
}

fn take_token(s: &mut State, settings: &QuotaSettings, caller: &str) -> Result<(), Shed> {
    if settings.rate_per_min == 0 {
        return Ok(());
    }
    let rate = f64::from(settings.rate_per_min) / 60.0;
    let burst = f64::from(settings.burst.max(1));
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
    Ok(())
}
