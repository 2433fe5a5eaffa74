//! The Docker backend of the `container-engine` capability: the local
//! engine, through bollard, over its Unix socket only. This folder is the
//! only place in the host that names bollard.
//!
//! The plugin chose the command and input (and the capability's policy
//! approved them); everything else about a container is set here, by the
//! host: the image ID it verified at start, no network, read-only root,
//! every capability dropped, no new privileges, memory equal to
//! memory+swap, a CPU share, a process limit, sized noexec tmpfs mounts at
//! /tmp, /dev/shm and /work, an unprivileged user, no logging driver, and
//! labels that let the sweeper find it (`envelope`).
//!
//! The tier this engine stands behind is the host's own evidence, gathered
//! at `connect`: the runtime the engine resolves (and, for gVisor, the
//! executable behind it), the image it pinned (`verify`), and a smoke test
//! run from inside a real container with exactly the settings runs get
//! (`smoke`).
//!
//! Every container's code waits on its stdin, which the host writes only
//! after every limit is in place (under gVisor the process limit lives on
//! the sandbox's host cgroup, created before the container starts and
//! checked after). So nothing a plugin asks for can run before it is
//! contained, and each lifecycle runs in a task of its own that removes the
//! container on every path, whether or not its caller is still waiting
//! (`lifecycle`). Warm containers (`pool`) and the sweeper of leftovers
//! (`sweep`) keep to the same rules.

mod envelope;
mod frames;
mod idle;
mod lifecycle;
pub mod metrics;
mod owner;
mod pool;
mod run;
mod runtime_version;
mod session;
pub mod settings;
mod smoke;
mod sweep;
mod verify;

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bollard::Docker;
use futures_util::future::BoxFuture;

use crate::live::Live;
use crate::outcome::{NotReady, ProcessOutput};
use crate::plugin_host::capabilities::container_engine::backend::{
    Approved, BackendFacts, ContainerBackend, EngineFailure, Envelope, GrantMount, PrebootKind,
    SessionContainer,
};
use crate::tier::Tier;
pub use settings::Settings;
use verify::{PidsCgroup, RuntimeEvidence, pids_cgroup_root, resolve_image, verify_runtime};

/// Label every container the host creates carries.
pub const LABEL: &str = "io.plimsoll.run";
/// The process ID of the daemon that created the container, so an operator
/// (and the test suite) can tell whose it is.
pub const OWNER_LABEL: &str = "io.plimsoll.owner";
/// The making process as boot/PID-namespace/user/PID/start-time, so a later
/// daemon can tell a dead maker from a live one (see `owner`).
pub const PROCESS_LABEL: &str = "io.plimsoll.process";
/// Unix time after which the sweeper may remove a container it finds.
pub const EXPIRES_LABEL: &str = "io.plimsoll.expires";
/// Set on a session's container: kept for many calls, and removed by a
/// later daemon when the daemon that made it is gone.
pub const SESSION_LABEL: &str = "io.plimsoll.session";
/// Containers whose runs were answered before their removal ended (dead,
/// or a pre-booted process that sent its end frame and is being killed);
/// past this many, runs wait for their container's removal before
/// answering.
const MAX_ANSWERED_UNREMOVED: usize = 4;
/// How far past its deadline a container may live before it counts as leaked.
const EXPIRY_GRACE: Duration = Duration::from_secs(300);

/// What `connect` proved, kept for the daemon's life.
#[derive(Debug, Clone)]
struct Verified {
    /// What the capability sees: image, user, runtime, tier, languages.
    facts: BackendFacts,
    /// The runtime executable behind `runsc`, and its arguments.
    runtime: RuntimeEvidence,
}

/// The local Docker engine, verified. Cheap to clone: every clone drives
/// the same engine, pool and readiness state.
#[derive(Clone)]
pub struct DockerEngine {
    docker: Docker,
    settings: Arc<Settings>,
    verified: Arc<Verified>,
    pids: PidsCgroup,
    ready: Arc<Mutex<Result<(), NotReady>>>,
    last_probe: Arc<Mutex<Option<Instant>>>,
    /// Runs whose container is not yet removed: shutdown waits for them.
    removing: Arc<AtomicUsize>,
    /// Runs answered whose dead container is still being removed.
    answered_unremoved: Arc<AtomicUsize>,
    pool: Arc<Mutex<pool::Pool>>,
    project_pool: Arc<Mutex<pool::Pool>>,
    session_pool: Arc<Mutex<pool::Pool>>,
}

impl DockerEngine {
    /// Connects to the local engine, verifies the runtime and the image, and
    /// runs the smoke test. Any failure refuses start with what failed: a
    /// provider is never silently downgraded. Then keeps readiness, the
    /// warm pool and the sweep of leftovers going for the daemon's life.
    pub async fn connect(settings: Settings) -> Result<DockerEngine, String> {
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

        let runtime = verify_runtime(&settings, &info)?;
        // The gVisor the kernel tier rests on must be one the workload
        // corpus passed under (runtime_version.rs).
        let runsc_version = match &runtime.path {
            Some(path) => runtime_version::runsc_version(path).await?,
            None => String::new(),
        };
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
        let facts = BackendFacts {
            image: image_id,
            configured_image: settings.image.clone(),
            image_env,
            guest_uid: settings.guest_uid,
            runtime: settings.runtime.clone(),
            runtime_version: runtime.stated(&runsc_version),
            languages: vec![],
            tier,
            checks: vec![],
            envelope: Envelope {
                memory_mb: settings.memory_mb,
                cpus: settings.nano_cpus as f64 / 1e9,
                pids: u32::try_from(settings.pids).unwrap_or(0),
                disk_mb: settings.disk_mb,
            },
        };
        let mut engine = DockerEngine {
            docker,
            settings: Arc::new(settings),
            verified: Arc::new(Verified { facts, runtime }),
            pids,
            ready: Arc::new(Mutex::new(Ok(()))),
            last_probe: Arc::new(Mutex::new(None)),
            removing: Arc::new(AtomicUsize::new(0)),
            answered_unremoved: Arc::new(AtomicUsize::new(0)),
            pool: Arc::new(Mutex::new(pool::Pool::default())),
            project_pool: Arc::new(Mutex::new(pool::Pool::default())),
            session_pool: Arc::new(Mutex::new(pool::Pool::default())),
        };
        let (mut checks, languages) = engine.smoke().await?;
        let v = Arc::make_mut(&mut engine.verified);
        checks.push(v.runtime.describe(&runsc_version));
        v.facts.checks = checks;
        v.facts.languages = languages;
        for check in &engine.verified.facts.checks {
            tracing::info!(target: "plimsoll::engine", check = %check, "smoke test");
        }
        // Readiness, the warm pool, and leftovers of an earlier daemon
        // (removed before the first run, and every minute).
        engine.spawn_maintenance(sweep::SWEEP_EVERY);
        Ok(engine)
    }

    /// The image ID every container uses.
    fn image_id(&self) -> &str {
        &self.verified.facts.image
    }

    /// The last readiness verdict: the engine answers and the configured
    /// image still resolves to the ID runs use.
    fn last_verdict(&self) -> Result<(), NotReady> {
        self.ready.lock().map_or_else(
            |_| Err(NotReady::new("state", "readiness state poisoned")),
            |r| r.clone(),
        )
    }

    /// Checks readiness now and records the verdict.
    async fn check_ready_now(&self) -> Result<(), NotReady> {
        // /readyz needs no token: at most one probe of the engine a second,
        // whoever asks how often.
        if let Ok(mut last) = self.last_probe.lock() {
            if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
                return self.last_verdict();
            }
            *last = Some(Instant::now());
        }
        let verdict = self.probe_ready().await;
        if verdict.is_err() {
            // Warm containers from before an outage have dead streams: none
            // may serve a run. Removed once the engine answers again.
            self.orphan_warm();
        }
        if let Ok(mut r) = self.ready.lock() {
            if r.is_ok() != verdict.is_ok() {
                match &verdict {
                    Ok(()) => tracing::info!("the docker engine is ready again"),
                    Err(why) => {
                        tracing::warn!(code = why.code, why = %why.detail, "the docker engine is not ready; runs are refused")
                    }
                }
            }
            *r = verdict.clone();
        }
        verdict
    }

    async fn probe_ready(&self) -> Result<(), NotReady> {
        let unreachable = |why: String| NotReady::new("engine_unreachable", why);
        let ping = tokio::time::timeout(Duration::from_secs(5), self.docker.ping()).await;
        match ping {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(unreachable(format!(
                    "the docker engine is unreachable: {}",
                    short(&e)
                )));
            }
            Err(_) => {
                return Err(unreachable(
                    "the docker engine did not answer within 5 s".into(),
                ));
            }
        }
        // The runtime still resolves as it did at start (the engine could
        // have been reconfigured and restarted under us).
        let info = self
            .docker
            .info()
            .await
            .map_err(|e| unreachable(format!("docker info: {}", short(&e))))?;
        let runtime = verify_runtime(&self.settings, &info)
            .map_err(|why| NotReady::new("runtime_changed", why))?;
        if runtime != self.verified.runtime {
            return Err(NotReady::new(
                "runtime_changed",
                "the engine's runtime no longer resolves to the executable, version and arguments verified at start",
            ));
        }
        let image = self
            .docker
            .inspect_image(&self.settings.image)
            .await
            .map_err(|e| {
                NotReady::new(
                    "image_changed",
                    format!("the image {:?} is gone: {}", self.settings.image, short(&e)),
                )
            })?;
        if image.id.as_deref() != Some(self.image_id()) {
            return Err(NotReady::new(
                "image_changed",
                format!(
                    "the image {:?} no longer resolves to the ID verified at start",
                    self.settings.image
                ),
            ));
        }
        Ok(())
    }
}

impl ContainerBackend for DockerEngine {
    fn facts(&self) -> &BackendFacts {
        &self.verified.facts
    }

    fn ready(&self) -> Result<(), NotReady> {
        self.last_verdict()
    }

    fn check_ready(&self) -> BoxFuture<'_, Result<(), NotReady>> {
        Box::pin(self.check_ready_now())
    }

    fn run(
        &self,
        spec: Approved,
        stdin: Vec<u8>,
        timeout: Duration,
        output_limit: usize,
        grant: Option<GrantMount>,
        live: Option<Live>,
    ) -> BoxFuture<'static, Result<ProcessOutput, EngineFailure>> {
        let engine = self.clone();
        Box::pin(async move {
            engine
                .run_container(spec, stdin, timeout, output_limit, grant, live)
                .await
        })
    }

    fn prewarm(&self, spec: Approved) -> u32 {
        self.prewarm_spec(pool::Which::Runs, spec, false)
    }

    fn prewarm_sessions(&self, spec: Approved) -> u32 {
        self.prewarm_spec(pool::Which::Sessions, spec, false)
    }

    /// Each kind has its own pool.
    fn preboot(&self, kind: PrebootKind, spec: Approved) -> u32 {
        let which = match kind {
            PrebootKind::Snippet => pool::Which::Runs,
            PrebootKind::Project => pool::Which::Projects,
            PrebootKind::Session => pool::Which::Sessions,
        };
        self.prewarm_spec(which, spec, true)
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.close_pool())
    }

    fn start_session(
        &self,
        spec: Approved,
        lifetime: Duration,
        deadline: Instant,
        grant_dir: Option<std::path::PathBuf>,
    ) -> BoxFuture<'static, Result<Box<dyn SessionContainer>, EngineFailure>> {
        let engine = self.clone();
        Box::pin(async move {
            engine
                .start_session_container(spec, lifetime, deadline, grant_dir)
                .await
                .map(|s| Box::new(s) as Box<dyn SessionContainer>)
        })
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn expiry(lifetime: Duration) -> u64 {
    unix_now() + (lifetime + EXPIRY_GRACE).as_secs()
}

/// An engine error, bounded for logs and plugin-facing messages.
fn short(e: &bollard::errors::Error) -> String {
    crate::text::sanitize(&e.to_string(), 300)
}
