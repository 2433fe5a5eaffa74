//! The docker engine as the tests see it: the images they run, the
//! containers a daemon made (by its label), and containers planted the way
//! a crashed daemon would have left them.

use std::process::Command;

/// The content-addressed ID of a tiny test image (Debian's static busybox,
/// imported locally: no registry is reachable here). Fails the test when no
/// docker engine answers: a docker test never skips itself into a pass.
pub fn busybox_image() -> String {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let docker = |args: &[&str]| {
            Command::new("docker")
                .args(args)
                .output()
                .expect("running the docker CLI")
        };
        let info = docker(&["info", "--format", "{{.ServerVersion}}"]);
        assert!(
            info.status.success(),
            "no docker engine answers (scripts/setup.sh starts one): {}",
            String::from_utf8_lossy(&info.stderr)
        );
        let tag = "plimsoll-test/busybox:1";
        if !docker(&["image", "inspect", tag]).status.success() {
            let dir = std::env::temp_dir().join(format!("plimsoll-busybox-{}", std::process::id()));
            std::fs::create_dir_all(dir.join("bin")).expect("image dir");
            std::fs::create_dir_all(dir.join("tmp")).expect("image dir");
            std::fs::copy("/bin/busybox", dir.join("bin/busybox"))
                .expect("busybox-static is installed by scripts/setup.sh");
            let status = Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "tar -C {} -c . | docker import - {tag}",
                    dir.display()
                ))
                .status()
                .expect("docker import");
            assert!(status.success(), "importing the test image failed");
            let _ = std::fs::remove_dir_all(&dir);
        }
        let out = docker(&["image", "inspect", tag, "--format", "{{.Id}}"]);
        String::from_utf8(out.stdout)
            .expect("utf-8")
            .trim()
            .to_string()
    })
    .clone()
}

/// The content-addressed ID of the guest image (Debian with node and
/// python3), built by `make image` (images/build-sandbox-image.sh). Fails the
/// test when it is missing or no docker engine answers: docker tests never
/// skip themselves into a pass.
pub fn sandbox_image() -> String {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let out = Command::new("docker")
            .args(["image", "inspect", SANDBOX_TAG, "--format", "{{.Id}}"])
            .output()
            .expect("running the docker CLI");
        assert!(
            out.status.success(),
            "the guest image {SANDBOX_TAG} is missing or docker is down (make image builds it): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .expect("utf-8")
            .trim()
            .to_string()
    })
    .clone()
}

/// The IDs of a daemon's containers: all that exist, or those running.
pub fn container_ids_of(pid: u32, all: bool) -> Vec<String> {
    let which = if all { "-aq" } else { "-q" };
    let out = Command::new("docker")
        .args([
            "ps",
            which,
            "--no-trunc",
            "--filter",
            &format!("label=io.plimsoll.owner={pid}"),
        ])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Containers a given daemon (by process ID) created that still exist.
pub fn containers_of(pid: u32) -> usize {
    count_containers_of(pid, "-aq")
}

/// Containers a given daemon created that are running now.
pub fn running_containers_of(pid: u32) -> usize {
    count_containers_of(pid, "-q")
}

fn count_containers_of(pid: u32, which: &str) -> usize {
    let out = Command::new("docker")
        .args([
            "ps",
            which,
            "--filter",
            &format!("label=io.plimsoll.owner={pid}"),
        ])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// The tag `make image` gives the guest image.
pub const SANDBOX_TAG: &str = "plimsoll/sandbox:bookworm";

/// Containers any daemon created that still exist: its label, and the
/// `plimsoll-` names it gives them (tests that plant labelled containers of
/// their own name them otherwise). Every daemon's, so not for a test while
/// others run: another test's containers would fail it, and another
/// daemon's sweep could hide its own leak. A test counts its daemon's with
/// `Daemon::stop_counting_leftovers`; the suite as a whole is checked at
/// its end (scripts/leftovers.sh).
pub fn leftover_containers() -> usize {
    let out = Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            "label=io.plimsoll.run",
            "--format",
            "{{.Names}}",
        ])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|n| n.starts_with("plimsoll-"))
        .count()
}

/// Whether a container of this name exists.
pub fn container_exists(name: &str) -> bool {
    Command::new("docker")
        .args(["inspect", name])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Starts a long-running, labelled container the way a crashed daemon
/// would have left one, expiring at `expires` (unix seconds).
pub fn plant_container(name: &str, image: &str, expires: u64) {
    plant_container_made_by(name, image, expires, None)
}

/// As `plant_container`, with the `io.plimsoll.process` label a daemon
/// writes (boot/PID-namespace/PID/start-time) when `process` is given.
pub fn plant_container_made_by(name: &str, image: &str, expires: u64, process: Option<&str>) {
    plant(name, image, expires, process, "io.plimsoll.run");
}

/// The run label of containers planted for one daemon's sweeper alone
/// (`plant_private_container`): only a daemon whose engine relay rewrites
/// its sweep's query (`RelayFaults::sweep_only_planted`) looks for it.
pub const PLANTED_LABEL: &str = "io.plimsoll.tst";

/// As `plant_container_made_by`, under `PLANTED_LABEL` instead of the run
/// label: no daemon's sweeper but the test's own sees it, so whether it
/// is swept or kept is that daemon's doing, whatever other tests' daemons
/// sweep meanwhile.
pub fn plant_private_container(name: &str, image: &str, expires: u64, process: Option<&str>) {
    plant(name, image, expires, process, PLANTED_LABEL);
}

fn plant(name: &str, image: &str, expires: u64, process: Option<&str>, run_label: &str) {
    let mut args: Vec<String> = ["run", "-d", "--name", name, "--network", "none"]
        .map(String::from)
        .to_vec();
    args.extend([
        "--label".into(),
        format!("{run_label}=1"),
        "--label".into(),
        format!("io.plimsoll.expires={expires}"),
    ]);
    if let Some(p) = process {
        args.extend(["--label".into(), format!("io.plimsoll.process={p}")]);
    }
    args.extend([image, "/bin/busybox", "sleep", "300"].map(String::from));
    let status = Command::new("docker")
        .args(&args)
        .output()
        .expect("docker run");
    let stderr = String::from_utf8_lossy(&status.stderr);
    // A container planted expired or orphaned is exactly what every
    // daemon's sweeper removes, and tests run side by side: another test's
    // daemon may take it between create and start. It is then gone, as
    // planted and swept.
    if !status.status.success() && stderr.contains("marked for removal") {
        return;
    }
    assert!(status.status.success(), "{stderr}");
}

/// The `io.plimsoll.process` value for process `pid` started at `start`
/// (clock ticks after boot), in this boot, PID namespace and user.
pub fn process_identity(pid: u32, start: &str) -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
    let ns = std::fs::read_link("/proc/self/ns/pid").expect("pid namespace");
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let uid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("uid");
    format!(
        "{}/{}/{uid}/{pid}/{start}",
        boot.trim(),
        ns.to_string_lossy()
    )
}

/// This test process's start time, as `process_identity` wants it.
pub fn own_start_time() -> String {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("stat");
    let rest = &stat[stat.rfind(')').expect("stat name") + 1..];
    rest.split_whitespace()
        .nth(19)
        .expect("start time")
        .to_string()
}
