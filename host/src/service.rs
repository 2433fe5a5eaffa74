//! The run pipeline, independent of HTTP: validate, admit, check the floor
//! against current evidence, dispatch to the provider, seal the record.
//!
//! The order is the security argument. Everything that can refuse a run does
//! so before `dispatch`, and each refusal is a typed `Refusal` (nothing ran).
//! The isolation floor is compared with the provider's evidence as the very
//! last step before the provider is called, after admission, so no wait in a
//! queue can sit between the check and the run.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Semaphore;

use crate::admission::{self, Limits};
use crate::callers::Caller;
use crate::grants::{Grants, Profile, broker};
use crate::metrics::Metrics;
use crate::plugins::{self, ProjectOutput};
use crate::providers::{Evidence, ProcessOutput, Provider, RunFailure};
use crate::quota::{QuotaSettings, Quotas, Shed};
use crate::record;
use crate::refusal::{Code, Reason, Refusal};
use crate::tier::Tier;
use crate::wire::{
    Artifact, B64, DescribeResponse, I64, JavaScriptResult, PROTOCOL, PayloadEnvironment,
    ProjectOutcome, ProjectResult, ProjectRun, RunRequest, RunResources, RunResponse, StepResult,
};

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
    provider: Arc<Provider>,
    limits: Limits,
    in_flight: Arc<Semaphore>,
    grants: Arc<Grants>,
    /// The broker's upstream client: no redirects, no proxy. None if it
    /// could not be built, and then every grant is refused.
    broker_client: Option<reqwest::Client>,
    quotas: Arc<Quotas>,
    metrics: Arc<Metrics>,
}

/// Everything a daemon is built from besides its provider.
pub struct Options {
    pub limits: Limits,
    pub grants: Arc<Grants>,
    pub quotas: QuotaSettings,
    pub metrics: Arc<Metrics>,
}

impl Daemon {
    pub fn with(provider: Provider, o: Options) -> Self {
        let in_flight = Arc::new(Semaphore::new(o.limits.max_concurrent as usize));
        let broker_client = match crate::plugins::http::client() {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::error!(error = %e, "the broker's HTTP client could not be built; grants are refused");
                None
            }
        };
        Daemon {
            provider: Arc::new(provider),
            limits: o.limits,
            in_flight,
            grants: o.grants,
            broker_client,
            quotas: Quotas::new(o.quotas),
            metrics: o.metrics,
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The profile a request names, if this caller may use it and this
    /// provider can carry it; an unknown profile, a forbidden one and one
    /// the provider cannot carry get the same answer.
    fn grant_for(
        &self,
        name: &str,
        project: bool,
        caller: &str,
    ) -> Result<Option<Arc<Profile>>, Refusal> {
        if name.is_empty() {
            return Ok(None);
        }
        let carries = match &*self.provider {
            Provider::Wasm(_) => !project,
            Provider::Plugin(p) => p.engine().is_some(),
            Provider::Disabled => false,
        };
        match self.grants.for_caller(name, caller) {
            Some(p) if carries => Ok(Some(p)),
            _ => Err(Refusal::permission(
                "grant profile is unknown or not permitted for this caller",
            )),
        }
    }

    pub fn evidence(&self) -> Evidence {
        self.provider.evidence()
    }

    /// Releases what the provider holds that would outlive the process
    /// (warm containers), before a clean exit.
    pub async fn shutdown(&self) {
        if let Provider::Plugin(p) = &*self.provider
            && let Some(e) = p.engine()
        {
            e.shutdown().await;
        }
    }

    /// Whether runs can be dispatched now (for /readyz): checked afresh.
    pub async fn check_ready(&self) -> Result<(), String> {
        match &*self.provider {
            Provider::Plugin(p) => p.check_ready().await,
            Provider::Disabled | Provider::Wasm(_) => Ok(()),
        }
    }

    pub fn describe(&self) -> DescribeResponse {
        let ev = self.provider.evidence();
        let mut d = DescribeResponse {
            sandbox: ev.sandbox.clone(),
            isolation: ev.tier.as_str().to_string(),
            protocol: PROTOCOL,
            ..Default::default()
        };
        if self.provider.runs_javascript() {
            d.javascript_environment = Some(PayloadEnvironment {
                identity: ev.environment.clone(),
                max_timeout_ms: self.limits.max_timeout.as_millis() as u32,
                software_identity: ev.software_identity.clone(),
                languages: vec!["javascript".to_string()],
            });
        }
        if self.provider.runs_project() {
            d.supports_project = true;
            let languages = match &*self.provider {
                Provider::Plugin(p) => p.described().languages.clone(),
                _ => vec![],
            };
            d.project_environment = Some(PayloadEnvironment {
                identity: ev.environment.clone(),
                max_timeout_ms: self.limits.project_max_timeout.as_millis() as u32,
                software_identity: ev.software_identity.clone(),
                languages,
            });
        }
        match &*self.provider {
            Provider::Wasm(w) => {
                d.resources = Some(RunResources {
                    memory_mb: (w.memory_limit() >> 20) as u32,
                    ..Default::default()
                });
            }
            Provider::Plugin(p) => {
                if let Some(e) = p.engine() {
                    let s = e.settings();
                    d.resources = Some(RunResources {
                        memory_mb: s.memory_mb,
                        cpus: s.nano_cpus as f64 / 1e9,
                        pids: u32::try_from(s.pids).unwrap_or(0),
                        disk_mb: s.disk_mb,
                    });
                }
            }
            Provider::Disabled => {}
        }
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
        // 1. The request on its own: malformed or out of bounds is `request`.
        let checked = admission::validate(&req, &self.limits)?;

        // 2. What this daemon can do at all.
        let work = match (&*self.provider, &checked.payload) {
            (Provider::Disabled, _) => {
                return Err(Refusal::new(
                    Code::FailedPrecondition,
                    Reason::Unsupported,
                    "no provider is configured (SANDBOX_PROVIDER is unset): this daemon runs nothing",
                )
                .into());
            }
            (
                _,
                admission::Payload::JavaScript {
                    code,
                    grant_profile,
                },
            ) if self.provider.runs_javascript() => Work::JavaScript(
                code.clone(),
                self.grant_for(grant_profile, false, &caller.id)?,
            ),
            (_, admission::Payload::Project(p)) if self.provider.runs_project() => Work::Project(
                p.clone(),
                self.grant_for(&p.grant_profile, true, &caller.id)?,
            ),
            (provider, payload) => {
                return Err(Refusal::unsupported(format!(
                    "the {} provider does not run {} payloads",
                    provider.evidence().sandbox,
                    payload.kind()
                ))
                .into());
            }
        };

        // 3. Admission: a daemon slot, then the caller's limits (so a full
        //    daemon spends nobody's rate), now or a capacity refusal now (no
        //    queue). A metered run reserves its whole budget of paid
        //    seconds up front and is refunded what it did not use.
        let shed = |why: Shed| {
            self.metrics.shed.with_label_values(&[why.label()]).inc();
            Refusal::capacity(why.text())
        };
        let slot = self
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| shed(Shed::AtCapacity))?;
        let reserved = checked.timeout.as_millis().div_ceil(1000) as u64;
        let caller_slot = self
            .quotas
            .admit(&caller.id, caller.paid_seconds_per_day, reserved)
            .map_err(shed)?;

        let daemon = self.clone();
        let task = tokio::spawn(async move {
            let _slot = slot;
            let _caller_slot = caller_slot;
            let _inflight = InFlight::new(&daemon.metrics);
            let started = Instant::now();
            let answer = daemon.admitted(req, checked, work, &caller).await;
            // Whole seconds, and nothing for a run refused before it ran.
            let used = match &answer {
                Err(RunError::Refused(_)) => 0,
                _ => started.elapsed().as_millis().div_ceil(1000) as u64,
            };
            daemon.quotas.settle(&caller.id, reserved, used);
            if matches!(answer, Err(RunError::Internal { .. })) {
                daemon.metrics.runs_failed.inc();
            }
            answer
        });
        match task.await {
            Ok(answer) => answer,
            Err(join) => Err(internal(format!("run task failed: {join}"))),
        }
    }

    /// Steps 4 to 6 of a run that holds a slot.
    async fn admitted(
        &self,
        req: RunRequest,
        checked: admission::Checked,
        work: Work,
        caller: &Caller,
    ) -> Result<RunResponse, RunError> {
        // 4. The wall: current evidence against the floor and the software
        //    rule, immediately before dispatch.
        let ev = self.provider.evidence();
        check_floor(checked.floor, ev.tier)?;
        if let Some(rule) = &req.software_rule
            && (ev.software_identity.is_empty() || !rule.identities.contains(&ev.software_identity))
        {
            return Err(Refusal::environment(
                "the provider's software is not in the request's software rule",
            )
            .into());
        }

        // The run's credential is minted here, after every check and
        // immediately before dispatch; it lives in the session only.
        let profile = match &work {
            Work::JavaScript(_, p) | Work::Project(_, p) => p.clone(),
        };
        let session = match (profile, &self.broker_client) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(
                    Refusal::environment("the broker is not available on this daemon").into(),
                );
            }
            (Some(p), Some(client)) => Some(Arc::new(
                broker::Session::open(p, &caller.id, checked.timeout, client.clone()).map_err(
                    |_| Refusal::environment("the grant's credential could not be minted"),
                )?,
            )),
        };

        // 5. Dispatch.
        self.metrics.runs.inc();
        let started_wall = unix_ms();
        let started = Instant::now();
        let op = work.kind();
        let dispatched = match work {
            Work::JavaScript(code, _) => self
                .dispatch_javascript(code, checked.timeout, session.clone())
                .await
                .map(Answer::JavaScript),
            Work::Project(p, _) => self
                .dispatch_project(p, checked.timeout, session.clone())
                .await
                .map(Answer::Project),
        };
        let call_trace = session.as_ref().map(|s| s.trace());
        let grant_profile = session.as_ref().map(|s| s.profile().name.clone());
        if let (Some(t), Some(p)) = (&call_trace, &grant_profile) {
            self.metrics.record_calls(p, t);
        }
        let (host_calls, host_calls_denied, host_calls_shed) =
            call_trace.as_ref().map_or((0, 0, 0), |t| {
                (t.calls.len() as u32 + t.dropped, t.denied, t.shed)
            });
        let elapsed_ms = started.elapsed().as_millis() as i64;
        let code_bytes = req.javascript.as_ref().map_or(0, |j| j.code.len());
        let trace_id = checked.trace_id.as_deref().unwrap_or("");
        // One audit line per dispatched run, whatever became of it: a run
        // that failed after it may have started is audited like any other.
        // A project's sizes: counts and bytes, never names or contents.
        let (files, steps, total_bytes) = req.project.as_ref().map_or((None, None, None), |p| {
            (
                Some(p.files.len()),
                Some(p.steps.len()),
                Some(p.files.iter().map(|f| f.content.len()).sum::<usize>()),
            )
        });
        let audit = |exit_code: Option<i32>,
                     timed_out: Option<bool>,
                     error_id: Option<&str>,
                     outcome: Option<&str>| {
            tracing::info!(
                target: "plimsoll::audit",
                op,
                caller = caller.id.as_str(),
                sandbox = ev.sandbox.as_str(),
                isolation = ev.tier.as_str(),
                duration_ms = elapsed_ms,
                code_bytes,
                files,
                steps,
                total_bytes,
                outcome,
                exit_code,
                timed_out,
                error_id,
                trace_id,
                trace_id_rejected = checked.trace_id_rejected,
                grant_profile = grant_profile.as_deref(),
                host_calls,
                host_calls_denied,
                host_calls_shed,
                "code run"
            );
        };
        let output = match dispatched {
            Ok(out) => out,
            Err(e) => {
                if let RunError::Internal { id, .. } = &e {
                    audit(None, None, Some(id.as_str()), None);
                }
                return Err(e);
            }
        };

        // 6. The answer and its record.
        let (javascript, project, result_digest, exit_code, timed_out) = match output {
            Answer::JavaScript(output) => {
                let result = JavaScriptResult {
                    stdout: B64(output.stdout),
                    stderr: B64(output.stderr),
                    exit_code: output.exit_code,
                    timed_out: output.timed_out,
                    stdout_truncated: output.stdout_truncated,
                    stderr_truncated: output.stderr_truncated,
                    call_trace: call_trace.clone(),
                };
                let digest = record::javascript_result_digest(&result);
                let (code, t) = (result.exit_code, result.timed_out);
                (Some(result), None, digest, code, t)
            }
            Answer::Project(p) => {
                let mut result = project_result(p);
                result.call_trace = call_trace.clone();
                let digest = record::project_result_digest(&result);
                // The audit line's exit code for a project is its last
                // step's; timed out is the outcome's.
                let code = result.steps.last().map_or(0, |s| s.exit_code);
                let t = result.outcome == ProjectOutcome::TimedOut;
                (None, Some(result), digest, code, t)
            }
        };
        let rec = record::seal(
            record::request_digest(&req),
            result_digest,
            req.software_rule.as_ref(),
            &record::Evidence {
                provider: &ev.sandbox,
                isolation: ev.tier.as_str(),
                environment: &ev.environment,
                policy: &ev.policy,
                software_identity: &ev.software_identity,
                instance: "",
            },
            started_wall,
            started_wall + elapsed_ms,
        );
        let outcome = project.as_ref().map(|p| p.outcome.name());
        audit(Some(exit_code), Some(timed_out), None, outcome);
        Ok(RunResponse {
            sandbox: ev.sandbox.clone(),
            isolation: ev.tier.as_str().to_string(),
            duration_ms: I64(elapsed_ms),
            record: rec,
            software_identity: ev.software_identity.clone(),
            environment: ev.environment.clone(),
            instance: String::new(),
            javascript,
            project,
        })
    }

    async fn dispatch_project(
        &self,
        p: ProjectRun,
        timeout: Duration,
        grant: Option<Arc<broker::Session>>,
    ) -> Result<ProjectOutput, RunError> {
        let Provider::Plugin(plugin) = &*self.provider else {
            // Unreachable by construction (checked in `run`).
            return Err(Refusal::unsupported("no provider for this dispatch path").into());
        };
        let payload = plugins::ProjectPayloadIn {
            files: p.files.into_iter().map(|f| (f.path, f.content)).collect(),
            steps: p.steps,
            artifacts: p.artifacts,
        };
        plugin
            .run_project(payload, timeout, self.limits.output_limit, grant)
            .await
            .map_err(failed)
    }

    async fn dispatch_javascript(
        &self,
        code: String,
        timeout: Duration,
        grant: Option<Arc<broker::Session>>,
    ) -> Result<ProcessOutput, RunError> {
        if let Provider::Plugin(p) = &*self.provider {
            // Plugins are async all the way down: no blocking thread.
            return p
                .run_javascript(code, timeout, self.limits.output_limit, grant)
                .await
                .map_err(failed);
        }
        let provider = self.provider.clone();
        let handle = tokio::runtime::Handle::current();
        let joined = tokio::task::spawn_blocking(move || match &*provider {
            Provider::Wasm(w) => w.run_granted(&code, timeout, grant.map(|s| (s, handle))),
            // Unreachable by construction (checked in `run`); answered as a
            // refusal rather than a panic all the same.
            Provider::Disabled | Provider::Plugin(_) => Err(RunFailure::NotDispatched(
                Refusal::unsupported("no provider for this dispatch path"),
            )),
        })
        .await;
        match joined {
            Ok(answer) => answer.map_err(failed),
            Err(join) => Err(internal(format!("run task failed: {join}"))),
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
enum Work {
    JavaScript(String, Option<Arc<Profile>>),
    Project(ProjectRun, Option<Arc<Profile>>),
}

impl Work {
    fn kind(&self) -> &'static str {
        match self {
            Work::JavaScript(..) => "javascript",
            Work::Project(..) => "project",
        }
    }
}

enum Answer {
    JavaScript(ProcessOutput),
    Project(ProjectOutput),
}

fn project_result(p: ProjectOutput) -> ProjectResult {
    ProjectResult {
        steps: p
            .steps
            .into_iter()
            .map(|s| StepResult {
                command: s.command,
                stdout: B64(s.output.stdout),
                stderr: B64(s.output.stderr),
                exit_code: s.output.exit_code,
                timed_out: s.output.timed_out,
                duration_ms: I64(i64::try_from(s.duration_ms).unwrap_or(i64::MAX)),
                stdout_truncated: s.output.stdout_truncated,
                stderr_truncated: s.output.stderr_truncated,
            })
            .collect(),
        outcome: match p.outcome {
            plugins::ProjectOutcome::Completed => ProjectOutcome::Completed,
            plugins::ProjectOutcome::SetupFailed => ProjectOutcome::SetupFailed,
            plugins::ProjectOutcome::TimedOut => ProjectOutcome::TimedOut,
            plugins::ProjectOutcome::ProtocolError => ProjectOutcome::ProtocolError,
        },
        outcome_detail: p.outcome_detail,
        artifacts: p
            .artifacts
            .into_iter()
            .map(|(path, content)| Artifact {
                path,
                content: B64(content),
            })
            .collect(),
        artifacts_truncated: p.artifacts_truncated,
        call_trace: None,
    }
}

/// The floor check. `None` is no floor. Below the floor nothing runs.
pub fn check_floor(floor: Option<Tier>, current: Tier) -> Result<(), Refusal> {
    match floor {
        Some(f) if !current.meets(f) => Err(Refusal::new(
            Code::FailedPrecondition,
            Reason::Isolation,
            format!("the provider's isolation is {current}, below the requested minimum {f}"),
        )),
        _ => Ok(()),
    }
}

/// A provider's failure as the API answers it: a refusal stays marked,
/// anything that may have run becomes an unmarked internal error.
fn failed(f: RunFailure) -> RunError {
    match f {
        RunFailure::NotDispatched(r) => r.into(),
        RunFailure::MayHaveRun(detail) => internal(detail),
    }
}

fn internal(detail: String) -> RunError {
    let mut id = [0u8; 8];
    // Without randomness the ID is only a join key; zeros still answer.
    let _ = getrandom::fill(&mut id);
    let id = hex::encode(id);
    tracing::error!(error_id = %id, detail = %crate::text::truncate(&detail, 4096), "internal error during a run");
    RunError::Internal { id, detail }
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_below_evidence_refuses_with_isolation() {
        let r = check_floor(Some(Tier::Vm), Tier::Process).expect_err("refused");
        assert_eq!(r.reason, Reason::Isolation);
        assert_eq!(r.code, Code::FailedPrecondition);
        assert!(check_floor(Some(Tier::Process), Tier::Process).is_ok());
        assert!(check_floor(None, Tier::None).is_ok());
        assert!(check_floor(Some(Tier::Process), Tier::None).is_err());
    }
}
