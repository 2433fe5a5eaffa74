//! The snapshot every wasm run starts from: QuickJS already initialised,
//! built once at start with wasmtime-wizer's instrument/snapshot, driven by
//! our own engine and linker (wizer's own runner is not used, so it pulls no
//! extra wasmtime features into the build).

use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store};

use super::{RunState, TICK, WasmError};
use crate::store_limits::ticks;
use std::time::Duration;

/// Builds the snapshot every run starts from: the component is instrumented
/// so its state can be read back, instantiated once, its `initialize` export
/// builds the QuickJS runtime and context, and the resulting memory and
/// globals are written into a new component (wizer). The snapshot is derived
/// from the embedded bytes at every start and never stored, so the identity
/// Describe reports still names exactly the bytes that run.
pub(super) fn pre_initialize(
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
    // The runs' linker is async (see the module's docs), so start-up drives
    // it the same way. With a trapping deadline (no yields) and host imports
    // that are ready at once, nothing here ever waits.
    let instance = poll_ready(linker.instantiate_async(&mut store, &component))?.map_err(err)?;
    let init = instance
        .get_typed_func::<(), ()>(&mut store, "initialize")
        .map_err(err)?;
    poll_ready(init.call_async(&mut store, ()))?.map_err(err)?;
    if !store.data().stdout.buf.is_empty() || !store.data().stderr.buf.is_empty() {
        return Err(WasmError::Snapshot(
            "initialize wrote output; the snapshot would carry it".into(),
        ));
    }
    let mut state = SnapshotAccess {
        store: &mut store,
        instance,
    };
    poll_ready(wizer.snapshot_component(&cx, &mut state))?.map_err(err)
}

/// The state reads wizer's snapshot makes, served by calls into the
/// instrumented instance that never wait (see `pre_initialize`).
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
        match poll_ready(f.call_async(&mut *self.store, ())) {
            Ok(Ok((r,))) => r,
            Err(e) => panic!("wizer accessor {instance}#{func}: {e}"),
            Ok(Err(e)) => panic!("wizer accessor {instance}#{func} failed: {e:#}"),
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
/// (see `pre_initialize`); there is nothing to wait for, so no executor. A
/// future that does wait is a broken start-up, reported rather than spun on.
fn poll_ready<F: Future>(fut: F) -> Result<F::Output, WasmError> {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Ok(v),
        std::task::Poll::Pending => Err(WasmError::Snapshot(
            "start-up waited on an import; the snapshot's imports must answer at once".into(),
        )),
    }
}
