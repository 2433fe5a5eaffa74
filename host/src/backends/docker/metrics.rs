//! The docker backend's series, served with the daemon's (`/metrics`):
//! how runs found their containers, and what became of pre-booted ones.
//! Counts only; no container, spec or run is named.

use std::sync::LazyLock;

use prometheus::core::Collector;
use prometheus::{IntCounter, IntCounterVec, Opts};

use super::idle::Reason;

/// How each run's container was had: a pre-booted warm one, a gated warm
/// one, or one created for it (cold).
pub(super) static TAKEN: LazyLock<IntCounterVec> = LazyLock::new(|| {
    IntCounterVec::new(
        Opts::new(
            "plimsoll_run_containers_total",
            "Containers single runs used, by how they were had",
        ),
        &["how"],
    )
    .expect("a valid metric")
});

/// Pre-booted warm containers removed before any run took them.
pub(super) static REMOVED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    IntCounterVec::new(
        Opts::new(
            "plimsoll_warm_removed_total",
            "Pre-booted warm containers removed before any run took them, by reason",
        ),
        &["reason"],
    )
    .expect("a valid metric")
});

/// Pools that paused pre-booting after repeated removals.
pub(super) static STOPPED: LazyLock<IntCounter> = LazyLock::new(|| {
    IntCounter::new(
        "plimsoll_preboot_stopped_total",
        "Times a pool paused pre-booting after repeated removals",
    )
    .expect("a valid metric")
});

/// How a run's container was had.
#[derive(Debug, Clone, Copy)]
pub(super) enum Taken {
    Booted,
    Gated,
    Cold,
}

impl Taken {
    fn name(self) -> &'static str {
        match self {
            Taken::Booted => "booted",
            Taken::Gated => "gated",
            Taken::Cold => "cold",
        }
    }

    pub(super) fn count(self) {
        TAKEN.with_label_values(&[self.name()]).inc();
    }
}

/// The series, each label present from the start, for the daemon's
/// registry.
pub fn collectors() -> Vec<Box<dyn Collector>> {
    for how in [Taken::Booted, Taken::Gated, Taken::Cold] {
        TAKEN.with_label_values(&[how.name()]);
    }
    for reason in Reason::ALL {
        REMOVED.with_label_values(&[reason.name()]);
    }
    vec![
        Box::new(TAKEN.clone()),
        Box::new(REMOVED.clone()),
        Box::new(STOPPED.clone()),
    ]
}
