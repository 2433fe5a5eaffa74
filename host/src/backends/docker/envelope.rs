//! The envelope: how every container is created, whatever the plugin
//! asked for. The plugin's approved command and environment are the only
//! inputs it controls; the image ID, user, runtime, network, mounts, limits
//! and labels are the host's.
//!
//! And when it starts: every container runs the host's gate first, a few
//! lines of the image's `/bin/sh` that wait for one line on stdin, then put
//! the plugin's environment in place and become the plugin's command. The
//! host writes that line only when a run takes the container (`lifecycle`),
//! so nothing a plugin chose executes in a container that is started and
//! waiting, warm or cold. The one exception is a pre-boot command the
//! plugin declared before its first request, frozen for its life: its warm
//! containers launch it at once, in this same envelope, and it takes its
//! request on stdin when a run takes the container. The plugin's environment is not the container's:
//! it is applied by the gate at the last moment, so no variable a plugin
//! names (a shell's startup file, say) can act on the gate itself.

use std::collections::HashMap;
use std::path::Path;

use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig, ResourcesUlimits};

use super::settings::{SHM_MB, Settings, TMP_MB};
use super::{DockerEngine, EXPIRES_LABEL, LABEL, OWNER_LABEL, PROCESS_LABEL, SESSION_LABEL, owner};
use crate::grants::socket::MOUNT_POINT;
use crate::plugin_host::capabilities::container_engine::backend::Approved;

/// Per-process open files inside a container.
const NOFILE: i64 = 4096;

/// Exports the plugin's `KEY=value` pairs (the arguments before `--`),
/// then becomes the plugin's command (the arguments after it).
macro_rules! export_and_exec {
    () => {
        r#"while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do export "$1" || exit 125; shift; done
shift
exec "$@""#
    };
}

/// The gate: waits for the host's line, then exports and execs. `read`
/// takes its line a byte at a time from a pipe, so everything after the
/// line reaches the command untouched.
pub(super) const GATE: &str = concat!("read -r _ || exit 125\n", export_and_exec!());
/// The gate's name in the process list (`$0`).
const GATE_NAME: &str = "plimsoll-gate";
/// A pre-booted container's launch: the gate without its wait. Only for
/// the command a plugin declared before its first request (the capability's
/// `preboot`), which runs as soon as the container starts and takes its
/// request on stdin when a run takes the container.
pub(super) const LAUNCH: &str = export_and_exec!();
/// The launch's name in the process list.
const LAUNCH_NAME: &str = "plimsoll-launch";
/// The variable that carries a pre-booted run's end-frame nonce (`frames`).
pub(super) const END_VAR: &str = "PLIMSOLL_END";

/// How a container's command starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start<'a> {
    /// Behind the gate: nothing of the plugin's runs until a run opens it.
    Gated,
    /// At once: a pre-boot declaration, with the nonce of its end frames.
    Booted { end: &'a str },
}
/// What the host writes to open the gate.
pub(super) const GATE_LINE: &[u8] = b"\n";

/// How long a container may live, and what for: the sweeper reads both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Life {
    /// Unix time after which the sweeper may remove it.
    pub expires: u64,
    /// A session's container (kept for many calls), not a run's.
    pub session: bool,
}

impl Life {
    pub fn run(expires: u64) -> Life {
        Life {
            expires,
            session: false,
        }
    }
}

impl DockerEngine {
    pub(super) fn create_body(
        &self,
        spec: &Approved,
        start: Start<'_>,
        life: Life,
        grant_dir: Option<&Path>,
    ) -> ContainerCreateBody {
        create_body(
            &self.settings,
            self.image_id(),
            spec,
            start,
            life,
            grant_dir,
        )
    }
}

/// The whole create request for one container. Pure, so the envelope is
/// tested without an engine.
/// Long on purpose: the whole envelope is one literal, so what every
/// container gets is read in one place.
pub(super) fn create_body(
    s: &Settings,
    image_id: &str,
    spec: &Approved,
    start: Start<'_>,
    life: Life,
    grant_dir: Option<&Path>,
) -> ContainerCreateBody {
    {
        let memory = i64::from(s.memory_mb) << 20;
        let (script, name, host_env) = match start {
            Start::Gated => (GATE, GATE_NAME, None),
            // The host's variable comes last, so the plugin's cannot set it.
            Start::Booted { end } => (LAUNCH, LAUNCH_NAME, Some(format!("{END_VAR}={end}"))),
        };
        let entrypoint = vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            script.to_string(),
            name.to_string(),
        ];
        let cmd: Vec<String> = spec
            .env
            .iter()
            .cloned()
            .chain(host_env)
            .chain(std::iter::once("--".to_string()))
            .chain(spec.command.iter().cloned())
            .collect();
        let mut security_opt = vec!["no-new-privileges".to_string()];
        if !s.gvisor()
            && let Some(profile) = &s.seccomp
        {
            security_opt.push(format!("seccomp={profile}"));
        }
        let scratch = |mb: u32, extra: &str| format!("rw,noexec,nosuid,nodev,size={mb}m{extra}");
        ContainerCreateBody {
            image: Some(image_id.to_string()),
            entrypoint: Some(entrypoint),
            cmd: Some(cmd),
            // The plugin's environment reaches its command through the gate.
            env: Some(vec![]),
            user: Some(s.user()),
            working_dir: Some("/work".into()),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            open_stdin: Some(true),
            stdin_once: Some(true),
            tty: Some(false),
            network_disabled: Some(true),
            labels: Some({
                let mut labels = HashMap::from([
                    (LABEL.to_string(), "1".to_string()),
                    (EXPIRES_LABEL.to_string(), life.expires.to_string()),
                    (OWNER_LABEL.to_string(), std::process::id().to_string()),
                    (PROCESS_LABEL.to_string(), owner::this_process().to_string()),
                ]);
                if life.session {
                    labels.insert(SESSION_LABEL.to_string(), "1".to_string());
                }
                labels
            }),
            host_config: Some(HostConfig {
                network_mode: Some("none".into()),
                // The only host path a container ever sees: the run's broker
                // directory, read-only, made by the host for this run.
                binds: grant_dir.map(|d| vec![format!("{}:{}:ro", d.display(), MOUNT_POINT)]),
                readonly_rootfs: Some(true),
                privileged: Some(false),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(security_opt),
                memory: Some(memory),
                memory_swap: Some(memory),
                nano_cpus: Some(s.nano_cpus),
                // This runsc build crashes when docker passes a pids limit;
                // under gVisor the limit is on the sandbox's host cgroup.
                pids_limit: if s.gvisor() { None } else { Some(s.pids) },
                tmpfs: Some(HashMap::from([
                    ("/tmp".to_string(), scratch(TMP_MB, "")),
                    // Owned by the guest user: runc here keeps the mode of
                    // the directory it mounts over, so mode=1777 is not
                    // enough to make it writable.
                    (
                        "/work".to_string(),
                        scratch(s.work_mb(), &format!(",uid={0},gid={0}", s.guest_uid)),
                    ),
                ])),
                shm_size: Some(i64::from(SHM_MB) << 20),
                // Named even for runc: the engine's default could change
                // under a running daemon, and the tier rests on the runtime.
                runtime: Some(if s.runtime.is_empty() {
                    "runc".to_string()
                } else {
                    s.runtime.clone()
                }),
                ulimits: Some(vec![
                    ResourcesUlimits {
                        name: Some("core".into()),
                        soft: Some(0),
                        hard: Some(0),
                    },
                    // POSIX message queues are the one writable thing in
                    // /dev a run would otherwise have; their memory is
                    // counted per uid, which every run shares.
                    ResourcesUlimits {
                        name: Some("msgqueue".into()),
                        soft: Some(0),
                        hard: Some(0),
                    },
                    ResourcesUlimits {
                        name: Some("nofile".into()),
                        soft: Some(NOFILE),
                        hard: Some(NOFILE),
                    },
                ]),
                ipc_mode: Some("private".into()),
                log_config: Some(HostConfigLogConfig {
                    typ: Some("none".into()),
                    config: None,
                }),
                auto_remove: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::env_vars::Env;

    const IMAGE: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn settings(runtime: &str) -> Settings {
        let mut vars = BTreeMap::new();
        vars.insert("SANDBOX_CPUS".to_string(), "0.5".to_string());
        if !runtime.is_empty() {
            vars.insert("SANDBOX_DOCKER_RUNTIME".to_string(), runtime.to_string());
        }
        Settings::from_env(&Env::new(&vars), 128).expect("settings")
    }

    fn spec() -> Approved {
        Approved {
            command: vec!["node".into(), "-".into()],
            env: vec!["HOME=/work".into()],
        }
    }

    /// A run's container of `spec()` under runc, without a grant.
    fn run_body(start: Start<'_>) -> ContainerCreateBody {
        create_body(&settings(""), IMAGE, &spec(), start, Life::run(42), None)
    }

    /// Long on purpose: one assertion per field of the envelope, in the
    /// order create_body sets them, so a field dropped there fails here by name.
    #[test]
    fn every_container_gets_the_whole_envelope() {
        let body = run_body(Start::Gated);
        assert_eq!(body.image.as_deref(), Some(IMAGE));
        assert_eq!(body.user.as_deref(), Some("61000:61000"));
        assert_eq!(body.network_disabled, Some(true));
        // The gate reads its one line on stdin, attached before start and
        // closed after it; output is read from the attach, in /work.
        assert_eq!(
            (
                body.attach_stdin,
                body.attach_stdout,
                body.attach_stderr,
                body.open_stdin,
                body.stdin_once,
                body.tty,
            ),
            (
                Some(true),
                Some(true),
                Some(true),
                Some(true),
                Some(true),
                Some(false)
            )
        );
        assert_eq!(body.working_dir.as_deref(), Some("/work"));
        assert_eq!(
            body.env,
            Some(vec![]),
            "the plugin's env goes through the gate"
        );
        assert_eq!(
            body.entrypoint,
            Some(vec![
                "/bin/sh".into(),
                "-c".into(),
                GATE.into(),
                GATE_NAME.into()
            ])
        );
        assert_eq!(
            body.cmd,
            Some(vec![
                "HOME=/work".into(),
                "--".into(),
                "node".into(),
                "-".into()
            ])
        );
        assert_eq!(body.tty, Some(false));
        let labels = body.labels.expect("labels");
        assert_eq!(labels.get(LABEL).map(String::as_str), Some("1"));
        assert_eq!(labels.get(EXPIRES_LABEL).map(String::as_str), Some("42"));
        assert!(labels.contains_key(OWNER_LABEL));
        assert_eq!(labels[PROCESS_LABEL], owner::this_process());
        assert!(!labels.contains_key(SESSION_LABEL), "a run's container");
        let session = create_body(
            &settings(""),
            IMAGE,
            &spec(),
            Start::Gated,
            Life {
                expires: 42,
                session: true,
            },
            None,
        );
        let session_labels = session.labels.expect("labels");
        assert_eq!(
            session_labels.get(SESSION_LABEL).map(String::as_str),
            Some("1")
        );
        assert_eq!(
            session.host_config,
            create_body(
                &settings(""),
                IMAGE,
                &spec(),
                Start::Gated,
                Life::run(42),
                None
            )
            .host_config,
            "the same envelope"
        );

        let h = body.host_config.expect("host config");
        assert_eq!(h.network_mode.as_deref(), Some("none"));
        assert_eq!(h.binds, None, "no host path without a grant");
        assert_eq!(h.readonly_rootfs, Some(true));
        assert_eq!(h.privileged, Some(false));
        assert_eq!(h.cap_drop, Some(vec!["ALL".to_string()]));
        let sec = h.security_opt.expect("security options");
        assert!(sec.contains(&"no-new-privileges".to_string()));
        assert!(
            sec.iter().any(|o| o.starts_with("seccomp={")),
            "the shipped seccomp profile under runc: {sec:?}"
        );
        assert_eq!(h.memory, Some(128 << 20));
        assert_eq!(h.memory_swap, h.memory, "memory+swap equals memory");
        assert_eq!(h.nano_cpus, Some(500_000_000));
        assert_eq!(h.pids_limit, Some(256));
        let tmpfs = h.tmpfs.expect("tmpfs");
        assert_eq!(
            tmpfs.get("/tmp").map(String::as_str),
            Some("rw,noexec,nosuid,nodev,size=16m")
        );
        assert_eq!(
            tmpfs.get("/work").map(String::as_str),
            Some("rw,noexec,nosuid,nodev,size=128m,uid=61000,gid=61000")
        );
        assert_eq!(h.shm_size, Some(16 << 20));
        assert_eq!(h.runtime.as_deref(), Some("runc"), "named even for runc");
        let ulimits: Vec<(String, i64, i64)> = h
            .ulimits
            .expect("ulimits")
            .into_iter()
            .map(|u| {
                (
                    u.name.unwrap_or_default(),
                    u.soft.unwrap_or(-1),
                    u.hard.unwrap_or(-1),
                )
            })
            .collect();
        for want in [("core", 0, 0), ("msgqueue", 0, 0), ("nofile", 4096, 4096)] {
            assert!(
                ulimits.contains(&(want.0.to_string(), want.1, want.2)),
                "{want:?} in {ulimits:?}"
            );
        }
        assert_eq!(h.ipc_mode.as_deref(), Some("private"));
        assert_eq!(
            h.log_config.and_then(|l| l.typ).as_deref(),
            Some("none"),
            "no log driver"
        );
        assert_eq!(h.auto_remove, Some(false));
    }

    #[test]
    fn a_preboot_differs_from_the_gate_only_in_its_wait_and_end_nonce() {
        let gated = run_body(Start::Gated);
        let booted = run_body(Start::Booted { end: "abc" });
        assert_eq!(booted.host_config, gated.host_config, "the same envelope");
        assert_eq!(booted.labels, gated.labels);
        assert_eq!(booted.env, Some(vec![]));
        assert_eq!(
            (&booted.user, booted.network_disabled),
            (&gated.user, gated.network_disabled)
        );
        let script = |b: &ContainerCreateBody| b.entrypoint.clone().expect("entrypoint")[2].clone();
        assert!(script(&gated).starts_with("read -r _ || exit 125\n"));
        assert_eq!(
            format!("read -r _ || exit 125\n{}", script(&booted)),
            script(&gated),
            "the launch is the gate without its wait"
        );
        assert!(!script(&booted).contains("read"));
        assert_eq!(
            booted.cmd,
            Some(vec![
                "HOME=/work".into(),
                "PLIMSOLL_END=abc".into(),
                "--".into(),
                "node".into(),
                "-".into()
            ]),
            "the host's nonce after the plugin's variables"
        );
    }

    #[test]
    fn under_runsc_gvisor_filters_and_the_host_cgroup_limits() {
        let h = create_body(
            &settings("runsc"),
            IMAGE,
            &spec(),
            Start::Gated,
            Life::run(42),
            None,
        )
        .host_config
        .expect("host config");
        assert_eq!(h.runtime.as_deref(), Some("runsc"));
        assert_eq!(h.pids_limit, None, "the host cgroup carries the limit");
        let sec = h.security_opt.expect("security options");
        assert_eq!(sec, ["no-new-privileges"]);
    }

    #[test]
    fn a_granted_run_mounts_only_its_broker_directory_read_only() {
        let dir = std::path::Path::new("/run/plimsoll-runs/abc");
        let h = create_body(
            &settings(""),
            IMAGE,
            &spec(),
            Start::Gated,
            Life::run(42),
            Some(dir),
        )
        .host_config
        .expect("host config");
        assert_eq!(
            h.binds,
            Some(vec![format!("/run/plimsoll-runs/abc:{MOUNT_POINT}:ro")])
        );
    }
}
