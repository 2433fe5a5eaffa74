//! What every wasmtime store the host creates is held to: a memory cap that
//! traps on growth past it, counted over the whole store, and deadlines
//! counted in epochs by a ticker thread. Shared by the QuickJS provider and
//! the plugin host, so the rule that guest code cannot catch its way past a
//! limit lives in one place.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::{Engine, ResourceLimiter};

/// Table elements all of a store's tables may hold together: generous for
/// the guests the host runs (a few small function tables) while keeping a
/// runaway table from eating host memory.
const MAX_TABLE_ELEMENTS: usize = 1 << 16;
/// Instances, memories and tables one store may create. A component is a few
/// core instances with one memory; wasmtime's defaults (10,000 each) would let
/// a crafted component multiply every other limit.
const MAX_INSTANCES: usize = 32;
const MAX_MEMORIES: usize = 8;
const MAX_TABLES: usize = 32;

/// Caps the linear memory of a whole store: the sum over every memory in it,
/// not each one alone (a component may define many). Growth past the cap is
/// an error, which wasmtime turns into a trap: the guest cannot catch it and
/// carry on. `denied` records that it happened, so the host can say why a
/// run stopped.
pub struct MemoryCap {
    limit: usize,
    /// Bytes of linear memory across all of the store's memories.
    memory_total: usize,
    /// Elements across all of the store's tables.
    table_total: usize,
    denied: bool,
}

impl MemoryCap {
    pub fn new(limit: usize) -> Self {
        MemoryCap {
            limit,
            memory_total: 0,
            table_total: 0,
            denied: false,
        }
    }

    /// Whether a growth was refused during this store's life.
    pub fn denied(&self) -> bool {
        self.denied
    }

    /// Bytes of linear memory the store's memories hold now.
    pub fn memory_total(&self) -> usize {
        self.memory_total
    }
}

/// A store-wide total after one of its memories or tables goes from
/// `current` to `desired`.
fn regrown(total: usize, current: usize, desired: usize) -> usize {
    total.saturating_sub(current).saturating_add(desired)
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = regrown(self.memory_total, current, desired);
        if total > self.limit {
            self.denied = true;
            return Err(wasmtime::Error::msg("memory limit reached"));
        }
        self.memory_total = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = regrown(self.table_total, current, desired);
        if total > MAX_TABLE_ELEMENTS {
            return Ok(false);
        }
        self.table_total = total;
        Ok(true)
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_on_the_sum_of_memories() {
        let mut cap = MemoryCap::new(100);
        assert!(cap.memory_growing(0, 60, None).expect("first memory"));
        // A second memory may not take the total past the cap.
        assert!(cap.memory_growing(0, 50, None).is_err());
        assert!(cap.denied());
        assert!(cap.memory_growing(0, 40, None).expect("fits"));
        // Growing an existing memory counts only the difference.
        assert!(cap.memory_growing(60, 60, None).expect("no change"));
        assert!(cap.memory_growing(40, 41, None).is_err());
    }

    #[test]
    fn tables_are_capped_in_total() {
        let mut cap = MemoryCap::new(100);
        assert!(
            cap.table_growing(0, MAX_TABLE_ELEMENTS - 10, None)
                .expect("ok")
        );
        assert!(!cap.table_growing(0, 11, None).expect("refused"));
        assert!(cap.table_growing(0, 10, None).expect("ok"));
    }
}
