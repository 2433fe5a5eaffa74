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

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, Trap};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::grants::broker;
use crate::limits::{EpochTicker, MemoryCap, ticks};
use crate::providers::{ProcessOutput, RunFailure};
use crate::refusal::Refusal;

mod generated {
    wasmtime::component::bindgen!({
        world: "guest",
        path: "../wit/js",
    });
}

use generated::plimsoll::broker::broker as broker_if;
use generated::plimsoll::js::entropy as entropy_if;
use generated::plimsoll::js::output as output_if;

/// The QuickJS guest, built by `make guest` before the host (see build.rs).
static GUEST_JS: &[u8] = include_bytes!(env!("PLIMSOLL_GUEST_JS_WASM"));

/// Epoch tick. Deadlines are rounded up to it, so a run overruns its budget by
/// at most one tick.
const TICK: Duration = Duration::from_millis(5);
const TICKER_NAME: &str = "plimsoll-epoch";

/// Native stack wasm code may use; see `Config::max_wasm_stack` above.
pub const MAX_WASM_STACK: usize = 4 << 20;
/// Stack size for threads that call `WasmProvider::run`: the wasm stack plus
/// room for the host frames beneath it.
pub const RUN_THREAD_STACK: usize = 8 << 20;

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

pub struct WasmProvider {
    engine: Engine,
    pre: generated::GuestPre<RunState>,
    identity: String,
    memory_limit: usize,
    output_limit: usize,
    _ticker: EpochTicker,
}

impl WasmProvider {
    /// Compiles and links the embedded QuickJS component. Slow (about a second
    /// of Cranelift on two cores), so it happens once, at start.
    pub fn new(
        memory_mb: u32,
        max_concurrent: u32,
        output_limit: usize,
    ) -> Result<Self, WasmError> {
        Self::from_component(GUEST_JS, memory_mb, max_concurrent, output_limit)
    }

    pub fn from_component(
        bytes: &[u8],
        memory_mb: u32,
        max_concurrent: u32,
        output_limit: usize,
    ) -> Result<Self, WasmError> {
        let memory_limit = (memory_mb as usize) << 20;
        let mut cfg = Config::new();
        cfg.wasm_component_model(true);
        cfg.epoch_interruption(true);
        // Deep JS recursion is bounded by this native stack (QuickJS's own
        // check is compiled out under WASI): a larger one lets legitimate
        // recursive code go deeper before the instance traps. Runs happen on
        // threads with `RUN_THREAD_STACK`, so the trap always comes first and
        // the host thread itself can never overflow.
        cfg.max_wasm_stack(MAX_WASM_STACK);
        // wasmtime requires the async fiber stack to hold the wasm stack even
        // though this provider calls the guest synchronously.
        cfg.async_stack_size(MAX_WASM_STACK + (1 << 20));
        // One pool slot per run that may be in flight, plus headroom for the
        // few core instances and memories one component instance consists of.
        let slots = max_concurrent.max(1);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(slots)
            .total_core_instances(slots * 8)
            .total_memories(slots * 2)
            .total_tables(slots * 4)
            .max_memory_size(memory_limit);
        cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&cfg).map_err(|e| WasmError::Engine(format!("{e:#}")))?;

        let mut linker: Linker<RunState> = Linker::new(&engine);
        // All of WASI p2 is linked, but the context grants nothing: no
        // preopened directories, no sockets, no environment, no arguments,
        // stdin empty and stdout/stderr discarded (output goes through the
        // `output` import instead, where the host caps it).
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| WasmError::Link(format!("{e:#}")))?;
        generated::Guest::add_to_linker::<RunState, HasSelf<RunState>>(&mut linker, |s| s)
            .map_err(|e| WasmError::Link(format!("{e:#}")))?;

        let snapshot = pre_initialize(&engine, &linker, bytes, memory_limit, output_limit)?;
        let component =
            Component::new(&engine, &snapshot).map_err(|e| WasmError::Compile(format!("{e:#}")))?;
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| WasmError::Link(format!("{e:#}")))?;
        let pre = generated::GuestPre::new(pre).map_err(|e| WasmError::Link(format!("{e:#}")))?;

        let ticker = EpochTicker::start(&engine, TICK, TICKER_NAME);

        Ok(WasmProvider {
            engine,
            pre,
            identity: format!("quickjs-wasm:sha256:{}", hex::encode(Sha256::digest(bytes))),
            memory_limit,
            output_limit,
            _ticker: ticker,
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
    /// Blocking: call it from a blocking thread.
    pub fn run(&self, code: &str, timeout: Duration) -> Result<ProcessOutput, RunFailure> {
        self.run_granted(code, timeout, None)
    }

    /// Runs one snippet with the grant's broker session, if any. The
    /// session's calls are made on `handle`'s runtime while this thread
    /// waits (the guest sees a synchronous call and wraps it in a Promise).
    pub fn run_granted(
        &self,
        code: &str,
        timeout: Duration,
        grant: Option<(Arc<broker::Session>, tokio::runtime::Handle)>,
    ) -> Result<ProcessOutput, RunFailure> {
        let global = grant.as_ref().map(|(s, _)| s.profile().global.clone());
        let mut state = RunState::new(self.memory_limit, self.output_limit);
        state.broker = grant;
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        store.set_epoch_deadline(ticks(timeout, TICK));
        store.epoch_deadline_trap();

        let guest = match self.pre.instantiate(&mut store) {
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
        let result = guest.call_run(&mut store, code, global.as_deref());
        let state = store.into_data();
        let (mut out, mut err) = (state.stdout, state.stderr);
        let (exit_code, timed_out) = match result {
            Ok(code) => (code, false),
            Err(e) => {
                if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
                    err.push_notice(&format!(
                        "plimsoll: the run was stopped at its deadline of {} ms\n",
                        timeout.as_millis()
                    ));
                    (EXIT_TIMED_OUT, true)
                } else if state.limits.denied() {
                    err.push_notice(&format!(
                        "plimsoll: the run was stopped at its memory limit of {} MiB\n",
                        self.memory_limit >> 20
                    ));
                    (EXIT_OUT_OF_MEMORY, false)
                } else if e.downcast_ref::<Trap>() == Some(&Trap::StackOverflow) {
                    // QuickJS has no working stack check under WASI, so deep
                    // recursion ends here rather than as a RangeError.
                    err.push_notice("plimsoll: the run exhausted its stack (runaway recursion) and was stopped\n");
                    (EXIT_ENGINE_TRAP, false)
                } else if let Some(trap) = e.downcast_ref::<Trap>() {
                    // A trap code names the fault class only; the wasm
                    // backtrace is left out of the result and the log.
                    err.push_notice(&format!("plimsoll: the engine stopped the run: {trap}\n"));
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

/// Everything one run's store holds.
struct RunState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: MemoryCap,
    stdout: Capped,
    stderr: Capped,
    /// The run's broker session, when it carries a grant.
    broker: Option<(Arc<broker::Session>, tokio::runtime::Handle)>,
}

impl RunState {
    fn new(memory_limit: usize, output_limit: usize) -> Self {
        RunState {
            wasi: WasiCtx::builder().build(),
            table: ResourceTable::new(),
            limits: MemoryCap::new(memory_limit),
            stdout: Capped::new(output_limit),
            stderr: Capped::new(output_limit),
            broker: None,
        }
    }
}

/// Builds the snapshot every run starts from: the component is instrumented
/// so its state can be read back, instantiated once, its `initialize` export
/// builds the QuickJS runtime and context, and the resulting memory and
/// globals are written into a new component (wizer). The snapshot is derived
/// from the embedded bytes at every start and never stored, so the identity
/// Describe reports still names exactly the bytes that run.
fn pre_initialize(
    engine: &Engine,
    linker: &Linker<RunState>,
    bytes: &[u8],
    memory_limit: usize,
    output_limit: usize,
) -> Result<Vec<u8>, WasmError> {
    let err = |e: wasmtime::Error| WasmError::Snapshot(format!("{e:#}"));
    let mut wizer = wasmtime_wizer::Wizer::new();
    wizer.init_func("initialize").keep_init_func(true);
    let (cx, instrumented) = wizer.instrument_component(bytes).map_err(err)?;
    let component = Component::new(engine, &instrumented).map_err(err)?;
    let mut store = Store::new(engine, RunState::new(memory_limit, output_limit));
    store.limiter(|s| &mut s.limits);
    // Initialisation is bounded like a run, so a broken guest cannot hang start.
    store.set_epoch_deadline(ticks(Duration::from_secs(30), TICK));
    store.epoch_deadline_trap();
    let instance = linker.instantiate(&mut store, &component).map_err(err)?;
    let init = instance
        .get_typed_func::<(), ()>(&mut store, "initialize")
        .map_err(err)?;
    init.call(&mut store, ()).map_err(err)?;
    if !store.data().stdout.buf.is_empty() || !store.data().stderr.buf.is_empty() {
        return Err(WasmError::Snapshot(
            "initialize wrote output; the snapshot would carry it".into(),
        ));
    }
    let mut state = SnapshotAccess {
        store: &mut store,
        instance,
    };
    poll_ready(wizer.snapshot_component(&cx, &mut state)).map_err(err)
}

/// The state reads wizer's snapshot makes, served by synchronous calls into
/// the instrumented instance, so every future it awaits is already ready.
struct SnapshotAccess<'a> {
    store: &'a mut Store<RunState>,
    instance: wasmtime::component::Instance,
}

impl SnapshotAccess<'_> {
    fn call<R>(&mut self, instance: &str, func: &str) -> R
    where
        R: wasmtime::component::Lift + Send + Sync + 'static,
    {
        let found = self
            .instance
            .get_export_index(&mut *self.store, None, instance)
            .and_then(|i| {
                self.instance
                    .get_export_index(&mut *self.store, Some(&i), func)
            })
            .and_then(|f| {
                self.instance
                    .get_typed_func::<(), (R,)>(&mut *self.store, f)
                    .ok()
            });
        // wizer only asks for accessors its own instrumentation added, so a
        // missing one is a bug in this start-up path, not input to handle.
        let Some(f) = found else {
            panic!("wizer accessor {instance}#{func} missing")
        };
        match f.call(&mut *self.store, ()) {
            Ok((r,)) => r,
            Err(e) => panic!("wizer accessor {instance}#{func} failed: {e:#}"),
        }
    }
}

impl wasmtime_wizer::ComponentInstanceState for SnapshotAccess<'_> {
    fn call_func_ret_list_u8(
        &mut self,
        instance: &str,
        func: &str,
        contents: impl FnOnce(&[u8]) + Send,
    ) -> impl Future<Output = ()> + Send {
        let list: wasmtime::component::WasmList<u8> = self.call(instance, func);
        contents(list.as_le_slice(&*self.store));
        std::future::ready(())
    }

    fn call_func_ret_s32(
        &mut self,
        instance: &str,
        func: &str,
    ) -> impl Future<Output = i32> + Send {
        std::future::ready(self.call::<i32>(instance, func))
    }

    fn call_func_ret_s64(
        &mut self,
        instance: &str,
        func: &str,
    ) -> impl Future<Output = i64> + Send {
        std::future::ready(self.call::<i64>(instance, func))
    }

    fn call_func_ret_f32(
        &mut self,
        instance: &str,
        func: &str,
    ) -> impl Future<Output = u32> + Send {
        std::future::ready(self.call::<f32>(instance, func).to_bits())
    }

    fn call_func_ret_f64(
        &mut self,
        instance: &str,
        func: &str,
    ) -> impl Future<Output = u64> + Send {
        std::future::ready(self.call::<f64>(instance, func).to_bits())
    }
}

/// Drives to completion a future whose every await point is ready at once
/// (see `SnapshotAccess`); there is nothing to wait for, so no executor.
fn poll_ready<F: Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

impl entropy_if::Host for RunState {
    fn seed(&mut self) -> u64 {
        let mut b = [0u8; 8];
        // A fixed fallback seed would silently repeat Math.random sequences
        // across runs; an OS without randomness is not one to run code on.
        getrandom::fill(&mut b).expect("the OS random source failed");
        u64::from_le_bytes(b)
    }
}

impl WasiView for RunState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl output_if::Host for RunState {
    fn write(&mut self, channel: output_if::Channel, data: String) -> bool {
        let stream = match channel {
            output_if::Channel::Stdout => &mut self.stdout,
            output_if::Channel::Stderr => &mut self.stderr,
        };
        stream.push_str(&data);
        !stream.truncated
    }
}

impl broker_if::Host for RunState {
    fn call(
        &mut self,
        request: broker_if::Request,
    ) -> Result<broker_if::Response, broker_if::CallError> {
        let Some((session, handle)) = &self.broker else {
            // No grant: the guest has no network at all.
            return Err(broker_if::CallError::NoGrant);
        };
        // This is a blocking-pool thread, outside the runtime's async
        // context, so waiting on the runtime here is allowed.
        let answer = handle.block_on(session.call(&request.method, &request.path, request.body));
        match answer {
            Ok(r) => Ok(broker_if::Response {
                status: r.status,
                body: r.body,
            }),
            Err(broker::CallError::NotPermitted(why)) => {
                Err(broker_if::CallError::NotPermitted(why.to_string()))
            }
            Err(broker::CallError::Budget(why)) => {
                Err(broker_if::CallError::BudgetExhausted(why.to_string()))
            }
            Err(broker::CallError::Shed) => Err(broker_if::CallError::Shed),
            Err(broker::CallError::Upstream(why)) => Err(broker_if::CallError::UpstreamFailed(why)),
        }
    }
}

/// An output stream that keeps at most `limit` bytes and remembers whether it
/// dropped any. Cut on a UTF-8 boundary so the kept part stays text.
struct Capped {
    buf: Vec<u8>,
    limit: usize,
    truncated: bool,
}

impl Capped {
    fn new(limit: usize) -> Self {
        Capped {
            buf: Vec::new(),
            limit,
            truncated: false,
        }
    }

    fn push_str(&mut self, s: &str) {
        if self.truncated {
            return;
        }
        let room = self.limit - self.buf.len();
        if s.len() <= room {
            self.buf.extend_from_slice(s.as_bytes());
            return;
        }
        let mut cut = room;
        while cut > 0 && !s.is_char_boundary(cut) {
            cut -= 1;
        }
        self.buf.extend_from_slice(&s.as_bytes()[..cut]);
        self.truncated = true;
    }

    /// The daemon's own closing line (deadline, memory cap): always kept,
    /// even on a full stream, by giving up the end of the guest's output,
    /// which the truncated flag already says is incomplete.
    fn push_notice(&mut self, notice: &str) {
        let notice = &notice.as_bytes()[..notice.len().min(self.limit)];
        if notice.len() > self.limit - self.buf.len() {
            // The buffer holds whole UTF-8 text, so a cut that does not land
            // on a continuation byte (0b10xx_xxxx) leaves it whole.
            let mut keep = self.limit - notice.len();
            while keep > 0 && keep < self.buf.len() && (self.buf[keep] & 0xC0) == 0x80 {
                keep -= 1;
            }
            self.buf.truncate(keep);
            self.truncated = true;
        }
        self.buf.extend_from_slice(notice);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_keeps_limit_and_flags() {
        let mut c = Capped::new(5);
        c.push_str("abc");
        c.push_str("déf");
        assert_eq!(c.buf, b"abcd");
        assert!(c.truncated);
        c.push_str("x");
        assert_eq!(c.buf, b"abcd");
    }

    #[test]
    fn notices_survive_a_full_stream() {
        let mut c = Capped::new(10);
        c.push_str("ééééé");
        c.push_notice("stop\n");
        assert_eq!(c.buf.len(), 9, "{:?}", String::from_utf8_lossy(&c.buf));
        assert_eq!(
            std::str::from_utf8(&c.buf).expect("utf-8"),
            "éé".to_string() + "stop\n"
        );
        assert!(c.truncated);
        let mut c = Capped::new(10);
        c.push_str("ab");
        c.push_notice("stop\n");
        assert_eq!(c.buf, b"abstop\n");
        assert!(!c.truncated);
    }

    #[test]
    fn capped_exact_fit_is_not_truncated() {
        let mut c = Capped::new(3);
        c.push_str("abc");
        assert!(!c.truncated);
        assert_eq!(c.buf, b"abc");
    }
}
