//! The plugin host: provider adapters loaded as Wasm components, each
//! running in wasmtime with only the capabilities the operator granted it.
//!
//! The host stays in charge of everything the security promises rest on:
//! - what a plugin can reach (`capabilities`): every capability is linked,
//!   each refuses a plugin the operator did not grant it, and a plugin whose
//!   component *imports* an ungranted capability is refused at start
//!   (`load`);
//! - the tier (`results::effective_tier`): the plugin states one, the host
//!   caps it with what the operator allows and what a container backend's
//!   evidence stands behind;
//! - the not-dispatched mark (`dispatch_mark`): a refusal is marked only if
//!   the host saw the plugin use no capability that could have started
//!   execution;
//! - containment (`call`): every call gets a fresh store (fresh instance,
//!   fresh memory) with an epoch deadline and a memory cap, so a plugin that
//!   traps, loops, panics or exhausts memory fails that call and nothing
//!   else; and everything it passes or returns is copied under a budget
//!   (`lazy`).

pub mod bindings;
pub mod call;
pub mod capabilities;
pub mod config_file;
pub mod dispatch_mark;
mod error;
mod lazy;
pub mod load;
mod plugin_file;
pub mod results;
pub mod session;
pub mod settings;
pub mod strings;

use std::sync::Arc;
use std::time::Duration;

use crate::job::{Job, Kind, Output, Payload};
use crate::outcome::{CellOutput, NotReady, ProjectOutput, RunFailure};
use crate::refusal::Refusal;
use crate::text::sanitize;
use crate::tier::Tier;
use bindings::types;
use call::Runner;
use capabilities::container_engine::backend::ContainerBackend;
pub use error::PluginError;
pub use plugin_file::{PluginSource, locate, name_shape};

/// Extra time a run call gets over the run's own budget, for the plugin's
/// set-up and tear-down around it.
const CALL_MARGIN: Duration = Duration::from_secs(2);
/// Longest plugin-supplied message passed on to a caller.
const MESSAGE_BYTES: usize = 512;

/// What a loaded plugin stated about itself, after the host's checks.
#[derive(Debug, Clone)]
pub struct Described {
    pub claimed_tier: Tier,
    pub environment: String,
    /// The configuration keys the plugin declared.
    pub config: Vec<capabilities::config_keys::Declared>,
    pub runs_javascript: bool,
    pub runs_project: bool,
    pub languages: Vec<String>,
    /// What the plugin's sessions run, when it has sessions.
    pub sessions: Option<SessionSupport>,
}

/// What a plugin states its sessions run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSupport {
    pub javascript: bool,
    pub project: bool,
    /// Only languages the plugin's smoke test proved present.
    pub cell_languages: Vec<String>,
}

/// A plugin that loaded, described itself and passed its smoke test.
pub struct PluginProvider {
    runner: Arc<Runner>,
    sha256: String,
    described: Described,
    tier: Tier,
}

impl PluginProvider {
    pub fn name(&self) -> &str {
        &self.runner.name
    }

    pub fn tier(&self) -> Tier {
        self.tier
    }

    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    pub fn described(&self) -> &Described {
        &self.described
    }

    /// The container backend, when this plugin drives one.
    pub fn backend(&self) -> Option<&Arc<dyn ContainerBackend>> {
        self.runner
            .granted
            .container_engine
            .as_ref()
            .map(|e| &e.backend)
    }

    /// Whether this plugin can carry a grant into a hosted sandbox: it
    /// imports `grant`, and the daemon has a guard for it to hand out.
    pub fn carries_hosted_grants(&self) -> bool {
        self.runner.imports_grant && self.runner.granted.guard.is_some()
    }

    /// The last readiness verdict, without asking the backend.
    pub fn ready(&self) -> Result<(), NotReady> {
        self.backend().map_or(Ok(()), |b| b.ready())
    }

    /// Runs one job through the plugin. The output the plugin returns is
    /// read in place and capped here: the host never trusts a plugin to keep
    /// to a limit it could enforce itself, and never copies more than the
    /// cap out of the plugin's memory.
    pub async fn run(&self, job: Job) -> Result<Output, RunFailure> {
        let Job {
            payload,
            timeout,
            output_limit,
            grant,
            live,
        } = job;
        let asked = payload.kind();
        // A project's output reaches the caller through the plugin's report,
        // at its end: nothing is streamed.
        let live = live.filter(|_| asked != Kind::Project);
        let payload = wit_payload(payload);
        // A plugin whose backend is not ready never gets the run: nothing is
        // dispatched, and the refusal says why.
        if let Err(why) = self.ready() {
            return Err(RunFailure::NotDispatched(Refusal::environment(format!(
                "the provider is not ready ({})",
                why.code
            ))));
        }
        let runner = &self.runner;
        let deadline = timeout + CALL_MARGIN;
        let mut store = runner.store(deadline);
        // The report keeps only the artifacts this request names.
        if let types::Payload::Project(p) = &payload {
            store.data_mut().report.expect_artifacts(&p.artifacts);
        }
        let request = types::RunRequest {
            timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
            output_limit: u32::try_from(output_limit).unwrap_or(u32::MAX),
            payload,
        };
        store.data_mut().report.output_limit = output_limit;
        store.data_mut().call.grant = grant;
        store.data_mut().call.live = live;
        let outcome = runner
            .call::<(types::RunRequest,), (Result<types::RunResult, types::RunError>,)>(
                &mut store,
                deadline,
                runner.exports.run,
                (request,),
            )
            .await
            .map(|r| r.map(|(r,)| r));
        store.data().log.report_dropped();
        store.data().report.report_unrequested(self.name());
        let name = self.name();
        match outcome {
            Ok(Ok(Ok(result))) => {
                answered(name, asked, result_of(result, &mut store, output_limit))
            }
            Ok(Ok(Err(e))) => Err(error_of(name, e, &store)),
            Ok(Err(e)) => Err(store
                .data()
                .call
                .mark
                .failed(name, &call::classify(&e, &store))),
            Err(_) => Err(store
                .data()
                .call
                .mark
                .failed(name, "the call overran its deadline")),
        }
    }
}

/// A plugin's error in the host's terms: a refusal is repeated only if the
/// host saw nothing that could have started execution; a plugin's own
/// text about a failure is not passed on.
fn error_of(
    name: &str,
    e: types::RunError,
    store: &wasmtime::Store<call::PluginState>,
) -> RunFailure {
    match e {
        types::RunError::MayHaveRun(_) => RunFailure::MayHaveRun(format!(
            "plugin {name} reported that the run may have happened (its detail is not logged)"
        )),
        types::RunError::NotDispatched(r) => {
            store.data().call.mark.refused(name, results::refusal_of(r))
        }
    }
}

/// A plugin's result in the host's terms: outputs held to the run's limit,
/// a project's steps and artifacts from what the host kept of its report.
fn result_of(
    result: types::RunResult,
    store: &mut wasmtime::Store<call::PluginState>,
    output_limit: usize,
) -> Output {
    match result {
        types::RunResult::Javascript(out) => {
            Output::JavaScript(results::cap_output(out, output_limit))
        }
        types::RunResult::Project(summary) => {
            let report = std::mem::take(&mut store.data_mut().report);
            Output::Project(ProjectOutput {
                steps: report.steps,
                outcome: results::outcome_of(summary.outcome),
                outcome_detail: sanitize(&summary.outcome_detail, MESSAGE_BYTES),
                artifacts: report.artifacts,
                artifacts_truncated: summary.artifacts_truncated || report.refused_artifacts,
            })
        }
        types::RunResult::Cell(c) => Output::Cell(CellOutput {
            output: results::cap_output(c.output, output_limit),
            interpreter_started: c.interpreter_started,
            interpreter_ended: c.interpreter_ended,
        }),
    }
}

/// The payload in the plugin's terms: the one conversion, for runs and
/// session calls alike.
fn wit_payload(p: Payload) -> types::Payload {
    let files = |files: Vec<(String, String)>| {
        files
            .into_iter()
            .map(|(path, content)| types::ProjectFile { path, content })
            .collect()
    };
    match p {
        Payload::JavaScript(code) => types::Payload::Javascript(code),
        Payload::Project(p) => types::Payload::Project(types::ProjectPayload {
            files: files(p.files),
            steps: p.steps,
            artifacts: p.artifacts,
        }),
        Payload::Cell(c) => types::Payload::Cell(types::CellPayload {
            language: if c.language == "python" {
                types::Language::Python
            } else {
                types::Language::Javascript
            },
            code: c.code,
            files: files(c.files),
        }),
    }
}

/// A result of the kind asked for, or the plugin answered something else
/// (after the call ran: it may have happened).
fn answered(name: &str, asked: Kind, out: Output) -> Result<Output, RunFailure> {
    if out.kind() == asked {
        return Ok(out);
    }
    let what = match asked {
        Kind::JavaScript => "a snippet",
        Kind::Project => "a project",
        Kind::Cell => "a cell",
    };
    Err(RunFailure::MayHaveRun(format!(
        "plugin {name} answered {what} with another kind of result"
    )))
}
