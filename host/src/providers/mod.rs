//! Providers: the backends that actually run code, and the evidence each one
//! holds for the tier it reports.
//!
//! Exactly one provider serves a daemon, chosen by `SANDBOX_PROVIDER` and
//! started by `start`. The pipeline talks to it only through `Provider`:
//! what it can stand behind now (`evidence`, read immediately before every
//! dispatch, so a provider whose evidence weakens is held to the weaker tier
//! at once), what it runs and can carry a grant into (`offer`), its
//! resource envelope, readiness, shutdown, and `run`. Which provider it is
//! is known only inside this folder.

pub mod disabled;
pub mod docker;
pub mod plugin;
pub mod session;
pub mod settings;
pub mod wasm;

use std::sync::Arc;

use futures_util::future::{BoxFuture, ready};

use crate::job::{Job, Output, SessionOptions};
use crate::outcome::{NotReady, RunFailure};
use crate::refusal::Refusal;
use crate::tier::Tier;
pub use session::{ProviderSession, SessionOffer};
pub use settings::{ProviderKind, ProviderSettings};

/// What a provider can stand behind right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// The provider's name, reported as `sandbox`.
    pub sandbox: String,
    /// The tier that holds for a run dispatched now.
    pub tier: Tier,
    /// The outer artifact runs execute in (content-addressed).
    pub environment: String,
    /// The selected software a caller's software rule is checked against.
    pub software_identity: String,
    /// What governs the runs beyond the environment: for a plugin provider,
    /// `plugin:sha256:<digest>` of the adapter component. Carried into every
    /// run record, so a record names the adapter that handled the run.
    pub policy: String,
}

/// What a provider runs, and which payloads it can carry a grant into.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offer {
    pub javascript: bool,
    pub project: bool,
    pub javascript_grants: bool,
    pub project_grants: bool,
    /// Interpreters a project's steps can use.
    pub project_languages: Vec<String>,
}

/// The resource envelope each run gets, as Describe reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Resources {
    pub memory_mb: u32,
    pub cpus: f64,
    pub pids: u32,
    pub disk_mb: u32,
}

/// A configured provider, as the pipeline sees it.
pub trait Provider: Send + Sync {
    /// What the provider can stand behind now.
    fn evidence(&self) -> Evidence;

    /// What it runs and which payloads can carry a grant.
    fn offer(&self) -> Offer;

    /// The envelope each run gets, where the provider enforces one.
    fn resources(&self) -> Option<Resources> {
        None
    }

    /// The container runtime behind the tier and its version, as verified
    /// at start (`runsc 0.0~20240729.0`), for providers that run
    /// containers on this host's engine.
    fn runtime(&self) -> Option<String> {
        None
    }

    /// A refusal for every run, for a daemon that has no way to run
    /// anything.
    fn refuses_everything(&self) -> Option<Refusal> {
        None
    }

    /// The last readiness verdict, without asking anything (cheap: read
    /// before every session call).
    fn ready(&self) -> Result<(), NotReady> {
        Ok(())
    }

    /// Whether runs can be dispatched now, checked afresh.
    fn check_ready(&self) -> BoxFuture<'_, Result<(), NotReady>> {
        Box::pin(ready(Ok(())))
    }

    /// Releases what would outlive the process, before a clean exit.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(ready(()))
    }

    /// Runs one admitted job. Only payloads the offer names are passed.
    fn run(&self, job: Job) -> BoxFuture<'_, Result<Output, RunFailure>>;

    /// What this provider's sessions run; `None` when it has none.
    fn session_offer(&self) -> Option<SessionOffer> {
        None
    }

    /// Opens a session's sandbox. Called only when `session_offer` is
    /// some, after every check the pipeline makes; nothing of a caller's
    /// code runs in it until its first call.
    fn open_session(
        &self,
        _options: SessionOptions,
    ) -> BoxFuture<'_, Result<Box<dyn ProviderSession>, RunFailure>> {
        Box::pin(ready(Err(RunFailure::NotDispatched(Refusal::unsupported(
            "this provider has no sessions",
        )))))
    }
}

/// Why a provider did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Wasm(#[from] wasm::WasmError),
    #[error(transparent)]
    Plugin(#[from] crate::plugin_host::PluginError),
    #[error("{0}")]
    Backend(String),
}

/// Starts the configured provider: compiles, connects, verifies and
/// smoke-tests whatever it rests on, and prepares what the grant profiles
/// need (the wasm provider compiles their preambles). Nothing is returned
/// half-started.
pub async fn start(
    settings: &ProviderSettings,
    grants: &crate::grants::Grants,
    guard: Option<Arc<crate::grants::guard::Guard>>,
) -> Result<Arc<dyn Provider>, StartError> {
    let provider: Arc<dyn Provider> = match &settings.kind {
        ProviderKind::Disabled => {
            tracing::warn!("SANDBOX_PROVIDER is unset: the Disabled provider refuses every run");
            Arc::new(disabled::Disabled)
        }
        ProviderKind::Wasm => {
            let w = wasm::start(settings).await?;
            w.prepare_preambles(grants)
                .await
                .map_err(StartError::Backend)?;
            Arc::new(w)
        }
        ProviderKind::Docker => Arc::new(docker::start(settings).await?),
        ProviderKind::Plugin(name) => Arc::new(plugin::start(name, settings, guard).await?),
    };
    // Profiles that no run here could carry are a configuration mistake,
    // said at start rather than as a refusal on every granted request.
    let offer = provider.offer();
    if !grants.is_empty() && !offer.javascript_grants && !offer.project_grants {
        provider.shutdown().await;
        return Err(StartError::Backend(
            "grant profiles are configured, but this provider cannot carry a grant: a plugin carries one through a container engine, or through `plimsoll:provider/grant` with PLIMSOLL_GUARD_ADDR and PLIMSOLL_GUARD_URL set".into(),
        ));
    }
    Ok(provider)
}

/// The not-dispatched answer for a payload a provider was handed but does
/// not run (unreachable: the pipeline checks the offer first).
fn not_offered() -> RunFailure {
    RunFailure::NotDispatched(Refusal::unsupported("no provider for this dispatch path"))
}
