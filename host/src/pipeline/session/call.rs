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
use std::time::{SystemTime, UNIX_EPOCH};

use super::{SessionError, ended_refusal};
use crate::admission::{self, Payload as Checked};
use crate::callers::Caller;
use crate::grants::Profile;
use crate::job::{CellInput, Ended, Payload, ProjectInput};
use crate::pipeline::dispatch::{Admitted, Target, Undone};
use crate::pipeline::{Daemon, answer, floor, own_task};
use crate::record::Link;
use crate::refusal::{Reason, Refusal};
use crate::sessions::{Entry, Turn, reaper};
use crate::wire::{RunRequest, SessionEnd, SessionRunRequest, SessionRunResponse};
use tokio::sync::OwnedMutexGuard;

/// A session call that passed its checks, waiting for nothing but its turn.
struct Call {
    req: RunRequest,
    checked: admission::Checked,
    caller: Arc<Caller>,
    entry: Arc<Entry>,
    payload: Payload,
    profile: Option<Arc<Profile>>,
    /// When the call arrived (an unanswered record's start).
    received: i64,
}

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
        let entry = self.callers_session(&id, &caller)?;
        if let Some(ended) = entry.ended() {
            return Err(ended_refusal(ended, Reason::Request));
        }
        // 2. The session's rule cannot be dropped by a call: the call must
        //    carry it, or a narrower one, so its digest and record bind it.
        if !admission::rule_within(req.software_rule.as_ref(), entry.rule.as_ref()) {
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
        let Some(turn) = entry.wait_turn().await else {
            return Err(Refusal::capacity(
                "another call is already waiting for this session's turn",
            )
            .into());
        };

        let call = Call {
            req,
            checked,
            caller,
            entry,
            payload,
            profile,
            received,
        };
        own_task("session call", self.clone().in_turn(call, turn))
            .await
            .unwrap_or_else(|failed| Err(SessionError::internal(&failed)))
    }

    /// Steps 4 to 6 of a call that holds its session's turn; in a task of
    /// its own, so the call keeps its place in the chain whatever the
    /// caller does.
    /// Long on purpose: steps 4 to 6 in order, as the module comment numbers
    /// them; each refusal must come before the dispatch below it.
    async fn in_turn(
        self: Arc<Self>,
        call: Call,
        mut turn: OwnedMutexGuard<Turn>,
    ) -> Result<SessionRunResponse, SessionError> {
        let entry = &call.entry;
        // 4. Under the turn: the end, the evidence, the wall, the rate.
        if let Some(ended) = entry.ended() {
            return Err(ended_refusal(ended, Reason::Request));
        }
        // A sandbox that ended by itself, or evidence that no longer
        // holds, ends the session here and refuses the call.
        let end_now = |ended: Ended| {
            reaper::end(
                entry,
                ended.reason,
                ended.detail.clone(),
                &self.metrics,
                None,
            );
            ended_refusal(ended, Reason::Environment)
        };
        if let Some(ended) = turn.sandbox.as_ref().and_then(|s| s.ended()) {
            return Err(end_now(ended));
        }
        if let Err(why) = self.session_evidence_holds(entry) {
            return Err(end_now(Ended {
                reason: SessionEnd::SandboxChanged,
                detail: why,
            }));
        }
        floor::check(
            call.checked.floor,
            call.req.software_rule.as_ref(),
            &entry.evidence,
        )?;
        if let Err(why) = self.quotas.charge(&call.caller.id).await {
            return Err(self.shed_for(why).into());
        }
        let grant = self.mint_grant(call.profile, &call.caller.id, call.checked.timeout)?;

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
        let work = Admitted {
            req: &call.req,
            checked: &call.checked,
            evidence: &entry.evidence,
            caller: &call.caller.id,
            payload: call.payload,
            grant,
            live: None,
        };
        let target = Target::Call {
            sandbox: sandbox.as_ref(),
            session: &entry.fingerprint,
            link: &link,
        };
        let dispatched = self.dispatch(work, target).await;
        let ended = sandbox.ended();

        // 6. The answer, or the unanswered record, in the chain.
        let answer = match dispatched {
            Ok(sealed) => {
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
            Err(Undone::Refused(refusal)) => Err(SessionError::Refused {
                refusal,
                ended: ended.clone(),
            }),
            Err(Undone::MayHaveRun { id, .. }) => {
                let record = answer::unanswered(
                    &call.req,
                    &entry.evidence,
                    (call.received, unix_ms()),
                    &link,
                );
                turn.chain.calls = link.sequence;
                turn.chain.last = record.record_sha256.clone();
                self.metrics.runs_failed.inc();
                Err(SessionError::Unanswered {
                    id,
                    record: Box::new(record),
                    ended: ended.clone(),
                })
            }
        };
        if answer.is_ok() || matches!(answer, Err(SessionError::Unanswered { .. })) {
            entry.touch(self.sessions.tick());
        }
        if let Some(e) = ended {
            reaper::end(entry, e.reason, e.detail, &self.metrics, Some(turn));
        }
        answer
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
                Payload::Project(ProjectInput::from(p)),
                profile(&p.grant_profile),
            )),
            Checked::Cell(c) if offer.cell_languages.contains(&c.language) => {
                Ok((Payload::Cell(CellInput::from(c)), None))
            }
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
    ) -> Result<Arc<Profile>, SessionError> {
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

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
