//! One instance's store: what it holds, how it is built, how it is let go.
//!
//! A run's store and a session's store are built the same way (the memory
//! cap, a deadline checked at every epoch tick) and released the same way
//! (off the async workers when the instance grew large). The guest's host
//! imports are implemented on the state it holds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::ResourceTable;
use wasmtime::{Engine, Store, Trap, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::generated::plimsoll::broker::broker as broker_if;
use super::generated::plimsoll::js::entropy as entropy_if;
use super::generated::plimsoll::js::output as output_if;
use super::output::Capped;
use crate::grants::broker;
use crate::live::{Channel, Live};
use crate::store_limits::MemoryCap;

/// An instance whose memories grew past this is released on a blocking thread:
/// resetting that many pages would hold an async worker for milliseconds.
const RESET_INLINE: usize = 32 << 20;

/// A store for one instance: its memory cap, and a deadline checked at every
/// epoch tick, where the guest also yields to the executor. The deadline is
/// the state's `ends`, so a session moves it per call.
pub(super) fn new(engine: &Engine, state: RunState) -> Store<RunState> {
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.limits);
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|ctx| {
        if Instant::now() >= ctx.data().ends {
            Err(Trap::Interrupt.into())
        } else {
            Ok(UpdateDeadline::Yield(1))
        }
    });
    store
}

/// Lets a store go and returns what it held. Releasing the instance resets
/// its pages: done in place for the usual small instance, on a blocking
/// thread for one that grew large. Awaited either way, so the instance is
/// back in the pool before the caller gives up its slot.
pub(super) async fn release(store: Store<RunState>) -> Result<RunState, tokio::task::JoinError> {
    if store.data().limits.memory_total() > RESET_INLINE {
        tokio::task::spawn_blocking(move || store.into_data()).await
    } else {
        Ok(store.into_data())
    }
}

/// Everything one run's store holds.
pub(super) struct RunState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(super) limits: MemoryCap,
    pub(super) stdout: Capped,
    pub(super) stderr: Capped,
    /// The run's broker session, when it carries a grant.
    pub(super) broker: Option<Arc<broker::Session>>,
    /// Where kept output also goes as it is written, when watched.
    pub(super) live: Option<Live>,
    /// When the current call is stopped (checked at each epoch tick).
    pub(super) ends: Instant,
}

impl RunState {
    pub(super) fn new(memory_limit: usize, output_limit: usize) -> Self {
        RunState {
            wasi: WasiCtx::builder().build(),
            table: ResourceTable::new(),
            limits: MemoryCap::new(memory_limit),
            stdout: Capped::new(output_limit),
            stderr: Capped::new(output_limit),
            broker: None,
            live: None,
            // Set by whoever calls into the instance; until then, a bound
            // that keeps a broken start-up from hanging.
            ends: Instant::now() + Duration::from_secs(30),
        }
    }
}

/// Types only: how a granted run's client is set up travels in `run`'s
/// arguments, not through an import.
impl super::generated::plimsoll::js::grant::Host for RunState {}

impl entropy_if::Host for RunState {
    async fn seed(&mut self) -> u64 {
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
    async fn write(&mut self, channel: output_if::Channel, data: String) -> bool {
        let (stream, which) = match channel {
            output_if::Channel::Stdout => (&mut self.stdout, Channel::Stdout),
            output_if::Channel::Stderr => (&mut self.stderr, Channel::Stderr),
        };
        let before = stream.buf.len();
        stream.push_str(&data);
        if let Some(live) = &self.live {
            // Exactly what was kept: a watcher sees no byte the result lacks.
            live.send(which, &stream.buf[before..]);
        }
        !stream.truncated
    }
}

impl broker_if::Host for RunState {
    async fn call(
        &mut self,
        request: broker_if::Request,
    ) -> Result<broker_if::Response, broker_if::CallError> {
        let Some(session) = &self.broker else {
            // No grant: the guest has no network at all.
            return Err(broker_if::CallError::NoGrant);
        };
        // The guest's fiber is suspended while the call waits upstream; the
        // guest sees a synchronous call and wraps it in a Promise.
        let answer = session
            .call(&request.method, &request.path, request.body)
            .await;
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
