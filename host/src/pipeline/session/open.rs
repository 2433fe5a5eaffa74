//! OpenSession: checks, a place, slots, then the provider's sandbox.
//!
//! The order mirrors a run's. Everything that can refuse does so before
//! the provider is asked for a sandbox: the request on its own, the
//! provider's offer, the wall (floor and software rule against current
//! evidence), a place under the caps, a daemon slot and the caller's slot.
//! The sandbox is opened in a task of its own: a caller that goes away
//! while it opens does not leak it (the task closes what nobody claimed).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::oneshot;

use super::SessionError;
use crate::admission::{CELL_LANGUAGES, valid_trace_id};
use crate::callers::Caller;
use crate::job::SessionOptions;
use crate::outcome::RunFailure;
use crate::pipeline::{Daemon, floor};
use crate::providers::{Evidence, ProviderSession, SessionOffer};
use crate::quota::{SessionPlace, Shed};
use crate::refusal::Refusal;
use crate::replicas::HolderRecord;
use crate::sessions::{self, Entry, Holds, Opened, Reservation, reaper, settings::MIN_IDLE};
use crate::tier::Tier;
use crate::wire::{I64, OpenSessionRequest, OpenSessionResponse, SessionEnd};

/// How long a provider may take to open a sandbox (create, start, and
/// its agent's first answer).
const OPEN_TIMEOUT: Duration = Duration::from_secs(60);

/// The configured duration, or the request's when it asks for less (0 is
/// "the daemon's").
fn shorter(configured: Duration, requested_ms: u32) -> Duration {
    let asked = Duration::from_millis(u64::from(requested_ms));
    if !asked.is_zero() && asked < configured {
        asked
    } else {
        configured
    }
}

/// An open that has its sandbox but will not hand it out: the sandbox is
/// closed, what the session would have held given back (the paid seconds
/// settled to the time the attempt took), and its holder record, if one
/// was written, deleted.
async fn abandon(
    sandbox: Box<dyn ProviderSession>,
    holds: Holds,
    holder: Option<HolderRecord>,
    started: Instant,
) {
    sandbox.close().await;
    holds.settle(started.elapsed()).await;
    if let Some(h) = holder {
        h.delete().await;
    }
}

/// An open request that passed every check needing nothing but itself.
struct Asked {
    floor: Option<Tier>,
    owner: Option<String>,
    trace_id: Option<String>,
}

/// Step 1: the request on its own.
fn validate(req: &OpenSessionRequest) -> Result<Asked, SessionError> {
    let floor =
        Tier::parse_floor(&req.minimum_isolation).map_err(|e| Refusal::request(e.to_string()))?;
    if let Some(rule) = &req.software_rule {
        crate::admission::validate_rule(rule)?;
    }
    for l in &req.languages {
        if !CELL_LANGUAGES.contains(&l.as_str()) {
            return Err(Refusal::request(format!(
                "unknown language {l:?} in the hint (want javascript or python)"
            ))
            .into());
        }
    }
    let owner = match req.owner.as_str() {
        "" => None,
        o if sessions::valid_owner(o) => Some(o.to_string()),
        _ => {
            return Err(
                Refusal::request("owner must be 1 to 64 characters of [A-Za-z0-9._:-]").into(),
            );
        }
    };
    let trace_id = Some(req.trace_id.clone()).filter(|t| valid_trace_id(t));
    Ok(Asked {
        floor,
        owner,
        trace_id,
    })
}

/// What an open holds before its sandbox exists: its place among the
/// sessions and every slot the session keeps for its life.
struct Reserved {
    reservation: Reservation,
    holds: Holds,
    lifetime: Duration,
    idle: Duration,
}

/// Everything the sandbox's task needs to open, commit and answer.
struct Plan {
    req: OpenSessionRequest,
    caller: Arc<Caller>,
    asked: Asked,
    evidence: Evidence,
    offer: SessionOffer,
    languages: Vec<String>,
    reserved: Reserved,
}

impl Daemon {
    /// `owner_place`: the new session's place among its owner's sessions
    /// across the fleet, when the replicas count them (`api::replica`).
    pub async fn open_session(
        self: &Arc<Self>,
        req: OpenSessionRequest,
        caller: Arc<Caller>,
        owner_place: Option<SessionPlace>,
    ) -> Result<OpenSessionResponse, SessionError> {
        // 1. The request on its own.
        let asked = validate(&req)?;

        // 2. What this daemon can do.
        if let Some(refusal) = self.provider.refuses_everything() {
            return Err(refusal.into());
        }
        let settings = &self.sessions.settings;
        let offer = match self.provider.session_offer() {
            Some(o) if settings.enabled() => o,
            _ => {
                return Err(Refusal::unsupported(
                    "this daemon has no sessions (its provider has none, or SANDBOX_MAX_SESSIONS is 0)",
                )
                .into());
            }
        };
        // The hint keeps only languages the sessions have, in the offer's
        // order: it changes latency, never behaviour.
        let languages: Vec<String> = offer
            .cell_languages
            .iter()
            .filter(|l| req.languages.contains(l))
            .cloned()
            .collect();

        // 3. The wall, against the evidence sessions run under now.
        let now = self.provider.evidence();
        let evidence = Evidence {
            software_identity: offer
                .software_identity
                .clone()
                .unwrap_or_else(|| now.software_identity.clone()),
            ..now
        };
        floor::check(asked.floor, req.software_rule.as_ref(), &evidence)?;

        // 4. A place, then the slots a session holds for its life.
        let reserved = self.reserve(&req, &caller, &asked, owner_place).await?;

        // 5. The sandbox, in a task that outlives a caller who left.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let plan = Plan {
            req,
            caller,
            asked,
            evidence,
            offer,
            languages,
            reserved,
        };
        tokio::spawn(self.clone().open(plan, tx));
        match rx.await {
            Ok(answer) => answer,
            Err(_) => Err(SessionError::internal(
                "the session open task ended without an answer",
            )),
        }
    }

    /// Step 4: a place among the sessions (closing any it replaces), then
    /// the daemon's slot, the caller's paid seconds and the caller's place
    /// in the fleet's count. Nothing is held when it refuses.
    async fn reserve(
        &self,
        req: &OpenSessionRequest,
        caller: &Caller,
        asked: &Asked,
        owner_place: Option<SessionPlace>,
    ) -> Result<Reserved, SessionError> {
        let settings = &self.sessions.settings;
        let shed = |why: Shed| self.shed_for(why);
        let mut reservation = self
            .sessions
            .reserve(&caller.id, asked.owner.as_deref())
            .map_err(|full| match full {
                // Not a limit: the daemon is stopping, so not counted as shed.
                sessions::Full::Stopping => Refusal::environment(full.text()),
                _ => self.shed(full.label(), full.text()),
            })?;
        // Replaced sessions are closed before this one takes a slot, so the
        // owner never holds more sandboxes than its cap. In a task of its
        // own: they are already marked replaced (the reaper and shutdown
        // pass them by), so a caller who leaves mid-open must not cancel
        // the only thing that frees them.
        // The first replaced session's place in the fleet's count passes
        // to this open, so no open elsewhere can take it in between.
        let replaced: Vec<_> = reservation.replaced.drain(..).collect();
        let mut inherited = None;
        if !replaced.is_empty() {
            let metrics = self.metrics.clone();
            let closing = tokio::spawn(async move {
                let mut kept = None;
                for (victim, mut turn) in replaced {
                    if kept.is_none() {
                        kept = turn.take_fleet_place();
                    }
                    turn.finish(&victim, &metrics).await;
                }
                kept
            });
            inherited = closing.await.ok().flatten();
        }
        let lifetime = shorter(settings.lifetime, req.lifetime_ms);
        let idle = match shorter(settings.idle, req.idle_timeout_ms) {
            d if d.is_zero() => d,
            d => d.max(MIN_IDLE),
        };
        let daemon_slot = self
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| shed(Shed::AtCapacity))?;
        let reserved_paid = lifetime.as_secs().max(1);
        let caller_slot = self
            .quotas
            .admit(&caller.id, caller.paid_seconds_per_day, reserved_paid)
            .await
            .map_err(shed)?;
        // With replicas sharing a store, the caller's session cap holds
        // across all of them, not per replica.
        let taken = match inherited {
            Some(place) => Ok(Some(place)),
            None => {
                self.quotas
                    .take_session_place(&caller.id, settings.max_per_caller)
                    .await
            }
        };
        let fleet_place = match taken {
            Ok(p) => p,
            Err(why) => {
                // Nothing was opened: the paid seconds booked above go
                // back, in a task of its own so an opener who leaves now
                // does not cancel the refund.
                let _ = tokio::spawn(caller_slot.settle(Duration::ZERO)).await;
                return Err(match why {
                    Some(s) => shed(s),
                    None => {
                        let full = sessions::Full::Caller(settings.max_per_caller);
                        self.shed(full.label(), full.text())
                    }
                }
                .into());
            }
        };
        Ok(Reserved {
            reservation,
            holds: Holds {
                daemon_slot,
                caller_slot,
                fleet_place,
                owner_place,
            },
            lifetime,
            idle,
        })
    }

    /// Step 5: the provider's sandbox, the session committed, and the
    /// answer sent. Runs in a task of its own, so a caller who leaves
    /// mid-open cannot leak the sandbox: if nobody takes the answer, the
    /// session is ended here.
    async fn open(
        self: Arc<Self>,
        plan: Plan,
        tx: oneshot::Sender<Result<OpenSessionResponse, SessionError>>,
    ) {
        match self.start(plan).await {
            Ok((answer, entry)) => {
                if tx.send(Ok(answer)).is_err() {
                    // Nobody holds the ID: nobody can ever use or close it.
                    reaper::end(
                        &entry,
                        SessionEnd::Closed,
                        "the caller left before the session was opened",
                        &self.metrics,
                        None,
                    );
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        }
    }

    /// The sandbox, then the commit. Long on purpose: every way out after
    /// the sandbox exists must close it, and they read best in sequence.
    async fn start(&self, plan: Plan) -> Result<(OpenSessionResponse, Arc<Entry>), SessionError> {
        let (req, caller, asked, evidence) = (plan.req, plan.caller, plan.asked, plan.evidence);
        let Reserved {
            reservation,
            holds,
            lifetime,
            idle,
        } = plan.reserved;
        let started = Instant::now();
        let opened = self
            .provider
            .open_session(SessionOptions {
                languages: plan.languages,
                lifetime,
                open_timeout: OPEN_TIMEOUT,
                grants: !self.grants.is_empty(),
            })
            .await;
        let sandbox = match opened {
            Ok(s) => s,
            Err(f) => {
                // The reservation and the slots go back as they drop; the
                // paid seconds reserved for the lifetime are settled to the
                // time the attempt took.
                holds.settle(started.elapsed()).await;
                return Err(match f {
                    RunFailure::NotDispatched(r) => r.into(),
                    RunFailure::MayHaveRun(detail) => SessionError::internal(&detail),
                });
            }
        };
        // The sandbox was started (the plugin's start ran), so an open
        // given up from here on is answered unmarked: not a refusal.
        let Ok(id) = sessions::new_id() else {
            abandon(sandbox, holds, None, started).await;
            return Err(SessionError::internal(
                "no session ID could be drawn from the OS random source",
            ));
        };
        let fingerprint = sessions::fingerprint(&id);
        // With replicas, the holder record is written before the session is
        // committed: however the session then ends, its end finds the
        // record to remove (one written after the commit could land after
        // an end that came first, and stay for the session's lifetime). And
        // before the caller has the ID, so a call through any replica
        // finds it.
        let holder = match &self.replicas {
            Some(r) => Some(r.hold(&fingerprint, lifetime).await),
            None => None,
        };
        // The daemon began to stop while this session started. Its place
        // is still reserved, so a stop still waiting for opens under way
        // waits for this close too; one that has given up waiting would
        // never end the session, so it is closed here rather than handed
        // out. Checked after the last wait and right before the commit: a
        // stop that begins after this check finds the committed session in
        // its list and ends it.
        if self.sessions.is_closed() {
            abandon(sandbox, holds, holder, started).await;
            return Err(SessionError::internal(
                "the daemon began to stop while the session was starting",
            ));
        }
        let expires_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
            + lifetime.as_millis() as i64;
        let entry = Entry::new(
            Opened {
                fingerprint: fingerprint.clone(),
                caller: caller.id.clone(),
                owner: asked.owner,
                evidence: evidence.clone(),
                floor: asked.floor,
                rule: req.software_rule.clone(),
                offer: plan.offer,
                lifetime,
                expires_unix_ms,
                idle_timeout: idle,
                holder,
            },
            sandbox,
            holds,
            self.sessions.tick(),
        );
        self.sessions.commit(reservation, entry.clone());
        self.metrics.sessions_open.inc();
        self.metrics.sessions_opened.inc();
        tracing::info!(
            target: "plimsoll::audit",
            op = "session_open",
            caller = caller.id.as_str(),
            session = fingerprint.as_str(),
            sandbox = evidence.sandbox.as_str(),
            isolation = evidence.tier.as_str(),
            lifetime_ms = lifetime.as_millis() as u64,
            idle_timeout_ms = idle.as_millis() as u64,
            duration_ms = started.elapsed().as_millis() as u64,
            trace_id = asked.trace_id.as_deref().unwrap_or(""),
            "session opened"
        );
        let answer = OpenSessionResponse {
            session_id: id,
            session: fingerprint,
            sandbox: evidence.sandbox.clone(),
            isolation: evidence.tier.as_str().to_string(),
            expires_unix_ms: I64(expires_unix_ms),
            idle_timeout_ms: u32::try_from(idle.as_millis()).unwrap_or(u32::MAX),
            software_identity: evidence.software_identity.clone(),
        };
        Ok((answer, entry))
    }
}
