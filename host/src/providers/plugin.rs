//! A provider plugin as a provider: loading one through the plugin host's
//! stages with the capabilities the operator granted, and the `Provider`
//! face of a loaded plugin.

use std::sync::Arc;

use futures_util::future::{BoxFuture, ready};

use super::{Evidence, Offer, Provider, ProviderSession, ProviderSettings, Resources, StartError};
use crate::backends::docker::{self, DockerEngine};
use crate::job::{Ended, Job, Output, Payload, SessionOptions};
use crate::outcome::{NotReady, RunFailure};
use crate::plugin_host::call::Granted;
use crate::plugin_host::capabilities::container_engine::ContainerEngine;
use crate::plugin_host::capabilities::http::HttpCapability;
use crate::plugin_host::capabilities::http::policy::HttpAllowance;
use crate::plugin_host::load::{self, Grants, PluginSource};
use crate::plugin_host::session::PluginSession;
use crate::plugin_host::{PluginError, PluginProvider};
use crate::tier::Tier;

/// Starts the plugin `name` from the plugin directory, with what the
/// operator granted it.
pub async fn start(name: &str, settings: &ProviderSettings) -> Result<PluginProvider, StartError> {
    let p = &settings.plugin;
    let plugin = load_plugin(
        name,
        PluginSource::Dir(settings.plugin_dir()),
        p.sha256.as_deref(),
        p.max_tier.unwrap_or(Tier::Process),
        p.http.clone(),
        settings.docker.as_ref(),
        settings,
    )
    .await?;
    tracing::info!(
        plugin = plugin.name(),
        sha256 = plugin.sha256(),
        claimed = plugin.described().claimed_tier.as_str(),
        isolation = plugin.tier().as_str(),
        "provider plugin loaded"
    );
    Ok(plugin)
}

/// The plugin host's loading stages, with the container backend connected
/// (and verified, and smoke-tested) between the import check and linking.
pub(super) async fn load_plugin(
    name: &str,
    source: PluginSource,
    pin: Option<&str>,
    max_tier: Tier,
    http: Option<HttpAllowance>,
    docker: Option<&docker::Settings>,
    settings: &ProviderSettings,
) -> Result<PluginProvider, StartError> {
    let memory_mb = settings.memory_mb;
    let cache = settings.open_compile_cache();
    if let Some(d) = docker {
        d.check_guest_uid_on_host().map_err(StartError::Backend)?;
    }
    let checked = load::read(name, &source, pin)?.compile(
        Grants {
            http: http.is_some(),
            container_engine: docker.is_some(),
        },
        cache.as_ref(),
    )?;
    let http = match http {
        None => None,
        Some(allowance) => Some(Arc::new(
            HttpCapability::new(allowance).map_err(PluginError::Engine)?,
        )),
    };
    // The backend is reached (and a configured runtime found registered
    // there) before the plugin can ask for anything.
    let container_engine = match docker {
        None => None,
        Some(d) => {
            let engine = DockerEngine::connect(d.clone())
                .await
                .map_err(PluginError::Engine)?;
            Some(Arc::new(ContainerEngine::new(Arc::new(engine))))
        }
    };
    let linked = checked.link(
        Granted {
            http,
            container_engine,
        },
        memory_mb,
    )?;
    // Preflight freezes what warm containers hold (`Described::preflight`).
    let config = settings.plugin.config.clone().unwrap_or_default();
    Ok(linked.describe(max_tier, config).await?.preflight().await?)
}

impl Provider for PluginProvider {
    fn evidence(&self) -> Evidence {
        Evidence {
            sandbox: self.name().to_string(),
            tier: self.tier(),
            environment: self.described().environment.clone(),
            software_identity: String::new(),
            policy: format!("plugin:sha256:{}", self.sha256()),
        }
    }

    fn offer(&self) -> Offer {
        let d = self.described();
        // Grants reach a run only through a container's broker socket.
        let carries = self.backend().is_some();
        Offer {
            javascript: d.runs_javascript,
            project: d.runs_project,
            javascript_grants: carries,
            project_grants: carries,
            project_languages: d.languages.clone(),
        }
    }

    fn resources(&self) -> Option<Resources> {
        self.backend().map(|b| {
            let e = b.facts().envelope;
            Resources {
                memory_mb: e.memory_mb,
                cpus: e.cpus,
                pids: e.pids,
                disk_mb: e.disk_mb,
            }
        })
    }

    fn runtime(&self) -> Option<String> {
        self.backend()
            .map(|b| b.facts().runtime_version.clone())
            .filter(|v| !v.is_empty())
    }

    fn ready(&self) -> Result<(), NotReady> {
        PluginProvider::ready(self)
    }

    fn check_ready(&self) -> BoxFuture<'_, Result<(), NotReady>> {
        match self.backend() {
            Some(b) => b.check_ready(),
            None => Box::pin(ready(Ok(()))),
        }
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        match self.backend() {
            Some(b) => b.shutdown(),
            None => Box::pin(ready(())),
        }
    }

    fn session_offer(&self) -> Option<super::SessionOffer> {
        let s = self.described().sessions.as_ref()?;
        Some(super::SessionOffer {
            javascript: s.javascript,
            project: s.project,
            cell_languages: s.cell_languages.clone(),
            // A container session mounts a broker directory that serves
            // each granted call while it runs (see plugin_host/session.rs).
            javascript_grants: self.backend().is_some() && s.javascript,
            project_grants: self.backend().is_some() && s.project,
            software_identity: None,
        })
    }

    fn open_session(
        &self,
        options: SessionOptions,
    ) -> BoxFuture<'_, Result<Box<dyn ProviderSession>, RunFailure>> {
        Box::pin(async move {
            PluginProvider::open_session(self, options)
                .await
                .map(|s| Box::new(s) as Box<dyn ProviderSession>)
        })
    }

    fn run(&self, job: Job) -> BoxFuture<'_, Result<Output, RunFailure>> {
        Box::pin(async move {
            match job.payload {
                Payload::Cell(_) => Err(super::not_offered()),
                _ => PluginProvider::run(self, job).await,
            }
        })
    }
}

/// A plugin's session as the pipeline holds it: the plugin host does the
/// work, this is only the provider's face of it.
impl ProviderSession for PluginSession {
    fn run(&self, job: Job) -> BoxFuture<'_, Result<Output, RunFailure>> {
        Box::pin(self.call(job))
    }

    fn ended(&self) -> Option<Ended> {
        PluginSession::ended(self)
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(PluginSession::close(self))
    }
}
