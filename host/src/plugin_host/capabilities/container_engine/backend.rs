//! The seam between the `container-engine` capability and whatever runs
//! containers.
//!
//! The capability owns this trait; a backend (Docker, in `backends/docker`)
//! implements it. The split is the reference monitor's: the capability
//! decides *whether* a spec may run (`policy`) and keeps the dispatched
//! mark; a backend decides nothing about isolation that a plugin could
//! influence. It puts every container in the envelope it verified at start,
//! and reports what it verified as `BackendFacts`, which are the host's
//! evidence for the tier. A second backend (podman, a microVM runner) is a
//! new implementation of this trait, with no change to the plugin host or
//! the pipeline.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use crate::live::Live;
use crate::outcome::{NotReady, ProcessOutput};
use crate::tier::Tier;

/// What a plugin asked for, once the policy approved it: the only parts of
/// a container a plugin chooses.
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

/// What a pre-booted container is for (see `preboot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrebootKind {
    Snippet,
    Project,
    Session,
}

impl PrebootKind {
    pub fn name(self) -> &'static str {
        match self {
            PrebootKind::Snippet => "snippet",
            PrebootKind::Project => "project",
            PrebootKind::Session => "session",
        }
    }
}

/// How a run through a backend failed.
#[derive(Debug)]
pub enum EngineFailure {
    /// Nothing of the container's code ran (the engine is unreachable or not
    /// ready, create or start failed, a limit could not be put in place).
    BeforeStart(String),
    /// Nothing of the container's code ran: the run's deadline came before
    /// the engine could start it.
    OutOfTime(String),
    /// The container's code may have run.
    AfterStart(String),
}

/// The resource envelope every container gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Envelope {
    pub memory_mb: u32,
    pub cpus: f64,
    pub pids: u32,
    /// The writable budget across the container's scratch mounts.
    pub disk_mb: u32,
}

/// What a backend verified at start and holds every container to. The
/// policy checks specs against it; plugins build their specs from it.
#[derive(Debug, Clone)]
pub struct BackendFacts {
    /// The content-addressed image every container uses.
    pub image: String,
    /// The image as the operator configured it (a tag or an ID), for logs.
    pub configured_image: String,
    /// The image's own environment, already checked for loader variables.
    pub image_env: Vec<String>,
    /// The unprivileged uid (and gid) every container runs as.
    pub guest_uid: u32,
    /// The OCI runtime ("" is the engine's default, runc).
    pub runtime: String,
    /// The runtime and its version as verified at start, for Describe:
    /// `runsc 0.0~20240729.0`, `runc 1.1.5+ds1-1+deb12u1`.
    pub runtime_version: String,
    /// Interpreters the backend's smoke test ran.
    pub languages: Vec<String>,
    /// The tier the backend's evidence stands behind.
    pub tier: Tier,
    /// One line per smoke check, for the operator's log.
    pub checks: Vec<String>,
    pub envelope: Envelope,
}

impl BackendFacts {
    /// `uid:gid`, as a spec must name it.
    pub fn user(&self) -> String {
        format!("{0}:{0}", self.guest_uid)
    }
}

/// A container engine the capability can drive.
pub trait ContainerBackend: Send + Sync + 'static {
    /// What was verified at start; fixed for the backend's life.
    fn facts(&self) -> &BackendFacts;

    /// The last readiness verdict, without asking the engine.
    fn ready(&self) -> Result<(), NotReady>;

    /// Readiness checked afresh (backends may rate-limit the probe).
    fn check_ready(&self) -> BoxFuture<'_, Result<(), NotReady>>;

    /// Runs one approved container to completion or its deadline, removing
    /// it on every path, even if the returned future is dropped. Its command
    /// may not run before every limit is in place. Output kept is also sent
    /// to `live`, as it arrives, when some.
    fn run(
        &self,
        spec: Approved,
        stdin: Vec<u8>,
        timeout: Duration,
        output_limit: usize,
        grant: Option<GrantMount>,
        live: Option<Live>,
    ) -> BoxFuture<'static, Result<ProcessOutput, EngineFailure>>;

    /// Registers the spec single runs use and keeps containers of it ready.
    /// Returns the pool size (0: no pooling).
    fn prewarm(&self, spec: Approved) -> u32;

    /// Keeps containers of `spec` with its command already running, for
    /// the runs (or sessions) of `kind` that use exactly that spec. The
    /// command is the plugin's frozen declaration; the request reaches it
    /// only through its stdin. Returns the pool size (0: none kept).
    fn preboot(&self, _kind: PrebootKind, _spec: Approved) -> u32 {
        0
    }

    /// Releases what would outlive the daemon (warm containers).
    fn shutdown(&self) -> BoxFuture<'_, ()>;

    /// Starts a session's container: created, started and its gate opened
    /// by `deadline`, labelled to expire after `lifetime`. The container is
    /// the session's alone until `SessionContainer::end`.
    fn start_session(
        &self,
        _spec: Approved,
        _lifetime: Duration,
        _deadline: Instant,
        _grant_dir: Option<PathBuf>,
    ) -> BoxFuture<'static, Result<Box<dyn SessionContainer>, EngineFailure>> {
        Box::pin(std::future::ready(Err(EngineFailure::BeforeStart(
            "this backend has no session containers".into(),
        ))))
    }

    /// Registers the spec session containers use and keeps some started
    /// behind the gate. Returns the pool size (0: no pooling).
    fn prewarm_sessions(&self, _spec: Approved) -> u32 {
        0
    }
}

/// One session's container, started and bound to that session.
pub trait SessionContainer: Send + Sync {
    /// Writes `request` to the container's stdin and reads its stdout
    /// until `until` appears, returning what came before it. `BeforeStart`
    /// only when nothing was written (the container had already ended); any
    /// failure after that (the deadline, more than `limit` bytes, the
    /// stream ending) kills the container, and it stays dead.
    fn exchange(
        &self,
        request: Vec<u8>,
        until: Vec<u8>,
        deadline: Instant,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<u8>, EngineFailure>>;

    /// Whether the container can still take an exchange.
    fn alive(&self) -> bool;

    /// Removes the container, on every path; later exchanges fail.
    fn end(&self) -> BoxFuture<'_, ()>;
}
