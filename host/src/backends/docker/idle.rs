//! Pre-booted containers held to idleness while they wait.
//!
//! A pre-booted container runs the plugin's declared command before any
//! run takes it, so the host watches it: one that printed, or whose process
//! died, or that used more CPU than an idle interpreter needs, is removed
//! and counted (`plimsoll_warm_removed_total{reason}`, and a log line). A
//! plugin cannot hold CPU through warm containers: after `STRIKES` such
//! removals within `STRIKE_WINDOW`, the pool stops pre-booting for that
//! long and keeps its containers behind the gate instead
//! (`plimsoll_preboot_stopped_total`). A pause rather than an end: an
//! engine restart kills every waiting container at once, and should not
//! cost pre-booting for the daemon's life.
//!
//! CPU is read from the container's own cgroup, found through its first
//! process on the host (the interpreter under runc, the sandbox under
//! runsc, whose Sentry's time is the container's). A container whose
//! cgroup cannot be read is not kept pre-booted: the budget would be
//! unenforced.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Time a container has to boot before its idleness is measured.
const BOOT_ALLOWANCE: Duration = Duration::from_secs(2);
/// Most CPU its boot may take.
const BOOT_CPU: Duration = Duration::from_secs(2);
/// Share of the container's CPU quota it may use while idle. gVisor's
/// Sentry keeps ticking in an idle sandbox (about 5% of a CPU here); an
/// idle interpreter under runc uses none.
const IDLE_SHARE: f64 = 0.25;
/// Idle CPU allowed whatever the quota, and slack for a late boot.
const IDLE_FLOOR_PER_SEC: Duration = Duration::from_millis(60);
const IDLE_SLACK: Duration = Duration::from_millis(500);
/// Removals after which a pool stops pre-booting, and over what time.
const STRIKES: usize = 3;
const STRIKE_WINDOW: Duration = Duration::from_secs(600);

/// Why a pre-booted container was removed before a run took it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reason {
    /// Over its CPU budget.
    Cpu,
    /// Its process ended.
    Died,
    /// It printed.
    Dirty,
    /// Its CPU could not be read.
    Unmeasured,
}

impl Reason {
    pub(super) const ALL: [Reason; 4] =
        [Reason::Cpu, Reason::Died, Reason::Dirty, Reason::Unmeasured];

    pub(super) fn name(self) -> &'static str {
        match self {
            Reason::Cpu => "cpu",
            Reason::Died => "died",
            Reason::Dirty => "dirty",
            Reason::Unmeasured => "unmeasured",
        }
    }
}

/// Where a container's CPU time is read, and the first reading after boot.
pub(super) struct CpuProbe {
    usage: PathBuf,
    /// cgroup v2's `cpu.stat` (microseconds) rather than v1's
    /// `cpuacct.usage` (nanoseconds).
    v2: bool,
    baseline: Option<(Instant, Duration)>,
}

impl CpuProbe {
    /// Finds the cgroup of the container's first host process.
    pub(super) fn of_pid(pid: i64) -> Option<CpuProbe> {
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        for line in cgroups.lines() {
            let mut parts = line.splitn(3, ':');
            let (controllers, path) = (parts.nth(1)?, parts.next()?);
            let path = path.trim_start_matches('/');
            if controllers.split(',').any(|c| c == "cpuacct") {
                for root in ["/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/cpu,cpuacct"] {
                    let usage = PathBuf::from(root).join(path).join("cpuacct.usage");
                    if usage.is_file() {
                        return Some(CpuProbe {
                            usage,
                            v2: false,
                            baseline: None,
                        });
                    }
                }
            }
            if controllers.is_empty() {
                let usage = PathBuf::from("/sys/fs/cgroup").join(path).join("cpu.stat");
                if usage.is_file() {
                    return Some(CpuProbe {
                        usage,
                        v2: true,
                        baseline: None,
                    });
                }
            }
        }
        None
    }

    fn read(&self) -> Option<Duration> {
        let text = std::fs::read_to_string(&self.usage).ok()?;
        if self.v2 {
            let usec = text
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))?
                .trim()
                .parse::<u64>()
                .ok()?;
            Some(Duration::from_micros(usec))
        } else {
            Some(Duration::from_nanos(text.trim().parse::<u64>().ok()?))
        }
    }

    /// Whether the container is within its budget now. `per_sec` is the
    /// idle CPU allowed per second of waiting.
    pub(super) fn within(&mut self, born: Instant, per_sec: Duration) -> Result<(), Reason> {
        if born.elapsed() < BOOT_ALLOWANCE {
            return Ok(());
        }
        let used = self.read().ok_or(Reason::Unmeasured)?;
        let Some((since, base)) = self.baseline else {
            if used > BOOT_CPU {
                return Err(Reason::Cpu);
            }
            self.baseline = Some((Instant::now(), used));
            return Ok(());
        };
        let allowed = per_sec.mul_f64(since.elapsed().as_secs_f64()) + IDLE_SLACK;
        if used.saturating_sub(base) > allowed {
            return Err(Reason::Cpu);
        }
        Ok(())
    }
}

/// The idle budget per second for a container with this CPU quota.
pub(super) fn idle_per_sec(nano_cpus: i64) -> Duration {
    let quota = Duration::from_nanos(u64::try_from(nano_cpus).unwrap_or(0));
    quota.mul_f64(IDLE_SHARE).max(IDLE_FLOOR_PER_SEC)
}

/// Strikes against pre-booting within the window, and the end of the
/// pause they caused.
#[derive(Default)]
pub(super) struct Strikes {
    recent: VecDeque<Instant>,
    paused_until: Option<Instant>,
}

impl Strikes {
    /// Whether pre-booting is paused now.
    pub(super) fn paused(&self) -> bool {
        self.paused_until.is_some_and(|t| Instant::now() < t)
    }

    /// Records one strike; true when it is one too many, which starts a
    /// pause of `STRIKE_WINDOW`.
    pub(super) fn record(&mut self) -> bool {
        let now = Instant::now();
        self.recent.push_back(now);
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > STRIKE_WINDOW)
        {
            self.recent.pop_front();
        }
        if self.paused() || self.recent.len() < STRIKES {
            return false;
        }
        self.recent.clear();
        self.paused_until = Some(now + STRIKE_WINDOW);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_strikes_pause_pre_booting_once() {
        let mut s = Strikes::default();
        assert!(!s.record() && !s.record());
        assert!(!s.paused());
        assert!(s.record(), "the third starts a pause");
        assert!(s.paused());
        assert!(
            !s.record() && !s.record() && !s.record(),
            "no second pause during one"
        );
    }

    #[test]
    fn the_idle_budget_follows_the_quota_with_a_floor() {
        assert_eq!(idle_per_sec(1_000_000_000), Duration::from_millis(250));
        assert_eq!(idle_per_sec(10_000_000), IDLE_FLOOR_PER_SEC);
    }

    #[test]
    fn a_probe_over_budget_or_unreadable_is_unfit() {
        let dir = std::env::temp_dir().join(format!("plimsoll-idle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let usage = dir.join("cpuacct.usage");
        std::fs::write(&usage, "100000000").expect("write");
        let born = Instant::now() - BOOT_ALLOWANCE;
        let mut p = CpuProbe {
            usage: usage.clone(),
            v2: false,
            baseline: None,
        };
        assert_eq!(
            p.within(Instant::now(), Duration::ZERO),
            Ok(()),
            "still booting"
        );
        assert_eq!(p.within(born, Duration::ZERO), Ok(()), "a 100 ms boot");
        std::fs::write(&usage, "400000000").expect("write");
        assert_eq!(p.within(born, Duration::ZERO), Ok(()), "within the slack");
        std::fs::write(&usage, "700000000").expect("write");
        assert_eq!(p.within(born, Duration::ZERO), Err(Reason::Cpu));
        std::fs::write(&usage, "3000000000").expect("write");
        let mut q = CpuProbe {
            usage: usage.clone(),
            v2: false,
            baseline: None,
        };
        assert_eq!(
            q.within(born, Duration::ZERO),
            Err(Reason::Cpu),
            "a boot past its CPU"
        );
        std::fs::remove_file(&usage).expect("remove");
        assert_eq!(q.within(born, Duration::ZERO), Err(Reason::Unmeasured));
        let v2 = dir.join("cpu.stat");
        std::fs::write(&v2, "usage_usec 1500\nuser_usec 1000\n").expect("write");
        let r = CpuProbe {
            usage: v2,
            v2: true,
            baseline: None,
        };
        assert_eq!(r.read(), Some(Duration::from_micros(1500)));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
