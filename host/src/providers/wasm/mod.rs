//! The `wasm` provider: JavaScript snippets in QuickJS, compiled to a Wasm
//! component and run by wasmtime inside this process.
//!
//! Process tier, and only that: an engine escape lands in the daemon. It is for
//! trusted or low-stakes code and for development, never for hostile code.
//!
//! Performance shape: the component is compiled once at start and pre-linked
//! once (`InstancePre`); every run gets a fresh `Store` and a fresh instance
//! from the pooling allocator, whose memory images are copy-on-write, so a run
//! starts from the component's pristine state and leaves nothing behind.
//! Deadlines use epoch interruption (a ticker thread bumps the epoch); memory
//! is capped by a limiter that traps on the first growth past the cap, so a
//! script cannot catch its way around it.
//!
//! A run is an async call on the request's own task: wasmtime runs the guest
//! on a fiber, and at every epoch tick the guest hands the thread back to the
//! executor (or traps, past its deadline). No thread hand-off per run, and a
//! snippet that spins still cannot hold one of the runtime's few workers.

mod output;
mod preamble;
mod session;
mod slots;
mod snapshot;
mod store;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, Trap};

use super::{Evidence, Offer, Provider, ProviderSettings, Resources, not_offered};
use crate::admission::OUTPUT_LIMIT;
use crate::compile_cache::CompileCache;
use crate::grants::broker;
use crate::job::{Job, Output, Payload};
use crate::live::{Channel, Live};
use crate::outcome::{ProcessOutput, RunFailure};
use crate::refusal::Refusal;
use crate::store_limits::EpochTicker;
use crate::tier::Tier;
use output::Capped;
use store::RunState;

mod generated {
    wasmtime::component::bindgen!({
        world: "guest",
        path: "../wit/js",
        // Async so that the broker's call awaits its upstream on the
        // runtime instead of blocking a thread; the other imports are
        // ready at once.
        imports: { default: async },
        exports: { default: async },
    });
}

/// The QuickJS guest, built by `make guest` before the host (see build.rs).
static GUEST_JS: &[u8] = include_bytes!(env!("PLIMSOLL_GUEST_JS_WASM"));

/// Epoch tick. A run hands its thread back to the executor at every tick and
/// is checked against its deadline there, so it overruns its budget by at most
/// one tick.
pub(super) const TICK: Duration = Duration::from_millis(5);
const TICKER_NAME: &str = "plimsoll-epoch";

/// Native stack wasm code may use; see `Config::max_wasm_stack` below.
pub const MAX_WASM_STACK: usize = 4 << 20;
/// Each run's fiber stack: the wasm stack plus room for the host functions
/// the guest calls from the bottom of it (the broker's HTTP client among
/// them).
const FIBER_STACK: usize = MAX_WASM_STACK + (2 << 20);
/// How much of a fiber stack is wiped by writing zeros when it goes back to
/// the pool; the rest is handed back to the kernel (see `async_stack_zeroing`).
const FIBER_STACK_KEPT: usize = 128 << 10;

/// Exit code reported for a run stopped at its deadline, as `timeout(1)` does.
pub const EXIT_TIMED_OUT: i32 = 124;
/// Exit code reported for a run stopped at its memory cap, as for a process
/// the kernel's OOM killer ends.
pub const EXIT_OUT_OF_MEMORY: i32 = 137;
/// Exit code for any other trap inside the engine (a bug in the guest).
pub const EXIT_ENGINE_TRAP: i32 = 134;

#[derive(Debug, thiserror::Error)]
pub enum WasmError {
    #[error("configuring the wasm engine: {0}")]
    Engine(String),
    #[error("compiling the QuickJS component: {0}")]
    Compile(String),
    #[error("linking the QuickJS component: {0}")]
    Link(String),
    #[error("pre-initialising the QuickJS component: {0}")]
    Snapshot(String),
}

/// The compiled, snapshotted guest. Cheap to clone: clones share the
/// engine, the pre-linked component and the epoch ticker.
#[derive(Clone)]
pub struct WasmProvider {
    engine: Engine,
    pre: generated::GuestPre<RunState>,
    identity: Arc<str>,
    memory_limit: usize,
    output_limit: usize,
    preambles: Arc<preamble::Compiled>,
    _ticker: Arc<EpochTicker>,
}

/// Starts the wasm provider: compiling the guest takes about a second of
/// Cranelift, so it happens on a blocking thread.
pub async fn start(settings: &ProviderSettings) -> Result<WasmProvider, WasmError> {
    tracing::warn!(
        "the wasm provider is process-tier: an engine escape lands in this daemon; never use it for hostile code"
    );
    let (memory_mb, max) = (settings.memory_mb, settings.max_concurrent);
    let settings = settings.clone();
    tokio::task::spawn_blocking(move || {
        let cache = settings.open_compile_cache();
        WasmProvider::from_component(GUEST_JS, memory_mb, max, OUTPUT_LIMIT, cache.as_ref())
    })
    .await
    .map_err(|e| WasmError::Engine(format!("the start-up thread failed: {e}")))?
}

impl WasmProvider {
    /// Compiles and links the embedded QuickJS component. Slow (about a second
    /// of Cranelift on two cores), so it happens once, at start.
    pub fn new(
        memory_mb: u32,
        max_concurrent: u32,
        output_limit: usize,
    ) -> Result<Self, WasmError> {
        Self::from_component(GUEST_JS, memory_mb, max_concurrent, output_limit, None)
    }

    pub fn from_component(
        bytes: &[u8],
        memory_mb: u32,
        max_concurrent: u32,
        output_limit: usize,
        cache: Option<&CompileCache>,
    ) -> Result<Self, WasmError> {
        let memory_limit = (memory_mb as usize) << 20;
        let mut cfg = Config::new();
        cfg.wasm_component_model(true);
        cfg.epoch_interruption(true);
        // Deep JS recursion is bounded by this native stack (QuickJS's own
        // check is compiled out under WASI): a larger one lets legitimate
        // recursive code go deeper before the instance traps. Runs happen on
        // fibers of `FIBER_STACK`, so the trap always comes first and the
        // host's own frames can never overflow.
        cfg.max_wasm_stack(MAX_WASM_STACK);
        cfg.async_stack_size(FIBER_STACK);
        // A fiber stack goes back to the pool after each call. Wiped, so
        // nothing the host wrote on it (a broker call's frames, the code)
        // stays for the next run, and so a run that recursed deep does not
        // leave megabytes resident in its slot for the daemon's life: the
        // top is zeroed in place (the part every call uses), the rest given
        // back to the kernel.
        cfg.async_stack_zeroing(true);
        // One pool slot per run that may be in flight; a used slot is reset
        // by copying the image over what the run wrote (slots.rs).
        let pool = slots::pool(max_concurrent, FIBER_STACK_KEPT, memory_limit);
        cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&cfg).map_err(|e| WasmError::Engine(format!("{e:#}")))?;

        let mut linker: Linker<RunState> = Linker::new(&engine);
        // All of WASI p2 is linked, but the context grants nothing: no
        // preopened directories, no sockets, no environment, no arguments,
        // stdin empty and stdout/stderr discarded (output goes through the
        // `output` import instead, where the host caps it).
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| WasmError::Link(format!("{e:#}")))?;
        generated::Guest::add_to_linker::<RunState, HasSelf<RunState>>(&mut linker, |s| s)
            .map_err(|e| WasmError::Link(format!("{e:#}")))?;

        let digest = hex::encode(Sha256::digest(bytes));
        // The snapshot is built under the run limits, so they are part of
        // its key with the guest's own digest.
        let key = CompileCache::key(
            &engine,
            "quickjs-snapshot",
            &digest,
            &[&memory_limit.to_le_bytes(), &output_limit.to_le_bytes()],
        );
        let component = match cache.and_then(|c| c.load(&engine, &key)) {
            Some(c) => c,
            None => {
                let snapshot =
                    snapshot::pre_initialize(&engine, &linker, bytes, memory_limit, output_limit)?;
                let c = Component::new(&engine, &snapshot)
                    .map_err(|e| WasmError::Compile(format!("{e:#}")))?;
                if let Some(cache) = cache {
                    cache.store(&key, &c);
                }
                c
            }
        };
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| WasmError::Link(format!("{e:#}")))?;
        let pre = generated::GuestPre::new(pre).map_err(|e| WasmError::Link(format!("{e:#}")))?;

        let ticker = EpochTicker::start(&engine, TICK, TICKER_NAME);

        Ok(WasmProvider {
            engine,
            pre,
            identity: Arc::from(format!("quickjs-wasm:sha256:{digest}")),
            memory_limit,
            output_limit,
            preambles: Arc::default(),
            _ticker: Arc::new(ticker),
        })
    }

    /// `quickjs-wasm:sha256:<digest of the component>`: the exact engine
    /// every run of this daemon executes in.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn memory_limit(&self) -> usize {
        self.memory_limit
    }

    /// Runs one snippet to completion, its deadline, or its memory cap.
    pub async fn run(&self, code: &str, timeout: Duration) -> Result<ProcessOutput, RunFailure> {
        self.run_granted(code, timeout, None, None).await
    }

    /// Runs one snippet with the grant's broker session, if any.
    pub async fn run_granted(
        &self,
        code: &str,
        timeout: Duration,
        grant: Option<Arc<broker::Session>>,
        live: Option<Live>,
    ) -> Result<ProcessOutput, RunFailure> {
        let client = match grant.as_deref() {
            Some(session) => Some(self.grant_client(session).await?),
            None => None,
        };
        let mut state = RunState::new(self.memory_limit, self.output_limit);
        state.broker = grant;
        state.live = live;
        state.ends = Instant::now() + timeout;
        let mut store = store::new(&self.engine, state);

        let guest = match self.pre.instantiate_async(&mut store).await {
            Ok(g) => g,
            Err(e) => {
                // Instantiation runs no snippet code (the component has no
                // start function that evaluates anything), so this is a
                // refusal. The pool being exhausted is the usual cause.
                tracing::warn!(error = %format!("{e:#}"), "wasm instantiation failed");
                return Err(RunFailure::NotDispatched(Refusal::capacity(
                    "no wasm instance could be created for this run",
                )));
            }
        };
        let result = guest.call_run(&mut store, code, client.as_ref()).await;
        let state = store::release(store)
            .await
            .map_err(|e| RunFailure::MayHaveRun(format!("releasing the instance failed: {e}")))?;
        let (mut out, mut err) = (state.stdout, state.stderr);
        let live = state.live;
        // The daemon's closing line reaches a watcher too, as it reaches the
        // result.
        let notice = |err: &mut Capped, text: &str| {
            err.push_notice(text);
            if let Some(live) = &live {
                live.send(Channel::Stderr, text.as_bytes());
            }
        };
        let (exit_code, timed_out) = match result {
            Ok(code) => (code, false),
            Err(e) => {
                if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
                    notice(
                        &mut err,
                        &format!(
                            "plimsoll: the run was stopped at its deadline of {} ms\n",
                            timeout.as_millis()
                        ),
                    );
                    (EXIT_TIMED_OUT, true)
                } else if state.limits.denied() {
                    notice(
                        &mut err,
                        &format!(
                            "plimsoll: the run was stopped at its memory limit of {} MiB\n",
                            self.memory_limit >> 20
                        ),
                    );
                    (EXIT_OUT_OF_MEMORY, false)
                } else if e.downcast_ref::<Trap>() == Some(&Trap::StackOverflow) {
                    // QuickJS has no working stack check under WASI, so deep
                    // recursion ends here rather than as a RangeError.
                    notice(
                        &mut err,
                        "plimsoll: the run exhausted its stack (runaway recursion) and was stopped\n",
                    );
                    (EXIT_ENGINE_TRAP, false)
                } else if let Some(trap) = e.downcast_ref::<Trap>() {
                    // A trap code names the fault class only; the wasm
                    // backtrace is left out of the result and the log.
                    notice(
                        &mut err,
                        &format!("plimsoll: the engine stopped the run: {trap}\n"),
                    );
                    (EXIT_ENGINE_TRAP, false)
                } else {
                    return Err(RunFailure::MayHaveRun(format!("{e:#}")));
                }
            }
        };
        Ok(ProcessOutput {
            stdout_truncated: out.truncated,
            stderr_truncated: err.truncated,
            stdout: std::mem::take(&mut out.buf),
            stderr: std::mem::take(&mut err.buf),
            exit_code,
            timed_out,
        })
    }
}

impl Provider for WasmProvider {
    fn evidence(&self) -> Evidence {
        Evidence {
            sandbox: "wasm".to_string(),
            tier: Tier::Process,
            environment: self.identity.to_string(),
            software_identity: self.identity.to_string(),
            policy: String::new(),
        }
    }

    fn offer(&self) -> Offer {
        Offer {
            javascript: true,
            javascript_grants: true,
            ..Offer::default()
        }
    }

    fn resources(&self) -> Option<Resources> {
        Some(Resources {
            memory_mb: (self.memory_limit >> 20) as u32,
            ..Resources::default()
        })
    }

    fn session_offer(&self) -> Option<super::SessionOffer> {
        Some(session::offer())
    }

    fn open_session(
        &self,
        _options: crate::job::SessionOptions,
    ) -> BoxFuture<'_, Result<Box<dyn super::ProviderSession>, RunFailure>> {
        Box::pin(async move {
            self.open_session()
                .await
                .map(|s| Box::new(s) as Box<dyn super::ProviderSession>)
        })
    }

    fn run(&self, job: Job) -> BoxFuture<'_, Result<Output, RunFailure>> {
        let Payload::JavaScript(code) = job.payload else {
            return Box::pin(std::future::ready(Err(not_offered())));
        };
        Box::pin(async move {
            self.run_granted(&code, job.timeout, job.grant, job.live)
                .await
                .map(Output::JavaScript)
        })
    }
}
