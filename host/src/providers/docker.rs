//! The docker provider: the docker adapter shipped inside the daemon,
//! driving the local Docker engine through the container-engine capability.
//! Its tier is what the engine's evidence stands behind: container under
//! runc, kernel under a verified runsc.

use super::{ProviderSettings, StartError};
use crate::plugin_host::PluginProvider;
use crate::plugin_host::load::PluginSource;
use crate::tier::Tier;

/// The docker adapter, embedded at build time (see host/build.rs): the
/// docker provider runs exactly these bytes, whose digest the run records
/// name as the policy.
pub static ADAPTER: &[u8] = include_bytes!(env!("PLIMSOLL_DOCKER_PLUGIN_WASM"));

pub async fn start(settings: &ProviderSettings) -> Result<PluginProvider, StartError> {
    let docker = settings
        .docker
        .as_ref()
        .ok_or_else(|| StartError::Backend("the docker provider has no engine settings".into()))?;
    let plugin = super::plugin::Load {
        name: "docker",
        source: PluginSource::Embedded(ADAPTER),
        pin: None,
        // The adapter ships with the daemon; its tier is what the engine's
        // evidence stands behind.
        max_tier: Tier::Vm,
        http: None,
        engine: super::plugin::Engine::Docker(docker),
        guard: None,
        instruments: None,
    }
    .start(settings)
    .await?;
    tracing::info!(
        sha256 = plugin.sha256(),
        isolation = plugin.tier().as_str(),
        environment = %plugin.described().environment,
        languages = ?plugin.described().languages,
        "docker provider ready"
    );
    Ok(plugin)
}
