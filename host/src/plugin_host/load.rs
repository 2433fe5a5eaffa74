//! Loading a plugin, in stages, each a type of its own so nothing
//! half-built can be used:
//!
//! 1. `read`: the bytes, from the plugin directory or the daemon itself,
//!    and their SHA-256, held to the operator's pin;
//! 2. `Pinned::compile`: a Wasm component, whose every import is a
//!    capability the operator granted (or WASI, linked with nothing in it);
//! 3. `Checked::link`: the granted capabilities linked and the component
//!    pre-instantiated;
//! 4. `Linked::describe`: what the plugin says it is, and the tier the host
//!    will report for it;
//! 5. `Described::preflight`: the plugin's own smoke test through its
//!    capabilities, after which it is a provider.
//!
//! Between 2 and 3 the caller connects what the capabilities need (a
//! container backend), so nothing is reached for a plugin that would be
//! refused anyway, and the plugin reaches nothing before it is linked.

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine};

use super::bindings::{PluginPre, types};
use super::call::{AdapterExports, Granted, PluginState, Runner, classify};
use super::capabilities;
use super::capabilities::config_keys::ConfigState;
use super::config_file::OperatorValues;
pub use super::error::PluginError;
pub use super::plugin_file::PluginSource;
use super::plugin_file::{locate, read_in};
use super::results::{effective_tier, tier_of};
use super::{Described as Facts, MESSAGE_BYTES, PluginProvider};
use crate::text::{sanitize, truncate};
use crate::tier::Tier;

/// The segments the host appends to a plugin's environment.
const HOST_SEGMENTS: &[&str] = &["+config:", "+preboot:"];

/// Time a plugin gets to describe itself.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a plugin's start-up smoke test gets.
const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(120);

/// Stage 1: the bytes and their digest, held to the pin.
pub struct Pinned {
    name: String,
    bytes: Vec<u8>,
    sha256: String,
}

pub fn read(name: &str, source: &PluginSource, pin: Option<&str>) -> Result<Pinned, PluginError> {
    let bytes = match source {
        PluginSource::Embedded(bytes) => bytes.to_vec(),
        PluginSource::Dir(dir) => {
            let path = locate(dir, name)?;
            read_in(dir, name).map_err(|e| PluginError::Read(path.display().to_string(), e))?
        }
    };
    let sha256 = hex::encode(Sha256::digest(&bytes));
    if let Some(pin) = pin
        && !pin.eq_ignore_ascii_case(&sha256)
    {
        return Err(PluginError::PinMismatch {
            name: name.to_string(),
            expected: pin.to_ascii_lowercase(),
            actual: sha256,
        });
    }
    Ok(Pinned {
        name: name.to_string(),
        bytes,
        sha256,
    })
}

/// Which capabilities the operator grants, by interface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Grants {
    pub http: bool,
    pub container_engine: bool,
}

/// Stage 2: a component whose imports are all granted.
pub struct Checked {
    name: String,
    sha256: String,
    wasm: Engine,
    component: Component,
    exports: AdapterExports,
    grants: Grants,
    /// Whether it imports `grant`: how it carries a grant to a hosted
    /// sandbox.
    imports_grant: bool,
}

impl Pinned {
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// Compiles the component (or loads its compilation from `cache`, keyed
    /// by its digest and the engine), then checks its imports and exports:
    /// the checks are the same either way.
    pub fn compile(
        self,
        grants: Grants,
        cache: Option<&crate::compile_cache::CompileCache>,
    ) -> Result<Checked, PluginError> {
        match super::strings::non_utf8_encoding(&self.bytes) {
            Ok(None) => {}
            Ok(Some(encoding)) => {
                return Err(PluginError::NotComponent(
                    self.name,
                    format!("it passes strings as {encoding}; plugins must use UTF-8"),
                ));
            }
            Err(why) => return Err(PluginError::NotComponent(self.name, why)),
        }
        let mut wcfg = Config::new();
        wcfg.wasm_component_model(true);
        wcfg.epoch_interruption(true);
        let wasm = Engine::new(&wcfg).map_err(|e| PluginError::Engine(format!("{e:#}")))?;
        let key = crate::compile_cache::CompileCache::key(
            &wasm,
            &format!("plugin-{}", self.name),
            &self.sha256,
            &[],
        );
        let component = match cache.and_then(|c| c.load(&wasm, &key)) {
            Some(c) => c,
            None => {
                let c = Component::new(&wasm, &self.bytes)
                    .map_err(|e| PluginError::NotComponent(self.name.clone(), format!("{e:#}")))?;
                if let Some(cache) = cache {
                    cache.store(&key, &c);
                }
                c
            }
        };
        let imports_grant = check_imports(&self.name, grants, &component, &wasm)?;
        let exports = AdapterExports::find(&component).ok_or_else(|| {
            PluginError::Mismatch(
                self.name.clone(),
                "no plimsoll:provider/adapter export".into(),
            )
        })?;
        Ok(Checked {
            name: self.name,
            sha256: self.sha256,
            wasm,
            component,
            exports,
            grants,
            imports_grant,
        })
    }
}

/// Checks the component's imports against the operator's grants: WASI is
/// linked with an empty context (no files, no sockets, no environment), the
/// plugin interfaces only where granted, anything else is refused. Says
/// whether `grant` is among them.
fn check_imports(
    name: &str,
    grants: Grants,
    component: &Component,
    engine: &Engine,
) -> Result<bool, PluginError> {
    let mut imports_grant = false;
    for (import, _) in component.component_type().imports(engine) {
        let interface = import.split('@').next().unwrap_or(import);
        imports_grant |= interface == capabilities::GRANT;
        let Some(granted) = granted_by(interface, grants) else {
            return Err(PluginError::UnknownImport(
                name.to_string(),
                import.to_string(),
            ));
        };
        if !granted {
            return Err(PluginError::Ungranted(
                name.to_string(),
                interface.to_string(),
            ));
        }
    }
    Ok(imports_grant)
}

/// Whether `grants` allow importing `interface` (`None`: no plugin may).
fn granted_by(interface: &str, grants: Grants) -> Option<bool> {
    Some(match interface {
        // The network: only for a plugin the operator gave origins.
        _ if interface.starts_with(capabilities::WASI_HTTP) => grants.http,
        _ if interface.starts_with("wasi:") => true,
        capabilities::TYPES
        | capabilities::LOG
        | capabilities::PROJECT_REPORT
        | capabilities::CONFIG_KEYS
        | capabilities::GRANT => true,
        capabilities::HTTP => grants.http,
        capabilities::CONTAINER_ENGINE => grants.container_engine,
        _ => return None,
    })
}

/// Stage 3: linked with its capabilities, ready to call.
pub struct Linked {
    sha256: String,
    runner: Runner,
}

impl Checked {
    /// `granted` must hold exactly the capabilities `compile` checked for.
    pub fn link(self, granted: Granted, memory_mb: u32) -> Result<Linked, PluginError> {
        let holds = Grants {
            http: granted.http.is_some(),
            container_engine: granted.container_engine.is_some(),
        };
        if holds != self.grants {
            return Err(PluginError::Engine(format!(
                "the capabilities linked for plugin {} differ from those its imports were checked against",
                self.name
            )));
        }
        let engine_err = |e: wasmtime::Error| PluginError::Engine(format!("{e:#}"));
        let mut linker: Linker<PluginState> = Linker::new(&self.wasm);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(engine_err)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).map_err(engine_err)?;
        capabilities::add_to_linker(&mut linker).map_err(engine_err)?;
        let mismatch =
            |e: wasmtime::Error| PluginError::Mismatch(self.name.clone(), format!("{e:#}"));
        let pre = linker.instantiate_pre(&self.component).map_err(mismatch)?;
        let pre = PluginPre::new(pre).map_err(mismatch)?;
        let runner = Runner::new(
            Arc::from(self.name.as_str()),
            self.wasm,
            pre,
            self.exports,
            granted,
            self.imports_grant,
            (memory_mb as usize) << 20,
        );
        Ok(Linked {
            sha256: self.sha256,
            runner,
        })
    }
}

/// Stage 4: what the plugin says it is, and the tier the host reports.
pub struct Described {
    linked: Linked,
    facts: Facts,
    tier: Tier,
}

impl Linked {
    /// `max_tier` is the strongest tier the operator lets this plugin
    /// report; a backend's verified tier caps it further. `config` is the
    /// operator's values, which the plugin's declarations must account for.
    pub async fn describe(
        mut self,
        max_tier: Tier,
        config: Arc<OperatorValues>,
    ) -> Result<Described, PluginError> {
        let runner = &self.runner;
        let name = runner.name.to_string();
        let fail = |e: String| PluginError::Describe(name.clone(), e);
        let mut store = runner.store(DESCRIBE_TIMEOUT);
        store.data_mut().config = ConfigState::declaring(config);
        let result = runner
            .call::<(), (types::Description,)>(
                &mut store,
                DESCRIBE_TIMEOUT,
                runner.exports.describe,
                (),
            )
            .await;
        let d = match result {
            Ok(Ok((d,))) => d,
            Ok(Err(e)) => return Err(fail(classify(&e, &store))),
            Err(_) => return Err(fail("timed out".into())),
        };
        if d.name != name {
            return Err(PluginError::Describe(
                name,
                format!("it calls itself {:?}", truncate(&d.name, 64)),
            ));
        }
        // Declarations close with describe: every later call reads the same
        // values, and those that change what runs join the evidence.
        let declared = std::mem::replace(
            &mut store.data_mut().config,
            ConfigState::Settled(Arc::default()),
        )
        .into_declaring()
        .expect("describe's store was declaring");
        let settled = declared.settle().map_err(|problems| PluginError::Config {
            plugin: name.clone(),
            problems,
        })?;
        let mut environment = sanitize(&d.environment, 256);
        // What follows the plugin's own environment is the host's (its
        // configuration's and pre-boot declarations' digests): a plugin
        // that writes such a segment itself would have a client that reads
        // the first one read its forgery.
        if HOST_SEGMENTS.iter().any(|s| environment.contains(s)) {
            return Err(fail(format!(
                "its environment holds a segment the host reserves ({})",
                HOST_SEGMENTS.join(", ")
            )));
        }
        if let Some(digest) = &settled.digest {
            environment = format!("{environment}+config:sha256:{digest}");
        }
        for k in settled.keys.iter().filter(|k| k.changes_what_runs) {
            // Operators' values are not secret (the WIT says so), and these
            // name what runs: the operator's log shows them.
            let value = settled
                .effective
                .get(&k.key)
                .map(String::as_str)
                .unwrap_or("");
            tracing::info!(target: "plimsoll::plugin", plugin = %name, key = %k.key, value = %sanitize(value, 128), "configuration that changes what runs");
        }
        let facts = Facts {
            claimed_tier: tier_of(d.tier),
            environment,
            config: settled.keys,
            runs_javascript: d.payloads.contains(&types::PayloadKind::Javascript),
            runs_project: d.payloads.contains(&types::PayloadKind::Project),
            languages: vec![],
            sessions: d.sessions.map(|s| super::SessionSupport {
                javascript: s.payloads.contains(&types::PayloadKind::Javascript),
                project: s.payloads.contains(&types::PayloadKind::Project),
                cell_languages: s
                    .cell_languages
                    .iter()
                    .map(|l| language_name(*l).to_string())
                    .collect(),
            }),
        };
        drop(store);
        self.runner.config = settled.values;
        let tier = effective_tier(facts.claimed_tier, max_tier, self.runner.backend_tier());
        Ok(Described {
            linked: self,
            facts,
            tier,
        })
    }
}

impl Described {
    /// What the plugin stated, after the host's checks.
    pub fn facts(&self) -> &Facts {
        &self.facts
    }

    /// The tier the host will report for it.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// The tier its container backend's evidence stands behind, if it has
    /// one.
    pub fn backend_tier(&self) -> Option<Tier> {
        self.linked.runner.backend_tier()
    }

    /// Stage 5: the smoke test; a plugin that fails it does not start.
    pub async fn preflight(self) -> Result<PluginProvider, PluginError> {
        let Described {
            linked,
            mut facts,
            tier,
        } = self;
        let runner = &linked.runner;
        let fail = |e: String| PluginError::Preflight(runner.name.to_string(), e);
        let mut store = runner.store(PREFLIGHT_TIMEOUT);
        // Returned values are copied whole (the plugin frees them right
        // after the call); the WIT keeps them flat so the copy is bounded by
        // the plugin's memory.
        let result = runner
            .call::<(), (Result<types::PreflightReport, String>,)>(
                &mut store,
                PREFLIGHT_TIMEOUT,
                runner.exports.preflight,
                (),
            )
            .await;
        let report = match result {
            Ok(Ok((Ok(report),))) => report,
            Ok(Ok((Err(why),))) => return Err(fail(sanitize(&why, MESSAGE_BYTES))),
            Ok(Err(e)) => return Err(fail(classify(&e, &store))),
            Err(_) => return Err(fail("timed out".into())),
        };
        // What warm containers hold, and what they may run before a request,
        // is the plugin's to choose only until now, before it has seen a
        // request: fixed from here for its life, and named in its evidence.
        if let Some(engine) = &runner.granted.container_engine {
            engine.freeze();
            if let Some(digest) = engine.preboot_digest() {
                facts.environment = format!("{}+preboot:sha256:{digest}", facts.environment);
                for (kind, program) in engine.declared_summary() {
                    tracing::info!(target: "plimsoll::plugin", plugin = %runner.name, kind, program = %program, digest = %digest, "pre-boot command declared");
                }
            }
        }
        // At most 64 check lines of 200 bytes are kept.
        let checks: Vec<String> = report
            .checks
            .lines()
            .take(64)
            .map(|l| sanitize(l, 200))
            .collect();
        if !report.passed {
            let failed: Vec<&str> = checks.iter().take(8).map(String::as_str).collect();
            return Err(fail(format!("it reported failure: {}", failed.join("; "))));
        }
        for l in &report.languages {
            let name = language_name(*l);
            if !facts.languages.iter().any(|x| x == name) {
                facts.languages.push(name.to_string());
            }
        }
        for check in &checks {
            tracing::info!(target: "plimsoll::plugin", plugin = %runner.name, check = %check, "preflight");
        }
        // A session's cells can only use interpreters the smoke test proved.
        if let Some(s) = facts.sessions.as_mut() {
            s.cell_languages.retain(|l| facts.languages.contains(l));
        }
        Ok(PluginProvider {
            runner: Arc::new(linked.runner),
            sha256: linked.sha256,
            described: facts,
            tier,
        })
    }
}

fn language_name(l: types::Language) -> &'static str {
    match l {
        types::Language::Javascript => "javascript",
        types::Language::Python => "python",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_network_in_either_form_needs_the_http_grant() {
        let none = Grants::default();
        let http = Grants {
            http: true,
            ..Grants::default()
        };
        for network in [
            "wasi:http/outgoing-handler",
            "wasi:http/types",
            "wasi:http/incoming-handler",
            "plimsoll:provider/http",
        ] {
            assert_eq!(granted_by(network, none), Some(false), "{network}");
            assert_eq!(granted_by(network, http), Some(true), "{network}");
        }
        assert_eq!(granted_by("wasi:io/streams", none), Some(true));
        assert_eq!(
            granted_by("plimsoll:provider/container-engine", http),
            Some(false)
        );
        assert_eq!(granted_by("plimsoll:provider/secrets", http), None);
    }
}
