//! The container envelope, measured from inside real containers under runc
//! and runsc: memory equal to memory+swap, the CPU quota, the seccomp
//! profile (runc), core dumps, open files, message queues, private IPC.
//! Each is read or provoked by the container's own code, so a setting that
//! is dropped from the create request shows here, not only in a unit test
//! of the request (`backends/docker/envelope.rs`).

use base64::Engine as _;
use plimsoll_tests::{Answer, Daemon, call};
use serde_json::json;

fn docker(runtime: &str) -> Daemon {
    let image = plimsoll_tests::sandbox_image();
    let mut env: Vec<(&str, &str)> = vec![
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_DOCKER_IMAGE", image.as_str()),
        ("SANDBOX_DOCKER_POOL", "0"),
        ("SANDBOX_MEMORY_MB", "128"),
        ("SANDBOX_CPUS", "0.5"),
    ];
    if !runtime.is_empty() {
        env.push(("SANDBOX_DOCKER_RUNTIME", runtime));
    }
    Daemon::start(&env)
}

async fn steps(d: &Daemon, steps: &[&str]) -> Answer {
    let mut req = json!({"protocol": 4, "project": {"files": [], "steps": steps, "artifacts": []}});
    req["timeoutMs"] = json!(60_000);
    let a = call(d, "Run", &req).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    a
}

fn out(a: &Answer, i: usize) -> String {
    let v = &a.body["project"]["steps"][i]["stdout"];
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap_or(""))
        .expect("base64");
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `key value...` lines, as the probes print them.
fn field<'a>(report: &'a str, key: &str) -> &'a str {
    report
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key} ")))
        .unwrap_or_else(|| panic!("no {key} line in:\n{report}"))
}

/// Limits every process inherits, from python's view of them.
const RLIMITS: &str = r#"python3 -c '
import resource
for name in ("CORE", "NOFILE", "MSGQUEUE"):
    soft, hard = resource.getrlimit(getattr(resource, "RLIMIT_" + name))
    print(name.lower(), soft, hard)
'"#;

/// Allocates well past the 128 MiB cap: the kernel (or gVisor) must kill it.
const MEMORY_BOMB: &str =
    r#"python3 -c 'b = bytearray(400 * 1024 * 1024); print("survived")'; echo "bomb $?""#;

/// Two processes spin for two seconds of wall time; their CPU seconds show
/// the quota (0.5 CPU: about one second; unlimited on two cores: four).
const SPIN: &str = r#"python3 -c '
import os, time
for _ in range(2):
    if os.fork() == 0:
        end = time.time() + 2
        while time.time() < end:
            pass
        os._exit(0)
for _ in range(2):
    os.wait()
t = os.times()
print("cpu", round(t.children_user + t.children_system, 2))
'"#;

fn ipc_namespace_of_this_process() -> String {
    std::fs::read_link("/proc/self/ns/ipc")
        .expect("ipc ns")
        .display()
        .to_string()
}

/// The CPU quota and throttling counters of a container's cgroup on the
/// host, read through its init process (runc's container process, or
/// runsc's sandbox process): `(quota_us, period_us, nr_throttled)`.
fn host_cpu_cgroup(container: &str) -> Option<(i64, i64, u64)> {
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.State.Pid}}", container])
        .output()
        .ok()?;
    let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    // cgroup v1: `n:cpu,cpuacct:/path` (or `n:cpu:/path`).
    let path = cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "cpu")
            .then(|| path.to_string())
    })?;
    let dir = format!("/sys/fs/cgroup/cpu{path}");
    let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
    let quota = read("cpu.cfs_quota_us")?.trim().parse().ok()?;
    let period = read("cpu.cfs_period_us")?.trim().parse().ok()?;
    let throttled = read("cpu.stat")?
        .lines()
        .find_map(|l| l.strip_prefix("nr_throttled ")?.parse().ok())?;
    Some((quota, period, throttled))
}

/// Reads the host cgroup of every container the daemon runs, every 50 ms
/// until `stop`, keeping the most each was throttled and its quota.
fn watch_throttling(
    owner: u32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Option<(i64, i64, u64)>> {
    std::thread::spawn(move || {
        let mut most: Option<(i64, i64, u64)> = None;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let ids = std::process::Command::new("docker")
                .args(["ps", "-q", "--no-trunc", "--filter"])
                .arg(format!("label=io.plimsoll.owner={owner}"))
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            for id in ids.split_whitespace() {
                if let Some(seen) = host_cpu_cgroup(id)
                    && most.is_none_or(|m| seen.2 > m.2)
                {
                    most = Some(seen);
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        most
    })
}

async fn common(d: &Daemon, runtime: &str) {
    // The host's own view of the quota: the container's cgroup on the host,
    // read while the spinners run, must hold 0.5 CPU and have throttled
    // them. Under runsc this is the only trustworthy view: the CPU time
    // the sandbox reports to its processes is gVisor's own accounting.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = watch_throttling(d.pid().expect("pid"), stop.clone());
    let a = steps(d, &[RLIMITS, SPIN, MEMORY_BOMB]).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let host = watcher.join().expect("the cgroup watcher");
    let limits = out(&a, 0);
    assert_eq!(field(&limits, "core"), "0 0", "core dumps");
    assert_eq!(field(&limits, "nofile"), "4096 4096", "open files");
    assert_eq!(field(&limits, "msgqueue"), "0 0", "message queues");

    let (quota, period, throttled) =
        host.unwrap_or_else(|| panic!("{runtime}: no container's host cgroup was readable"));
    assert_eq!(
        quota * 2,
        period,
        "{runtime}: the host cgroup's quota is not 0.5 CPU"
    );
    assert!(
        throttled > 0,
        "{runtime}: two spinners under a 0.5 CPU quota were never throttled"
    );
    if runtime == "runc" {
        let cpu: f64 = field(&out(&a, 1), "cpu").parse().expect("cpu seconds");
        assert!(
            cpu < 1.6,
            "two spinners used {cpu} CPU seconds in 2 s under a 0.5 CPU quota"
        );
    }

    // Last, since gVisor kills the whole sandbox at its memory limit while
    // runc's kernel kills the one process: either way it is killed.
    let bomb = out(&a, 2);
    assert!(!bomb.contains("survived"), "{bomb}");
    let step = &a.body["project"]["steps"][2];
    let sandbox_killed = a.body["project"]["outcomeDetail"]
        .as_str()
        .is_some_and(|d| d.contains("killed (out of memory"));
    let killed = bomb.lines().any(|l| l == "bomb 137") || step["exitCode"] == 137 || sandbox_killed;
    assert!(killed, "the allocation was not killed: {:?}", a.body);
}

#[tokio::test]
async fn the_envelope_holds_from_inside_under_runc() {
    let d = docker("");
    common(&d, "runc").await;
    // runc: the container's own cgroup says it, the shipped seccomp profile
    // is in force (filter mode, and calls only it refuses are refused), and the IPC
    // namespace is the container's own. (Under gVisor the Sentry keeps IPC
    // to itself and shows no namespace link.)
    let a = steps(
        &d,
        &[
            "readlink /proc/self/ns/ipc",
            "echo mem $(cat /sys/fs/cgroup/memory/memory.limit_in_bytes); echo memsw $(cat /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes); echo swap $(awk '$1 == \"swap\" {print $2}' /sys/fs/cgroup/memory/memory.stat)",
            "echo cfs $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)",
            r#"echo seccomp $(awk '$1 == "Seccomp:" {print $2}' /proc/self/status); python3 -c '
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
for name, call in (("unshare", lambda: libc.unshare(0x10000000)), ("io_uring", lambda: libc.syscall(425, 1, None)),
                   ("shmget", lambda: libc.shmget(0, 4096, 0o1600)), ("ptrace", lambda: libc.ptrace(0, 0, None, None))):
    r = call()
    print(name, r, errno.errorcode.get(ctypes.get_errno(), "none") if r == -1 else "allowed")
'"#,
        ],
    )
    .await;
    let ipc = out(&a, 0);
    assert!(ipc.starts_with("ipc:["), "{ipc}");
    assert_ne!(
        ipc.trim(),
        ipc_namespace_of_this_process(),
        "the host's IPC namespace"
    );
    let a_ipc_offset = 1;
    let mem = out(&a, a_ipc_offset);
    assert_eq!(field(&mem, "mem"), (128u64 << 20).to_string(), "{mem}");
    assert_eq!(
        field(&mem, "memsw"),
        (128u64 << 20).to_string(),
        "memory+swap: {mem}"
    );
    assert_eq!(field(&mem, "swap"), "0", "{mem}");
    assert_eq!(field(&out(&a, a_ipc_offset + 1), "cfs"), "50000 100000");
    let sec = out(&a, a_ipc_offset + 2);
    assert_eq!(field(&sec, "seccomp"), "2", "{sec}");
    assert_eq!(field(&sec, "unshare"), "-1 EPERM", "{sec}");
    assert_eq!(field(&sec, "io_uring"), "-1 EPERM", "{sec}");
    // Docker's own default profile refuses the two above as well; these two
    // it allows (a SysV shared memory segment, PTRACE_TRACEME), and only the
    // shipped profile refuses them, so they tell the profiles apart.
    assert_eq!(field(&sec, "shmget"), "-1 EPERM", "{sec}");
    assert_eq!(field(&sec, "ptrace"), "-1 EPERM", "{sec}");
    // Counted before the stopped daemon is reaped, so no other daemon's
    // sweep can have taken a container it left (`Daemon::stop_then`).
    assert_eq!(
        d.stop_counting_leftovers(),
        0,
        "containers were left behind"
    );
}

#[tokio::test]
async fn the_envelope_holds_from_inside_under_runsc() {
    let d = docker("runsc");
    common(&d, "runsc").await;
    // Counted before the stopped daemon is reaped, so no other daemon's
    // sweep can have taken a container it left (`Daemon::stop_then`).
    assert_eq!(
        d.stop_counting_leftovers(),
        0,
        "containers were left behind"
    );
}
