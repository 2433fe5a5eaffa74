//! Dispatch: the one step every run and every session call goes through
//! once it holds its slot (or its session's turn) and passed the wall.
//!
//! It hands the job to its target (the provider for a run, the session's
//! sandbox for a call), counts it, meters the grant's calls, writes the
//! audit line and seals the answer under the evidence the wall checked.
//! What differs between a run and a session call is only the target and,
//! for a call, its link in the session's chain; what becomes of a failure
//! (an error for a run, a place in the chain for a call) is the caller's.

use std::sync::Arc;
use std::time::Instant;

use super::answer::{self, Sealed};
use super::audit::AuditLine;
use super::{Daemon, internal_id, unix_ms};
use crate::admission::Checked;
use crate::grants::advice;
use crate::grants::broker;
use crate::grants::catalog::AdviceMode;
use crate::job::{Job, Payload};
use crate::live::Live;
use crate::outcome::RunFailure;
use crate::providers::{Evidence, Provider, ProviderSession};
use crate::record::Link;
use crate::refusal::Refusal;
use crate::wire::RunRequest;

/// Where a job runs.
pub(crate) enum Target<'a> {
    /// A single run, in a sandbox of the provider's.
    Run(&'a dyn Provider),
    /// A session call, in the session's sandbox, taking `link`'s place in
    /// the chain of the session whose fingerprint is `session`.
    Call {
        sandbox: &'a dyn ProviderSession,
        session: &'a str,
        link: &'a Link,
    },
}

/// A job that passed every check, with what its record and audit line are
/// made of.
pub(crate) struct Admitted<'a> {
    pub req: &'a RunRequest,
    pub checked: &'a Checked,
    /// The evidence the wall compared the floor with.
    pub evidence: &'a Evidence,
    pub caller: &'a str,
    pub payload: Payload,
    /// The grant's broker session, minted immediately before dispatch.
    pub grant: Option<Arc<broker::Session>>,
    pub live: Option<Live>,
}

/// A dispatched job that has no answer.
pub(crate) enum Undone {
    /// The target says nothing of it ran: the refusal keeps its mark.
    Refused(Refusal),
    /// It may have run. The detail is logged under `id`, which the audit
    /// line and the caller's answer carry.
    MayHaveRun { id: String, detail: String },
}

impl Daemon {
    /// Runs `work` in `target` and answers it sealed, its audit line written.
    pub(crate) async fn dispatch(
        &self,
        work: Admitted<'_>,
        target: Target<'_>,
    ) -> Result<Sealed, Undone> {
        let job = Job {
            payload: work.payload,
            timeout: work.checked.timeout,
            output_limit: self.limits.output_limit,
            grant: work.grant.clone(),
            live: work.live,
        };
        let started_wall = unix_ms();
        let started = Instant::now();
        let (dispatched, link) = match &target {
            Target::Run(provider) => {
                self.metrics.runs.inc();
                (provider.run(job).await, None)
            }
            Target::Call { sandbox, link, .. } => {
                self.metrics.session_calls.inc();
                (sandbox.run(job).await, Some(*link))
            }
        };
        let elapsed_ms = started.elapsed().as_millis() as i64;
        // The run is over: its broker starts no call now, and one already at
        // the API (made in a task of its own) is waited for, so the trace
        // holds every call that could have reached it.
        let call_trace = match &work.grant {
            Some(s) => Some(s.finish().await),
            None => None,
        };
        let grant_profile = work.grant.as_ref().map(|s| s.profile().name.clone());
        if let (Some(t), Some(p)) = (&call_trace, &grant_profile) {
            self.metrics.record_calls(p, t);
        }
        // Advice reads the finished trace; it never gates the run.
        let advice = match (&work.grant, &call_trace) {
            (Some(s), Some(t)) if s.profile().advice != AdviceMode::Off => {
                let found = advice::assess(t, s.profile());
                self.metrics.record_advice(&s.profile().name, &found);
                Some((s.profile_arc(), found))
            }
            _ => None,
        };
        let mut audit = AuditLine::new(
            work.checked.payload.kind(),
            work.caller,
            work.evidence,
            work.req,
            work.checked.trace_id.as_deref().unwrap_or(""),
            work.checked.trace_id_rejected,
            elapsed_ms,
        )
        .with_grant(grant_profile.as_deref(), call_trace.as_ref());
        if let Some((profile, found)) = &advice {
            audit = audit.with_advice(profile.retention, found);
        }
        // The caller sees only what it can act on, and only when the
        // profile says so.
        let for_caller = match advice {
            Some((profile, found)) if profile.advice == AdviceMode::Caller => {
                found.into_iter().filter(|f| f.agent_fixable).collect()
            }
            _ => Vec::new(),
        };
        if let Target::Call { session, link, .. } = &target {
            audit = audit.with_session(session, link.sequence);
        }
        match dispatched {
            Ok(output) => {
                let mut sealed = answer::seal(
                    work.req,
                    work.evidence,
                    output,
                    call_trace,
                    for_caller,
                    (started_wall, elapsed_ms),
                    link,
                );
                if let Some(receipts) = &self.receipts {
                    sealed.response.receipt = receipts.sign(&sealed.response.record);
                }
                audit.answered(
                    sealed.exit_code,
                    sealed.timed_out,
                    sealed.outcome,
                    &sealed.response.record.record_sha256,
                );
                Ok(sealed)
            }
            // A grant's call was asked for: code of the request ran,
            // whatever the provider says.
            Err(RunFailure::NotDispatched(refusal))
                if call_trace.as_ref().is_some_and(|t| !t.is_empty()) =>
            {
                let detail = format!(
                    "the provider refused the run as not dispatched ({}), but its grant was used",
                    refusal.message
                );
                let id = internal_id(&detail);
                audit.failed(&id);
                Err(Undone::MayHaveRun { id, detail })
            }
            Err(RunFailure::NotDispatched(refusal)) => Err(Undone::Refused(refusal)),
            Err(RunFailure::MayHaveRun(detail)) => {
                let id = internal_id(&detail);
                audit.failed(&id);
                Err(Undone::MayHaveRun { id, detail })
            }
        }
    }
}
