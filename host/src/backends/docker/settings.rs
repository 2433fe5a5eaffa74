//! What the operator configures for containers, and the variables that say
//! it. Parsed here, next to the engine that enforces it; `config` only adds
//! the rule that these are refused when no provider would use them.

use std::path::PathBuf;

use crate::env_vars::{ConfigError, Env, Var, invalid, var};

/// Sizes of the two small scratch mounts; /work gets the rest of the
/// operator's disk budget.
pub const TMP_MB: u32 = 16;
pub const SHM_MB: u32 = 16;
/// Smallest /work the smoke test and a project can live with.
pub const MIN_WORK_MB: u32 = 16;

/// The variables this backend reads. Set while no provider uses a
/// container engine, each is refused (a limit must take effect or not be
/// set).
pub const VARIABLES: &[Var] = &[
    var(
        "SANDBOX_DOCKER_RUNTIME",
        "(unset: runc)",
        "the only OCI runtime containers may use: unset (runc, container tier) or runsc (gVisor, kernel tier once verified)",
    ),
    var(
        "SANDBOX_DOCKER_IMAGE",
        "plimsoll/sandbox:bookworm",
        "guest image (tag or ID), resolved to its ID at start; runs use that ID, and a tag re-pointed later makes runs refused",
    ),
    var(
        "SANDBOX_DOCKER_SECCOMP",
        "(unset: the shipped profile)",
        "seccomp profile applied under runc: a JSON file's path, or engine-default for the engine's own",
    ),
    var(
        "SANDBOX_DOCKER_POOL",
        "2",
        "warm containers kept started for snippets, and as many for projects, 0-32; each serves one run",
    ),
    var(
        "SANDBOX_DOCKER_SOCKET",
        "/var/run/docker.sock",
        "the docker engine's Unix socket (DOCKER_HOST is never read)",
    ),
    var(
        "SANDBOX_GUEST_UID",
        "61000",
        "uid and gid of every container's processes; refused if uid or uid+1 is in this host's /etc/passwd or /etc/group",
    ),
    var(
        "SANDBOX_CPUS",
        "1",
        "per-container CPUs (docker); the wasm provider refuses it",
    ),
    var(
        "SANDBOX_PIDS",
        "256",
        "per-container process limit (docker; under runsc it counts gVisor's own ~40 tasks); the wasm provider refuses it",
    ),
    var(
        "SANDBOX_DISK_MB",
        "160",
        "per-container writable budget in MiB (docker): /tmp 16 + /dev/shm 16 + the rest for /work; the wasm provider refuses it",
    ),
];

/// The shipped seccomp profile, applied under runc unless the operator names
/// another (see docs/isolation-tiers.md).
pub const SHIPPED_SECCOMP: &str = include_str!("../../../../plugins/docker/seccomp.json");

/// What the operator configured for containers.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The engine's Unix socket. Only this is used: DOCKER_HOST and the
    /// docker CLI's configuration are never consulted.
    pub socket: PathBuf,
    /// The image as configured: a tag or an ID, resolved to an ID at start.
    pub image: String,
    /// "" for the engine's default (which must be runc), or "runsc".
    pub runtime: String,
    pub guest_uid: u32,
    pub memory_mb: u32,
    pub nano_cpus: i64,
    pub pids: i64,
    /// The writable budget: /tmp + /dev/shm + /work.
    pub disk_mb: u32,
    /// A seccomp profile (JSON text) applied under runc; None keeps the
    /// engine's default profile. gVisor filters the host calls itself.
    pub seccomp: Option<String>,
    /// Warm containers kept for snippets, and again for projects; 0 turns
    /// pooling off.
    pub pool: u32,
    /// Warm containers kept for sessions (`SANDBOX_SESSION_POOL`, set from
    /// the session settings); 0 turns that pool off.
    pub session_pool: u32,
    /// The session lifetime, which a warm session container's expiry
    /// must outlast (set from the session settings).
    pub session_lifetime: std::time::Duration,
}

impl Settings {
    pub(super) fn work_mb(&self) -> u32 {
        self.disk_mb.saturating_sub(TMP_MB + SHM_MB)
    }

    pub(super) fn gvisor(&self) -> bool {
        self.runtime == "runsc"
    }

    pub fn user(&self) -> String {
        format!("{0}:{0}", self.guest_uid)
    }

    /// Parses this backend's variables; `memory_mb` is the providers'
    /// shared per-run memory cap.
    pub fn from_env(env: &Env, memory_mb: u32) -> Result<Settings, ConfigError> {
        let runtime = match env.get("SANDBOX_DOCKER_RUNTIME") {
            None | Some("runc") => String::new(),
            Some("runsc") => "runsc".to_string(),
            Some(_) => {
                return Err(invalid(
                    "SANDBOX_DOCKER_RUNTIME",
                    "must be unset (runc) or runsc: those are the runtimes plimsoll verifies",
                ));
            }
        };
        let image = env
            .get("SANDBOX_DOCKER_IMAGE")
            .unwrap_or("plimsoll/sandbox:bookworm")
            .to_string();
        if image.len() > 256 || !image.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(
                "SANDBOX_DOCKER_IMAGE",
                "must be an image tag or ID",
            ));
        }
        let seccomp = match env.get("SANDBOX_DOCKER_SECCOMP") {
            None => Some(SHIPPED_SECCOMP.to_string()),
            Some("engine-default") => None,
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    invalid("SANDBOX_DOCKER_SECCOMP", format!("reading {path}: {e}"))
                })?;
                Some(text)
            }
        };
        if let Some(text) = &seccomp {
            let v: serde_json::Value = serde_json::from_str(text).map_err(|e| {
                invalid("SANDBOX_DOCKER_SECCOMP", format!("not a JSON profile: {e}"))
            })?;
            if v.get("defaultAction").and_then(|a| a.as_str()).is_none() {
                return Err(invalid(
                    "SANDBOX_DOCKER_SECCOMP",
                    "the profile has no defaultAction",
                ));
            }
        }
        let pool = env.u32_in("SANDBOX_DOCKER_POOL", 0, 32)?.unwrap_or(2);
        let socket = PathBuf::from(
            env.get("SANDBOX_DOCKER_SOCKET")
                .unwrap_or("/var/run/docker.sock"),
        );
        if !socket.is_absolute() {
            return Err(invalid(
                "SANDBOX_DOCKER_SOCKET",
                "must be an absolute path to a Unix socket",
            ));
        }
        let guest_uid = env
            .u32_in("SANDBOX_GUEST_UID", 1000, (1 << 31) - 2)?
            .unwrap_or(61000);
        let nano_cpus = match env.get("SANDBOX_CPUS") {
            None => 1_000_000_000,
            Some(s) => match s.parse::<f64>() {
                Ok(c) if c.is_finite() && (0.01..=64.0).contains(&c) => (c * 1e9) as i64,
                _ => {
                    return Err(invalid(
                        "SANDBOX_CPUS",
                        "must be a number of CPUs from 0.01 to 64",
                    ));
                }
            },
        };
        // gVisor's own tasks count against the limit under runsc.
        let pids = env.u32_in("SANDBOX_PIDS", 64, 65536)?.unwrap_or(256);
        let min_disk = TMP_MB + SHM_MB + MIN_WORK_MB;
        let disk_mb = env
            .u32_in("SANDBOX_DISK_MB", min_disk, 1 << 20)?
            .unwrap_or(TMP_MB + SHM_MB + 128);
        Ok(Settings {
            socket,
            image,
            runtime,
            guest_uid,
            memory_mb,
            nano_cpus,
            pids: i64::from(pids),
            disk_mb,
            seccomp,
            pool,
            session_pool: 0,
            session_lifetime: std::time::Duration::ZERO,
        })
    }

    /// Refuses a guest uid that is an account or group on this host.
    pub fn check_guest_uid_on_host(&self) -> Result<(), String> {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        check_guest_uid(self.guest_uid, &read("/etc/passwd"), &read("/etc/group"))
    }
}

/// The guest uid must belong to nobody on this host: a container process
/// with a host account's uid could use that account's files through any
/// mount or leak, and uid+1 is refused too so an off-by-one elsewhere cannot
/// land on a real account.
pub fn check_guest_uid(uid: u32, passwd: &str, group: &str) -> Result<(), String> {
    let taken = |table: &str, id: u32| {
        table.lines().any(|l| {
            l.split(':')
                .nth(2)
                .and_then(|f| f.parse::<u32>().ok())
                .is_some_and(|n| n == id)
        })
    };
    for id in [uid, uid + 1] {
        if taken(passwd, id) {
            return Err(format!(
                "SANDBOX_GUEST_UID={uid}: {id} is a user in this host's /etc/passwd"
            ));
        }
        if taken(group, id) {
            return Err(format!(
                "SANDBOX_GUEST_UID={uid}: {id} is a group in this host's /etc/group"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_uid_that_is_a_host_account_is_refused() {
        let passwd = "root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/usr/sbin/nologin\n";
        let group = "root:x:0:\nstaff:x:61001:\n";
        assert!(check_guest_uid(61010, passwd, group).is_ok());
        assert!(check_guest_uid(65534, passwd, group).is_err());
        assert!(
            check_guest_uid(65533, passwd, group).is_err(),
            "uid+1 is nobody"
        );
        assert!(
            check_guest_uid(61000, passwd, group).is_err(),
            "uid+1 is a group"
        );
    }
}
