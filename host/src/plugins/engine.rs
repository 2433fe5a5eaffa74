//! Drives the local container engine (Docker, through bollard) for the
//! `container-engine` capability, after `engine_policy` approved the spec.
//!
//! The plugin chose the command and input; everything else about a container
//! is set here, by the host: the image ID it verified at start, no network,
//! read-only root, every capability dropped, no new privileges, memory equal
//! to memory+swap, a CPU share, a process limit, sized noexec tmpfs mounts at
//! /tmp, /dev/shm and /work, an unprivileged user, no logging driver, and
//! labels that let a reconciler find it.
//!
//! The tier this engine stands behind is the host's own evidence, gathered at
//! `connect`: the runtime the engine resolves (and, for gVisor, the executable
//! behind it), the image it pinned, and a smoke test run from inside a real
//! container with exactly the settings runs get.
//!
//! Every container's code waits on its stdin, which the host writes only
//! after every limit is in place (under gVisor the process limit lives on
//! the sandbox's host cgroup, created before the container starts and
//! checked after). So nothing a plugin asks for can run before it is
//! contained, and each lifecycle runs in a task of its own that removes the
//! container on every path, whether or not its caller is still waiting.

use std::collections::{HashMap, VecDeque};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bollard::Docker;
use bollard::container::{AttachContainerResults, LogOutput};
use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, ResourcesUlimits,
    SystemInfoCgroupDriverEnum, SystemInfoCgroupVersionEnum,
};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, InspectContainerOptions,
    KillContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    WaitContainerOptions,
};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::providers::ProcessOutput;
use crate::tier::Tier;

/// Label every container the host creates carries.
pub const LABEL: &str = "io.plimsoll.run";
/// The process ID of the daemon that created the container, so an operator
/// (and the test suite) can tell whose it is.
pub const OWNER_LABEL: &str = "io.plimsoll.owner";
/// Unix time after which a reconciler may remove a container it finds.
pub const EXPIRES_LABEL: &str = "io.plimsoll.expires";
/// How far past its deadline a container may live before it counts as leaked.
const EXPIRY_GRACE: Duration = Duration::from_secs(300);
/// Longest a warm container waits for its run before it is replaced.
const WARM_MAX_AGE: Duration = Duration::from_secs(300);
/// How often the pool is topped up and aged, and readiness re-checked.
const MAINTAIN_EVERY: Duration = Duration::from_secs(2);
/// The longest run any caller can ask for (the project maximum), for the
/// expiry label of warm containers, whose run is not known yet.
const LONGEST_RUN: Duration = Duration::from_secs(120);
/// Per-process open files inside a container.
const NOFILE: i64 = 4096;
/// Sizes of the two small scratch mounts; /work gets the rest of the
/// operator's disk budget.
pub const TMP_MB: u32 = 16;
pub const SHM_MB: u32 = 16;
/// Smallest /work the smoke test and a project can live with.
pub const MIN_WORK_MB: u32 = 16;

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
    /// Warm containers kept for single runs; 0 turns pooling off.
    pub pool: u32,
}

impl Settings {
    fn work_mb(&self) -> u32 {
        self.disk_mb.saturating_sub(TMP_MB + SHM_MB)
    }
    fn gvisor(&self) -> bool {
        self.runtime == "runsc"
    }
    pub fn user(&self) -> String {
        format!("{0}:{0}", self.guest_uid)
    }
}

/// What `connect` proved, kept for the daemon's life.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The image ID every container uses.
    pub image_id: String,
    /// The image's environment, checked for loader variables.
    pub image_env: Vec<String>,
    /// The tier the engine's evidence stands behind.
    pub tier: Tier,
    /// Interpreters the smoke test ran.
    pub languages: Vec<String>,
    /// One line per smoke check, for the operator's log.
    pub checks: Vec<String>,
    /// The runtime executable behind `runsc`, when that is the runtime.
    pub runtime_path: Option<PathBuf>,
}

/// What the plugin asked for, once the policy approved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approved {
    pub command: Vec<String>,
    pub env: Vec<String>,
}

/// A granted run's broker directory, mounted read-only at
/// `grants::socket::MOUNT_POINT`, and the environment that points the guest
/// clients at it.
#[derive(Debug, Clone)]
pub struct GrantMount {
    pub dir: PathBuf,
    pub env: Vec<String>,
}

/// How a run through the engine failed.
#[derive(Debug)]
pub enum EngineFailure {
    /// Nothing of the container's code ran (the engine is unreachable or not
    /// ready, create or start failed, a limit could not be put in place).
    BeforeStart(String),
    /// The container's code may have run.
    AfterStart(String),
}

/// Where the host keeps the sandbox's process limit under gVisor, whose
/// emulated cgroup files inside the sandbox do not show the host's limit.
#[derive(Debug, Clone)]
enum PidsCgroup {
    /// Set by the engine from the container's config (runc).
    Engine,
    /// `<root>/<id>` on the host, created and limited before start (gVisor).
    Host { root: PathBuf, parent: String },
}

struct Warm {
    /// The engine's ID for the container: every later call names it by
    /// this, and under gVisor it is also the name of its host cgroup.
    id: String,
    io: AttachContainerResults,
    born: Instant,
}

#[derive(Default)]
struct Pool {
    template: Option<Approved>,
    warm: VecDeque<Warm>,
    /// Warm containers being started right now, so top-ups do not overshoot.
    starting: u32,
    /// Set at shutdown: nothing more is started.
    closed: bool,
    /// Warm containers dropped while the engine was unreachable, removed
    /// once it answers again.
    orphans: Vec<String>,
}

#[derive(Clone)]
pub struct ContainerEngine {
    docker: Docker,
    settings: Arc<Settings>,
    verified: Arc<Verified>,
    pids: PidsCgroup,
    ready: Arc<Mutex<Result<(), String>>>,
    last_probe: Arc<Mutex<Option<Instant>>>,
    pool: Arc<Mutex<Pool>>,
}

impl ContainerEngine {
    /// Connects to the local engine, verifies the runtime and the image, and
    /// runs the smoke test. Any failure refuses start with what failed: a
    /// provider is never silently downgraded.
    pub async fn connect(settings: Settings) -> Result<ContainerEngine, String> {
        let docker = Docker::connect_with_unix(
            &settings.socket.to_string_lossy(),
            120,
            bollard::API_DEFAULT_VERSION,
        )
        .map_err(|e| format!("connecting to the docker engine: {}", short(&e)))?;
        let docker = docker
            .negotiate_version()
            .await
            .map_err(|e| format!("the docker engine did not answer: {}", short(&e)))?;
        let info = docker
            .info()
            .await
            .map_err(|e| format!("docker info: {}", short(&e)))?;

        let runtime_path = verify_runtime(&settings, &info)?;
        let pids = if settings.gvisor() {
            pids_cgroup_root(&info)?
        } else {
            PidsCgroup::Engine
        };
        let (image_id, image_env) = resolve_image(&docker, &settings.image).await?;
        let tier = if settings.gvisor() {
            Tier::Kernel
        } else {
            Tier::Container
        };
        let mut engine = ContainerEngine {
            docker,
            settings: Arc::new(settings),
            verified: Arc::new(Verified {
                image_id,
                image_env,
                tier,
                languages: vec![],
                checks: vec![],
                runtime_path,
            }),
            pids,
            ready: Arc::new(Mutex::new(Ok(()))),
            last_probe: Arc::new(Mutex::new(None)),
            pool: Arc::new(Mutex::new(Pool::default())),
        };
        let (checks, languages) = engine.smoke().await?;
        let v = Arc::make_mut(&mut engine.verified);
        v.checks = checks;
        v.languages = languages;
        Ok(engine)
    }

    pub fn verified(&self) -> &Verified {
        &self.verified
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The last readiness verdict: the engine answers and the configured
    /// image still resolves to the ID runs use.
    pub fn ready(&self) -> Result<(), String> {
        self.ready
            .lock()
            .map_or_else(|_| Err("readiness state poisoned".into()), |r| r.clone())
    }

    /// Checks readiness now and records the verdict.
    pub async fn check_ready(&self) -> Result<(), String> {
        // /readyz needs no token: at most one probe of the engine a second,
        // whoever asks how often.
        if let Ok(mut last) = self.last_probe.lock() {
            if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
                return self.ready();
            }
            *last = Some(Instant::now());
        }
        let verdict = self.probe_ready().await;
        if verdict.is_err() {
            // Warm containers from before an outage have dead streams: none
            // may serve a run. Removed once the engine answers again.
            if let Ok(mut pool) = self.pool.lock() {
                let stale: Vec<String> = pool.warm.drain(..).map(|w| w.id).collect();
                pool.orphans.extend(stale);
            }
        }
        if let Ok(mut r) = self.ready.lock() {
            if r.is_ok() != verdict.is_ok() {
                match &verdict {
                    Ok(()) => tracing::info!("the docker engine is ready again"),
                    Err(why) => {
                        tracing::warn!(why = %why, "the docker engine is not ready; runs are refused")
                    }
                }
            }
            *r = verdict.clone();
        }
        verdict
    }

    async fn probe_ready(&self) -> Result<(), String> {
        let ping = tokio::time::timeout(Duration::from_secs(5), self.docker.ping()).await;
        match ping {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(format!("the docker engine is unreachable: {}", short(&e))),
            Err(_) => return Err("the docker engine did not answer within 5 s".into()),
        }
        // The runtime still resolves as it did at start (the engine could
        // have been reconfigured and restarted under us).
        let info = self
            .docker
            .info()
            .await
            .map_err(|e| format!("docker info: {}", short(&e)))?;
        let runtime_path = verify_runtime(&self.settings, &info)?;
        if runtime_path != self.verified.runtime_path {
            return Err(
                "the engine's runtime no longer resolves to the executable verified at start"
                    .into(),
            );
        }
        let image = self
            .docker
            .inspect_image(&self.settings.image)
            .await
            .map_err(|e| format!("the image {:?} is gone: {}", self.settings.image, short(&e)))?;
        if image.id.as_deref() != Some(self.verified.image_id.as_str()) {
            return Err(format!(
                "the image {:?} no longer resolves to the ID verified at start",
                self.settings.image
            ));
        }
        Ok(())
    }

    /// Keeps readiness current, the pool topped up, and expired containers
    /// swept, for the daemon's life.
    pub fn spawn_maintenance(&self, sweep_every: Duration) {
        let engine = self.clone();
        tokio::spawn(async move {
            let mut last_sweep: Option<Instant> = None;
            loop {
                let ready = engine.check_ready().await.is_ok();
                if !ready {
                    // Warm containers may be dead, and their attached
                    // streams are: drop them (removed now, or once the
                    // engine answers again).
                    engine.drain_pool().await;
                } else {
                    let orphans = engine.pool.lock().map_or(0, |p| p.orphans.len());
                    if orphans > 0 {
                        engine.drain_pool().await;
                    }
                    engine.top_up().await;
                }
                if last_sweep.is_none_or(|t| t.elapsed() >= sweep_every) {
                    last_sweep = Some(Instant::now());
                    match engine.sweep().await {
                        Ok(0) => {}
                        Ok(n) => {
                            tracing::warn!(
                                removed = n,
                                "removed run containers left past their expiry"
                            )
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "sweeping for leftover run containers failed")
                        }
                    }
                }
                tokio::time::sleep(MAINTAIN_EVERY).await;
            }
        });
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
        let now = unix_now();
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
            if expires <= now && self.remove(&id).await {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Registers the spec single runs use and starts keeping warm containers
    /// of it. Returns the pool size.
    pub fn prewarm(&self, spec: Approved) -> u32 {
        if self.settings.pool == 0 {
            return 0;
        }
        if let Ok(mut pool) = self.pool.lock()
            && pool.template.as_ref() != Some(&spec)
        {
            // A new template: warm containers of the old one are of no use;
            // maintenance removes them.
            let old: Vec<String> = pool.warm.drain(..).map(|w| w.id).collect();
            pool.orphans.extend(old);
            pool.template = Some(spec);
        }
        let engine = self.clone();
        tokio::spawn(async move { engine.top_up().await });
        self.settings.pool
    }

    async fn top_up(&self) {
        loop {
            let template = {
                let Ok(mut pool) = self.pool.lock() else {
                    return;
                };
                // Age out containers that waited too long.
                // Aged-out containers go to the orphans, which maintenance
                // removes: dropped here they would linger until their expiry.
                let (young, old): (VecDeque<Warm>, VecDeque<Warm>) = pool
                    .warm
                    .drain(..)
                    .partition(|w| w.born.elapsed() < WARM_MAX_AGE);
                pool.warm = young;
                pool.orphans.extend(old.into_iter().map(|w| w.id));
                let have = pool.warm.len() as u32 + pool.starting;
                match pool.template.clone() {
                    Some(t) if have < self.settings.pool && !pool.closed => {
                        pool.starting += 1;
                        t
                    }
                    _ => return,
                }
            };
            let started = self
                .start_waiting(&template, expiry(WARM_MAX_AGE + LONGEST_RUN))
                .await
                .map_err(|(EngineFailure::BeforeStart(e) | EngineFailure::AfterStart(e))| e);
            // The lock is never held across an await. A container that is
            // no longer wanted (shutdown, a new template) is removed before
            // `starting` drops, so shutdown, which waits for `starting` to
            // reach 0, never exits with it still in the engine.
            let unwanted = {
                let Ok(mut pool) = self.pool.lock() else {
                    return;
                };
                match started {
                    Ok(warm) if pool.template.as_ref() == Some(&template) && !pool.closed => {
                        pool.warm.push_back(warm);
                        pool.starting = pool.starting.saturating_sub(1);
                        None
                    }
                    Ok(warm) => Some(warm.id),
                    Err(why) => {
                        pool.starting = pool.starting.saturating_sub(1);
                        tracing::warn!(why = %why, "starting a warm container failed");
                        return;
                    }
                }
            };
            if let Some(name) = unwanted {
                self.remove(&name).await;
                if let Ok(mut pool) = self.pool.lock() {
                    pool.starting = pool.starting.saturating_sub(1);
                }
                return;
            }
        }
    }

    /// At shutdown: starts no more warm containers and removes the ones
    /// waiting, so a daemon stopped cleanly leaves nothing behind.
    pub async fn shutdown(&self) {
        if let Ok(mut pool) = self.pool.lock() {
            pool.closed = true;
        }
        // A warm container being started now would be created after the
        // drain and outlive the daemon: wait for those starts to end (they
        // remove what they started once they see the pool closed).
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.pool.lock().is_ok_and(|p| p.starting > 0) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.drain_pool().await;
    }

    async fn drain_pool(&self) {
        let drained: Vec<String> = match self.pool.lock() {
            Ok(mut pool) => {
                let mut names: Vec<String> = pool.warm.drain(..).map(|w| w.id).collect();
                names.append(&mut pool.orphans);
                names
            }
            Err(_) => return,
        };
        let mut failed = Vec::new();
        for name in drained {
            if !self.remove(&name).await {
                failed.push(name);
            }
        }
        if let Ok(mut pool) = self.pool.lock() {
            pool.orphans.extend(failed);
        }
    }

    fn take_warm(&self, spec: &Approved) -> Option<Warm> {
        let mut pool = self.pool.lock().ok()?;
        if pool.template.as_ref() != Some(spec) {
            return None;
        }
        while let Some(w) = pool.warm.pop_front() {
            if w.born.elapsed() < WARM_MAX_AGE {
                return Some(w);
            }
            pool.orphans.push(w.id);
        }
        None
    }

    /// Runs one approved container to completion or its deadline.
    pub async fn run(
        &self,
        spec: Approved,
        stdin: Vec<u8>,
        timeout: Duration,
        output_limit: usize,
        grant: Option<GrantMount>,
    ) -> Result<ProcessOutput, EngineFailure> {
        if let Err(why) = self.ready() {
            return Err(EngineFailure::BeforeStart(why));
        }
        let engine = self.clone();
        // Own task: if the caller's future is dropped, this still finishes
        // and removes the container.
        let task = tokio::spawn(async move {
            // A granted run needs its own mount: never a warm container.
            let taken = if grant.is_none() {
                engine.take_warm(&spec)
            } else {
                None
            };
            let began = Instant::now();
            let warm = match taken {
                Some(w) => {
                    let refill = engine.clone();
                    tokio::spawn(async move { refill.top_up().await });
                    w
                }
                None => {
                    let mut spec = spec;
                    if let Some(g) = &grant {
                        spec.env.extend(g.env.iter().cloned());
                    }
                    let warm = engine
                        .start_waiting_with(
                            &spec,
                            expiry(timeout),
                            grant.as_ref().map(|g| g.dir.as_path()),
                        )
                        .await?;
                    // Creating and starting can be slow on a loaded engine;
                    // a run whose budget went on that never gets its input.
                    if began.elapsed() >= timeout {
                        engine.remove(&warm.id).await;
                        return Err(EngineFailure::AfterStart(
                            "the run's budget was spent starting its container".into(),
                        ));
                    }
                    warm
                }
            };
            let name = warm.id.clone();
            let result = engine.drive(warm, stdin, timeout, output_limit).await;
            engine.remove(&name).await;
            result
        });
        task.await
            .map_err(|e| EngineFailure::AfterStart(format!("the container task failed: {e}")))?
    }

    /// Creates, attaches and starts a container whose command waits on its
    /// stdin, with every limit in place. On any failure the container is
    /// removed and nothing of its command has had input.
    async fn start_waiting(&self, spec: &Approved, expires: u64) -> Result<Warm, EngineFailure> {
        self.start_waiting_with(spec, expires, None).await
    }

    async fn start_waiting_with(
        &self,
        spec: &Approved,
        expires: u64,
        grant_dir: Option<&Path>,
    ) -> Result<Warm, EngineFailure> {
        let mut id = [0u8; 8];
        let _ = getrandom::fill(&mut id);
        let name = format!("plimsoll-{}", hex::encode(id));
        let body = self.create_body(spec, expires, grant_dir);
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        let created = match self.docker.create_container(Some(options), body).await {
            Ok(c) => c,
            Err(e) => {
                // The engine may have created it even so (a timeout on the
                // answer): remove by name, or it outlives every deadline.
                self.remove(&name).await;
                return Err(EngineFailure::BeforeStart(format!(
                    "creating the container: {}",
                    short(&e)
                )));
            }
        };
        match self.attach_and_start(&created.id).await {
            Ok(io) => Ok(Warm {
                id: created.id,
                io,
                born: Instant::now(),
            }),
            Err(why) => {
                self.remove(&created.id).await;
                Err(why)
            }
        }
    }

    /// Failures before `start_container` is asked are `BeforeStart`; from
    /// then on the engine may have started the command (one that does not
    /// wait on stdin would be running), so they are `AfterStart`.
    async fn attach_and_start(&self, id: &str) -> Result<AttachContainerResults, EngineFailure> {
        if let PidsCgroup::Host { root, .. } = &self.pids {
            // Before start: the sandbox joins a cgroup that is already
            // limited, so there is no moment without the limit.
            let dir = root.join(id);
            std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(dir.join("pids.max"), self.settings.pids.to_string()))
                .map_err(|e| {
                    EngineFailure::BeforeStart(format!(
                        "limiting the sandbox's host cgroup {}: {e}",
                        dir.display()
                    ))
                })?;
        }
        let attach = AttachContainerOptionsBuilder::default()
            .stream(true)
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .build();
        let io = self
            .docker
            .attach_container(id, Some(attach))
            .await
            .map_err(|e| EngineFailure::BeforeStart(format!("attaching: {}", short(&e))))?;
        self.docker
            .start_container(id, None)
            .await
            .map_err(|e| EngineFailure::AfterStart(format!("starting: {}", short(&e))))?;
        if let PidsCgroup::Host { .. } = &self.pids {
            self.check_host_pids(id)
                .await
                .map_err(EngineFailure::AfterStart)?;
        }
        Ok(io)
    }

    /// Under gVisor: the sandbox process is in the cgroup the host limited,
    /// and the limit is the configured one. Read from the host, where the
    /// sandbox cannot reach.
    async fn check_host_pids(&self, id: &str) -> Result<(), String> {
        let PidsCgroup::Host { root, parent } = &self.pids else {
            return Ok(());
        };
        let inspect = self
            .docker
            .inspect_container(id, None::<InspectContainerOptions>)
            .await
            .map_err(|e| format!("inspecting the sandbox: {}", short(&e)))?;
        let pid = inspect
            .state
            .and_then(|s| s.pid)
            .filter(|p| *p > 0)
            .ok_or("the sandbox has no host process")?;
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .map_err(|e| format!("reading the sandbox's cgroups: {e}"))?;
        let expected = format!("{parent}/{id}");
        let joined = cgroups.lines().any(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
            let is_pids =
                controllers.is_some_and(|c| c.is_empty() || c.split(',').any(|c| c == "pids"));
            is_pids && path == Some(expected.as_str())
        });
        if !joined {
            return Err(
                "the sandbox is not in the host cgroup that carries its process limit".into(),
            );
        }
        let max = std::fs::read_to_string(root.join(id).join("pids.max"))
            .map_err(|e| format!("reading the sandbox's process limit: {e}"))?;
        if max.trim() != self.settings.pids.to_string() {
            return Err(format!(
                "the sandbox's host process limit is {}, not {}",
                max.trim(),
                self.settings.pids
            ));
        }
        Ok(())
    }

    /// Removes a container, named by its ID (or by its name when create
    /// failed before an ID was known, when no cgroup was made either).
    async fn remove(&self, name_or_id: &str) -> bool {
        let remove = RemoveContainerOptionsBuilder::default().force(true).build();
        let removed = match self.docker.remove_container(name_or_id, Some(remove)).await {
            Ok(()) => true,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => true,
            Err(e) => {
                // The reconciler removes it later by its label.
                tracing::warn!(container = %name_or_id, error = %short(&e), "removing a run container failed");
                false
            }
        };
        if let PidsCgroup::Host { root, .. } = &self.pids {
            // Empty once the sandbox is gone; a busy one is left and named.
            if let Err(e) = std::fs::remove_dir(root.join(name_or_id))
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::debug!(error = %e, "removing a sandbox's host cgroup failed");
            }
        }
        removed
    }

    fn create_body(
        &self,
        spec: &Approved,
        expires: u64,
        grant_dir: Option<&Path>,
    ) -> ContainerCreateBody {
        let s = &self.settings;
        let memory = i64::from(s.memory_mb) << 20;
        let (entrypoint, cmd) = match spec.command.split_first() {
            Some((first, rest)) => (vec![first.clone()], rest.to_vec()),
            None => (vec![], vec![]),
        };
        let mut security_opt = vec!["no-new-privileges".to_string()];
        if !s.gvisor()
            && let Some(profile) = &s.seccomp
        {
            security_opt.push(format!("seccomp={profile}"));
        }
        let scratch = |mb: u32, extra: &str| format!("rw,noexec,nosuid,nodev,size={mb}m{extra}");
        ContainerCreateBody {
            image: Some(self.verified.image_id.clone()),
            entrypoint: Some(entrypoint),
            cmd: Some(cmd),
            env: Some(spec.env.clone()),
            user: Some(s.user()),
            working_dir: Some("/work".into()),
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
                (OWNER_LABEL.to_string(), std::process::id().to_string()),
            ])),
            host_config: Some(HostConfig {
                network_mode: Some("none".into()),
                // The only host path a container ever sees: the run's broker
                // directory, read-only, made by the host for this run.
                binds: grant_dir.map(|d| {
                    vec![format!(
                        "{}:{}:ro",
                        d.display(),
                        crate::grants::socket::MOUNT_POINT
                    )]
                }),
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

    /// Feeds the container its input and collects its output until it exits
    /// or its deadline, when the whole container is killed.
    async fn drive(
        &self,
        warm: Warm,
        stdin: Vec<u8>,
        timeout: Duration,
        output_limit: usize,
    ) -> Result<ProcessOutput, EngineFailure> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut out = ProcessOutput::default();
        let Warm { id: name, io, .. } = warm;
        let mut output = io.output;
        // Input is fed while output is read: a container that prints a lot
        // before it reads all its input must not stall until the deadline.
        let mut input = io.input;
        let feeder = tokio::spawn(async move {
            input.write_all(&stdin).await?;
            input.shutdown().await
        });
        let collect = async {
            while let Some(frame) = output.next().await {
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
        // Input that never reached the container means this is not the
        // run's result (a stream cut under it); it may have run partly.
        let delivered = if feeder.is_finished() {
            matches!(feeder.await, Ok(Ok(())))
        } else {
            feeder.abort();
            // Still writing when output ended: only a timeout explains it.
            timed_out
        };
        if !delivered {
            let kill = KillContainerOptionsBuilder::default()
                .signal("SIGKILL")
                .build();
            let _ = self.docker.kill_container(&name, Some(kill)).await;
            return Err(EngineFailure::AfterStart(
                "the run's input could not be delivered to the container".into(),
            ));
        }
        if timed_out {
            out.timed_out = true;
            let kill = KillContainerOptionsBuilder::default()
                .signal("SIGKILL")
                .build();
            let _ = self.docker.kill_container(&name, Some(kill)).await;
        }
        let mut wait = self
            .docker
            .wait_container(&name, None::<WaitContainerOptions>);
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

    /// The smoke test: one container with exactly the settings runs get,
    /// proving from inside what the tier rests on. Returns the checks passed
    /// and the interpreters found; any failure names what failed.
    async fn smoke(&self) -> Result<(Vec<String>, Vec<String>), String> {
        let spec = Approved {
            command: vec!["/bin/sh".into(), "-c".into(), SMOKE_SCRIPT.into()],
            env: self.verified.image_env.clone(),
        };
        let warm = self
            .start_waiting(&spec, expiry(Duration::from_secs(60)))
            .await
            .map_err(
                |(EngineFailure::BeforeStart(e) | EngineFailure::AfterStart(e))| {
                    format!("smoke test: {e}")
                },
            )?;
        let name = warm.id.clone();
        let ran = self
            .drive(warm, b"go\n".to_vec(), Duration::from_secs(60), 1 << 20)
            .await;
        self.remove(&name).await;
        let out = match ran {
            Ok(out) => out,
            Err(EngineFailure::BeforeStart(e) | EngineFailure::AfterStart(e)) => {
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
    Ok(checks)
}

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

/// The runtime is the one configured, and for gVisor the engine resolves it
/// to an executable named runsc on this host. Returns that executable.
fn verify_runtime(
    settings: &Settings,
    info: &bollard::models::SystemInfo,
) -> Result<Option<PathBuf>, String> {
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
            Ok(None)
        }
        "runsc" => {
            let runtimes = info.runtimes.clone().unwrap_or_default();
            let Some(rt) = runtimes.get("runsc") else {
                return Err("the docker engine does not register the runtime runsc".into());
            };
            let path = rt.path.clone().unwrap_or_default();
            let resolved = resolve_executable(&path)
                .ok_or_else(|| format!("the engine's runsc runtime points at {path:?}, which is not an executable on this host"))?;
            if resolved.file_name().and_then(|n| n.to_str()) != Some("runsc") {
                return Err(format!(
                    "the engine's runsc runtime resolves to {}, not an executable named runsc",
                    resolved.display()
                ));
            }
            Ok(Some(resolved))
        }
        other => Err(format!(
            "SANDBOX_DOCKER_RUNTIME={other:?}: plimsoll verifies runc (unset) and runsc only"
        )),
    }
}

/// A path as the engine would run it: absolute, or searched on PATH; then
/// symlinks resolved, and it must be an executable file.
fn resolve_executable(path: &str) -> Option<PathBuf> {
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
    (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then_some(real)
}

/// Where gVisor sandboxes' process limits go: the host's pids cgroup under
/// the engine's cgroupfs parent.
fn pids_cgroup_root(info: &bollard::models::SystemInfo) -> Result<PidsCgroup, String> {
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
    if !root.is_dir() {
        return Err(format!("no pids cgroup at {}", root.display()));
    }
    Ok(PidsCgroup::Host { root, parent })
}

/// Environment variables that change how the dynamic loader or libc behave.
pub fn loader_var(key: &str) -> bool {
    key.starts_with("LD_")
        || matches!(
            key,
            "GLIBC_TUNABLES" | "LOCPATH" | "NLSPATH" | "GCONV_PATH" | "MALLOC_CONF" | "HOSTALIASES"
        )
}

/// Resolves the configured image to its ID and checks what it declares.
async fn resolve_image(docker: &Docker, image: &str) -> Result<(String, Vec<String>), String> {
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

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn expiry(lifetime: Duration) -> u64 {
    unix_now() + (lifetime + EXPIRY_GRACE).as_secs()
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
lang javascript
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
        assert_eq!(smoke_languages(RUNSC), ["javascript"]);
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

    #[test]
    fn loader_variables() {
        for k in [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "GLIBC_TUNABLES",
            "GCONV_PATH",
        ] {
            assert!(loader_var(k), "{k}");
        }
        assert!(!loader_var("PATH"));
        assert!(!loader_var("NODE_ENV"));
    }
}
