//! Why a plugin did not load, stage by stage: what the operator reads when
//! the daemon refuses to start.

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("plugin name {0:?} must be 1-32 of [a-z0-9-] and not a built-in provider name")]
    BadName(String),
    #[error("no plugin {path}; built-in providers: {builtin}; plugins found: {found}")]
    NotFound {
        path: String,
        builtin: String,
        found: String,
    },
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
    #[error("plugin {plugin}'s configuration (SANDBOX_PLUGIN_CONFIG_FILE) has {} problem(s):\n  - {}", problems.len(), problems.join("\n  - "))]
    Config {
        plugin: String,
        problems: Vec<String>,
    },
    #[error("plugin {0}'s startup smoke test failed: {1}")]
    Preflight(String, String),
    #[error("engine: {0}")]
    Engine(String),
}
