//! Providers: the backends that actually run code, and the evidence each one
//! holds for the tier it reports.
//!
//! Exactly one provider serves a daemon, chosen by `SANDBOX_PROVIDER`. The
//! evidence a provider reports is read immediately before every dispatch, so
//! a provider whose evidence weakens is held to the weaker tier at once.

pub mod disabled;
pub mod wasm;

use crate::plugins::PluginProvider;
use crate::refusal::Refusal;
use crate::tier::Tier;

/// Why a run produced no result.
#[derive(Debug)]
pub enum RunFailure {
    /// Nothing of the code ran; the host can stand behind that.
    NotDispatched(Refusal),
    /// The run may have started. Answered unmarked.
    MayHaveRun(String),
}

/// Output of one process-like run, as the API reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: i32,
    pub timed_out: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

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

/// The configured provider.
pub enum Provider {
    Disabled,
    Wasm(wasm::WasmProvider),
    Plugin(PluginProvider),
}

impl Provider {
    /// Whether the provider runs JavaScript snippets.
    pub fn runs_javascript(&self) -> bool {
        match self {
            Provider::Disabled => false,
            Provider::Wasm(_) => true,
            Provider::Plugin(p) => p.described().runs_javascript,
        }
    }

    /// Whether the provider runs projects.
    pub fn runs_project(&self) -> bool {
        match self {
            Provider::Plugin(p) => p.described().runs_project,
            Provider::Disabled | Provider::Wasm(_) => false,
        }
    }

    pub fn evidence(&self) -> Evidence {
        match self {
            Provider::Disabled => disabled::evidence(),
            Provider::Wasm(w) => Evidence {
                sandbox: "wasm".to_string(),
                tier: Tier::Process,
                environment: w.identity().to_string(),
                software_identity: w.identity().to_string(),
                policy: String::new(),
            },
            Provider::Plugin(p) => Evidence {
                sandbox: p.name().to_string(),
                tier: p.tier(),
                environment: p.described().environment.clone(),
                software_identity: String::new(),
                policy: format!("plugin:sha256:{}", p.sha256()),
            },
        }
    }
}
