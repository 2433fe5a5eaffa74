//! Drives the local container engine (Docker, through bollard) for the
//! `container-engine` capability, after `engine_policy` approved the spec.
//!
//! The plugin chose the image, command, environment and user; everything
//! else about the container is set here, by the host: no network, read-only
//! root, every capability dropped, no new privileges, memory equal to
//! memory+swap, a CPU share, a process limit where the runtime allows one, a
//! small noexec tmpfs at /tmp, no logging driver, and labels that let a
//! reconciler find it. The whole lifecycle runs in a task of its own, so a
//! caller that goes away cannot leave a container behind: it is removed on
//! every path.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig, ResourcesUlimits};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, KillContainerOptionsBuilder,
    ListContainersOptionsBuilder, RemoveContainerOptionsBuilder, WaitContainerOptions,
};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::providers::ProcessOutput;

/// Where the local engine listens.
const DOCKER_SOCKET: &str = "/var/run/docker.sock";
/// Label every container the host creates carries.
pub const LABEL: &str = "io.plimsoll.run";
/// Unix time after which a reconciler may remove a container it finds.
pub const EXPIRES_LABEL: &str = "io.plimsoll.expires";
/// How far past its deadline a container may live before it counts as leaked.
const EXPIRY_GRACE: Duration = Duration::from_secs(300);

/// The container settings the host owns.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub runtime: String,
    pub memory_mb: u32,
    pub nano_cpus: i64,
    pub pids: i64,
    pub tmp_mb: u32,
}

/// What the plugin asked for, once the policy approved it.
pub struct Approved {
    pub image: String,
    pub command: Vec<String>,
    pub env: Vec<String>,
    pub user: String,
}

/// How a run through the engine failed.
#[derive(Debug)]
pub enum EngineFailure {
    /// Nothing started (the image is missing, create failed, the engine is
    /// unreachable).
    BeforeStart(String),
    /// The container may have run.
    AfterStart(String),
}

#[derive(Clone)]
pub struct ContainerEngine {
    docker: Docker,
    envelope: Envelope,
}

impl ContainerEngine {
    /// Connects to the local engine over its Unix socket and agrees on an API
    /// version. With a runtime configured, the engine must register it.
    pub async fn connect(envelope: Envelope) -> Result<ContainerEngine, String> {
        // The engine's own socket, named here: DOCKER_HOST and other client
        // settings from the environment are never consulted.
        let docker = Docker::connect_with_unix(DOCKER_SOCKET, 120, bollard::API_DEFAULT_VERSION)
            .map_err(|e| format!("connecting to the docker engine: {e}"))?;
        let docker = docker
            .negotiate_version()
            .await
            .map_err(|e| format!("the docker engine did not answer: {e}"))?;
        if !envelope.runtime.is_empty() {
            let info = docker
                .info()
                .await
                .map_err(|e| format!("docker info: {e}"))?;
            let registered = info.runtimes.unwrap_or_default();
            if !registered.contains_key(&envelope.runtime) {
                return Err(format!(
                    "the docker engine does not register the runtime {:?}",
                    envelope.runtime
                ));
            }
        }
        Ok(ContainerEngine { docker, envelope })
    }

    /// Removes every container this host's label marks whose expiry has
    /// passed: the ones a daemon that crashed, or was killed mid-run, left
    /// behind. Expiry, not mere presence, decides, so a second daemon on the
    /// same engine never loses a container it is still running. Returns how
    /// many were removed.
    pub async fn sweep(&self) -> Result<usize, String> {
        let filters = HashMap::from([("label", vec![format!("{LABEL}=1")])]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let found = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|e| short(&e))?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut removed = 0;
        for c in found {
            let expires = c
                .labels
                .as_ref()
                .and_then(|l| l.get(EXPIRES_LABEL))
                .and_then(|v| v.parse::<u64>().ok())
                // A container with our run label but no readable expiry is
                // not one this host made whole; it is old enough to go.
                .unwrap_or(0);
            let Some(id) = c.id else { continue };
            if expires <= now {
                let remove = RemoveContainerOptionsBuilder::default().force(true).build();
                if self
                    .docker
                    .remove_container(&id, Some(remove))
                    .await
                    .is_ok()
                {
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// Sweeps now and then every `every`, for the daemon's life.
    pub fn spawn_sweeper(&self, every: Duration) {
        let engine = self.clone();
        tokio::spawn(async move {
            loop {
                match engine.sweep().await {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::warn!(removed = n, "removed run containers left past their expiry")
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "sweeping for leftover run containers failed")
                    }
                }
                tokio::time::sleep(every).await;
            }
        });
    }

    /// Runs one approved container to completion or its deadline.
    pub async fn run(
        &self,
        spec: Approved,
        stdin: Vec<u8>,
        timeout: Duration,
        output_limit: usize,
    ) -> Result<ProcessOutput, EngineFailure> {
        let engine = self.clone();
        // Own task: if the caller's future is dropped, this still finishes
        // and removes the container.
        let task =
            tokio::spawn(async move { engine.lifecycle(spec, stdin, timeout, output_limit).await });
        task.await
            .map_err(|e| EngineFailure::AfterStart(format!("the container task failed: {e}")))?
    }

    async fn lifecycle(
        &self,
        spec: Approved,
        stdin: Vec<u8>,
        timeout: Duration,
        output_limit: usize,
    ) -> Result<ProcessOutput, EngineFailure> {
        let mut id = [0u8; 8];
        let _ = getrandom::fill(&mut id);
        let name = format!("plimsoll-{}", hex::encode(id));
        let body = self.create_body(spec, timeout);
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        if let Err(e) = self.docker.create_container(Some(options), body).await {
            // The engine may have created it even so (a timeout on the
            // answer): remove by name, or it outlives every deadline.
            let remove = RemoveContainerOptionsBuilder::default().force(true).build();
            let _ = self.docker.remove_container(&name, Some(remove)).await;
            return Err(EngineFailure::BeforeStart(format!(
                "creating the container: {}",
                short(&e)
            )));
        }
        let result = self
            .attach_start_collect(&name, stdin, timeout, output_limit)
            .await;
        let remove = RemoveContainerOptionsBuilder::default().force(true).build();
        if let Err(e) = self.docker.remove_container(&name, Some(remove)).await {
            // The reconciler removes it later by its label.
            tracing::warn!(container = %name, error = %short(&e), "removing a run container failed");
        }
        result
    }

    fn create_body(&self, spec: Approved, timeout: Duration) -> ContainerCreateBody {
        let env = &self.envelope;
        let memory = i64::from(env.memory_mb) << 20;
        let expires = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            + (timeout + EXPIRY_GRACE).as_secs();
        let (entrypoint, cmd) = match spec.command.split_first() {
            Some((first, rest)) => (vec![first.clone()], rest.to_vec()),
            None => (vec![], vec![]),
        };
        ContainerCreateBody {
            image: Some(spec.image),
            entrypoint: Some(entrypoint),
            cmd: Some(cmd),
            env: Some(spec.env),
            user: Some(spec.user),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            open_stdin: Some(true),
            stdin_once: Some(true),
            tty: Some(false),
            network_disabled: Some(true),
            labels: Some(HashMap::from([
                (LABEL.to_string(), "1".to_string()),
                (EXPIRES_LABEL.to_string(), expires.to_string()),
            ])),
            host_config: Some(HostConfig {
                network_mode: Some("none".into()),
                readonly_rootfs: Some(true),
                privileged: Some(false),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                memory: Some(memory),
                memory_swap: Some(memory),
                nano_cpus: Some(env.nano_cpus),
                // This runsc build crashes when docker passes a pids limit;
                // under gVisor the limit is enforced on the sandbox's host
                // cgroup instead (docker provider smoke test).
                pids_limit: if env.runtime == "runsc" {
                    None
                } else {
                    Some(env.pids)
                },
                tmpfs: Some(HashMap::from([(
                    "/tmp".to_string(),
                    format!("rw,noexec,nosuid,nodev,size={}m", env.tmp_mb),
                )])),
                runtime: if env.runtime.is_empty() {
                    None
                } else {
                    Some(env.runtime.clone())
                },
                ulimits: Some(vec![
                    ResourcesUlimits {
                        name: Some("core".into()),
                        soft: Some(0),
                        hard: Some(0),
                    },
                    ResourcesUlimits {
                        name: Some("nofile".into()),
                        soft: Some(4096),
                        hard: Some(4096),
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

    async fn attach_start_collect(
        &self,
        name: &str,
        stdin: Vec<u8>,
        timeout: Duration,
        output_limit: usize,
    ) -> Result<ProcessOutput, EngineFailure> {
        let attach = AttachContainerOptionsBuilder::default()
            .stream(true)
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .build();
        let mut io = self
            .docker
            .attach_container(name, Some(attach))
            .await
            .map_err(|e| EngineFailure::BeforeStart(format!("attaching: {}", short(&e))))?;
        self.docker
            .start_container(name, None)
            .await
            .map_err(|e| EngineFailure::AfterStart(format!("starting: {}", short(&e))))?;

        let deadline = tokio::time::Instant::now() + timeout;
        let mut out = ProcessOutput::default();
        // Input is fed while output is read: a container that prints a lot
        // before it reads its input must not stall until the deadline.
        let mut input = io.input;
        let feeder = tokio::spawn(async move {
            let _ = input.write_all(&stdin).await;
            let _ = input.shutdown().await;
        });
        let collect = async {
            while let Some(frame) = io.output.next().await {
                match frame {
                    Ok(LogOutput::StdOut { message }) => keep(
                        &mut out.stdout,
                        &mut out.stdout_truncated,
                        &message,
                        output_limit,
                    ),
                    Ok(LogOutput::StdErr { message }) => keep(
                        &mut out.stderr,
                        &mut out.stderr_truncated,
                        &message,
                        output_limit,
                    ),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        };
        let timed_out = tokio::time::timeout_at(deadline, collect).await.is_err();
        feeder.abort();
        if timed_out {
            out.timed_out = true;
            let kill = KillContainerOptionsBuilder::default()
                .signal("SIGKILL")
                .build();
            let _ = self.docker.kill_container(name, Some(kill)).await;
        }
        let mut wait = self
            .docker
            .wait_container(name, None::<WaitContainerOptions>);
        let waited = tokio::time::timeout(Duration::from_secs(10), wait.next()).await;
        out.exit_code = match waited {
            Ok(Some(Ok(w))) => i32::try_from(w.status_code).unwrap_or(i32::MAX),
            // bollard reports a non-zero exit as an error carrying the code.
            Ok(Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. }))) => {
                i32::try_from(code).unwrap_or(i32::MAX)
            }
            _ => {
                return Err(EngineFailure::AfterStart(
                    "the container's exit status could not be read".into(),
                ));
            }
        };
        Ok(out)
    }
}

fn keep(buf: &mut Vec<u8>, truncated: &mut bool, data: &[u8], limit: usize) {
    let room = limit.saturating_sub(buf.len());
    if data.len() > room {
        *truncated = true;
    }
    buf.extend_from_slice(&data[..data.len().min(room)]);
}

/// An engine error, bounded for logs and plugin-facing messages.
fn short(e: &bollard::errors::Error) -> String {
    crate::text::sanitize(&e.to_string(), 300)
}
