//! The smoke test: one container created exactly as runs are, proving from
//! inside what the tier rests on (the user, a read-only root, which mounts
//! accept writes and how big they are, loopback as the only interface, the
//! process limit, the interpreters), and that the first things an agent
//! runs work there (`ls -la`, `stat`, `find`: a runtime that answers
//! statx with EINVAL breaks the first two). The report is judged by a pure
//! function, tested on recorded reports from both runtimes.

use std::collections::HashMap;
use std::time::Duration;

use super::envelope::Life;
use super::settings::{SHM_MB, TMP_MB};
use super::{DockerEngine, expiry};
use crate::plugin_host::capabilities::container_engine::backend::{Approved, EngineFailure};

/// The smoke test's whole budget, from creating its container to reading
/// its report.
const SMOKE_TIME: Duration = Duration::from_secs(60);

impl DockerEngine {
    /// The smoke test: one container with exactly the settings runs get,
    /// proving from inside what the tier rests on. Returns the checks passed
    /// and the interpreters found; any failure names what failed.
    pub(super) async fn smoke(&self) -> Result<(Vec<String>, Vec<String>), String> {
        let spec = Approved {
            command: vec!["/bin/sh".into(), "-c".into(), SMOKE_SCRIPT.into()],
            env: self.verified.facts.image_env.clone(),
        };
        let deadline = tokio::time::Instant::now() + SMOKE_TIME;
        let warm = self
            .start_waiting(&spec, false, Life::run(expiry(SMOKE_TIME)), None, deadline)
            .await
            .map_err(
                |(EngineFailure::BeforeStart(e)
                 | EngineFailure::OutOfTime(e)
                 | EngineFailure::AfterStart(e))| { format!("smoke test: {e}") },
            )?;
        let name = warm.id.clone();
        let ran = self
            .drive(warm, b"go\n".to_vec(), deadline, 1 << 20, None)
            .await;
        self.remove(&name).await;
        let out = match ran {
            Ok(out) => out,
            Err(
                EngineFailure::BeforeStart(e)
                | EngineFailure::OutOfTime(e)
                | EngineFailure::AfterStart(e),
            ) => {
                return Err(format!("smoke test: {e}"));
            }
        };
        if out.exit_code != 0 || out.timed_out {
            return Err(format!(
                "smoke test: the probe exited {} (timed out: {}): {}",
                out.exit_code,
                out.timed_out,
                crate::text::sanitize(&String::from_utf8_lossy(&out.stderr), 300)
            ));
        }
        let report = String::from_utf8_lossy(&out.stdout);
        let expect = Expectations {
            user: self.settings.user(),
            tmp_mb: TMP_MB,
            shm_mb: SHM_MB,
            work_mb: self.settings.work_mb(),
            pids: if self.settings.gvisor() {
                None
            } else {
                Some(self.settings.pids)
            },
            nosuid_reported: !self.settings.gvisor(),
        };
        let mut checks = judge_smoke(&report, &expect).map_err(|e| format!("smoke test: {e}"))?;
        if self.settings.gvisor() {
            checks.push(format!(
                "process limit {} on the sandbox's host cgroup (checked before every run)",
                self.settings.pids
            ));
        }
        let languages = smoke_languages(&report);
        if languages.is_empty() {
            return Err("smoke test: the image runs neither node nor python3".into());
        }
        Ok((checks, languages))
    }
}

/// Run as the guest user, after the host's go on stdin: what the mounts,
/// network, process limit and interpreters look like from inside.
const SMOKE_SCRIPT: &str = r#"read -r _
echo "user $(id -u):$(id -g)"
while IFS= read -r line; do echo "mount $line"; done < /proc/self/mountinfo
for m in $(awk '{print $5}' /proc/self/mountinfo); do
  if ( : > "$m/.plimsoll-probe" ) 2>/dev/null; then echo "writable $m"; rm -f "$m/.plimsoll-probe"; fi
done
awk -F: 'NR > 2 { gsub(/ /, "", $1); print "iface " $1 }' /proc/net/dev
for f in /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/pids.max; do
  if [ -r "$f" ]; then echo "pids $(cat "$f")"; break; fi
done
cd /work && printf 'plimsoll\n' > smoke.txt
if ls -la /work 2>/dev/null | grep -q ' smoke\.txt$'; then echo "works ls -la"; fi
if [ "$(stat -c %s /work/smoke.txt 2>/dev/null)" = 9 ]; then echo "works stat"; fi
if [ "$(find /work -name smoke.txt 2>/dev/null)" = /work/smoke.txt ]; then echo "works find"; fi
rm -f /work/smoke.txt
if node -e 'process.stdout.write("node-ran\n")' 2>/dev/null | grep -qx node-ran; then echo "lang javascript"; fi
if python3 -c 'print("python-ran")' 2>/dev/null | grep -qx python-ran; then echo "lang python"; fi
"#;

struct Expectations {
    user: String,
    tmp_mb: u32,
    shm_mb: u32,
    work_mb: u32,
    /// The limit the container's own cgroup must show (None under gVisor,
    /// whose emulated file does not show the host's).
    pids: Option<i64>,
    /// Whether the kernel reports nosuid in the mount table (gVisor's
    /// does not list it).
    nosuid_reported: bool,
}

/// Judges the smoke probe's report. Pure, so it is tested on recorded
/// reports from both runtimes.
/// Long on purpose: one check per line of the report, in the probe's order.
fn judge_smoke(report: &str, want: &Expectations) -> Result<Vec<String>, String> {
    let mut checks = Vec::new();
    let field = |prefix: &str| {
        report
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let user = field("user ");
    if user != [want.user.clone()] {
        return Err(format!("the probe ran as {user:?}, not {}", want.user));
    }
    checks.push(format!("runs as {}", want.user));

    // Mount table: target, per-mount options, fs type, super options.
    let mut mounts: HashMap<String, (String, String, String)> = HashMap::new();
    for line in field("mount ") {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split_whitespace().collect();
        let r: Vec<&str> = right.split_whitespace().collect();
        if l.len() >= 6 && r.len() >= 3 {
            mounts.insert(
                l[4].to_string(),
                (l[5].to_string(), r[0].to_string(), r[2].to_string()),
            );
        }
    }
    let root_ro = mounts
        .get("/")
        .is_some_and(|(opts, _, _)| opts.split(',').any(|o| o == "ro"));
    if !root_ro {
        return Err("the root filesystem is not mounted read-only".into());
    }
    checks.push("root filesystem read-only".into());

    let promised = [
        ("/tmp", want.tmp_mb),
        ("/dev/shm", want.shm_mb),
        ("/work", want.work_mb),
    ];
    let writable = field("writable ");
    for w in &writable {
        if !promised.iter().any(|(p, _)| p == w) {
            return Err(format!(
                "{w} accepts writes; only /tmp, /dev/shm and /work may"
            ));
        }
    }
    for (path, mb) in promised {
        if !writable.iter().any(|w| w == path) {
            return Err(format!("{path} does not accept writes"));
        }
        let Some((opts, fstype, super_opts)) = mounts.get(path) else {
            return Err(format!("{path} is not a mount of its own"));
        };
        if fstype != "tmpfs" {
            return Err(format!("{path} is {fstype}, not tmpfs"));
        }
        let has = |o: &str| opts.split(',').chain(super_opts.split(',')).any(|x| x == o);
        if !has("noexec") {
            return Err(format!("{path} is not noexec"));
        }
        if want.nosuid_reported && !has("nosuid") {
            return Err(format!("{path} is not nosuid"));
        }
        let size = super_opts
            .split(',')
            .find_map(|o| o.strip_prefix("size="))
            .and_then(parse_size);
        if size != Some(u64::from(mb) << 20) {
            return Err(format!("{path} is not sized {mb} MiB"));
        }
    }
    checks.push(format!(
        "only /tmp ({} MiB), /dev/shm ({} MiB), /work ({} MiB) accept writes: tmpfs, noexec",
        want.tmp_mb, want.shm_mb, want.work_mb
    ));

    let ifaces = field("iface ");
    if ifaces != ["lo"] {
        return Err(format!("network interfaces {ifaces:?}; only lo is allowed"));
    }
    checks.push("loopback is the only network interface".into());

    if let Some(pids) = want.pids {
        let seen = field("pids ");
        if seen != [pids.to_string()] {
            return Err(format!(
                "the container's process limit is {seen:?}, not {pids}"
            ));
        }
        checks.push(format!("process limit {pids} on the container's cgroup"));
    }

    let works = field("works ");
    for command in ORDINARY_COMMANDS {
        if !works.iter().any(|w| w == command) {
            return Err(format!(
                "`{command}` fails inside the sandbox: this runtime or image breaks what agents run first (Debian 12's runsc answers statx with EINVAL)"
            ));
        }
    }
    checks.push(format!(
        "ordinary commands work: {}",
        ORDINARY_COMMANDS.join(", ")
    ));
    Ok(checks)
}

/// The corpus commands the smoke test runs on a file it wrote in /work.
const ORDINARY_COMMANDS: [&str; 3] = ["ls -la", "stat", "find"];

fn smoke_languages(report: &str) -> Vec<String> {
    report
        .lines()
        .filter_map(|l| l.strip_prefix("lang "))
        .filter(|l| matches!(*l, "javascript" | "python"))
        .map(str::to_string)
        .collect()
}

/// `16m`, `16384k`, `16777216`, as mount tables print sizes.
fn parse_size(s: &str) -> Option<u64> {
    let (digits, mult) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1u64 << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1 << 20),
        b'g' | b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded from a runc container with the run settings (trimmed to the
    /// lines the judge reads).
    const RUNC: &str = "user 61000:61000
mount 72 48 0:39 / / ro,relatime master:2 - overlay overlay rw,lowerdir=x
mount 73 72 0:42 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
mount 74 72 0:43 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
mount 88 74 0:47 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=16384k
mount 89 72 0:48 / /work rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,size=131072k,mode=1777
mount 90 72 0:49 / /tmp rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,size=16384k
writable /dev/shm
writable /work
writable /tmp
iface lo
pids 256
works ls -la
works stat
works find
lang javascript
lang python
";

    /// Recorded from a runsc container: no nosuid in its table, sizes in
    /// other units, no pids line that means anything.
    const RUNSC: &str = "user 61000:61000
mount 8 8 0:8 / / ro  - 9p none ro,trans=fd
mount 9 8 0:6 / /dev rw  - tmpfs none rw,mode=0755
mount 11 8 0:10 / /tmp rw,noexec  - tmpfs none rw,size=16m
mount 13 8 0:12 / /work rw,noexec  - tmpfs none rw,mode=1777,size=128m
mount 15 9 0:14 / /dev/shm rw,noexec  - tmpfs none rw,mode=1777,size=16777216
writable /tmp
writable /work
writable /dev/shm
iface lo
pids max
works ls -la
works stat
works find
lang javascript
lang python
";

    fn want(gvisor: bool) -> Expectations {
        Expectations {
            user: "61000:61000".into(),
            tmp_mb: 16,
            shm_mb: 16,
            work_mb: 128,
            pids: if gvisor { None } else { Some(256) },
            nosuid_reported: !gvisor,
        }
    }

    #[test]
    fn recorded_reports_pass() {
        judge_smoke(RUNC, &want(false)).expect("runc report");
        judge_smoke(RUNSC, &want(true)).expect("runsc report");
        assert_eq!(smoke_languages(RUNC), ["javascript", "python"]);
        assert_eq!(smoke_languages(RUNSC), ["javascript", "python"]);
    }

    #[test]
    fn a_runtime_that_breaks_ls_is_refused() {
        // Under Debian 12's runsc (0.0~20221219.0) statx answers EINVAL, so
        // `ls -la` and `stat` fail there and only `find` reports working.
        let runsc_2022 = RUNSC.replacen("works ls -la\nworks stat\n", "", 1);
        let e = judge_smoke(&runsc_2022, &want(true)).expect_err("2022 runsc passed");
        assert!(e.contains("`ls -la` fails inside the sandbox"), "{e}");
        for command in ORDINARY_COMMANDS {
            let report = RUNC.replacen(&format!("works {command}\n"), "", 1);
            let e = judge_smoke(&report, &want(false)).expect_err(command);
            assert!(e.contains(&format!("`{command}` fails")), "{e}");
        }
    }

    #[test]
    fn every_weakening_fails_the_smoke_test() {
        let cases: &[(&str, &str, &str)] = &[
            ("writable root", " / ro,relatime", " / rw,relatime"),
            (
                "extra writable",
                "writable /tmp\n",
                "writable /tmp\nwritable /etc\n",
            ),
            ("tmp not writable", "writable /tmp\n", ""),
            (
                "exec tmp",
                "/tmp rw,nosuid,nodev,noexec,relatime",
                "/tmp rw,nosuid,nodev,relatime",
            ),
            (
                "suid work",
                "/work rw,nosuid,nodev,noexec",
                "/work rw,nodev,noexec",
            ),
            (
                "big tmp",
                "rw,size=16384k\nwritable",
                "rw,size=65536k\nwritable",
            ),
            (
                "not tmpfs",
                "- tmpfs tmpfs rw,size=131072k",
                "- ext4 /dev/vda rw,size=131072k",
            ),
            ("a second interface", "iface lo\n", "iface lo\niface eth0\n"),
            ("no pids limit", "pids 256", "pids max"),
            ("root user", "user 61000:61000", "user 0:0"),
        ];
        for (name, from, to) in cases {
            assert!(RUNC.contains(from), "{name}: fixture lacks {from:?}");
            let report = RUNC.replacen(from, to, 1);
            assert!(judge_smoke(&report, &want(false)).is_err(), "{name} passed");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16m"), Some(16 << 20));
        assert_eq!(parse_size("16384k"), Some(16 << 20));
        assert_eq!(parse_size("16777216"), Some(16 << 20));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
    }
}
