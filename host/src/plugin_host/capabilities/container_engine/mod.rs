//! The `container-engine` capability: containers on a backend the host
//! verified (`backend`), for plugins the operator granted it
//! (`SANDBOX_PLUGIN_CONTAINER_ENGINE=1`, or the built-in docker provider).
//!
//! Each spec a plugin sends is copied out under a budget and put to the
//! reference monitor (`policy`) against the backend's verified facts; only
//! an approved spec reaches the backend, and only its command and
//! environment: the backend fills in everything else. The call is marked as
//! possibly dispatched before the backend is asked, and the mark is put back
//! only when the backend proves the container never started.

pub mod backend;
pub mod policy;
pub mod preboot;
pub mod session;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, WasmList};

use super::{CallContext, CallView};
use crate::grants::socket;
use crate::live::Live;
use crate::plugin_host::bindings::{engine_if, types};
use crate::plugin_host::lazy;
use backend::{Approved, ContainerBackend, EngineFailure, GrantMount};
use policy::ContainerPolicy;
pub use session::SessionSlot;

/// Longest a single container may run at a plugin's request.
const MAX_CONTAINER_TIME: Duration = Duration::from_secs(120);
/// Most output kept per stream of a container, whatever the plugin asks.
const MAX_CONTAINER_OUTPUT: usize = 32 << 20;
/// Time a plugin keeps, after its container's deadline, to report on it.
const REPORT_MARGIN: Duration = Duration::from_secs(1);
/// Most input a plugin may feed a container.
const MAX_CONTAINER_STDIN: usize = 8 << 20;
/// What one container spec's strings may cost to copy, and how many.
const SPEC_BYTES: usize = 256 << 10;
const SPEC_ITEMS: usize = 512;

/// The capability as one plugin holds it, for the daemon's life.
pub struct ContainerEngine {
    pub backend: Arc<dyn ContainerBackend>,
    policy: ContainerPolicy,
    /// Set once the plugin's preflight has returned, before it sees any
    /// request: from then on what warm containers hold is fixed.
    frozen: AtomicBool,
    /// The plugin's pre-boot commands, declared before the freeze.
    declared: preboot::Declarations,
}

impl ContainerEngine {
    pub fn new(backend: Arc<dyn ContainerBackend>) -> ContainerEngine {
        let facts = backend.facts();
        let policy = ContainerPolicy {
            runtime: facts.runtime.clone(),
            image: facts.image.clone(),
            user: facts.user(),
            run_dirs: Vec::new(),
        };
        ContainerEngine {
            backend,
            policy,
            frozen: AtomicBool::new(false),
            declared: preboot::Declarations::default(),
        }
    }

    /// Fixes what warm containers hold for the plugin's life: called when
    /// its preflight returns, structurally before any request reaches it.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }
}

/// Why a prewarm after preflight is refused.
const FROZEN: &str =
    "warm containers are chosen at preflight, before any request, and fixed for the plugin's life";

/// One call's use of the capability: the engine, and the broker directory
/// this call's containers mount (made on first use, removed when the call's
/// store is dropped).
pub struct ContainerEngineState {
    pub engine: Arc<ContainerEngine>,
    mount: Option<Arc<socket::Mount>>,
    /// The session this call serves, for the session functions.
    pub session: Option<Arc<SessionSlot>>,
}

impl ContainerEngineState {
    pub fn new(engine: Arc<ContainerEngine>) -> ContainerEngineState {
        ContainerEngineState {
            engine,
            mount: None,
            session: None,
        }
    }
}

pub trait ContainerEngineView: CallView {
    /// The call's context and the capability, if the operator granted it.
    fn container_engine(&mut self) -> (&mut CallContext, Option<&mut ContainerEngineState>);
}

pub fn add_to_linker<T: ContainerEngineView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    let mut engine = linker.instance("plimsoll:provider/container-engine@0.1.0")?;
    engine.func_wrap_async(
        "run",
        |mut store: StoreContextMut<'_, T>,
         (spec, stdin, timeout_ms, output_limit): (lazy::ContainerSpec, WasmList<u8>, u32, u32)| {
            Box::new(async move {
                Ok((copy_and_run(&mut store, spec, stdin, timeout_ms, output_limit, false).await,))
            })
        },
    )?;
    engine.func_wrap_async(
        "run-live",
        |mut store: StoreContextMut<'_, T>,
         (spec, stdin, timeout_ms, output_limit): (lazy::ContainerSpec, WasmList<u8>, u32, u32)| {
            Box::new(async move {
                Ok((copy_and_run(&mut store, spec, stdin, timeout_ms, output_limit, true).await,))
            })
        },
    )?;
    engine.func_wrap_async(
        "environment",
        |mut store: StoreContextMut<'_, T>, (): ()| {
            let (_, state) = store.data_mut().container_engine();
            let env = environment(state.map(|s| &*s.engine));
            Box::new(async move { Ok((env,)) })
        },
    )?;
    engine.func_wrap_async(
        "prewarm",
        |mut store: StoreContextMut<'_, T>, (spec,): (lazy::ContainerSpec,)| {
            let answer = prewarm_with(&mut store, &spec, |e, approved| {
                Ok(e.backend.prewarm(approved))
            });
            Box::new(async move { Ok((answer,)) })
        },
    )?;
    preboot::add_to_linker(&mut engine)?;
    session::add_to_linker(&mut engine)?;
    Ok(())
}

/// A container spec copied out of the plugin.
#[derive(Debug, Clone, Default)]
pub struct SpecValues {
    pub image: String,
    pub command: Vec<String>,
    pub env: Vec<String>,
    pub user: String,
    pub read_only_root: bool,
    pub network: String,
    pub privileged: bool,
    pub cap_add: Vec<String>,
    pub runtime: String,
    pub host_namespaces: Vec<String>,
    pub mounts: Vec<String>,
}

fn copy_spec<T: 'static>(
    store: &mut StoreContextMut<'_, T>,
    spec: &lazy::ContainerSpec,
) -> Result<SpecValues, &'static str> {
    let too_large = "the container spec or its input is over the host's limits";
    let mut b = lazy::Budget::new(SPEC_BYTES, SPEC_ITEMS);
    Ok(SpecValues {
        image: b.string(store, &spec.image).map_err(|_| too_large)?,
        command: b.strings(store, &spec.command).map_err(|_| too_large)?,
        env: b.strings(store, &spec.env).map_err(|_| too_large)?,
        user: b.string(store, &spec.user).map_err(|_| too_large)?,
        read_only_root: spec.read_only_root,
        network: b.string(store, &spec.network).map_err(|_| too_large)?,
        privileged: spec.privileged,
        cap_add: b.strings(store, &spec.cap_add).map_err(|_| too_large)?,
        runtime: b.string(store, &spec.runtime).map_err(|_| too_large)?,
        host_namespaces: b
            .strings(store, &spec.host_namespaces)
            .map_err(|_| too_large)?,
        mounts: b.strings(store, &spec.mounts).map_err(|_| too_large)?,
    })
}

/// Puts a copied spec to the reference monitor. On approval, the engine and
/// the only parts of the spec the backend takes from the plugin.
pub fn approve(
    call: &CallContext,
    state: Option<&ContainerEngineState>,
    spec: &SpecValues,
) -> Result<(Arc<ContainerEngine>, Approved), engine_if::EngineError> {
    let Some(state) = state else {
        return Err(refuse(
            call,
            "this plugin was not granted the container-engine capability",
        ));
    };
    let view = policy::Spec {
        image: &spec.image,
        command: &spec.command,
        env: &spec.env,
        user: &spec.user,
        read_only_root: spec.read_only_root,
        network: &spec.network,
        privileged: spec.privileged,
        cap_add: &spec.cap_add,
        runtime: &spec.runtime,
        host_namespaces: &spec.host_namespaces,
        mounts: &spec.mounts,
    };
    policy::check(&view, &state.engine.policy).map_err(|rule| refuse(call, rule))?;
    Ok((
        state.engine.clone(),
        Approved {
            command: spec.command.clone(),
            env: spec.env.clone(),
        },
    ))
}

async fn copy_and_run<T: ContainerEngineView>(
    store: &mut StoreContextMut<'_, T>,
    spec: lazy::ContainerSpec,
    stdin: WasmList<u8>,
    timeout_ms: u32,
    output_limit: u32,
    watched: bool,
) -> Result<types::ProcessOutput, engine_if::EngineError> {
    let copied = copy_spec(store, &spec);
    let (call, state) = store.data_mut().container_engine();
    let spec = copied.map_err(|rule| refuse(call, rule))?;
    let (_, approved) = approve(call, state.as_deref(), &spec)?;
    let stdin = lazy::Budget::new(MAX_CONTAINER_STDIN, 0)
        .bytes(store, &stdin)
        .map_err(|_| {
            engine_if::EngineError::Forbidden(
                "the container's input is over the host's limits".into(),
            )
        })?;
    let (call, state) = store.data_mut().container_engine();
    let Some(state) = state else {
        return Err(refuse(
            call,
            "this plugin was not granted the container-engine capability",
        ));
    };
    let live = if watched { call.live.clone() } else { None };
    run(call, state, approved, stdin, timeout_ms, output_limit, live).await
}

/// Runs one approved spec: the mark, the call's broker directory, then the
/// backend.
pub async fn run(
    call: &mut CallContext,
    state: &mut ContainerEngineState,
    approved: Approved,
    stdin: Vec<u8>,
    timeout_ms: u32,
    output_limit: u32,
    live: Option<Live>,
) -> Result<types::ProcessOutput, engine_if::EngineError> {
    let engine = state.engine.clone();
    // The container gets what is left of the call, less a moment for the
    // plugin to report what it did before the call itself ends.
    let remaining = call
        .ends
        .saturating_duration_since(Instant::now())
        .saturating_sub(REPORT_MARGIN);
    let timeout = Duration::from_millis(u64::from(timeout_ms))
        .min(MAX_CONTAINER_TIME)
        .min(remaining);
    let limit = (output_limit as usize).min(MAX_CONTAINER_OUTPUT);
    // The run's broker directory comes first: if it cannot be made, nothing
    // was asked of the backend and the mark is untouched.
    let grant = match grant_mount(call, state) {
        Ok(g) => g,
        Err(why) => return Err(engine_if::EngineError::NotStarted(why)),
    };
    // Marked before the backend is asked: if this call is abandoned at its
    // deadline while the container runs, the host must not later claim that
    // nothing ran. Put back only when the backend proves nothing started.
    let before = call.mark.before_execution();
    match engine
        .backend
        .run(approved, stdin, timeout, limit, grant, live)
        .await
    {
        Ok(out) => Ok(types::ProcessOutput {
            stdout: out.stdout,
            stderr: out.stderr,
            exit_code: out.exit_code,
            timed_out: out.timed_out,
            stdout_truncated: out.stdout_truncated,
            stderr_truncated: out.stderr_truncated,
        }),
        // Details (host paths, engine text) go to the operator's log; the
        // plugin, and through it the caller, gets a fixed sentence.
        Err(EngineFailure::BeforeStart(why)) => {
            call.mark.nothing_started(before);
            tracing::warn!(target: "plimsoll::engine", why = %why, "a container did not start");
            Err(engine_if::EngineError::NotStarted(
                "the container could not be started (the daemon's log has the details)".into(),
            ))
        }
        Err(EngineFailure::OutOfTime(why)) => {
            call.mark.nothing_started(before);
            tracing::warn!(target: "plimsoll::engine", why = %why, "a container could not start in its run's time");
            Err(engine_if::EngineError::OutOfTime(
                "the container could not be started within the run's time; the engine is busy"
                    .into(),
            ))
        }
        Err(EngineFailure::AfterStart(why)) => {
            tracing::warn!(target: "plimsoll::engine", why = %why, "a container failed after it started");
            Err(engine_if::EngineError::Engine(
                "the container failed after it started (the daemon's log has the details)".into(),
            ))
        }
    }
}

/// A warm-container request (a prewarm for runs or for sessions, or a
/// pre-boot declaration): the spec copied and approved exactly as a run's,
/// then handed to `warm`. Only until the freeze.
pub(super) fn prewarm_with<T: ContainerEngineView>(
    store: &mut StoreContextMut<'_, T>,
    spec: &lazy::ContainerSpec,
    warm: impl FnOnce(&ContainerEngine, Approved) -> Result<u32, engine_if::EngineError>,
) -> Result<u32, engine_if::EngineError> {
    let copied = copy_spec(store, spec);
    let (call, state) = store.data_mut().container_engine();
    still_open(call, state.as_deref())?;
    let spec = copied.map_err(|rule| refuse(call, rule))?;
    let (engine, approved) = approve(call, state.as_deref(), &spec)?;
    warm(&engine, approved)
}

/// A prewarm is the plugin's to ask only until its preflight returns. One
/// asked later, with requests in hand, could carry a request's bytes into
/// a container that then waits outside admission: it is refused, and the
/// call can no longer say nothing ran, for it acted outside the rule.
fn still_open(
    call: &mut CallContext,
    state: Option<&ContainerEngineState>,
) -> Result<(), engine_if::EngineError> {
    if state.is_some_and(|s| s.engine.is_frozen()) {
        let _kept = call.mark.before_execution();
        return Err(refuse(call, FROZEN));
    }
    Ok(())
}

/// For a granted run, the broker directory its containers mount, made on
/// first use.
fn grant_mount(
    call: &CallContext,
    state: &mut ContainerEngineState,
) -> Result<Option<GrantMount>, String> {
    let Some(session) = call.grant.clone() else {
        return Ok(None);
    };
    if state.mount.is_none() {
        let gid = state.engine.backend.facts().guest_uid;
        let mount = socket::Root::open(std::path::Path::new(socket::ROOT))
            .and_then(|root| socket::Mount::open(&root, session, gid))
            .map_err(|e| {
                tracing::error!(error = %e, "making a run's broker socket failed");
                "the run's broker socket could not be made".to_string()
            })?;
        state.mount = Some(Arc::new(mount));
    }
    Ok(state.mount.as_ref().map(|m| GrantMount {
        dir: m.dir().to_path_buf(),
        env: m.env(),
    }))
}

/// What the backend verified, for a plugin granted the engine; an empty
/// environment (no image) for one that is not, whose runs are refused
/// anyway.
fn environment(engine: Option<&ContainerEngine>) -> engine_if::EngineEnvironment {
    match engine {
        Some(e) => {
            let f = e.backend.facts();
            engine_if::EngineEnvironment {
                image: f.image.clone(),
                configured: f.configured_image.clone(),
                image_env: f.image_env.clone(),
                user: f.user(),
                runtime: f.runtime.clone(),
                languages: f.languages.clone(),
            }
        }
        None => engine_if::EngineEnvironment {
            image: String::new(),
            configured: String::new(),
            image_env: vec![],
            user: String::new(),
            runtime: String::new(),
            languages: vec![],
        },
    }
}

/// A refusal: the rule goes to the operator's log and back to the plugin;
/// what the spec held goes nowhere.
fn refuse(call: &CallContext, rule: &str) -> engine_if::EngineError {
    tracing::warn!(target: "plimsoll::plugin", plugin = &*call.plugin, rule, "container spec refused");
    engine_if::EngineError::Forbidden(rule.to_string())
}

#[cfg(test)]
mod tests;
