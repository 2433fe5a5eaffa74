//! The `log` capability: a plugin's lines in the daemon's log, tagged with
//! its name. Every plugin has it. Lines are budgeted per call, cut, and
//! stripped of control, bidi and zero-width characters before anything is
//! copied, so a plugin cannot flood the log or forge a line; plugins are
//! asked to log metadata only.

use std::sync::Arc;

use wasmtime::component::{Linker, WasmStr};
use wasmtime::{AsContext, StoreContextMut};

use crate::plugin_host::bindings::log_if;
use crate::text::{sanitize, truncate};

/// Log lines one plugin call may write; the rest are dropped and counted.
pub const LINES_PER_CALL: u32 = 200;
const LINE_BYTES: usize = 512;
/// Longer than any secret redacted from a line.
const REDACT_MARGIN: usize = 64;

/// One call's log budget.
pub struct LogState {
    plugin: Arc<str>,
    lines: u32,
    /// Secrets of this call the plugin was handed (a grant's token): cut
    /// from every line it writes.
    redacted: Vec<String>,
}

impl LogState {
    pub fn new(plugin: Arc<str>) -> LogState {
        LogState {
            plugin,
            lines: 0,
            redacted: Vec::new(),
        }
    }

    /// Keeps `secret` out of every line written from now on in this call.
    pub fn redact(&mut self, secret: String) {
        debug_assert!(secret.len() <= REDACT_MARGIN);
        if !secret.is_empty() {
            self.redacted.push(secret);
        }
    }

    /// Reports lines dropped over the budget; called when the call ends.
    pub fn report_dropped(&self) {
        if self.lines > LINES_PER_CALL {
            tracing::warn!(
                target: "plimsoll::plugin",
                plugin = &*self.plugin,
                dropped = self.lines - LINES_PER_CALL,
                "plugin log lines over the per-call budget were dropped"
            );
        }
    }
}

pub trait LogView: Send + 'static {
    fn log(&mut self) -> &mut LogState;
}

pub fn add_to_linker<T: LogView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    let mut log = linker.instance("plimsoll:provider/log@0.1.0")?;
    log.func_wrap_async(
        "write",
        |mut store: StoreContextMut<'_, T>, (level, message): (log_if::Level, WasmStr)| {
            write(&mut store, level, &message);
            Box::new(async { Ok(()) })
        },
    )?;
    Ok(())
}

fn write<T: LogView>(store: &mut StoreContextMut<'_, T>, level: log_if::Level, message: &WasmStr) {
    let state = store.data_mut().log();
    state.lines += 1;
    if state.lines > LINES_PER_CALL {
        return;
    }
    let plugin = state.plugin.clone();
    // Read in place and cut before copying anything; cut wide enough that
    // a secret starting inside the line is whole when it is redacted (a
    // token is 43 bytes), then to the line budget.
    let message = match message.to_str(store.as_context()) {
        Ok(text) => {
            let mut text = truncate(&text, LINE_BYTES + REDACT_MARGIN).to_string();
            for secret in &store.data_mut().log().redacted {
                text = text.replace(secret.as_str(), "[redacted]");
            }
            sanitize(&text, LINE_BYTES)
        }
        Err(_) => return,
    };
    let plugin = &*plugin;
    match level {
        log_if::Level::Debug => tracing::debug!(target: "plimsoll::plugin", plugin, "{message}"),
        log_if::Level::Info => tracing::info!(target: "plimsoll::plugin", plugin, "{message}"),
        log_if::Level::Warn => tracing::warn!(target: "plimsoll::plugin", plugin, "{message}"),
        log_if::Level::Error => tracing::error!(target: "plimsoll::plugin", plugin, "{message}"),
    }
}
