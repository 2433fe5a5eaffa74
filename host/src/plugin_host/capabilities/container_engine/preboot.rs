//! Pre-boot declarations: the one command per kind a plugin's warm
//! containers may run before any request reaches them.
//!
//! A plugin declares them while the host still knows it has seen no
//! request (in `describe` or `preflight`); the freeze at the end of
//! preflight fixes them for the plugin's life, and their digest joins the
//! plugin's evidence, so every record names what may have been running in
//! its container before the request arrived (a run that found no warm
//! container started cold, behind the gate). The backend starts warm
//! containers running exactly that, in the same envelope as any other; the
//! request's bytes reach one only when a run takes it, after admission and
//! the floor, so a refusal before then is truthfully "not dispatched".

use std::sync::Mutex;

use sha2::{Digest, Sha256};
use wasmtime::StoreContextMut;
use wasmtime::component::LinkerInstance;

use super::backend::{Approved, PrebootKind};
use super::{ContainerEngine, ContainerEngineView, prewarm_with};
use crate::plugin_host::bindings::engine_if;
use crate::plugin_host::lazy;

/// What a plugin declared, kind by kind; fixed once the engine is frozen.
#[derive(Default)]
pub struct Declarations(Mutex<Vec<(PrebootKind, Approved)>>);

impl Declarations {
    /// Records one declaration; a kind is declared once.
    fn declare(&self, kind: PrebootKind, spec: &Approved) -> Result<(), &'static str> {
        let mut all = self.0.lock().map_err(|_| "the declarations are poisoned")?;
        if all.iter().any(|(k, _)| *k == kind) {
            return Err("a pre-boot command is declared once per kind");
        }
        all.push((kind, spec.clone()));
        Ok(())
    }

    /// The digest of every declaration: SHA-256 of the compact JSON array
    /// of `{"command", "env", "kind"}` objects (keys in that order, which is
    /// sorted), sorted by kind. `None` when there are none.
    pub fn digest(&self) -> Option<String> {
        let mut all = self.0.lock().ok()?.clone();
        if all.is_empty() {
            return None;
        }
        all.sort_by_key(|(k, _)| k.name());
        let canonical: Vec<serde_json::Value> = all
            .iter()
            .map(|(k, s)| serde_json::json!({"command": s.command, "env": s.env, "kind": k.name()}))
            .collect();
        let bytes = serde_json::to_vec(&canonical).ok()?;
        Some(hex::encode(Sha256::digest(&bytes)))
    }

    /// The first word of each declared command, for the startup log.
    fn summary(&self) -> Vec<(&'static str, String)> {
        self.0.lock().map_or_else(
            |_| vec![],
            |all| {
                all.iter()
                    .map(|(k, s)| (k.name(), s.command.first().cloned().unwrap_or_default()))
                    .collect()
            },
        )
    }
}

impl ContainerEngine {
    /// The digest of the plugin's pre-boot declarations, once frozen.
    pub fn preboot_digest(&self) -> Option<String> {
        self.is_frozen().then(|| self.declared.digest()).flatten()
    }

    /// Each declaration's kind and program, for the startup log.
    pub fn declared_summary(&self) -> Vec<(&'static str, String)> {
        self.declared.summary()
    }
}

pub(super) fn add_to_linker<T: ContainerEngineView>(
    engine: &mut LinkerInstance<'_, T>,
) -> wasmtime::Result<()> {
    engine.func_wrap_async(
        "preboot",
        |mut store: StoreContextMut<'_, T>,
         (kind, spec): (engine_if::PrebootKind, lazy::ContainerSpec)| {
            let kind = match kind {
                engine_if::PrebootKind::Snippet => PrebootKind::Snippet,
                engine_if::PrebootKind::Project => PrebootKind::Project,
                engine_if::PrebootKind::Session => PrebootKind::Session,
            };
            let answer = prewarm_with(&mut store, &spec, |engine, approved| {
                engine
                    .declared
                    .declare(kind, &approved)
                    .map_err(|rule| engine_if::EngineError::Forbidden(rule.into()))?;
                Ok(engine.backend.preboot(kind, approved))
            });
            Box::new(async move { Ok((answer,)) })
        },
    )?;
    Ok(())
}
