//! What every wasmtime store the host creates is held to: a memory cap that
//! traps on growth past it, and deadlines counted in epochs by a ticker
//! thread. Shared by the QuickJS provider and the plugin host, so the rule
//! that guest code cannot catch its way past a limit lives in one place.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::{Engine, ResourceLimiter};

/// Generous for the guests the host runs (one small function table each)
/// while keeping a runaway table from eating host memory.
const MAX_TABLE_ELEMENTS: usize = 1 << 16;

/// Caps linear memory. Growth past the cap is an error, which wasmtime turns
/// into a trap: the guest cannot catch it and carry on. `denied` records that
/// it happened, so the host can say why a run stopped.
pub struct MemoryCap {
    limit: usize,
    denied: bool,
}

impl MemoryCap {
    pub fn new(limit: usize) -> Self {
        MemoryCap {
            limit,
            denied: false,
        }
    }

    /// Whether a growth was refused during this store's life.
    pub fn denied(&self) -> bool {
        self.denied
    }
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.denied = true;
            return Err(wasmtime::Error::msg("memory limit reached"));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// A thread that advances an engine's epoch every `tick`, so store deadlines
/// (`set_epoch_deadline`) fire. It stops when this value is dropped or the
/// engine is gone.
pub struct EpochTicker {
    stop: Arc<AtomicBool>,
}

impl EpochTicker {
    /// Starts the ticker. Called at start-up only, where failing to get a
    /// thread is a start failure, not something a request can cause.
    pub fn start(engine: &Engine, tick: Duration, name: &str) -> EpochTicker {
        let stop = Arc::new(AtomicBool::new(false));
        let (weak, flag) = (engine.weak(), stop.clone());
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    match weak.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .expect("spawning an epoch ticker thread at start-up");
        EpochTicker { stop }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Epoch ticks covering `d`, rounded up, plus one so a deadline never fires
/// early.
pub fn ticks(d: Duration, tick: Duration) -> u64 {
    d.as_nanos().div_ceil(tick.as_nanos()).max(1) as u64 + 1
}
