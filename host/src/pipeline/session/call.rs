//! SessionRun: one call in a caller's session.
//!
//! Refusals before the turn cost the session nothing. Once the call holds
//! the turn, the rest runs in a task of its own, so a caller that goes
//! away cannot cut a call between dispatch and its record: every call that
//! may have executed takes its place in the chain, answered or not.
//!
//! Before dispatch the session's evidence is checked again: the provider's
//! current evidence must still be what the session opened under, and the
//! provider still ready. If not, the call is refused and the session ends
//! (`sandbox_changed`): a session never continues on a weaker sandbox than
//! the one its caller accepted.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::{SessionError, ended_refusal, not_found};
use crate::admission::{self, Payload as Checked};
use crate::callers::Caller;
use crate::outcome::RunFailure;
use crate::pipeline::{Daemon, answer, audit::AuditLine, floor, internal_id};
use crate::providers::{CellInput, Ended, Job, Payload, ProjectInput};
use crate::record::{self, Link};
use crate::refusal::{Reason, Refusal};
use crate::sessions::{Entry, reaper};
use crate::wire::{RunRequest, SessionEnd, SessionRunRequest, SessionRunResponse, SoftwareRule};

impl Daemon {
    pub async fn session_run(
        self: &Arc<Self>,
        req: SessionRunRequest,
        caller: Arc<Caller>,
    ) -> Result<SessionRunResponse, SessionError> {
        let received = unix_ms();
        let (id, req) = req.into_run();
        // 1. The call on its own, then the session it names.
        let checked = admission::validate_in_session(&req, &self.limits)?;
        let entry = self.sessions.get(&id, &caller.id).ok_or_else(not_found)?;
        if let Some(ended) = entry.ended() {
            return Err(ended_refusal(ended, Reason::Request));
        }
        // 2. The session's rule cannot be dropped by a call: the call must
        //    carry it, or a narrower one, so its digest and record bind it.
        if !within(req.software_rule.as_ref(), entry.rule.as_ref()) {
            return Err(Refusal::request(
                "a session call must carry the software rule the session was opened with (or a narrower one)",
            )
            .into());
        }
        let (payload, profile_name) = self.session_payload(&entry, &checked.payload)?;
        let profile = match profile_name {
            None => None,
            Some(name) => Some(self.session_grant(&entry, &name, &caller.id, &checked.payload)?),
        };

        // 3. The turn: one call at a time, at most one waiting.
        let Some(mut turn) = entry.wait_turn().await else {
            return Err(Refusal::capacity(
                "another call is already waiting for this session's turn",
            )
            .into());
        };

        let daemon = self.clone();
        let task = tokio::spawn(async move {
            // 4. Under the turn: the end, the evidence, the wall, the rate.
            if let Some(ended) = entry.ended() {
                return Err(ended_refusal(ended, Reason::Request));
            }
            if let Some(ended) = turn.sandbox.as_ref().and_then(|s| s.ended()) {
                reaper::end(
                    &entry,
                    ended.reason,
                    ended.detail.clone(),
                    &daemon.metrics,
                    None,
                );
                return Err(ended_refusal(ended, Reason::Environment));
            }
            if let Err(why) = daemon.session_evidence_holds(&entry) {
                let ended = Ended {
                    reason: SessionEnd::SandboxChanged,
                    detail: why,
                };
                reaper::end(
                    &entry,
                    ended.reason,
                    ended.detail.clone(),
                    &daemon.metrics,
                    None,
                );
                return Err(ended_refusal(ended, Reason::Environment));
            }
            floor::check(checked.floor, req.software_rule.as_ref(), &entry.evidence)?;
            if let Err(why) = daemon.quotas.charge(&caller.id).await {
                daemon.metrics.shed.with_label_values(&[why.label()]).inc();
                return Err(Refusal::capacity(why.text()).into());
            }
            let grant = daemon.mint_grant(profile, &caller.id, checked.timeout)?;

            // 5. Dispatch, in the session's sandbox.
            let Some(sandbox) = turn.sandbox.as_ref() else {
                let ended = entry.ended().unwrap_or(Ended {
                    reason: SessionEnd::Closed,
                    detail: String::new(),
                });
                return Err(ended_refusal(ended, Reason::Request));
            };
            let link = Link {
                session: entry.fingerprint.clone(),
                sequence: turn.chain.calls + 1,
                previous: turn.chain.last.clone(),
            };
            daemon.metrics.session_calls.inc();
            let started_wall = unix_ms();
            let started = Instant::now();
            let dispatched = sandbox
                .run(Job {
                    live: None,
                    payload,
                    timeout: checked.timeout,
                    output_limit: daemon.limits.output_limit,
                    grant: grant.clone(),
                })
                .await;
            let elapsed_ms = started.elapsed().as_millis() as i64;
            let ended = sandbox.ended();
            let call_trace = grant.as_ref().map(|s| s.trace());
            let grant_name = grant.as_ref().map(|s| s.profile().name.clone());
            if let (Some(t), Some(p)) = (&call_trace, &grant_name) {
                daemon.metrics.record_calls(p, t);
            }
            let audit = AuditLine::new(
                checked.payload.kind(),
                &caller.id,
                &entry.evidence,
                &req,
                checked.trace_id.as_deref().unwrap_or(""),
                checked.trace_id_rejected,
                elapsed_ms,
            )
            .with_grant(grant_name.as_deref(), call_trace.as_ref())
            .with_session(&entry.fingerprint, link.sequence);

            // 6. The answer, or the unanswered record, in the chain.
            let answer = match dispatched {
                Ok(output) => {
                    let sealed = answer::seal(
                        &req,
                        &entry.evidence,
                        output,
                        call_trace,
                        (started_wall, elapsed_ms),
                        Some(&link),
                    );
                    audit.answered(sealed.exit_code, sealed.timed_out, sealed.outcome);
                    turn.chain.calls = link.sequence;
                    turn.chain.last = sealed.response.record.record_sha256.clone();
                    let (reason, detail) = ended
                        .as_ref()
                        .map_or((SessionEnd::Open, String::new()), |e| {
                            (e.reason, e.detail.clone())
                        });
                    Ok(SessionRunResponse {
                        run: sealed.response,
                        ended: reason,
                        end_detail: detail,
                    })
                }
                Err(RunFailure::NotDispatched(refusal)) => Err(SessionError::Refused {
                    refusal,
                    ended: ended.clone(),
                }),
                Err(RunFailure::MayHaveRun(detail)) => {
                    let id = internal_id(&detail);
                    audit.failed(&id);
                    let record = unanswered(&req, &entry, received, &link);
                    turn.chain.calls = link.sequence;
                    turn.chain.last = record.record_sha256.clone();
                    daemon.metrics.runs_failed.inc();
                    Err(SessionError::Unanswered {
                        id,
                        record: Box::new(record),
                        ended: ended.clone(),
                    })
                }
            };
            if answer.is_ok() || matches!(answer, Err(SessionError::Unanswered { .. })) {
                entry.touch(daemon.sessions.tick());
            }
            if let Some(e) = ended {
                reaper::end(&entry, e.reason, e.detail, &daemon.metrics, Some(turn));
            }
            answer
        });
        match task.await {
            Ok(answer) => answer,
            Err(join) => Err(SessionError::Internal {
                id: internal_id(&format!("session call task failed: {join}")),
            }),
        }
    }

    /// The payload as the session's sandbox takes it, and the grant profile
    /// it names; a kind or a language the session does not run is refused.
    fn session_payload(
        &self,
        entry: &Entry,
        payload: &Checked,
    ) -> Result<(Payload, Option<String>), SessionError> {
        let offer = &entry.offer;
        let unsupported = |what: &str| {
            SessionError::from(Refusal::unsupported(format!(
                "the {} provider's sessions do not run {what}",
                entry.evidence.sandbox
            )))
        };
        let profile = |p: &str| (!p.is_empty()).then(|| p.to_string());
        match payload {
            Checked::JavaScript {
                code,
                grant_profile,
            } if offer.javascript => {
                Ok((Payload::JavaScript(code.clone()), profile(grant_profile)))
            }
            Checked::Project(p) if offer.project => Ok((
                Payload::Project(ProjectInput {
                    files: p
                        .files
                        .iter()
                        .map(|f| (f.path.clone(), f.content.clone()))
                        .collect(),
                    steps: p.steps.clone(),
                    artifacts: p.artifacts.clone(),
                }),
                profile(&p.grant_profile),
            )),
            Checked::Cell(c) if offer.cell_languages.contains(&c.language) => Ok((
                Payload::Cell(CellInput {
                    language: c.language.clone(),
                    code: c.code.clone(),
                    files: c
                        .files
                        .iter()
                        .map(|f| (f.path.clone(), f.content.clone()))
                        .collect(),
                }),
                None,
            )),
            Checked::Cell(c) => Err(unsupported(&format!("{} cells", c.language))),
            other => Err(unsupported(&format!("{} payloads", other.kind()))),
        }
    }

    /// A grant in a session: the profile must allow sessions, the caller
    /// must be permitted it, and the session's sandbox must carry it. Every
    /// other case gets the one answer an unknown profile gets.
    fn session_grant(
        &self,
        entry: &Entry,
        name: &str,
        caller: &str,
        payload: &Checked,
    ) -> Result<Arc<crate::grants::Profile>, SessionError> {
        let carries = match payload {
            Checked::JavaScript { .. } => entry.offer.javascript_grants,
            Checked::Project(_) => entry.offer.project_grants,
            _ => false,
        };
        match self.grants.for_caller(name, caller) {
            Some(p) if carries && p.allow_in_sessions => Ok(p),
            _ => Err(Refusal::permission(
                "grant profile is unknown, not permitted for this caller, or not allowed in sessions",
            )
            .into()),
        }
    }

    /// Whether the evidence the session opened under still holds: the
    /// provider is ready and states the same sandbox, tier, environment and
    /// policy. The text says what changed, for the caller's end detail.
    fn session_evidence_holds(&self, entry: &Entry) -> Result<(), String> {
        if let Err(why) = self.provider.ready() {
            return Err(format!("the provider is no longer ready ({})", why.code));
        }
        let now = self.provider.evidence();
        let was = &entry.evidence;
        if now.sandbox != was.sandbox
            || now.tier != was.tier
            || now.environment != was.environment
            || now.policy != was.policy
        {
            return Err(format!(
                "the provider's evidence changed since the session opened (now {} at {})",
                now.sandbox,
                now.tier.as_str()
            ));
        }
        Ok(())
    }
}

/// Whether a call's rule keeps the session's: no rule at open allows any;
/// otherwise the call's identities must all be the session's.
fn within(call: Option<&SoftwareRule>, session: Option<&SoftwareRule>) -> bool {
    match (call, session) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(c), Some(s)) => c.identities.iter().all(|i| s.identities.contains(i)),
    }
}

/// The record of a call that may have run but has no answer.
fn unanswered(
    req: &RunRequest,
    entry: &Entry,
    received: i64,
    link: &Link,
) -> crate::wire::RunRecord {
    let ev = &entry.evidence;
    record::seal_unanswered(
        record::request_digest(req),
        "internal",
        req.software_rule.as_ref(),
        &record::Evidence {
            provider: &ev.sandbox,
            isolation: ev.tier.as_str(),
            environment: &ev.environment,
            policy: &ev.policy,
            software_identity: &ev.software_identity,
            instance: "",
        },
        received,
        unix_ms(),
        link,
    )
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
