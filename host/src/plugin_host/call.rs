//! One call into a plugin: a fresh store (fresh instance, fresh memory)
//! holding the call's capability state, a memory cap counted over the whole
//! store, and an epoch deadline that yields the thread every tick and traps
//! at the end; then one call of one adapter export, with a wall-clock
//! backstop that also bounds time spent inside host functions.
//!
//! Fresh store per call, rather than a long-lived supervised instance: a
//! plugin then carries no state from one run to the next that another caller
//! could influence, and a trap needs no recovery logic. Instantiation from a
//! pre-linked component costs microseconds next to a provider call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::{Component, ComponentExportIndex, ResourceTable};
use wasmtime::{Engine, Store, Trap};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::bindings::PluginPre;
use super::capabilities::config_keys::{ConfigState, ConfigView};
use super::capabilities::container_engine::{
    ContainerEngine, ContainerEngineState, ContainerEngineView,
};
use super::capabilities::grant::{GrantState, GrantView};
use super::capabilities::http::outgoing::{FIELDS_LIMIT, OutgoingHooks};
use super::capabilities::http::{HttpCapability, HttpView};
use super::capabilities::log::{LogState, LogView};
use super::capabilities::project_report::{ProjectReport, ProjectReportView};
use super::capabilities::{CallContext, CallView};
use crate::store_limits::{EpochTicker, MemoryCap};

/// WASI resources one plugin call may hold at once.
const MAX_RESOURCES: usize = 4096;
const TICK: Duration = Duration::from_millis(10);
const TICKER_NAME: &str = "plimsoll-plugin-epoch";

/// The capabilities one plugin was granted, for its whole life.
#[derive(Default, Clone)]
pub struct Granted {
    pub http: Option<Arc<HttpCapability>>,
    pub container_engine: Option<Arc<ContainerEngine>>,
    /// The daemon's guard, where a hosted sandbox reaches a granted run's
    /// broker (`grant`); none without one. Not an operator grant: every
    /// plugin may ask, and only a granted call gets an answer.
    pub guard: Option<Arc<crate::grants::guard::Guard>>,
    /// Pulled by `plimsoll plugin check` to stop the plugin mid-call, as
    /// its own trap would; none in the daemon.
    pub trip_wire: Option<Arc<TripWire>>,
}

/// Stops a plugin at its next epoch check once pulled. Pulling also
/// advances the engine's epoch, so the stop comes at the guest's next
/// function entry or loop, not at whenever the ticker next runs: a call
/// that returns within a tick of the pull is stopped all the same.
#[derive(Default)]
pub struct TripWire {
    pulled: std::sync::atomic::AtomicBool,
    engine: std::sync::OnceLock<Engine>,
}

impl TripWire {
    pub fn pull(&self) {
        self.pulled.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(engine) = self.engine.get() {
            engine.increment_epoch();
        }
    }

    pub fn reset(&self) {
        self.pulled
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn pulled(&self) -> bool {
        self.pulled.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Where the adapter's exports are, found once per component.
#[derive(Clone, Copy)]
pub(super) struct AdapterExports {
    pub describe: ComponentExportIndex,
    pub preflight: ComponentExportIndex,
    pub run: ComponentExportIndex,
    pub open_session: ComponentExportIndex,
    pub session_run: ComponentExportIndex,
    pub close_session: ComponentExportIndex,
}

impl AdapterExports {
    pub(super) fn find(component: &Component) -> Option<AdapterExports> {
        let (_, adapter) = component.get_export(None, "plimsoll:provider/adapter@0.1.0")?;
        let (_, describe) = component.get_export(Some(&adapter), "describe")?;
        let (_, preflight) = component.get_export(Some(&adapter), "preflight")?;
        let (_, run) = component.get_export(Some(&adapter), "run")?;
        let (_, open_session) = component.get_export(Some(&adapter), "open-session")?;
        let (_, session_run) = component.get_export(Some(&adapter), "session-run")?;
        let (_, close_session) = component.get_export(Some(&adapter), "close-session")?;
        Some(AdapterExports {
            describe,
            preflight,
            run,
            open_session,
            session_run,
            close_session,
        })
    }
}

/// A plugin compiled, checked and linked: everything needed to call it.
pub struct Runner {
    pub(super) name: Arc<str>,
    wasm: Engine,
    pre: PluginPre<PluginState>,
    pub(super) exports: AdapterExports,
    pub(super) granted: Granted,
    /// Whether the plugin imports `grant` (see `load`).
    pub(super) imports_grant: bool,
    /// The plugin's configuration, as settled when it described itself
    /// (empty until then).
    pub(super) config: Arc<wasmtime_wasi_config::WasiConfigVariables>,
    memory_limit: usize,
    _ticker: EpochTicker,
}

impl Runner {
    pub(super) fn new(
        name: Arc<str>,
        wasm: Engine,
        pre: PluginPre<PluginState>,
        exports: AdapterExports,
        granted: Granted,
        imports_grant: bool,
        memory_limit: usize,
    ) -> Runner {
        let ticker = EpochTicker::start(&wasm, TICK, TICKER_NAME);
        if let Some(wire) = &granted.trip_wire {
            let _ = wire.engine.set(wasm.clone());
        }
        Runner {
            name,
            wasm,
            pre,
            exports,
            granted,
            imports_grant,
            config: Arc::default(),
            memory_limit,
            _ticker: ticker,
        }
    }

    /// The tier the plugin's container backend's evidence stands behind,
    /// if it drives one.
    pub(super) fn backend_tier(&self) -> Option<crate::tier::Tier> {
        self.granted
            .container_engine
            .as_ref()
            .map(|e| e.backend.facts().tier)
    }

    /// A fresh store for one call, with the memory cap and a deadline.
    pub(super) fn store(&self, deadline: Duration) -> Store<PluginState> {
        let ends = Instant::now() + deadline;
        let mut table = ResourceTable::new();
        // WASI resources (streams, pollables) a plugin may hold at once; the
        // default allows about a million, each costing host memory.
        table.set_max_capacity(MAX_RESOURCES);
        let call = CallContext::new(self.name.clone(), ends);
        let mut http_ctx = WasiHttpCtx::new();
        http_ctx.set_field_size_limit(FIELDS_LIMIT);
        let state = PluginState {
            wasi: WasiCtx::builder().build(),
            table,
            limits: MemoryCap::new(self.memory_limit),
            http_ctx,
            http_hooks: OutgoingHooks::new(
                self.granted.http.clone(),
                self.name.clone(),
                ends,
                call.mark.elsewhere(),
            ),
            call,
            log: LogState::new(self.name.clone()),
            grant: GrantState::new(self.granted.guard.clone()),
            report: ProjectReport::default(),
            config: ConfigState::Settled(self.config.clone()),
            http: self.granted.http.clone(),
            engine: self
                .granted
                .container_engine
                .clone()
                .map(ContainerEngineState::new),
        };
        let mut store = Store::new(&self.wasm, state);
        store.limiter(|s| &mut s.limits);
        // Every tick, hand the thread back to the executor: a plugin
        // spinning in wasm must not hold one of the runtime's few worker
        // threads. At the deadline, trap.
        store.set_epoch_deadline(1);
        let trip = self.granted.trip_wire.clone();
        store.epoch_deadline_callback(move |_| {
            let tripped = trip.as_ref().is_some_and(|t| t.pulled());
            if tripped || Instant::now() >= ends {
                Err(Trap::Interrupt.into())
            } else {
                Ok(wasmtime::UpdateDeadline::Yield(1))
            }
        });
        store
    }

    /// One call into a fresh instance's adapter export. The store's epoch
    /// deadline stops the plugin's own code; this wall-clock backstop, a
    /// second past it, also bounds time spent inside host functions.
    pub(super) async fn call<P, R>(
        &self,
        store: &mut Store<PluginState>,
        limit: Duration,
        export: ComponentExportIndex,
        params: P,
    ) -> Result<wasmtime::Result<R>, tokio::time::error::Elapsed>
    where
        P: wasmtime::component::ComponentNamedList
            + wasmtime::component::Lower
            + Send
            + Sync
            + 'static,
        R: wasmtime::component::ComponentNamedList
            + wasmtime::component::Lift
            + Send
            + Sync
            + 'static,
    {
        tokio::time::timeout(limit + Duration::from_secs(1), async {
            let instance = self
                .pre
                .instance_pre()
                .instantiate_async(&mut *store)
                .await?;
            let f = instance.get_typed_func::<P, R>(&mut *store, export)?;
            f.call_async(&mut *store, params).await
        })
        .await
    }
}

/// What went wrong in a call, as a class: the plugin's own error text may
/// carry anything, so only the host's classification is passed on.
pub(super) fn classify(e: &wasmtime::Error, store: &Store<PluginState>) -> String {
    if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
        "it ran past its deadline".into()
    } else if store.data().limits.denied() {
        "it exceeded its memory limit".into()
    } else if let Some(trap) = e.downcast_ref::<Trap>() {
        format!("it trapped ({trap})")
    } else {
        "it failed to instantiate or was stopped".into()
    }
}

/// One call's store data: WASI with an empty context (no files, sockets,
/// environment or arguments), the memory cap, and each capability's state.
pub struct PluginState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: MemoryCap,
    http_ctx: WasiHttpCtx,
    http_hooks: OutgoingHooks,
    pub(super) call: CallContext,
    pub(super) log: LogState,
    grant: GrantState,
    pub(super) report: ProjectReport,
    pub(super) config: ConfigState,
    http: Option<Arc<HttpCapability>>,
    engine: Option<ContainerEngineState>,
}

/// The call ends before its resources do: wasi:http learns it first, so a
/// request body the plugin left unfinished is not sent as finished while
/// the table is torn down, and no connection task outlives the call.
impl Drop for PluginState {
    fn drop(&mut self) {
        self.http_hooks.close();
    }
}

impl PluginState {
    /// Binds this call to a session: the container-engine's session
    /// functions act on that session's container only.
    pub(super) fn bind_session(
        &mut self,
        slot: Option<Arc<super::capabilities::container_engine::SessionSlot>>,
    ) {
        if let Some(e) = self.engine.as_mut() {
            e.session = slot;
        }
    }
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// wasi:http shares WASI's resource table; its hooks are the host's policy.
impl WasiHttpView for PluginState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http_ctx,
            table: &mut self.table,
            hooks: &mut self.http_hooks,
        }
    }
}

impl CallView for PluginState {
    fn call(&mut self) -> &mut CallContext {
        &mut self.call
    }
}

impl LogView for PluginState {
    fn log(&mut self) -> &mut LogState {
        &mut self.log
    }
}

impl GrantView for PluginState {
    fn grant(&mut self) -> &mut GrantState {
        &mut self.grant
    }
}

impl ConfigView for PluginState {
    fn config(&mut self) -> &mut ConfigState {
        &mut self.config
    }
}

impl ProjectReportView for PluginState {
    fn report(&mut self) -> &mut ProjectReport {
        &mut self.report
    }
}

impl HttpView for PluginState {
    fn http(&self) -> Option<Arc<HttpCapability>> {
        self.http.clone()
    }
}

impl ContainerEngineView for PluginState {
    fn container_engine(&mut self) -> (&mut CallContext, Option<&mut ContainerEngineState>) {
        (&mut self.call, self.engine.as_mut())
    }
}
