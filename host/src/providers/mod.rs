//! Providers: the backends that actually run code, and the evidence each one
//! holds for the tier it reports.
//!
//! Exactly one provider serves a daemon, chosen by `SANDBOX_PROVIDER`. The
//! evidence a provider reports is read immediately before every dispatch, so
//! a provider whose evidence weakens is held to the weaker tier at once.

pub mod disabled;
pub mod wasm;

use crate::tier::Tier;

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
    pub sandbox: &'static str,
    /// The tier that holds for a run dispatched now.
    pub tier: Tier,
    /// The outer artifact runs execute in (content-addressed).
    pub environment: String,
    /// The selected software a caller's software rule is checked against.
    pub software_identity: String,
}

/// The configured provider.
pub enum Provider {
    Disabled,
    Wasm(wasm::WasmProvider),
}

impl Provider {
    pub fn evidence(&self) -> Evidence {
        match self {
            Provider::Disabled => disabled::evidence(),
            Provider::Wasm(w) => Evidence {
                sandbox: "wasm",
                tier: Tier::Process,
                environment: w.identity().to_string(),
                software_identity: w.identity().to_string(),
            },
        }
    }
}
