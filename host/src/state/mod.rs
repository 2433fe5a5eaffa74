//! Where per-caller limits are counted: the runs each caller has in flight,
//! its rate bucket, and the day's paid seconds, per caller and in all.
//!
//! Two stores behind one interface, `counters::Counters` (`quota::Quotas`
//! is its only user):
//! - `embedded`: one daemon's memory, plus a file for the day's paid
//!   seconds on a metered provider. The default.
//! - `redis_store`: a Redis every replica shares (`PLIMSOLL_STATE_URL`),
//!   so N replicas hold callers to one set of limits, not N.
//!
//! Either way a check and the booking it allows are one atomic step (one
//! lock here, one server-side script there), and a store that cannot be
//! asked refuses the run rather than admitting it uncounted.

pub mod counters;
pub mod embedded;
pub mod opened;
pub mod paid_file;
pub mod redis_store;
pub mod settings;

use std::time::{SystemTime, UNIX_EPOCH};

pub use settings::StateSettings;

/// What one admission asks for.
pub struct Ask<'a> {
    pub caller: &'a str,
    /// The caller's paid seconds per UTC day, if it has an allowance.
    pub paid_allowance: Option<u64>,
    /// Paid seconds to book now (the run's whole budget).
    pub reserve: u64,
}

/// What one admission booked, to be given back when the run ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Booked {
    /// The booking's ID in a shared store (its lease, and its record of
    /// the seconds it reserved).
    pub id: Option<String>,
    /// Whether it holds a concurrency lease there.
    pub leased: bool,
    /// The UTC day the paid seconds were booked on (the store's clock).
    pub day: u64,
    /// Paid seconds booked (0 on a provider that is not metered).
    pub reserved: u64,
}

/// Days since 1970-01-01 in UTC, by this machine's clock.
pub fn utc_day() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400)
}
