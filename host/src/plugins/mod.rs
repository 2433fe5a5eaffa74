//! Provider plugins: adapters loaded as Wasm components from the plugin
//! directory, each running in wasmtime with only the capabilities the
//! operator granted it.
//!
//! The host stays in charge of everything the security promises rest on:
//! - what a plugin can reach: it links every capability interface, but each
//!   refuses a plugin the operator did not grant it to, and a plugin whose
//!   component *imports* an ungranted capability is refused at start;
//! - the tier: the plugin states one, the host caps it with what the operator
//!   allows and what the granted capabilities can stand behind;
//! - the not-dispatched mark: a refusal is marked only if the host saw the
//!   plugin use no capability that could have started execution;
//! - containment: every call gets a fresh store (fresh instance, fresh
//!   memory) with an epoch deadline and a memory cap, so a plugin that traps,
//!   loops, panics or exhausts memory fails that call and nothing else.
//!
//! Fresh store per call, rather than a long-lived supervised instance: a
//! plugin then carries no state from one run to the next that another caller
//! could influence, and a trap needs no recovery logic. Instantiation from a
//! pre-linked component costs microseconds next to a provider call.

pub mod engine;
pub mod engine_policy;
pub mod http;
mod lazy;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{
    Component, ComponentExportIndex, Linker, ResourceTable, WasmList, WasmStr,
};
use wasmtime::{AsContext, AsContextMut, StoreContextMut};
use wasmtime::{Config, Engine, Store, Trap};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::grants::broker;
use crate::limits::{EpochTicker, MemoryCap};
use crate::providers::{ProcessOutput, RunFailure};
use crate::refusal::{Code, Reason, Refusal};
use crate::text::{sanitize, truncate};
use crate::tier::Tier;
use engine_policy::EnginePolicy;
use http::HttpGrant;

mod generated {
    wasmtime::component::bindgen!({
        world: "plugin",
        path: "../wit/provider",
        imports: { default: async },
        exports: { default: async },
    });
}

use generated::plimsoll::provider::container_engine as engine_if;
use generated::plimsoll::provider::http as http_if;
use generated::plimsoll::provider::log as log_if;
use generated::plimsoll::provider::types;

/// Names the daemon's built-in providers use; a plugin may not take them.
pub const BUILT_IN: &[&str] = &["disabled", "wasm", "docker"];

/// The docker adapter, embedded at build time (see host/build.rs): the
/// docker provider runs exactly these bytes, whose digest the run records
/// name as the policy.
pub static DOCKER_ADAPTER: &[u8] = include_bytes!(env!("PLIMSOLL_DOCKER_PLUGIN_WASM"));

/// Time a plugin gets to describe itself.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a plugin's start-up smoke test gets.
const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(120);
/// Extra time a run call gets over the run's own budget, for the plugin's
/// set-up and tear-down around it.
const CALL_MARGIN: Duration = Duration::from_secs(2);
const TICK: Duration = Duration::from_millis(10);
const TICKER_NAME: &str = "plimsoll-plugin-epoch";
/// Log lines one plugin call may write; the rest are dropped and counted.
const LOG_LINES_PER_CALL: u32 = 200;
const LOG_LINE_BYTES: usize = 512;
/// Longest plugin-supplied message passed on to a caller.
const MESSAGE_BYTES: usize = 512;

/// Where a plugin's component comes from.
#[derive(Debug, Clone)]
pub enum PluginSource {
    /// `<name>.wasm` in the operator's plugin directory.
    Dir(PathBuf),
    /// Shipped inside the daemon.
    Embedded(&'static [u8]),
}

/// What the operator configured for the selected plugin.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    pub name: String,
    pub source: PluginSource,
    pub sha256_pin: Option<String>,
    /// The strongest tier the operator lets this plugin report.
    pub max_tier: Tier,
    pub http: Option<HttpGrant>,
    /// The container engine's settings, when the plugin is granted it.
    pub container_engine: Option<engine::Settings>,
    pub memory_mb: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("plugin name {0:?} must be 1-32 of [a-z0-9-] and not a built-in provider name")]
    BadName(String),
    #[error("no plugin {path}; built-in providers: {builtin}; plugins found: {found}", builtin = BUILT_IN.join(", "))]
    NotFound { path: String, found: String },
    #[error("reading plugin {0}: {1}")]
    Read(String, std::io::Error),
    #[error("plugin {name} has SHA-256 {actual}, but SANDBOX_PLUGIN_SHA256 pins {expected}")]
    PinMismatch {
        name: String,
        expected: String,
        actual: String,
    },
    #[error("plugin {0} is not a valid Wasm component: {1}")]
    NotComponent(String, String),
    #[error("plugin {0} imports {1}, which the operator did not grant it")]
    Ungranted(String, String),
    #[error("plugin {0} imports {1}, which no plimsoll plugin can have")]
    UnknownImport(String, String),
    #[error("plugin {0} does not match the plimsoll:provider plugin world: {1}")]
    Mismatch(String, String),
    #[error("plugin {0} failed to describe itself: {1}")]
    Describe(String, String),
    #[error("plugin {0}'s startup smoke test failed: {1}")]
    Preflight(String, String),
    #[error("engine: {0}")]
    Engine(String),
}

/// What a loaded plugin stated about itself, after the host's checks.
#[derive(Debug, Clone)]
pub struct Described {
    pub claimed_tier: Tier,
    pub environment: String,
    pub runs_javascript: bool,
    pub runs_project: bool,
    pub languages: Vec<String>,
}

pub struct PluginProvider {
    name: Arc<str>,
    engine: Engine,
    pre: generated::PluginPre<PluginState>,
    exports: AdapterExports,
    sha256: String,
    described: Described,
    tier: Tier,
    grants: Arc<Grants>,
    client: reqwest::Client,
    memory_limit: usize,
    _ticker: EpochTicker,
}

/// Where the adapter's exports are, found once per component.
struct AdapterExports {
    describe: ComponentExportIndex,
    preflight: ComponentExportIndex,
    run: ComponentExportIndex,
}

impl AdapterExports {
    fn find(component: &Component) -> Option<AdapterExports> {
        let (_, adapter) = component.get_export(None, "plimsoll:provider/adapter@0.1.0")?;
        let (_, describe) = component.get_export(Some(&adapter), "describe")?;
        let (_, preflight) = component.get_export(Some(&adapter), "preflight")?;
        let (_, run) = component.get_export(Some(&adapter), "run")?;
        Some(AdapterExports {
            describe,
            preflight,
            run,
        })
    }
}

/// The capabilities one plugin holds.
struct Grants {
    http: Option<HttpGrant>,
    container_engine: Option<(EnginePolicy, engine::ContainerEngine)>,
}

/// Longest a single container may run at a plugin's request.
const MAX_CONTAINER_TIME: Duration = Duration::from_secs(120);
/// Most output kept per stream of a container, whatever the plugin asks.
const MAX_CONTAINER_OUTPUT: usize = 32 << 20;
/// How often the host looks for run containers left past their expiry.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// Time a plugin keeps, after its container's deadline, to report on it.
const REPORT_MARGIN: Duration = Duration::from_secs(1);
/// Most input a plugin may feed a container.
const MAX_CONTAINER_STDIN: usize = 8 << 20;
/// WASI resources one plugin call may hold at once.
const MAX_RESOURCES: usize = 4096;

fn valid_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !BUILT_IN.contains(&name)
}

/// The plugins a directory holds, for error messages.
pub fn list_dir(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|f| f.strip_suffix(".wasm").map(str::to_string))
        .filter(|n| valid_name(n))
        .collect();
    names.sort();
    names
}

/// The file a plugin name refers to, if it is there.
pub fn locate(dir: &Path, name: &str) -> Result<PathBuf, PluginError> {
    if !valid_name(name) {
        return Err(PluginError::BadName(name.to_string()));
    }
    let path = dir.join(format!("{name}.wasm"));
    if !path.is_file() {
        let found = list_dir(dir);
        return Err(PluginError::NotFound {
            path: path.display().to_string(),
            found: if found.is_empty() {
                "none".into()
            } else {
                found.join(", ")
            },
        });
    }
    Ok(path)
}

impl PluginProvider {
    /// Loads, checks, describes and smoke-tests the configured plugin.
    pub async fn load(cfg: PluginConfig) -> Result<PluginProvider, PluginError> {
        let bytes = match &cfg.source {
            PluginSource::Embedded(bytes) => bytes.to_vec(),
            PluginSource::Dir(dir) => {
                let path = locate(dir, &cfg.name)?;
                std::fs::read(&path)
                    .map_err(|e| PluginError::Read(path.display().to_string(), e))?
            }
        };
        let sha256 = hex::encode(Sha256::digest(&bytes));
        if let Some(pin) = &cfg.sha256_pin
            && !pin.eq_ignore_ascii_case(&sha256)
        {
            return Err(PluginError::PinMismatch {
                name: cfg.name,
                expected: pin.to_ascii_lowercase(),
                actual: sha256,
            });
        }

        let mut wcfg = Config::new();
        wcfg.wasm_component_model(true);
        wcfg.epoch_interruption(true);
        let engine = Engine::new(&wcfg).map_err(|e| PluginError::Engine(format!("{e:#}")))?;
        let component = Component::new(&engine, &bytes)
            .map_err(|e| PluginError::NotComponent(cfg.name.clone(), format!("{e:#}")))?;

        check_imports(&cfg, &component, &engine)?;

        let mut linker: Linker<PluginState> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| PluginError::Engine(format!("{e:#}")))?;
        link_capabilities(&mut linker).map_err(|e| PluginError::Engine(format!("{e:#}")))?;
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| PluginError::Mismatch(cfg.name.clone(), format!("{e:#}")))?;
        let pre = generated::PluginPre::new(pre)
            .map_err(|e| PluginError::Mismatch(cfg.name.clone(), format!("{e:#}")))?;
        let exports = AdapterExports::find(&component).ok_or_else(|| {
            PluginError::Mismatch(
                cfg.name.clone(),
                "no plimsoll:provider/adapter export".into(),
            )
        })?;

        let ticker = EpochTicker::start(&engine, TICK, TICKER_NAME);
        let client =
            http::client().map_err(|e| PluginError::Engine(format!("http client: {e}")))?;
        // The engine is reached (and a configured runtime found registered
        // there) before the plugin can ask for anything.
        let container_engine = match &cfg.container_engine {
            None => None,
            Some(settings) => {
                let connected = engine::ContainerEngine::connect(settings.clone())
                    .await
                    .map_err(PluginError::Engine)?;
                for check in &connected.verified().checks {
                    tracing::info!(target: "plimsoll::engine", check = %check, "smoke test");
                }
                // Readiness, the warm pool, and leftovers of an earlier
                // daemon (removed before the first run, and every minute).
                connected.spawn_maintenance(SWEEP_EVERY);
                let policy = EnginePolicy {
                    runtime: settings.runtime.clone(),
                    image: connected.verified().image_id.clone(),
                    run_dirs: Vec::new(),
                };
                Some((policy, connected))
            }
        };
        let mut provider = PluginProvider {
            name: Arc::from(cfg.name.as_str()),
            engine,
            pre,
            exports,
            sha256,
            described: Described {
                claimed_tier: Tier::Process,
                environment: String::new(),
                runs_javascript: false,
                runs_project: false,
                languages: vec![],
            },
            tier: Tier::None,
            grants: Arc::new(Grants {
                http: cfg.http.clone(),
                container_engine,
            }),
            client,
            memory_limit: (cfg.memory_mb as usize) << 20,
            _ticker: ticker,
        };

        let d = provider.describe().await?;
        if d.name != cfg.name {
            return Err(PluginError::Describe(
                cfg.name,
                format!("it calls itself {:?}", truncate(&d.name, 64)),
            ));
        }
        provider.described = Described {
            claimed_tier: tier_of(d.tier),
            environment: sanitize(&d.environment, 256),
            runs_javascript: d.payloads.contains(&types::PayloadKind::Javascript),
            runs_project: d.payloads.contains(&types::PayloadKind::Project),
            languages: vec![],
        };
        provider.tier = effective_tier(
            provider.described.claimed_tier,
            cfg.max_tier,
            provider
                .grants
                .container_engine
                .as_ref()
                .map(|(_, e)| e.verified().tier),
        );

        let (checks, languages) = provider.preflight().await?;
        provider.described.languages = languages
            .into_iter()
            .filter(|l| matches!(l.as_str(), "javascript" | "python"))
            .collect();
        for check in &checks {
            tracing::info!(target: "plimsoll::plugin", plugin = %provider.name, check = %check, "preflight");
        }
        Ok(provider)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn tier(&self) -> Tier {
        self.tier
    }

    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    pub fn described(&self) -> &Described {
        &self.described
    }

    /// The container engine, when this plugin drives one.
    pub fn engine(&self) -> Option<&engine::ContainerEngine> {
        self.grants.container_engine.as_ref().map(|(_, e)| e)
    }

    /// Whether runs can be dispatched now: a plugin that drives a container
    /// engine is ready only while the engine answers and its image is the
    /// one verified at start. Checked afresh.
    pub async fn check_ready(&self) -> Result<(), String> {
        match self.engine() {
            Some(e) => e.check_ready().await,
            None => Ok(()),
        }
    }

    /// The last readiness verdict, without asking the engine.
    pub fn ready(&self) -> Result<(), String> {
        self.engine().map_or(Ok(()), engine::ContainerEngine::ready)
    }

    /// A fresh store for one call, with the memory cap and a deadline.
    fn store(&self, deadline: Duration) -> Store<PluginState> {
        let ends = std::time::Instant::now() + deadline;
        let mut table = ResourceTable::new();
        // WASI resources (streams, pollables) a plugin may hold at once; the
        // default allows about a million, each costing host memory.
        table.set_max_capacity(MAX_RESOURCES);
        let state = PluginState {
            wasi: WasiCtx::builder().build(),
            table,
            ends,
            limits: MemoryCap::new(self.memory_limit),
            plugin: self.name.clone(),
            grants: self.grants.clone(),
            client: self.client.clone(),
            dispatched: false,
            log_lines: 0,
            report: ProjectReport::default(),
            grant: None,
            mount: None,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        // Every tick, hand the thread back to the executor: a plugin
        // spinning in wasm must not hold one of the runtime's few worker
        // threads. At the deadline, trap.
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if std::time::Instant::now() >= ends {
                Err(Trap::Interrupt.into())
            } else {
                Ok(wasmtime::UpdateDeadline::Yield(1))
            }
        });
        store
    }

    async fn describe(&self) -> Result<types::Description, PluginError> {
        let mut store = self.store(DESCRIBE_TIMEOUT);
        let fail = |e: String| PluginError::Describe(self.name.to_string(), e);
        let result = self
            .call::<(), (types::Description,)>(
                &mut store,
                DESCRIBE_TIMEOUT,
                self.exports.describe,
                (),
            )
            .await;
        match result {
            Ok(Ok((d,))) => Ok(d),
            Ok(Err(e)) => Err(fail(classify(&e, &store))),
            Err(_) => Err(fail("timed out".into())),
        }
    }

    /// One call into a fresh instance's adapter export. The store's epoch
    /// deadline stops the plugin's own code; this wall-clock backstop, a
    /// second past it, also bounds time spent inside host functions.
    async fn call<P, R>(
        &self,
        store: &mut Store<PluginState>,
        limit: Duration,
        export: ComponentExportIndex,
        params: P,
    ) -> Result<wasmtime::Result<R>, tokio::time::error::Elapsed>
    where
        P: wasmtime::component::ComponentNamedList
            + wasmtime::component::Lower
            + Send
            + Sync
            + 'static,
        R: wasmtime::component::ComponentNamedList
            + wasmtime::component::Lift
            + Send
            + Sync
            + 'static,
    {
        tokio::time::timeout(limit + Duration::from_secs(1), async {
            let instance = self
                .pre
                .instance_pre()
                .instantiate_async(&mut *store)
                .await?;
            let f = instance.get_typed_func::<P, R>(&mut *store, export)?;
            f.call_async(&mut *store, params).await
        })
        .await
    }

    async fn preflight(&self) -> Result<(Vec<String>, Vec<String>), PluginError> {
        let mut store = self.store(PREFLIGHT_TIMEOUT);
        let fail = |e: String| PluginError::Preflight(self.name.to_string(), e);
        // Returned values are copied whole (the plugin frees them right
        // after the call); the WIT keeps them flat so the copy is bounded by
        // the plugin's memory.
        let result = self
            .call::<(), (Result<types::PreflightReport, String>,)>(
                &mut store,
                PREFLIGHT_TIMEOUT,
                self.exports.preflight,
                (),
            )
            .await;
        let report = match result {
            Ok(Ok((Ok(report),))) => report,
            Ok(Ok((Err(why),))) => return Err(fail(sanitize(&why, MESSAGE_BYTES))),
            Ok(Err(e)) => return Err(fail(classify(&e, &store))),
            Err(_) => return Err(fail("timed out".into())),
        };
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
        let mut languages: Vec<String> = Vec::new();
        for l in &report.languages {
            let name = match l {
                types::Language::Javascript => "javascript",
                types::Language::Python => "python",
            };
            if !languages.iter().any(|x| x == name) {
                languages.push(name.to_string());
            }
        }
        Ok((checks, languages))
    }

    /// Runs one JavaScript snippet through the plugin. The output the plugin
    /// returns is read in place and capped here: the host never trusts a
    /// plugin to keep to a limit it could enforce itself, and never copies
    /// more than the cap out of the plugin's memory.
    pub async fn run_javascript(
        &self,
        code: String,
        timeout: Duration,
        output_limit: usize,
        grant: Option<Arc<broker::Session>>,
    ) -> Result<ProcessOutput, RunFailure> {
        match self
            .run(
                types::Payload::Javascript(code),
                timeout,
                output_limit,
                grant,
            )
            .await?
        {
            PluginResult::Javascript(out) => Ok(out),
            PluginResult::Project(_) => Err(RunFailure::MayHaveRun(format!(
                "plugin {} answered a snippet with a project result",
                self.name
            ))),
        }
    }

    pub async fn run_project(
        &self,
        project: ProjectPayloadIn,
        timeout: Duration,
        output_limit: usize,
        grant: Option<Arc<broker::Session>>,
    ) -> Result<ProjectOutput, RunFailure> {
        let project = types::ProjectPayload {
            files: project
                .files
                .into_iter()
                .map(|(path, content)| types::ProjectFile { path, content })
                .collect(),
            steps: project.steps,
            artifacts: project.artifacts,
        };
        match self
            .run(
                types::Payload::Project(project),
                timeout,
                output_limit,
                grant,
            )
            .await?
        {
            PluginResult::Project(out) => Ok(out),
            PluginResult::Javascript(_) => Err(RunFailure::MayHaveRun(format!(
                "plugin {} answered a project with a snippet result",
                self.name
            ))),
        }
    }

    async fn run(
        &self,
        payload: types::Payload,
        timeout: Duration,
        output_limit: usize,
        grant: Option<Arc<broker::Session>>,
    ) -> Result<PluginResult, RunFailure> {
        // A plugin whose engine is not ready never gets the run: nothing is
        // dispatched, and the refusal says why.
        if let Err(why) = self.ready() {
            return Err(RunFailure::NotDispatched(Refusal::environment(why)));
        }
        let deadline = timeout + CALL_MARGIN;
        let mut store = self.store(deadline);
        let request = types::RunRequest {
            timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
            output_limit: u32::try_from(output_limit).unwrap_or(u32::MAX),
            payload,
        };
        store.data_mut().report.output_limit = output_limit;
        store.data_mut().grant = grant;
        let outcome = self
            .call::<(types::RunRequest,), (Result<types::RunResult, types::RunError>,)>(
                &mut store,
                deadline,
                self.exports.run,
                (request,),
            )
            .await
            .map(|r| r.map(|(r,)| r));
        let dispatched = store.data().dispatched;
        let logged = store.data().log_lines;
        if logged > LOG_LINES_PER_CALL {
            tracing::warn!(
                target: "plimsoll::plugin",
                plugin = &*self.name,
                dropped = logged - LOG_LINES_PER_CALL,
                "plugin log lines over the per-call budget were dropped"
            );
        }
        let failed = |what: String| -> RunFailure {
            if dispatched {
                RunFailure::MayHaveRun(format!(
                    "plugin {} failed after it started work: {what}",
                    self.name
                ))
            } else {
                RunFailure::NotDispatched(Refusal::environment(format!(
                    "plugin {} failed before dispatching anything: {what}",
                    self.name
                )))
            }
        };
        match outcome {
            Err(_) => Err(failed("the call overran its deadline".into())),
            Ok(Err(e)) => Err(failed(classify(&e, &store))),
            Ok(Ok(Ok(types::RunResult::Javascript(out)))) => {
                Ok(PluginResult::Javascript(cap_output(out, output_limit)))
            }
            Ok(Ok(Ok(types::RunResult::Project(summary)))) => {
                let report = std::mem::take(&mut store.data_mut().report);
                Ok(PluginResult::Project(ProjectOutput {
                    steps: report.steps,
                    outcome: match summary.outcome {
                        types::ProjectOutcome::Completed => ProjectOutcome::Completed,
                        types::ProjectOutcome::SetupFailed => ProjectOutcome::SetupFailed,
                        types::ProjectOutcome::TimedOut => ProjectOutcome::TimedOut,
                        types::ProjectOutcome::ProtocolError => ProjectOutcome::ProtocolError,
                    },
                    outcome_detail: sanitize(&summary.outcome_detail, MESSAGE_BYTES),
                    artifacts: report.artifacts,
                    artifacts_truncated: summary.artifacts_truncated || report.refused_artifacts,
                }))
            }
            Ok(Ok(Err(types::RunError::MayHaveRun(_)))) => Err(RunFailure::MayHaveRun(format!(
                "plugin {} reported that the run may have happened (its detail is not logged)",
                self.name
            ))),
            Ok(Ok(Err(types::RunError::NotDispatched(r)))) => {
                if dispatched {
                    // The plugin says nothing ran, but the host saw it use a
                    // capability that can start execution: the host does not
                    // repeat a claim it cannot stand behind.
                    Err(RunFailure::MayHaveRun(format!(
                        "plugin {} reported a refusal after using a capability that can start execution",
                        self.name
                    )))
                } else {
                    Err(RunFailure::NotDispatched(refusal_of(r)))
                }
            }
        }
    }
}

/// A validated project, as the host hands it to a plugin.
pub struct ProjectPayloadIn {
    pub files: Vec<(String, String)>,
    pub steps: Vec<String>,
    pub artifacts: Vec<String>,
}

/// What a plugin's run produced, copied out of its memory under budget.
enum PluginResult {
    Javascript(ProcessOutput),
    Project(ProjectOutput),
}

/// A project's result, as the API reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProjectOutput {
    pub steps: Vec<StepOutput>,
    pub outcome: ProjectOutcome,
    pub outcome_detail: String,
    pub artifacts: Vec<(String, Vec<u8>)>,
    pub artifacts_truncated: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepOutput {
    pub command: String,
    pub output: ProcessOutput,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProjectOutcome {
    #[default]
    Completed,
    SetupFailed,
    TimedOut,
    ProtocolError,
}

/// A plugin's output, held to the run's per-stream limit.
fn cap_output(mut out: types::ProcessOutput, limit: usize) -> ProcessOutput {
    let cut = |v: &mut Vec<u8>| {
        let over = v.len() > limit;
        v.truncate(limit);
        over
    };
    let cut_out = cut(&mut out.stdout);
    let cut_err = cut(&mut out.stderr);
    ProcessOutput {
        stdout: out.stdout,
        stderr: out.stderr,
        exit_code: out.exit_code,
        timed_out: out.timed_out,
        stdout_truncated: out.stdout_truncated || cut_out,
        stderr_truncated: out.stderr_truncated || cut_err,
    }
}

/// Total artifact bytes one project may bring back.
const ARTIFACT_BYTES: usize = 8 << 20;
/// Longest step command (the API's own bound) and artifact path.
const REPORT_TEXT_BYTES: usize = 16 << 10;

/// Steps and artifacts a plugin reported during one project run.
#[derive(Default)]
struct ProjectReport {
    output_limit: usize,
    steps: Vec<StepOutput>,
    artifacts: Vec<(String, Vec<u8>)>,
    artifact_bytes: usize,
    refused_artifacts: bool,
}

fn report_step(store: &mut StoreContextMut<'_, PluginState>, step: &lazy::StepResult) -> bool {
    let limit = store.data().report.output_limit;
    if store.data().report.steps.len() >= crate::admission::MAX_PROJECT_STEPS {
        return false;
    }
    let mut budget = lazy::Budget::new(REPORT_TEXT_BYTES + 2 * limit, 0);
    let Ok(command) = budget.string(store, &step.command) else {
        return false;
    };
    let out = &step.output;
    let (Ok((stdout, cut_out)), Ok((stderr, cut_err))) = (
        budget.bytes_capped(store, &out.stdout, limit),
        budget.bytes_capped(store, &out.stderr, limit),
    ) else {
        return false;
    };
    let output = ProcessOutput {
        stdout,
        stderr,
        exit_code: out.exit_code,
        timed_out: out.timed_out,
        stdout_truncated: out.stdout_truncated || cut_out,
        stderr_truncated: out.stderr_truncated || cut_err,
    };
    store.data_mut().report.steps.push(StepOutput {
        command,
        output,
        duration_ms: step.duration_ms,
    });
    true
}

fn report_artifact(store: &mut StoreContextMut<'_, PluginState>, a: &lazy::Artifact) -> bool {
    let r = &store.data().report;
    let room = ARTIFACT_BYTES.saturating_sub(r.artifact_bytes);
    if r.artifacts.len() >= crate::admission::MAX_ARTIFACTS || a.content.len() > room {
        store.data_mut().report.refused_artifacts = true;
        return false;
    }
    let mut budget = lazy::Budget::new(REPORT_TEXT_BYTES + room, 0);
    let (Ok(path), Ok(content)) = (
        budget.string(store, &a.path),
        budget.bytes(store, &a.content),
    ) else {
        store.data_mut().report.refused_artifacts = true;
        return false;
    };
    let r = &mut store.data_mut().report;
    r.artifact_bytes += content.len();
    r.artifacts.push((path, content));
    true
}

/// The tier a plugin provider reports: its claim, capped by what the
/// operator allows and, for a plugin that drives a container engine, by the
/// tier the engine's own evidence stands behind (container under runc,
/// kernel under a verified runsc).
pub fn effective_tier(claimed: Tier, operator_max: Tier, engine_tier: Option<Tier>) -> Tier {
    claimed
        .min(operator_max)
        .min(engine_tier.unwrap_or(Tier::Vm))
}

fn tier_of(t: types::Tier) -> Tier {
    match t {
        types::Tier::Process => Tier::Process,
        types::Tier::Container => Tier::Container,
        types::Tier::Kernel => Tier::Kernel,
        types::Tier::Vm => Tier::Vm,
    }
}

fn refusal_of(r: types::Refusal) -> Refusal {
    let (code, reason, msg) = match r {
        types::Refusal::Request(m) => (Code::InvalidArgument, Reason::Request, m),
        types::Refusal::Permission(m) => (Code::PermissionDenied, Reason::Permission, m),
        types::Refusal::Unsupported(m) => (Code::Unimplemented, Reason::Unsupported, m),
        types::Refusal::Isolation(m) => (Code::FailedPrecondition, Reason::Isolation, m),
        types::Refusal::Environment(m) => (Code::FailedPrecondition, Reason::Environment, m),
        types::Refusal::Capacity(m) => (Code::ResourceExhausted, Reason::Capacity, m),
    };
    Refusal::new(code, reason, sanitize(&msg, MESSAGE_BYTES))
}

/// What went wrong in a call, as a class: the plugin's own error text may
/// carry anything, so only the host's classification is passed on.
fn classify(e: &wasmtime::Error, store: &Store<PluginState>) -> String {
    if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
        "it ran past its deadline".into()
    } else if store.data().limits.denied() {
        "it exceeded its memory limit".into()
    } else if let Some(trap) = e.downcast_ref::<Trap>() {
        format!("it trapped ({trap})")
    } else {
        "it failed to instantiate or was stopped".into()
    }
}

/// Checks the component's imports against the operator's grants: WASI is
/// linked with an empty context (no files, no sockets, no environment), the
/// plugin interfaces only where granted, anything else is refused.
fn check_imports(
    cfg: &PluginConfig,
    component: &Component,
    engine: &Engine,
) -> Result<(), PluginError> {
    for (name, _) in component.component_type().imports(engine) {
        let interface = name.split('@').next().unwrap_or(name);
        let granted = match interface {
            _ if interface.starts_with("wasi:") => true,
            "plimsoll:provider/types"
            | "plimsoll:provider/log"
            | "plimsoll:provider/project-report" => true,
            "plimsoll:provider/http" => cfg.http.is_some(),
            "plimsoll:provider/container-engine" => cfg.container_engine.is_some(),
            _ => {
                return Err(PluginError::UnknownImport(
                    cfg.name.clone(),
                    name.to_string(),
                ));
            }
        };
        if !granted {
            return Err(PluginError::Ungranted(
                cfg.name.clone(),
                interface.to_string(),
            ));
        }
    }
    Ok(())
}

/// One call's store data.
struct PluginState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: MemoryCap,
    plugin: Arc<str>,
    grants: Arc<Grants>,
    client: reqwest::Client,
    /// Set once the plugin used a capability that can start execution.
    dispatched: bool,
    /// When this call's deadline passes; nothing a host function starts for
    /// the plugin (a container) may outlive it.
    ends: std::time::Instant,
    log_lines: u32,
    /// A project run's steps and artifacts, as the plugin reports them.
    report: ProjectReport,
    /// The run's broker session, when it carries a grant, and the socket
    /// directory containers of this call mount (made on first use, removed
    /// when the call's store is dropped).
    grant: Option<Arc<broker::Session>>,
    mount: Option<Arc<crate::grants::socket::Mount>>,
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Links the capability interfaces by hand rather than through the
/// generated traits, so every value a plugin passes is lifted lazily and
/// copied under a budget (see `lazy`). Each function also refuses a plugin
/// the operator did not grant it to.
fn link_capabilities(linker: &mut Linker<PluginState>) -> wasmtime::Result<()> {
    let mut log = linker.instance("plimsoll:provider/log@0.1.0")?;
    log.func_wrap_async(
        "write",
        |mut store: StoreContextMut<'_, PluginState>,
         (level, message): (log_if::Level, WasmStr)| {
            plugin_log(&mut store, level, &message);
            Box::new(async { Ok(()) })
        },
    )?;

    let mut report = linker.instance("plimsoll:provider/project-report@0.1.0")?;
    report.func_wrap_async(
        "add-step",
        |mut store: StoreContextMut<'_, PluginState>, (step,): (lazy::StepResult,)| {
            let kept = report_step(&mut store, &step);
            Box::new(async move { Ok((kept,)) })
        },
    )?;
    report.func_wrap_async(
        "add-artifact",
        |mut store: StoreContextMut<'_, PluginState>, (a,): (lazy::Artifact,)| {
            let kept = report_artifact(&mut store, &a);
            Box::new(async move { Ok((kept,)) })
        },
    )?;

    let mut http_instance = linker.instance("plimsoll:provider/http@0.1.0")?;
    http_instance.func_wrap_async(
        "send",
        |mut store: StoreContextMut<'_, PluginState>, (request,): (lazy::HttpRequest,)| {
            Box::new(async move { Ok((http_send(&mut store, request).await,)) })
        },
    )?;
    http_instance.func_wrap_async(
        "allowed-origins",
        |store: StoreContextMut<'_, PluginState>, (): ()| {
            let origins = store.data().origins();
            Box::new(async move { Ok((origins,)) })
        },
    )?;

    let mut engine_instance = linker.instance("plimsoll:provider/container-engine@0.1.0")?;
    engine_instance.func_wrap_async(
        "run",
        |mut store: StoreContextMut<'_, PluginState>,
         (spec, stdin, timeout_ms, output_limit): (lazy::ContainerSpec, WasmList<u8>, u32, u32)| {
            Box::new(async move { Ok((engine_run(&mut store, spec, stdin, timeout_ms, output_limit).await,)) })
        },
    )?;
    engine_instance.func_wrap_async(
        "environment",
        |store: StoreContextMut<'_, PluginState>, (): ()| {
            let env = store.data().engine_environment();
            Box::new(async move { Ok((env,)) })
        },
    )?;
    engine_instance.func_wrap_async(
        "prewarm",
        |mut store: StoreContextMut<'_, PluginState>, (spec,): (lazy::ContainerSpec,)| {
            let answer =
                approve(&mut store, &spec).map(|(engine, approved)| engine.prewarm(approved));
            Box::new(async move { Ok((answer,)) })
        },
    )?;
    Ok(())
}

fn plugin_log(
    store: &mut StoreContextMut<'_, PluginState>,
    level: log_if::Level,
    message: &WasmStr,
) {
    let state = store.data_mut();
    state.log_lines += 1;
    if state.log_lines > LOG_LINES_PER_CALL {
        return;
    }
    let plugin = state.plugin.clone();
    // Read in place and cut to the line budget before copying anything.
    let message = match message.to_str(store.as_context()) {
        Ok(text) => sanitize(&text, LOG_LINE_BYTES),
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

/// What one HTTP request's method, URL and headers may cost to copy.
const HTTP_META_BYTES: usize = 64 << 10;
const HTTP_MAX_HEADERS: usize = 64;

async fn http_send(
    store: &mut StoreContextMut<'_, PluginState>,
    request: lazy::HttpRequest,
) -> Result<http_if::Response, http_if::HttpError> {
    let plugin = store.data().plugin.clone();
    let refuse = |rule: &str| {
        tracing::warn!(target: "plimsoll::plugin", plugin = &*plugin, rule, "http request refused");
        http_if::HttpError::Forbidden(rule.to_string())
    };
    let too_large = "the request's method, URL, headers or body are over the host's limits";
    let mut budget = lazy::Budget::new(HTTP_META_BYTES, HTTP_MAX_HEADERS);
    let method = budget
        .string(store, &request.method)
        .map_err(|_| refuse(too_large))?;
    let url = budget
        .string(store, &request.url)
        .map_err(|_| refuse(too_large))?;
    if request.headers.len() > HTTP_MAX_HEADERS {
        return Err(refuse(too_large));
    }
    let mut headers = Vec::with_capacity(request.headers.len());
    for i in 0..request.headers.len() {
        let Some(Ok((name, value))) = request.headers.get(store.as_context_mut(), i) else {
            return Err(refuse(too_large));
        };
        let name = budget.string(store, &name).map_err(|_| refuse(too_large))?;
        let value = budget
            .string(store, &value)
            .map_err(|_| refuse(too_large))?;
        headers.push((name, value));
    }
    let body = match &request.body {
        None => None,
        Some(b) => Some(
            lazy::Budget::new(http::MAX_REQUEST_BODY, 0)
                .bytes(store, b)
                .map_err(|_| refuse(too_large))?,
        ),
    };
    let grants = store.data().grants.clone();
    let checked = http::check(grants.http.as_ref(), &method, &url, &headers, body)
        .map_err(|e| refuse(&e.to_string()))?;
    // From here on the request may reach the service: anything the plugin
    // reports afterwards may follow execution.
    store.data_mut().dispatched = true;
    let client = store.data().client.clone();
    match http::send(&client, checked).await {
        Ok((status, headers, body)) => Ok(http_if::Response {
            status,
            headers,
            body,
        }),
        Err(http::SendError::TooLarge) => Err(http_if::HttpError::TooLarge),
        Err(http::SendError::Transport(why)) => Err(http_if::HttpError::Transport(why)),
    }
}

/// What one container spec's strings may cost to copy, and how many.
const SPEC_BYTES: usize = 256 << 10;
const SPEC_ITEMS: usize = 512;

/// For a granted run, the broker directory its containers mount, made on
/// first use.
fn grant_mount(
    store: &mut StoreContextMut<'_, PluginState>,
) -> Result<Option<engine::GrantMount>, String> {
    let Some(session) = store.data().grant.clone() else {
        return Ok(None);
    };
    if store.data().mount.is_none() {
        let gid = store
            .data()
            .grants
            .container_engine
            .as_ref()
            .map_or(0, |(_, e)| e.settings().guest_uid);
        let root = std::path::Path::new(crate::grants::socket::ROOT);
        let mount = crate::grants::socket::Mount::open(root, session, gid).map_err(|e| {
            tracing::error!(error = %e, "making a run's broker socket failed");
            "the run's broker socket could not be made".to_string()
        })?;
        store.data_mut().mount = Some(Arc::new(mount));
    }
    Ok(store.data().mount.as_ref().map(|m| engine::GrantMount {
        dir: m.dir().to_path_buf(),
        env: m.env(),
    }))
}

/// Copies a container spec out of the plugin under budget and puts it to
/// the reference monitor. On approval, the engine and what it will run.
fn approve(
    store: &mut StoreContextMut<'_, PluginState>,
    spec: &lazy::ContainerSpec,
) -> Result<(engine::ContainerEngine, engine::Approved), engine_if::EngineError> {
    let plugin = store.data().plugin.clone();
    let refuse = |rule: &str| {
        tracing::warn!(target: "plimsoll::plugin", plugin = &*plugin, rule, "container spec refused");
        engine_if::EngineError::Forbidden(rule.to_string())
    };
    let grants = store.data().grants.clone();
    let Some((policy, container_engine)) = grants.container_engine.as_ref() else {
        return Err(refuse(
            "this plugin was not granted the container-engine capability",
        ));
    };
    let too_large = "the container spec or its input is over the host's limits";
    let mut b = lazy::Budget::new(SPEC_BYTES, SPEC_ITEMS);
    let image = b
        .string(store, &spec.image)
        .map_err(|_| refuse(too_large))?;
    let command = b
        .strings(store, &spec.command)
        .map_err(|_| refuse(too_large))?;
    let env = b.strings(store, &spec.env).map_err(|_| refuse(too_large))?;
    let user = b.string(store, &spec.user).map_err(|_| refuse(too_large))?;
    let network = b
        .string(store, &spec.network)
        .map_err(|_| refuse(too_large))?;
    let cap_add = b
        .strings(store, &spec.cap_add)
        .map_err(|_| refuse(too_large))?;
    let runtime = b
        .string(store, &spec.runtime)
        .map_err(|_| refuse(too_large))?;
    let host_namespaces = b
        .strings(store, &spec.host_namespaces)
        .map_err(|_| refuse(too_large))?;
    let mounts = b
        .strings(store, &spec.mounts)
        .map_err(|_| refuse(too_large))?;
    let view = engine_policy::Spec {
        image: &image,
        command: &command,
        env: &env,
        user: &user,
        read_only_root: spec.read_only_root,
        network: &network,
        privileged: spec.privileged,
        cap_add: &cap_add,
        runtime: &runtime,
        host_namespaces: &host_namespaces,
        mounts: &mounts,
    };
    if let Err(rule) = engine_policy::check(&view, policy) {
        return Err(refuse(rule));
    }
    // The user the host configured, not merely a non-root one.
    if user != container_engine.settings().user() {
        return Err(refuse(
            "the user must be the guest uid:gid the operator configured",
        ));
    }
    Ok((container_engine.clone(), engine::Approved { command, env }))
}

async fn engine_run(
    store: &mut StoreContextMut<'_, PluginState>,
    spec: lazy::ContainerSpec,
    stdin: WasmList<u8>,
    timeout_ms: u32,
    output_limit: u32,
) -> Result<types::ProcessOutput, engine_if::EngineError> {
    let (container_engine, approved) = approve(store, &spec)?;
    let stdin = lazy::Budget::new(MAX_CONTAINER_STDIN, 0)
        .bytes(store, &stdin)
        .map_err(|_| {
            engine_if::EngineError::Forbidden(
                "the container's input is over the host's limits".into(),
            )
        })?;
    // The container gets what is left of the call, less a moment for the
    // plugin to report what it did before the call itself ends.
    let remaining = store
        .data()
        .ends
        .saturating_duration_since(std::time::Instant::now())
        .saturating_sub(REPORT_MARGIN);
    let timeout = Duration::from_millis(u64::from(timeout_ms))
        .min(MAX_CONTAINER_TIME)
        .min(remaining);
    let limit = (output_limit as usize).min(MAX_CONTAINER_OUTPUT);
    // Marked before the engine is asked: if this call is abandoned at its
    // deadline while the container runs, the host must not later claim that
    // nothing ran. Put back only when the engine proves nothing started.
    let was_dispatched = store.data().dispatched;
    store.data_mut().dispatched = true;
    let grant = match grant_mount(store) {
        Ok(g) => g,
        Err(why) => return Err(engine_if::EngineError::NotStarted(why)),
    };
    match container_engine
        .run(approved, stdin, timeout, limit, grant)
        .await
    {
        Ok(out) => Ok(types::ProcessOutput {
            stdout: out.stdout,
            stderr: out.stderr,
            exit_code: out.exit_code,
            timed_out: out.timed_out,
            stdout_truncated: out.stdout_truncated,
            stderr_truncated: out.stderr_truncated,
        }),
        // Details (host paths, engine text) go to the operator's log; the
        // plugin, and through it the caller, gets a fixed sentence.
        Err(engine::EngineFailure::BeforeStart(why)) => {
            store.data_mut().dispatched = was_dispatched;
            tracing::warn!(target: "plimsoll::engine", why = %why, "a container did not start");
            Err(engine_if::EngineError::NotStarted(
                "the container could not be started (the daemon's log has the details)".into(),
            ))
        }
        Err(engine::EngineFailure::AfterStart(why)) => {
            tracing::warn!(target: "plimsoll::engine", why = %why, "a container failed after it started");
            Err(engine_if::EngineError::Engine(
                "the container failed after it started (the daemon's log has the details)".into(),
            ))
        }
    }
}

impl PluginState {
    /// What the host verified, for a plugin granted the engine; an empty
    /// environment (no image) for one that is not, whose runs the monitor
    /// refuses anyway.
    fn engine_environment(&self) -> engine_if::EngineEnvironment {
        match &self.grants.container_engine {
            Some((_, e)) => {
                let v = e.verified();
                engine_if::EngineEnvironment {
                    image: v.image_id.clone(),
                    configured: e.settings().image.clone(),
                    image_env: v.image_env.clone(),
                    user: e.settings().user(),
                    runtime: e.settings().runtime.clone(),
                    languages: v.languages.clone(),
                }
            }
            None => engine_if::EngineEnvironment {
                image: String::new(),
                configured: String::new(),
                image_env: vec![],
                user: String::new(),
                runtime: String::new(),
                languages: vec![],
            },
        }
    }

    fn origins(&self) -> Vec<String> {
        self.grants
            .http
            .as_ref()
            .map(|g| g.origins.iter().map(http::Origin::display).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_are_capped_never_raised() {
        assert_eq!(effective_tier(Tier::Vm, Tier::Vm, None), Tier::Vm);
        assert_eq!(effective_tier(Tier::Vm, Tier::Process, None), Tier::Process);
        assert_eq!(effective_tier(Tier::Process, Tier::Vm, None), Tier::Process);
        // The engine's evidence caps the claim: runc is container...
        assert_eq!(
            effective_tier(Tier::Vm, Tier::Vm, Some(Tier::Container)),
            Tier::Container
        );
        // ...and a verified runsc is kernel, never vm.
        assert_eq!(
            effective_tier(Tier::Vm, Tier::Vm, Some(Tier::Kernel)),
            Tier::Kernel
        );
        assert_eq!(
            effective_tier(Tier::Kernel, Tier::Container, Some(Tier::Kernel)),
            Tier::Container
        );
    }

    #[test]
    fn names() {
        for good in ["example", "remote-plimsoll", "e2b", "a"] {
            assert!(valid_name(good), "{good}");
        }
        for bad in [
            "",
            "wasm",
            "disabled",
            "Upper",
            "../x",
            "a.b",
            "x".repeat(33).as_str(),
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
