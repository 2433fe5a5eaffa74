//! Pre-booted containers held to idleness while they wait.
//!
//! A pre-booted container runs the plugin's declared command before any
//! run takes it, so the host watches it: one that printed, or whose process
//! died, or that used more CPU than an idle interpreter needs, is removed
//! and counted (`plimsoll_warm_removed_total{reason}`, and a log line). A
//! plugin holds little CPU through warm containers: what an idle
//! interpreter needs under the runtime, and after `STRIKES` removals within
//! `STRIKE_WINDOW` the pool pauses pre-booting, each pause twice the last,
//! and keeps its containers behind the gate meanwhile
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
/// CPU a waiting container may use per second, whatever its quota: what
/// an idle interpreter needs, with room. Under runc an idle node uses none
/// measurable; gVisor's Sentry keeps ticking in an idle sandbox (30-55 ms
/// a second measured here).
const IDLE_RUNC_PER_SEC: Duration = Duration::from_millis(20);
const IDLE_GVISOR_PER_SEC: Duration = Duration::from_millis(100);
/// Slack for a boot that runs past the allowance.
const IDLE_SLACK: Duration = Duration::from_millis(500);
/// Removals after which a pool pauses pre-booting, and over what time.
const STRIKES: usize = 3;
const STRIKE_WINDOW: Duration = Duration::from_secs(600);
/// Each pause is twice the last, up to `STRIKE_WINDOW` times this.
const LONGEST_PAUSE_FACTOR: u32 = 64;

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

/// The idle budget per second under this runtime.
pub(super) fn idle_per_sec(gvisor: bool) -> Duration {
    if gvisor {
        IDLE_GVISOR_PER_SEC
    } else {
        IDLE_RUNC_PER_SEC
    }
}

/// Strikes against pre-booting within the window, and the end of the
/// pause they caused.
#[derive(Default)]
pub(super) struct Strikes {
    recent: VecDeque<Instant>,
    paused_until: Option<Instant>,
    /// How long the next pause lasts, in `STRIKE_WINDOW`s.
    next_pause: u32,
}

impl Strikes {
    /// Whether pre-booting is paused now.
    pub(super) fn paused(&self) -> bool {
        self.paused_until.is_some_and(|t| Instant::now() < t)
    }

    /// Records one strike; when it is one too many, starts a pause (each
    /// twice the last, so a declaration that keeps failing costs less and
    /// less) and returns its length.
    pub(super) fn record(&mut self) -> Option<Duration> {
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
            return None;
        }
        self.recent.clear();
        let factor = self.next_pause.max(1);
        self.next_pause = (factor * 2).min(LONGEST_PAUSE_FACTOR);
        let pause = STRIKE_WINDOW * factor;
        self.paused_until = Some(now + pause);
        Some(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_strikes_pause_pre_booting_once() {
        let mut s = Strikes::default();
        assert_eq!((s.record(), s.record()), (None, None));
        assert!(!s.paused());
        assert_eq!(s.record(), Some(STRIKE_WINDOW), "the third starts a pause");
        assert!(s.paused());
        assert_eq!(
            (s.record(), s.record(), s.record()),
            (None, None, None),
            "no second pause during one"
        );
    }

    #[test]
    fn each_pause_is_twice_the_last_up_to_a_bound() {
        let mut s = Strikes::default();
        let mut pauses = Vec::new();
        for _ in 0..9 {
            s.paused_until = None;
            let p = (0..STRIKES).filter_map(|_| s.record()).last();
            pauses.push(p.expect("a pause") / STRIKE_WINDOW.as_secs() as u32);
        }
        let secs: Vec<u64> = pauses.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 64, 64, 64]);
    }

    #[test]
    fn the_idle_budget_is_the_runtimes_not_the_quotas() {
        assert_eq!(idle_per_sec(false), Duration::from_millis(20));
        assert_eq!(idle_per_sec(true), Duration::from_millis(100));
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
