//! The run pipeline, independent of HTTP: validate, admit, check the floor
//! against current evidence, dispatch to the provider, seal the record.
//!
//! The order is the security argument. Everything that can refuse a run does
//! so before dispatch, and each refusal is a typed `Refusal` (nothing ran).
//! The isolation floor is compared with the provider's evidence as the very
//! last step before the provider is called (`floor`), after admission, so no
//! wait in a queue can sit between the check and the run. Every dispatched
//! run gets one audit line (`audit`), whatever became of it.

pub mod answer;
pub mod audit;
pub(crate) mod dispatch;
pub mod floor;
mod grants;
pub mod session;

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Semaphore;

use crate::admission::{self, Limits};
use crate::attest::receipts::Receipts;
use crate::callers::Caller;
use crate::grants::{Grants, Profile};
use crate::job::{Payload, ProjectInput};
use crate::live::Live;
use crate::metrics::Metrics;
use crate::outcome::NotReady;
use crate::providers::{Evidence, Provider};
use crate::quota::{Quotas, Shed};
use crate::refusal::Refusal;
use crate::replicas::Replicas;
use crate::sessions::{self, Registry, SessionSettings};
use crate::wire::{
    DescribeResponse, PROTOCOL, PayloadEnvironment, RunRequest, RunResources, RunResponse,
};
use dispatch::{Admitted, Target, Undone};

/// How long a stopping daemon waits for session opens under way before it
/// ends the sessions it holds: as long as the docker pool waits for its
/// removals. An open still starting past it closes its own sandbox when
/// its start ends (see `open`), instead of handing the session out.
const OPENS_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

pub use floor::check_floor;

/// A run that produced no result.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Nothing ran; the answer carries the not-dispatched mark.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The run may have started. Unmarked: a client must not retry blindly.
    /// `id` joins the caller's answer to the detailed log line.
    #[error("internal error {id}")]
    Internal { id: String, detail: String },
}

pub struct Daemon {
    provider: Arc<dyn Provider>,
    limits: Limits,
    in_flight: Arc<Semaphore>,
    grants: Arc<Grants>,
    /// The broker's upstream client: no redirects, no proxy. None if it
    /// could not be built, and then every grant is refused.
    broker_client: Option<reqwest::Client>,
    quotas: Arc<Quotas>,
    metrics: Arc<Metrics>,
    sessions: Arc<Registry>,
    /// Forwarding of session calls to the replica holding the session.
    replicas: Option<Arc<Replicas>>,
    /// The daemon's signature on each record it seals, if configured.
    receipts: Option<Arc<Receipts>>,
}

/// Everything a daemon is built from besides its provider.
pub struct Options {
    pub limits: Limits,
    pub grants: Arc<Grants>,
    /// The per-caller limits, counted in the configured store.
    pub quotas: Arc<Quotas>,
    pub metrics: Arc<Metrics>,
    pub sessions: SessionSettings,
    pub replicas: Option<Arc<Replicas>>,
    pub receipts: Option<Arc<Receipts>>,
}

impl Daemon {
    pub fn with(provider: Arc<dyn Provider>, o: Options) -> Self {
        let in_flight = Arc::new(Semaphore::new(o.limits.max_concurrent as usize));
        let broker_client = match crate::outbound::client() {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::error!(error = %e, "the broker's HTTP client could not be built; grants are refused");
                None
            }
        };
        let sessions = Registry::new(o.sessions);
        // The reaper runs wherever a daemon with sessions is built inside a
        // runtime (plimsolld, the tests); without one nothing can open.
        if sessions.settings.enabled()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let _reaper = rt.enter();
            sessions::reaper::spawn(sessions.clone(), o.metrics.clone());
        }
        Daemon {
            provider,
            limits: o.limits,
            in_flight,
            grants: o.grants,
            broker_client,
            quotas: o.quotas,
            metrics: o.metrics,
            sessions,
            replicas: o.replicas,
            receipts: o.receipts,
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Session forwarding between replicas, when configured.
    pub fn replicas(&self) -> Option<&Arc<Replicas>> {
        self.replicas.as_ref()
    }

    pub fn session_settings(&self) -> &SessionSettings {
        &self.sessions.settings
    }

    /// Whether this replica holds an open session `id` of `caller`.
    pub fn holds_session(&self, id: &str, caller: &str) -> bool {
        self.sessions.get(id, caller).is_some()
    }

    /// A capacity refusal, counted under `label` on the shed metric: every
    /// run, call or open turned away for room goes through here.
    fn shed(&self, label: &str, text: impl Into<String>) -> Refusal {
        self.metrics.shed.with_label_values(&[label]).inc();
        Refusal::capacity(text)
    }

    /// `shed` for a reason the per-caller limits name (the API's and MCP's
    /// forwarding refuses with these too).
    pub fn shed_for(&self, why: Shed) -> Refusal {
        self.shed(why.label(), why.text())
    }

    /// Bytes a run keeps per output stream.
    pub fn output_limit(&self) -> usize {
        self.limits.output_limit
    }

    /// Whether the provider has sessions at all (whatever the settings).
    pub fn has_sessions(&self) -> bool {
        self.provider.session_offer().is_some()
    }

    pub fn evidence(&self) -> Evidence {
        self.provider.evidence()
    }

    /// Ends every session and releases what the provider holds that would
    /// outlive the process (session and warm containers), before a clean
    /// exit.
    pub async fn shutdown(&self) {
        // No session opens from here on; one under way finishes within
        // this wait and is then in `all` to be ended with the rest, or,
        // slower than the wait, closes its own sandbox instead of
        // committing after the list was read.
        self.sessions.close();
        let waiting = std::time::Instant::now();
        while self.sessions.opening() > 0 && waiting.elapsed() < OPENS_WAIT {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        for entry in self.sessions.all() {
            if entry.mark_ended(
                crate::wire::SessionEnd::Shutdown,
                "the daemon is shutting down",
            ) {
                // A call in progress is bounded by its deadline; the wait is
                // bounded again here so shutdown never hangs on one.
                let close = async {
                    let mut turn = entry.turn().await;
                    turn.finish(&entry, &self.metrics).await;
                };
                let _ = tokio::time::timeout(std::time::Duration::from_secs(10), close).await;
            }
        }
        self.provider.shutdown().await;
    }

    /// Whether runs can be dispatched now (for /readyz): checked afresh.
    pub async fn check_ready(&self) -> Result<(), NotReady> {
        self.provider.check_ready().await?;
        self.quotas.check_ready().await
    }

    pub fn describe(&self) -> DescribeResponse {
        let ev = self.provider.evidence();
        let offer = self.provider.offer();
        let mut d = DescribeResponse {
            sandbox: ev.sandbox.clone(),
            isolation: ev.tier.as_str().to_string(),
            protocol: PROTOCOL,
            record_signing_key_id: self
                .receipts
                .as_ref()
                .map(|r| r.key_id().to_string())
                .unwrap_or_default(),
            ..Default::default()
        };
        if offer.javascript {
            d.javascript_environment = Some(PayloadEnvironment {
                identity: ev.environment.clone(),
                max_timeout_ms: self.limits.max_timeout.as_millis() as u32,
                software_identity: ev.software_identity.clone(),
                languages: vec!["javascript".to_string()],
            });
        }
        if offer.project {
            d.supports_project = true;
            d.project_environment = Some(PayloadEnvironment {
                identity: ev.environment.clone(),
                max_timeout_ms: self.limits.project_max_timeout.as_millis() as u32,
                software_identity: ev.software_identity.clone(),
                languages: offer.project_languages,
            });
        }
        // Grants are stated only when some profile exists to name.
        let grants = !self.grants.is_empty();
        d.supports_javascript_grants = grants && offer.javascript_grants;
        d.supports_project_grants = grants && offer.project_grants;
        let settings = &self.sessions.settings;
        if let Some(so) = self.provider.session_offer().filter(|_| settings.enabled()) {
            d.supports_sessions = true;
            d.session_lifetime_ms =
                u32::try_from(settings.lifetime.as_millis()).unwrap_or(u32::MAX);
            d.session_idle_timeout_ms =
                u32::try_from(settings.idle.as_millis()).unwrap_or(u32::MAX);
            d.session_environment = Some(PayloadEnvironment {
                identity: ev.environment.clone(),
                max_timeout_ms: self.limits.project_max_timeout.as_millis() as u32,
                software_identity: so
                    .software_identity
                    .clone()
                    .unwrap_or_else(|| ev.software_identity.clone()),
                languages: so.cell_languages.clone(),
            });
            d.max_sessions_per_caller = settings.max_per_caller;
            d.max_sessions_per_owner = settings.max_per_owner;
        }
        d.resources = self.provider.resources().map(|r| RunResources {
            memory_mb: r.memory_mb,
            cpus: r.cpus,
            pids: r.pids,
            disk_mb: r.disk_mb,
        });
        d.runtime = self.provider.runtime().unwrap_or_default();
        d.policy = ev.policy;
        d
    }

    /// One `Run` call for an authenticated caller, from parsed request to
    /// sealed answer.
    ///
    /// Everything from admission on runs in a task of its own, which the
    /// caller only waits for: if the caller goes away (a dropped connection
    /// cancels the HTTP handler), the run that was admitted still holds its
    /// slot until it ends, and its audit line is still written. A run is
    /// never left executing without being counted and recorded.
    pub async fn run(
        self: &Arc<Self>,
        req: RunRequest,
        caller: Arc<Caller>,
    ) -> Result<RunResponse, RunError> {
        self.run_watched(req, caller, None).await
    }

    /// `run`, with the run's output also sent to `live` as the provider
    /// keeps it (where the provider can pass output on early). Every check,
    /// the record and the audit line are exactly `run`'s.
    pub async fn run_watched(
        self: &Arc<Self>,
        req: RunRequest,
        caller: Arc<Caller>,
        live: Option<Live>,
    ) -> Result<RunResponse, RunError> {
        // 1. The request on its own: malformed or out of bounds is `request`.
        let checked = admission::validate(&req, &self.limits)?;

        // 2. What this daemon can do at all.
        if let Some(refusal) = self.provider.refuses_everything() {
            return Err(refusal.into());
        }
        let offer = self.provider.offer();
        let work = match &checked.payload {
            admission::Payload::JavaScript {
                code,
                grant_profile,
            } if offer.javascript => Work {
                payload: Payload::JavaScript(code.clone()),
                profile: self.grant_for(grant_profile, false, &caller.id)?,
            },
            admission::Payload::Project(p) if offer.project => Work {
                profile: self.grant_for(&p.grant_profile, true, &caller.id)?,
                payload: Payload::Project(ProjectInput::from(p)),
            },
            admission::Payload::Cell(_) => {
                // validate() refuses a cell outside a session already.
                return Err(Refusal::request("a cell runs only inside a session").into());
            }
            payload => {
                return Err(Refusal::unsupported(format!(
                    "the {} provider does not run {} payloads",
                    self.provider.evidence().sandbox,
                    payload.kind()
                ))
                .into());
            }
        };

        // 3. Admission: a daemon slot, then the caller's limits (so a full
        //    daemon spends nobody's rate), now or a capacity refusal now (no
        //    queue). A metered run reserves its whole budget of paid
        //    seconds up front and is refunded what it did not use.
        let shed = |why: Shed| self.shed_for(why);
        let slot = self
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| shed(Shed::AtCapacity))?;
        let reserved = checked.timeout.as_millis().div_ceil(1000) as u64;
        let caller_slot = self
            .quotas
            .admit(&caller.id, caller.paid_seconds_per_day, reserved)
            .await
            .map_err(shed)?;

        let daemon = self.clone();
        let task = own_task("run", async move {
            let _slot = slot;
            let _inflight = InFlight::new(&daemon.metrics);
            let started = Instant::now();
            let answer = daemon.admitted(req, checked, work, &caller, live).await;
            // Nothing for a run refused before it ran.
            let used = match &answer {
                Err(RunError::Refused(_)) => std::time::Duration::ZERO,
                _ => started.elapsed(),
            };
            caller_slot.settle(used).await;
            if matches!(answer, Err(RunError::Internal { .. })) {
                daemon.metrics.runs_failed.inc();
            }
            answer
        });
        task.await.unwrap_or_else(|failed| Err(internal(failed)))
    }

    /// Steps 4 to 6 of a run that holds a slot.
    async fn admitted(
        &self,
        req: RunRequest,
        checked: admission::Checked,
        work: Work,
        caller: &Caller,
        live: Option<Live>,
    ) -> Result<RunResponse, RunError> {
        // 4. The wall: current evidence against the floor and the software
        //    rule, immediately before dispatch.
        let ev = self.provider.evidence();
        floor::check(checked.floor, req.software_rule.as_ref(), &ev)?;

        // The run's credential is minted here, after every check and
        // immediately before dispatch; it lives in the session only.
        let grant = self.mint_grant(work.profile, &caller.id, checked.timeout)?;

        // 5 and 6. Dispatch, the answer and its record.
        let work = Admitted {
            req: &req,
            checked: &checked,
            evidence: &ev,
            caller: &caller.id,
            payload: work.payload,
            grant,
            live,
        };
        match self
            .dispatch(work, Target::Run(self.provider.as_ref()))
            .await
        {
            Ok(sealed) => Ok(sealed.response),
            Err(Undone::Refused(refusal)) => Err(refusal.into()),
            Err(Undone::MayHaveRun { id, detail }) => Err(RunError::Internal { id, detail }),
        }
    }
}

/// Counts a run in the in-flight gauge for as long as it lives, whatever
/// path it leaves by.
struct InFlight(prometheus::IntGauge);

impl InFlight {
    fn new(m: &Metrics) -> InFlight {
        m.inflight.inc();
        InFlight(m.inflight.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// What a run will do, once step 2 accepted it.
struct Work {
    payload: Payload,
    profile: Option<Arc<Profile>>,
}

/// `work` in a task of its own, which the caller only waits for: a caller
/// that goes away cannot cut an admitted run, a session call or a close
/// short. Err is what a failed task (a panic) left, for an internal error.
pub(crate) async fn own_task<T: Send + 'static>(
    what: &str,
    work: impl Future<Output = T> + Send + 'static,
) -> Result<T, String> {
    tokio::spawn(work)
        .await
        .map_err(|join| format!("{what} task failed: {join}"))
}

fn internal(detail: String) -> RunError {
    let id = internal_id(&detail);
    RunError::Internal { id, detail }
}

/// Logs an internal error's detail under a fresh ID, which the caller's
/// answer carries: the join between the two, and nothing more.
pub(crate) fn internal_id(detail: &str) -> String {
    let mut id = [0u8; 8];
    // Without randomness the ID is only a join key; zeros still answer.
    let _ = getrandom::fill(&mut id);
    let id = hex::encode(id);
    tracing::error!(error_id = %id, detail = %crate::text::truncate(detail, 4096), "internal error during a run");
    id
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
