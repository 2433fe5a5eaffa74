//! What a plugin can be granted, one capability per folder or file, each
//! shaped like a small wasmtime capability crate: its state, a view trait
//! the store's data implements to reach that state, and `add_to_linker`.
//!
//! Capabilities are linked by hand rather than through the generated
//! bindings' traits: the generated code copies every list element of an
//! argument into host memory before a host function runs, so a plugin could
//! make the host allocate far beyond the plugin's own memory cap. Here every
//! argument is lifted lazily and copied under a budget checked first
//! (`lazy`). Every capability is linked for every plugin and refuses one the
//! operator did not grant it; a plugin whose component *imports* an
//! ungranted capability does not load at all (`load`).

pub mod config_keys;
pub mod container_engine;
pub mod grant;
pub mod http;
pub mod log;
pub mod project_report;

use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::Linker;

use super::dispatch_mark::DispatchMark;
use crate::grants::broker;

/// What every capability may read or update about the call in progress.
pub struct CallContext {
    /// The plugin's name, for the operator's log.
    pub plugin: Arc<str>,
    /// When the call's deadline passes; nothing a capability starts for the
    /// plugin (a container) may outlive it.
    pub ends: Instant,
    /// Whether anything that could start execution was used.
    pub mark: DispatchMark,
    /// The run's broker session, when it carries a grant.
    pub grant: Option<Arc<broker::Session>>,
    /// Where a run's output goes as it is written, when a caller watches
    /// (only through `container-engine.run-live`, which the plugin uses for
    /// a container whose output is the run's own).
    pub live: Option<crate::live::Live>,
}

impl CallContext {
    pub fn new(plugin: Arc<str>, ends: Instant) -> CallContext {
        CallContext {
            plugin,
            ends,
            mark: DispatchMark::default(),
            grant: None,
            live: None,
        }
    }
}

/// Store data that carries a call's context.
pub trait CallView: Send + 'static {
    fn call(&mut self) -> &mut CallContext;
}

/// The interface names a plugin may import, and whether each needs a grant.
pub const LOG: &str = "plimsoll:provider/log";
pub const PROJECT_REPORT: &str = "plimsoll:provider/project-report";
pub const HTTP: &str = "plimsoll:provider/http";
pub const CONTAINER_ENGINE: &str = "plimsoll:provider/container-engine";
pub const TYPES: &str = "plimsoll:provider/types";
pub const CONFIG_KEYS: &str = "plimsoll:provider/config-keys";
/// Needs no operator grant: it answers only in a granted call (`grant`).
pub const GRANT: &str = "plimsoll:provider/grant";
/// Every wasi:http interface (only the outgoing side and its types are
/// linked, policed by `http::outgoing`): granted with `http`, from the same
/// allowlist.
pub const WASI_HTTP: &str = "wasi:http/";

/// Links every capability into `linker`.
pub fn add_to_linker<T>(linker: &mut Linker<T>) -> wasmtime::Result<()>
where
    T: log::LogView
        + config_keys::ConfigView
        + project_report::ProjectReportView
        + http::HttpView
        + container_engine::ContainerEngineView
        + grant::GrantView,
{
    log::add_to_linker(linker)?;
    config_keys::add_to_linker(linker)?;
    project_report::add_to_linker(linker)?;
    http::add_to_linker(linker)?;
    container_engine::add_to_linker(linker)?;
    grant::add_to_linker(linker)?;
    Ok(())
}
