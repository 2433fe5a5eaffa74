//! A provider plugin as a provider: loading one through the plugin host's
//! stages with the capabilities the operator granted, and the `Provider`
//! face of a loaded plugin.

use std::sync::Arc;

use futures_util::future::{BoxFuture, ready};

use super::{Evidence, Offer, Provider, ProviderSession, ProviderSettings, Resources, StartError};
use crate::backends::docker::{self, DockerEngine};
use crate::grants::guard::Guard;
use crate::job::{Ended, Job, Output, Payload, SessionOptions};
use crate::outcome::{NotReady, RunFailure};
use crate::plugin_host::call::{Granted, TripWire};
use crate::plugin_host::capabilities::container_engine::ContainerEngine;
use crate::plugin_host::capabilities::container_engine::backend::ContainerBackend;
use crate::plugin_host::capabilities::http::HttpCapability;
use crate::plugin_host::capabilities::http::policy::HttpAllowance;
use crate::plugin_host::capabilities::http::watch::Watch;
use crate::plugin_host::load::{self, Grants, PluginSource};
use crate::plugin_host::session::PluginSession;
use crate::plugin_host::{PluginError, PluginProvider};
use crate::tier::Tier;

/// Starts the plugin `name` from the plugin directory, with what the
/// operator granted it and the daemon's guard, if it has one.
pub async fn start(
    name: &str,
    settings: &ProviderSettings,
    guard: Option<Arc<Guard>>,
) -> Result<PluginProvider, StartError> {
    let p = &settings.plugin;
    let plugin = Load {
        name,
        source: PluginSource::Dir(settings.plugin_dir()),
        pin: p.sha256.as_deref(),
        max_tier: p.max_tier.unwrap_or(Tier::Process),
        http: p.http.clone(),
        engine: Engine::from(settings.docker.as_ref()),
        guard,
        instruments: None,
    }
    .start(settings)
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

/// What runs a plugin's containers, when it is granted the engine.
pub enum Engine<'a> {
    None,
    /// The local docker engine, verified and smoke-tested at connect.
    Docker(&'a docker::Settings),
    /// A backend the caller made (`plimsoll plugin describe`'s scripted one).
    Given(Arc<dyn ContainerBackend>),
}

impl<'a> From<Option<&'a docker::Settings>> for Engine<'a> {
    fn from(d: Option<&'a docker::Settings>) -> Engine<'a> {
        d.map_or(Engine::None, Engine::Docker)
    }
}

/// Puts something around a container backend (the checker's counting).
pub type WrapBackend =
    Box<dyn FnOnce(Arc<dyn ContainerBackend>) -> Arc<dyn ContainerBackend> + Send>;

/// What `plimsoll plugin check` puts around a plugin's capabilities; the
/// daemon puts nothing.
pub struct Instruments {
    /// Shown every request the plugin sends.
    pub watch: Arc<dyn Watch>,
    /// Wraps the container backend, to count what it starts and ends.
    pub wrap_backend: WrapBackend,
    /// Stops the plugin mid-call when set.
    pub trip_wire: Arc<TripWire>,
}

/// One plugin to load through the plugin host's stages, with the container
/// backend connected (and verified, and smoke-tested) between the import
/// check and linking.
pub struct Load<'a> {
    pub name: &'a str,
    pub source: PluginSource,
    pub pin: Option<&'a str>,
    pub max_tier: Tier,
    pub http: Option<HttpAllowance>,
    pub engine: Engine<'a>,
    /// The daemon's guard, for a plugin that imports `grant`.
    pub guard: Option<Arc<Guard>>,
    pub instruments: Option<Instruments>,
}

impl Load<'_> {
    /// Every stage: the plugin ready to serve.
    pub async fn start(self, settings: &ProviderSettings) -> Result<PluginProvider, StartError> {
        // Preflight freezes what warm containers hold (`Described::preflight`).
        Ok(self.describe(settings).await?.preflight().await?)
    }

    /// The stages up to and including `describe`: what the plugin says it
    /// is and reads, before its smoke test.
    pub async fn describe(
        self,
        settings: &ProviderSettings,
    ) -> Result<load::Described, StartError> {
        let Load {
            name,
            source,
            pin,
            max_tier,
            http,
            engine,
            guard,
            instruments,
        } = self;
        let cache = settings.open_compile_cache();
        if let Engine::Docker(d) = &engine {
            d.check_guest_uid_on_host().map_err(StartError::Backend)?;
        }
        let checked = load::read(name, &source, pin)?.compile(
            Grants {
                http: http.is_some(),
                container_engine: !matches!(engine, Engine::None),
            },
            cache.as_ref(),
        )?;
        let (watch, wrap_backend, trip_wire) = match instruments {
            None => (None, None, None),
            Some(i) => (Some(i.watch), Some(i.wrap_backend), Some(i.trip_wire)),
        };
        let http = match http {
            None => None,
            Some(allowance) => {
                let mut capability = HttpCapability::new(allowance).map_err(PluginError::Engine)?;
                capability.watch = watch;
                Some(Arc::new(capability))
            }
        };
        // The backend is reached (and a configured runtime found registered
        // there) before the plugin can ask for anything.
        let backend: Option<Arc<dyn ContainerBackend>> = match engine {
            Engine::None => None,
            Engine::Given(b) => Some(b),
            Engine::Docker(d) => Some(Arc::new(
                DockerEngine::connect(d.clone())
                    .await
                    .map_err(PluginError::Engine)?,
            )),
        };
        let backend = match (backend, wrap_backend) {
            (Some(b), Some(wrap)) => Some(wrap(b)),
            (b, _) => b,
        };
        let linked = checked.link(
            Granted {
                http,
                container_engine: backend.map(|b| Arc::new(ContainerEngine::new(b))),
                guard,
                trip_wire,
            },
            settings.memory_mb,
        )?;
        let config = settings.plugin.config.clone().unwrap_or_default();
        Ok(linked.describe(max_tier, config).await?)
    }
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
        // Grants reach a run through a container's broker socket, or a
        // hosted sandbox's way to the guard.
        let carries = self.backend().is_some() || self.carries_hosted_grants();
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
        let carries = self.backend().is_some() || self.carries_hosted_grants();
        Some(super::SessionOffer {
            javascript: s.javascript,
            project: s.project,
            cell_languages: s.cell_languages.clone(),
            // A container session mounts a broker directory that serves
            // each granted call while it runs (see plugin_host/session.rs);
            // a hosted one is handed each granted call's channel.
            javascript_grants: carries && s.javascript,
            project_grants: carries && s.project,
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
