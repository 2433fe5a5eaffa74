//! What the tier rests on, checked against the engine itself: the runtime
//! it resolves (and for gVisor the executable behind it), where the
//! sandbox's process limit lives, and the image, pinned by ID with nothing
//! in it that changes how programs load.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bollard::Docker;
use bollard::models::{SystemInfoCgroupDriverEnum, SystemInfoCgroupVersionEnum};

use super::settings::Settings;
use super::short;
use crate::dirs::Dir;
use crate::plugin_host::capabilities::container_engine::policy::loader_var;

/// Where the host keeps the sandbox's process limit under gVisor, whose
/// emulated cgroup files inside the sandbox do not show the host's limit.
#[derive(Debug, Clone)]
pub(super) enum PidsCgroup {
    /// Set by the engine from the container's config (runc).
    Engine,
    /// `<root>/<id>` on the host, created and limited before start (gVisor).
    /// The root is held open: every cgroup is made, written, read and
    /// removed through its handle.
    Host {
        root: Arc<Dir>,
        path: PathBuf,
        parent: String,
    },
}

/// The arguments the engine may pass runsc for the kernel tier to hold.
/// Each one is here because the project needs it or it does not widen
/// what a sandbox reaches: `--network=none` (this VM's runsc needs it, and
/// containers have no network anyway), `--host-uds=open` (a container may
/// connect to the one host socket bind-mounted into it, the broker's), and
/// the two platforms that run without extra host devices. Anything else (a
/// host network, any host socket to be created, directfs changes, debug
/// logs) is refused: the tier would no longer be the one verified.
pub const ALLOWED_RUNSC_ARGS: &[&str] = &[
    "--network=none",
    "--host-uds=open",
    "--platform=systrap",
    "--platform=ptrace",
];

/// What the runtime resolved to: for gVisor, the executable (and the file
/// it is) and the arguments the engine passes it; for runc, the version
/// the engine reports. Compared on every readiness probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RuntimeEvidence {
    pub(super) path: Option<PathBuf>,
    pub(super) args: Vec<String>,
    /// The runsc executable as a file: replaced or rewritten since start
    /// (a package upgrade or downgrade), it is no longer the one whose
    /// version was read.
    pub(super) file: Option<FileIdentity>,
    /// runc's version as the engine reports it (its commit field).
    pub(super) engine_version: String,
}

/// Device, inode, size and modification time of an executable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileIdentity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

impl FileIdentity {
    fn of(meta: &std::fs::Metadata) -> FileIdentity {
        FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

impl RuntimeEvidence {
    /// The runtime and its version, as Describe states it: `runsc
    /// 0.0~20240729.0` (the version read at start), `runc 1.1.5`.
    pub(super) fn stated(&self, runsc_version: &str) -> String {
        match &self.path {
            Some(_) => format!("runsc {runsc_version}"),
            None if self.engine_version.is_empty() => "runc".to_string(),
            None => format!("runc {}", self.engine_version),
        }
    }

    /// A line for the operator's log and the startup evidence.
    pub(super) fn describe(&self, runsc_version: &str) -> String {
        match &self.path {
            Some(p) => format!(
                "runtime runsc {runsc_version} at {} with arguments [{}]",
                p.display(),
                self.args.join(" ")
            ),
            None => format!("runtime {} (the engine's default)", self.stated("")),
        }
    }
}

/// The runtime is the one configured, and for gVisor the engine resolves it
/// to an executable named runsc on this host, run with allowed arguments
/// only.
pub(super) fn verify_runtime(
    settings: &Settings,
    info: &bollard::models::SystemInfo,
) -> Result<RuntimeEvidence, String> {
    match settings.runtime.as_str() {
        "" => {
            // The container tier rests on runc's namespaces and cgroups; an
            // engine whose default is something else is not what we verify.
            let default = info.default_runtime.as_deref().unwrap_or("");
            if default != "runc" {
                return Err(format!(
                    "the docker engine's default runtime is {default:?}, not runc; set SANDBOX_DOCKER_RUNTIME to a runtime plimsoll verifies"
                ));
            }
            let engine_version = info
                .runc_commit
                .as_ref()
                .and_then(|c| c.id.as_deref())
                .map(|v| crate::text::sanitize(v, 64))
                .unwrap_or_default();
            Ok(RuntimeEvidence {
                path: None,
                args: vec![],
                file: None,
                engine_version,
            })
        }
        "runsc" => {
            let runtimes = info.runtimes.clone().unwrap_or_default();
            let Some(rt) = runtimes.get("runsc") else {
                return Err("the docker engine does not register the runtime runsc".into());
            };
            let path = rt.path.clone().unwrap_or_default();
            let (resolved, file) = resolve_executable(&path)
                .ok_or_else(|| format!("the engine's runsc runtime points at {path:?}, which is not an executable on this host owned by root and writable by no one else"))?;
            if resolved.file_name().and_then(|n| n.to_str()) != Some("runsc") {
                return Err(format!(
                    "the engine's runsc runtime resolves to {}, not an executable named runsc",
                    resolved.display()
                ));
            }
            let args = rt.runtime_args.clone().unwrap_or_default();
            check_runsc_args(&args)?;
            Ok(RuntimeEvidence {
                path: Some(resolved),
                args,
                file: Some(file),
                engine_version: String::new(),
            })
        }
        other => Err(format!(
            "SANDBOX_DOCKER_RUNTIME={other:?}: plimsoll verifies runc (unset) and runsc only"
        )),
    }
}

/// Every argument the engine passes runsc must be on the allowlist.
pub(super) fn check_runsc_args(args: &[String]) -> Result<(), String> {
    match args
        .iter()
        .find(|a| !ALLOWED_RUNSC_ARGS.contains(&a.as_str()))
    {
        Some(bad) => Err(format!(
            "the engine runs runsc with {:?}, which is not among the arguments the kernel tier allows ({})",
            crate::text::sanitize(bad, 100),
            ALLOWED_RUNSC_ARGS.join(", ")
        )),
        None => Ok(()),
    }
}

/// A path as the engine would run it: absolute, or searched on PATH; then
/// symlinks resolved, and it must be an executable file.
fn resolve_executable(path: &str) -> Option<(PathBuf, FileIdentity)> {
    if path.is_empty() {
        return None;
    }
    let candidate = if path.contains('/') {
        PathBuf::from(path)
    } else {
        [
            "/usr/local/sbin",
            "/usr/local/bin",
            "/usr/sbin",
            "/usr/bin",
            "/sbin",
            "/bin",
        ]
        .iter()
        .map(|d| Path::new(d).join(path))
        .find(|p| p.is_file())?
    };
    let real = std::fs::canonicalize(candidate).ok()?;
    let meta = std::fs::metadata(&real).ok()?;
    // The host runs this file itself (`--version`), so it must be one only
    // root can have put there: owned by root, writable by no one else.
    let trusted = meta.uid() == 0 && meta.permissions().mode() & 0o022 == 0;
    (meta.is_file() && meta.permissions().mode() & 0o111 != 0 && trusted)
        .then(|| (real, FileIdentity::of(&meta)))
}

/// Where gVisor sandboxes' process limits go: the host's pids cgroup under
/// the engine's cgroupfs parent.
pub(super) fn pids_cgroup_root(info: &bollard::models::SystemInfo) -> Result<PidsCgroup, String> {
    if info.cgroup_driver != Some(SystemInfoCgroupDriverEnum::CGROUPFS) {
        return Err(
            "the process limit under runsc needs the docker engine's cgroupfs cgroup driver".into(),
        );
    }
    let parent = "/docker".to_string();
    let root = match info.cgroup_version {
        Some(SystemInfoCgroupVersionEnum::_2) => PathBuf::from("/sys/fs/cgroup/docker"),
        _ => PathBuf::from("/sys/fs/cgroup/pids/docker"),
    };
    let dir = crate::dirs::open_nofollow(&root)
        .map_err(|e| format!("no pids cgroup at {}: {e}", root.display()))?;
    Ok(PidsCgroup::Host {
        root: Arc::new(dir),
        path: root,
        parent,
    })
}

/// Resolves the configured image to its ID and checks what it declares.
pub(super) async fn resolve_image(
    docker: &Docker,
    image: &str,
) -> Result<(String, Vec<String>), String> {
    let inspected = docker.inspect_image(image).await.map_err(|e| {
        format!(
            "the image {image:?} is not in the engine (images/build-sandbox-image.sh builds it): {}",
            short(&e)
        )
    })?;
    let id = inspected
        .id
        .ok_or("the engine reported the image without an ID")?;
    let config = inspected.config.unwrap_or_default();
    if config.volumes.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(format!(
            "the image {image:?} declares VOLUMEs, which would be writable outside the disk budget"
        ));
    }
    let env = config.env.unwrap_or_default();
    for e in &env {
        let key = e.split_once('=').map_or(e.as_str(), |(k, _)| k);
        if loader_var(key) {
            return Err(format!(
                "the image {image:?} sets {key}, which changes how programs load; refused"
            ));
        }
    }
    Ok((id, env))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_a_runtime_file_no_one_but_its_owner_can_write_is_resolved() {
        let dir = std::env::temp_dir().join(format!("plimsoll-rt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let exe = dir.join("runsc");
        std::fs::write(&exe, b"#!/bin/sh\n").expect("file");
        let path = exe.to_str().expect("utf-8");
        let mode = |m: u32| {
            std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(m)).expect("chmod")
        };
        mode(0o755);
        // The suite runs as root, which owns what it writes.
        let owned_by_root = std::fs::metadata(&exe).expect("meta").uid() == 0;
        assert_eq!(resolve_executable(path).is_some(), owned_by_root);
        for writable in [0o775, 0o757, 0o777] {
            mode(writable);
            assert!(resolve_executable(path).is_none(), "{writable:o}");
        }
        mode(0o644);
        assert!(resolve_executable(path).is_none(), "not executable");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn runsc_arguments_outside_the_allowlist_refuse_the_kernel_tier() {
        for bad in [
            "--network=host",
            "--network=sandbox",
            "--host-uds=all",
            "--host-uds=create",
            "--debug",
            "--directfs=false",
            "--platform=kvm",
        ] {
            let e = check_runsc_args(&args(&["--network=none", bad])).expect_err(bad);
            assert!(e.contains(bad), "{e}");
        }
        assert!(check_runsc_args(&args(&["--network=none", "--host-uds=open"])).is_ok());
        assert!(check_runsc_args(&[]).is_ok());
    }
}
