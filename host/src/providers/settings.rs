//! Which provider runs the code, and everything it needs configured: the
//! provider's own variables, the plugin host's and the docker backend's
//! (each parsed by its part), and the rules between them. A setting that
//! would not take effect for the chosen provider is refused, never ignored:
//! an operator who sets a limit must get it.

use std::path::{Path, PathBuf};

use crate::backends::docker;
use crate::compile_cache::CompileCache;
use crate::env_vars::{ConfigError, Env, Var, var};
use crate::plugin_host::settings::PluginSettings;

pub const VARIABLES: &[Var] = &[
    var(
        "SANDBOX_PROVIDER",
        "(unset: disabled)",
        "provider: disabled, wasm, docker, or the name of a plugin in PLIMSOLL_PLUGIN_DIR; unset runs nothing, ever",
    ),
    var(
        "SANDBOX_MEMORY_MB",
        "256",
        "per-run memory cap in MiB (wasm: linear memory, hard trap on growth past it)",
    ),
    var(
        "SANDBOX_MAX_CONCURRENT",
        "8",
        "runs in flight at once, 1-1024; more are refused as capacity",
    ),
    var(
        "PLIMSOLL_COMPILE_CACHE",
        DEFAULT_COMPILE_CACHE,
        "directory for compiled components kept between starts (only this user may write it and everything above it); off compiles on every start",
    ),
];

const DEFAULT_COMPILE_CACHE: &str = "/var/cache/plimsoll";

/// Which provider runs the code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderKind {
    /// The default: refuses every run.
    Disabled,
    /// QuickJS as a Wasm component in this process (process tier).
    Wasm,
    /// The docker adapter shipped inside the daemon, driving the local
    /// engine (container tier under runc, kernel under verified runsc).
    Docker,
    /// A provider plugin of this name, from the plugin directory.
    Plugin(String),
}

impl ProviderKind {
    pub const KNOWN: &'static [&'static str] = &["disabled", "wasm", "docker"];

    /// How a refusal names this provider.
    pub fn label(&self) -> &'static str {
        match self {
            ProviderKind::Disabled => "disabled",
            ProviderKind::Wasm => "wasm",
            ProviderKind::Docker => "docker",
            ProviderKind::Plugin(_) => "plugin",
        }
    }

    /// Whether this provider runs code at all.
    pub fn runs_code(&self) -> bool {
        *self != ProviderKind::Disabled
    }

    /// Whether this provider has a way to carry a grant into a run.
    pub fn carries_grants(&self) -> bool {
        matches!(self, ProviderKind::Wasm | ProviderKind::Docker)
    }
}

const DEFAULT_MEMORY_MB: u32 = 256;
const DEFAULT_MAX_CONCURRENT: u32 = 8;
/// The wasm32 address space is 4 GiB; anything near it is a mistake.
const MAX_MEMORY_MB: u32 = 4095;

#[derive(Debug, Clone)]
pub struct ProviderSettings {
    pub kind: ProviderKind,
    pub memory_mb: u32,
    pub max_concurrent: u32,
    pub plugin: PluginSettings,
    /// The docker backend's settings, when the provider drives one.
    pub docker: Option<docker::Settings>,
    /// Where compiled components are kept between starts; `None`: off.
    pub compile_cache: Option<PathBuf>,
}

impl ProviderSettings {
    pub fn from_env(env: &Env) -> Result<ProviderSettings, ConfigError> {
        let kind = match env
            .get("SANDBOX_PROVIDER")
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("disabled") => ProviderKind::Disabled,
            Some("wasm") => ProviderKind::Wasm,
            Some("docker") => ProviderKind::Docker,
            Some(name) if crate::plugin_host::name_shape(name) => {
                ProviderKind::Plugin(name.to_string())
            }
            Some(other) => {
                return Err(ConfigError::UnknownProvider {
                    name: other.to_string(),
                    known: ProviderKind::KNOWN,
                });
            }
        };
        let memory_mb = memory_mb(env)?;
        let max_concurrent = env
            .u32_in("SANDBOX_MAX_CONCURRENT", 1, 1024)?
            .unwrap_or(DEFAULT_MAX_CONCURRENT);

        let plugin = PluginSettings::from_env(env)?;
        // A plugin that is not there is a misspelt provider: said before
        // anything else about the configuration.
        if let ProviderKind::Plugin(name) = &kind
            && let Err(e) = crate::plugin_host::locate(&plugin_dir(plugin.dir.as_deref()), name)
        {
            return Err(ConfigError::Invalid {
                name: "SANDBOX_PROVIDER",
                why: e.to_string(),
            });
        }
        if plugin.any_set() && !matches!(kind, ProviderKind::Plugin(_)) {
            return Err(ConfigError::Invalid {
                name: "SANDBOX_PLUGIN_*",
                why: "plugin settings are set but SANDBOX_PROVIDER does not name a plugin".into(),
            });
        }

        let uses_docker = kind == ProviderKind::Docker
            || (matches!(kind, ProviderKind::Plugin(_)) && plugin.container_engine);
        let docker = if uses_docker {
            Some(docker::Settings::from_env(env, memory_mb)?)
        } else {
            if let Some(v) = docker::settings::VARIABLES
                .iter()
                .find(|v| env.is_set(v.name))
            {
                return Err(ConfigError::Unenforceable(v.name, kind.label()));
            }
            None
        };
        let compile_cache = match env.get("PLIMSOLL_COMPILE_CACHE") {
            Some("off") => None,
            Some(path) if Path::new(path).is_absolute() => Some(PathBuf::from(path)),
            Some(_) => {
                return Err(ConfigError::Invalid {
                    name: "PLIMSOLL_COMPILE_CACHE",
                    why: "must be an absolute path, or off".into(),
                });
            }
            None => Some(PathBuf::from(DEFAULT_COMPILE_CACHE)),
        };
        Ok(ProviderSettings {
            kind,
            memory_mb,
            max_concurrent,
            plugin,
            docker,
            compile_cache,
        })
    }

    /// The settings plimsolld would load the plugin `name` with, read from
    /// the same variables, for a plugin file examined on its own (`plimsoll
    /// plugin check`): no provider to select, and nothing cached.
    pub fn for_plugin_file(env: &Env, name: &str) -> Result<ProviderSettings, ConfigError> {
        let memory_mb = memory_mb(env)?;
        let plugin = PluginSettings::from_env(env)?;
        let docker = match plugin.container_engine {
            true => Some(docker::Settings::from_env(env, memory_mb)?),
            false => None,
        };
        Ok(ProviderSettings {
            kind: ProviderKind::Plugin(name.to_string()),
            memory_mb,
            max_concurrent: DEFAULT_MAX_CONCURRENT,
            plugin,
            docker,
            compile_cache: None,
        })
    }

    /// The compile cache, opened and checked; `None` when it is off or
    /// fails its checks, which is said in the log and costs only time.
    pub fn open_compile_cache(&self) -> Option<CompileCache> {
        let path = self.compile_cache.as_deref()?;
        match CompileCache::open(path) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(
                    path = %path.display(),
                    error = %e,
                    "the compile cache is not used; components are compiled on every start"
                );
                None
            }
        }
    }

    /// Where plugins are loaded from: `PLIMSOLL_PLUGIN_DIR`, or `plugins/`
    /// beside the build's `release/` directory, where `make guest` puts them.
    pub fn plugin_dir(&self) -> PathBuf {
        plugin_dir(self.plugin.dir.as_deref())
    }
}

fn plugin_dir(configured: Option<&Path>) -> PathBuf {
    if let Some(dir) = configured {
        return dir.to_path_buf();
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            exe.parent()
                .and_then(|p| p.parent())
                .map(|t| t.join("plugins"))
        })
        .unwrap_or_else(|| PathBuf::from("plugins"))
}

/// `SANDBOX_MEMORY_MB`, or its default.
fn memory_mb(env: &Env) -> Result<u32, ConfigError> {
    Ok(env
        .u32_in("SANDBOX_MEMORY_MB", 1, MAX_MEMORY_MB)?
        .unwrap_or(DEFAULT_MEMORY_MB))
}
