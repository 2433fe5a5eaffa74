//! Plugin-supplied values, lifted lazily and copied under a budget.
//!
//! wasmtime's generated bindings copy every element of a list into host
//! memory before a host function (or the caller of an export) sees it. A
//! plugin can build a list of a million strings that all point at the same
//! buffer, and the host would allocate far beyond the plugin's memory cap
//! before any check ran. These mirrors of the WIT types hold `WasmList` and
//! `WasmStr` instead, which only point into the plugin's memory; the host
//! reads them through a `Budget` that refuses before it copies.
//!
//! Only arguments of host functions (imports) are read this way: the
//! plugin's memory holds them until the host function returns. A value an
//! export *returns* is freed by the plugin's post-return function as soon as
//! the call ends, so it cannot be read in place afterwards; the WIT keeps
//! returned values flat (no list of strings or records), which bounds their
//! whole copy by the plugin's memory cap, and routes many-valued results
//! through imports (`project-report`).

use wasmtime::component::{ComponentType, Lift, WasmList, WasmStr};
use wasmtime::{AsContext, AsContextMut, StoreContextMut};

/// What a plugin value may cost the host to copy.
pub struct Budget {
    bytes: usize,
    items: usize,
}

/// A value over its budget: nothing past the limit was copied.
#[derive(Debug)]
pub struct OverBudget;

impl Budget {
    pub fn new(bytes: usize, items: usize) -> Budget {
        Budget { bytes, items }
    }

    fn take(&mut self, bytes: usize, items: usize) -> Result<(), OverBudget> {
        if bytes > self.bytes || items > self.items {
            return Err(OverBudget);
        }
        self.bytes -= bytes;
        self.items -= items;
        Ok(())
    }

    /// Copies one string. Every plugin string is UTF-8 (others are refused
    /// at load, see `strings`), so `to_str` reads it in place and its length
    /// is checked against the budget before anything is copied.
    pub fn string<T: 'static>(
        &mut self,
        store: &mut StoreContextMut<'_, T>,
        s: &WasmStr,
    ) -> Result<String, OverBudget> {
        let text = s.to_str(store.as_context()).map_err(|_| OverBudget)?;
        self.take(text.len(), 0)?;
        Ok(text.into_owned())
    }

    /// Copies a list of strings, refusing before the first copy when the
    /// list alone is longer than the budget allows.
    pub fn strings<T: 'static>(
        &mut self,
        store: &mut StoreContextMut<'_, T>,
        list: &WasmList<WasmStr>,
    ) -> Result<Vec<String>, OverBudget> {
        self.take(0, list.len())?;
        let mut out = Vec::with_capacity(list.len());
        for i in 0..list.len() {
            let s = list
                .get(store.as_context_mut(), i)
                .ok_or(OverBudget)?
                .map_err(|_| OverBudget)?;
            out.push(self.string(store, &s)?);
        }
        Ok(out)
    }

    /// Copies bytes.
    pub fn bytes<T: 'static>(
        &mut self,
        store: &mut StoreContextMut<'_, T>,
        list: &WasmList<u8>,
    ) -> Result<Vec<u8>, OverBudget> {
        self.take(list.len(), 0)?;
        Ok(list.as_le_slice(store.as_context()).to_vec())
    }

    /// Copies at most `limit` bytes, saying whether any were left behind.
    pub fn bytes_capped<T: 'static>(
        &mut self,
        store: &mut StoreContextMut<'_, T>,
        list: &WasmList<u8>,
        limit: usize,
    ) -> Result<(Vec<u8>, bool), OverBudget> {
        let slice = list.as_le_slice(store.as_context());
        let keep = slice.len().min(limit);
        self.take(keep, 0)?;
        Ok((slice[..keep].to_vec(), slice.len() > keep))
    }
}

// --- imports: what a plugin passes the host -----------------------------------

#[derive(ComponentType, Lift)]
#[component(record)]
pub struct HttpRequest {
    pub method: WasmStr,
    pub url: WasmStr,
    pub headers: WasmList<(WasmStr, WasmStr)>,
    pub body: Option<WasmList<u8>>,
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub struct ContainerSpec {
    pub image: WasmStr,
    pub command: WasmList<WasmStr>,
    pub env: WasmList<WasmStr>,
    pub user: WasmStr,
    #[component(name = "read-only-root")]
    pub read_only_root: bool,
    pub network: WasmStr,
    pub privileged: bool,
    #[component(name = "cap-add")]
    pub cap_add: WasmList<WasmStr>,
    pub runtime: WasmStr,
    #[component(name = "host-namespaces")]
    pub host_namespaces: WasmList<WasmStr>,
    pub mounts: WasmList<WasmStr>,
}

// --- project reports: a run's steps and artifacts, passed one per call --------

#[derive(ComponentType, Lift)]
#[component(record)]
pub struct ProcessOutput {
    pub stdout: WasmList<u8>,
    pub stderr: WasmList<u8>,
    #[component(name = "exit-code")]
    pub exit_code: i32,
    #[component(name = "timed-out")]
    pub timed_out: bool,
    #[component(name = "stdout-truncated")]
    pub stdout_truncated: bool,
    #[component(name = "stderr-truncated")]
    pub stderr_truncated: bool,
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub struct StepResult {
    pub command: WasmStr,
    pub output: ProcessOutput,
    #[component(name = "duration-ms")]
    pub duration_ms: u64,
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub struct Artifact {
    pub path: WasmStr,
    pub content: WasmList<u8>,
}
