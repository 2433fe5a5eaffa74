//! The per-caller limits' vocabulary: the variables and what the operator
//! configured (`QuotaSettings`), and which limit refused a run (`Shed`). A
//! leaf: `quota` enforces them, and the stores under `state` count them.

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
    /// The store the limits are counted in did not answer.
    StoreUnavailable,
}

impl Shed {
    pub fn label(self) -> &'static str {
        match self {
            Shed::AtCapacity => "at_capacity",
            Shed::PerKey => "per_key",
            Shed::Rate => "rate",
            Shed::PaidCaller => "paid_caller",
            Shed::PaidDaemon => "paid_daemon",
            Shed::StoreUnavailable => "state_store",
        }
    }

    pub fn text(self) -> &'static str {
        match self {
            Shed::AtCapacity => "the daemon is running as many runs as it is configured for",
            Shed::PerKey => "this caller is running as many runs as it may at once",
            Shed::Rate => "this caller has used its rate of runs; retry shortly",
            Shed::PaidCaller => "this caller has used its paid seconds for today",
            Shed::PaidDaemon => "this daemon has used its paid seconds for today",
            Shed::StoreUnavailable => {
                "the store this daemon counts limits in did not answer; retry shortly"
            }
        }
    }
}
