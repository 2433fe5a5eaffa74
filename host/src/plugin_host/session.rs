//! A plugin's sessions, as the plugin host holds them.
//!
//! Every call of a session gets a fresh plugin instance, like a run; what
//! carries over is the host's: the plugin's opaque state (bounded, never
//! logged) and, for a container plugin, the session's `SessionSlot`, which
//! binds the container-engine's session functions to this session's
//! container only. Whether the session ended is the host's to say as well:
//! a container the host saw die ends it, whatever the plugin reports.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::bindings::types;
use super::call::{self, Runner};
use super::capabilities::container_engine::SessionSlot;
use super::{
    CALL_MARGIN, MESSAGE_BYTES, PluginProvider, answered, error_of, result_of, wit_payload,
};
use crate::job::{Ended, Job, Output, SessionOptions};
use crate::outcome::RunFailure;
use crate::refusal::Refusal;
use crate::text::sanitize;
use crate::wire::SessionEnd;

/// Longest state a plugin may keep for a session.
const MAX_STATE_BYTES: usize = 4096;
/// How long a plugin's close-session may take.
/// Below the 10 s shutdown gives each session, so the host still removes
/// the container itself after a plugin that used all of it.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(8);
/// Extra time a session call gets over its budget: a session's sandbox
/// stops the call at the budget and may need a moment more to answer (a
/// run's container is simply killed instead).
const SESSION_CALL_MARGIN: Duration = Duration::from_secs(3);

pub struct PluginSession {
    runner: Arc<Runner>,
    state: String,
    slot: Option<Arc<SessionSlot>>,
    ended: Mutex<Option<Ended>>,
}

impl PluginProvider {
    /// Opens a session's sandbox through the plugin.
    pub async fn open_session(&self, o: SessionOptions) -> Result<PluginSession, RunFailure> {
        if let Err(why) = self.ready() {
            return Err(RunFailure::NotDispatched(Refusal::environment(format!(
                "the provider is not ready ({})",
                why.code
            ))));
        }
        let runner = self.runner.clone();
        // A container session gets a broker directory when the daemon has
        // grants: its container is made once, so the mount must be there
        // from the start; it serves only while a granted call runs.
        let mount = match (self.backend(), o.grants) {
            (Some(b), true) => match SessionSlot::grant_mount(b.facts().guest_uid) {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::error!(error = %e, "making a session's broker directory failed");
                    return Err(RunFailure::NotDispatched(Refusal::environment(
                        "the session's broker directory could not be made",
                    )));
                }
            },
            _ => None,
        };
        let slot = runner
            .granted
            .container_engine
            .as_ref()
            .map(|_| SessionSlot::new(o.lifetime, mount));
        let deadline = o.open_timeout + CALL_MARGIN;
        let mut store = runner.store(deadline);
        store.data_mut().bind_session(slot.clone());
        let options = types::SessionOptions {
            languages: o
                .languages
                .iter()
                .filter_map(|l| match l.as_str() {
                    "javascript" => Some(types::Language::Javascript),
                    "python" => Some(types::Language::Python),
                    _ => None,
                })
                .collect(),
            lifetime_ms: u32::try_from(o.lifetime.as_millis()).unwrap_or(u32::MAX),
            timeout_ms: u32::try_from(o.open_timeout.as_millis()).unwrap_or(u32::MAX),
        };
        let outcome = runner
            .call::<(types::SessionOptions,), (Result<String, types::RunError>,)>(
                &mut store,
                deadline,
                runner.exports.open_session,
                (options,),
            )
            .await;
        if let Some(s) = &slot {
            s.opened();
        }
        store.data().log.report_dropped();
        let name = runner.name.clone();
        let failed = match outcome {
            Ok(Ok((Ok(state),))) if state.len() <= MAX_STATE_BYTES => {
                return Ok(PluginSession {
                    runner,
                    state,
                    slot,
                    ended: Mutex::new(None),
                });
            }
            Ok(Ok((Ok(_),))) => store.data().call.mark.failed(
                &name,
                &format!("it kept more than {MAX_STATE_BYTES} bytes of session state"),
            ),
            Ok(Ok((Err(e),))) => error_of(&name, e, &store),
            Ok(Err(e)) => store
                .data()
                .call
                .mark
                .failed(&name, &call::classify(&e, &store)),
            Err(_) => store
                .data()
                .call
                .mark
                .failed(&name, "opening the session overran its deadline"),
        };
        // The call is over: its store (and any request it left open) goes
        // first, then whatever it started for a session that did not open.
        drop(store);
        if let Some(s) = &slot {
            s.end().await;
        }
        Err(failed)
    }
}

fn end_of(e: types::SessionEnded) -> Ended {
    Ended {
        reason: match e.reason {
            types::SessionEndReason::MainProcessEnded => SessionEnd::MainProcessEnded,
            types::SessionEndReason::SandboxChanged => SessionEnd::SandboxChanged,
            types::SessionEndReason::Expired => SessionEnd::Expired,
        },
        detail: sanitize(&e.detail, MESSAGE_BYTES),
    }
}

impl PluginSession {
    /// The host's own observation decides over the plugin's report: a
    /// container the host saw die ends the session.
    fn observe(&self) {
        if let Some(slot) = &self.slot
            && !slot.alive()
        {
            self.note_end(Ended {
                reason: SessionEnd::MainProcessEnded,
                detail: "the session's container ended".into(),
            });
        }
    }

    fn note_end(&self, e: Ended) {
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        if ended.is_none() {
            *ended = Some(e);
        }
    }

    /// Runs one call of the session, in a fresh instance with the session's
    /// state and slot.
    pub async fn call(&self, job: Job) -> Result<Output, RunFailure> {
        let runner = &self.runner;
        let asked = job.payload.kind();
        let deadline = job.timeout + SESSION_CALL_MARGIN;
        // However this call ends (even dropped mid-way), the session's
        // broker directory stops serving its grant.
        struct EndCall<'a>(Option<&'a SessionSlot>);
        impl Drop for EndCall<'_> {
            fn drop(&mut self) {
                if let Some(s) = self.0 {
                    s.call_ended();
                }
            }
        }
        let _end = EndCall(self.slot.as_deref());
        let mut store = runner.store(deadline);
        store.data_mut().bind_session(self.slot.clone());
        store.data_mut().report.output_limit = job.output_limit;
        store.data_mut().call.grant = job.grant;
        let request = types::RunRequest {
            timeout_ms: u32::try_from(job.timeout.as_millis()).unwrap_or(u32::MAX),
            output_limit: u32::try_from(job.output_limit).unwrap_or(u32::MAX),
            payload: wit_payload(job.payload),
        };
        // The report keeps only the artifacts this request names.
        if let types::Payload::Project(p) = &request.payload {
            store.data_mut().report.expect_artifacts(&p.artifacts);
        }
        let outcome = runner
            .call::<(String, types::RunRequest), (Result<types::SessionAnswer, types::SessionFailure>,)>(
                &mut store,
                deadline,
                runner.exports.session_run,
                (self.state.clone(), request),
            )
            .await;
        store.data().log.report_dropped();
        store.data().report.report_unrequested(&runner.name);
        let name = runner.name.clone();
        let answer = match outcome {
            Ok(Ok((Ok(a),))) => {
                if let Some(e) = a.ended {
                    self.note_end(end_of(e));
                }
                answered(
                    &name,
                    asked,
                    result_of(a.outcome, &mut store, job.output_limit),
                )
            }
            Ok(Ok((Err(f),))) => {
                if let Some(e) = f.ended {
                    self.note_end(end_of(e));
                }
                Err(error_of(&name, f.error, &store))
            }
            Ok(Err(e)) => Err(store
                .data()
                .call
                .mark
                .failed(&name, &call::classify(&e, &store))),
            Err(_) => Err(store
                .data()
                .call
                .mark
                .failed(&name, "the session call overran its deadline")),
        };
        self.observe();
        answer
    }

    /// Why the session's sandbox ended by itself, if it did.
    pub fn ended(&self) -> Option<Ended> {
        self.observe();
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Ends the session: the plugin's close, then the host's own end of
    /// whatever the session's slot holds.
    pub async fn close(&self) {
        let runner = &self.runner;
        let mut store = runner.store(CLOSE_TIMEOUT);
        store.data_mut().bind_session(self.slot.clone());
        // The plugin's close is best effort; the host's end is not.
        let _ = runner
            .call::<(String,), ()>(
                &mut store,
                CLOSE_TIMEOUT,
                runner.exports.close_session,
                (self.state.clone(),),
            )
            .await;
        store.data().log.report_dropped();
        if let Some(slot) = &self.slot {
            slot.end().await;
        }
    }
}
