//! Warm containers: started behind the host's gate, so a single run of the
//! registered spec skips creation and start-up. Only the gate runs in a warm
//! container; the plugin's command starts when a run takes it (see
//! `envelope`). A pool of a plugin's pre-boot declaration is the exception:
//! its containers run the declared command at once, held to idleness
//! (`idle`) until a run takes one. Each serves one run and is then removed; none waits longer
//! than `WARM_MAX_AGE`; a new spec, an unreachable engine or shutdown sends
//! the waiting ones to be removed.
//!
//! Never more than the pool size is alive: containers of an old spec still
//! being removed, or still starting, count against it. And a plugin may
//! change the spec at most `TEMPLATE_CHANGES_PER_MINUTE` times a minute, so
//! it cannot make the host churn containers.
//!
//! Two pools keep to these rules: one for single runs, one for sessions
//! (`Which`). A warm session container carries the session label and an
//! expiry past the longest session, as a cold one does.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::envelope::Life;
use super::idle::{self, Reason, Strikes};
use super::lifecycle::Warm;
use super::metrics::{REMOVED, STOPPED};
use super::{DockerEngine, expiry};
use crate::plugin_host::capabilities::container_engine::backend::{Approved, EngineFailure};

/// Longest a warm container waits for its run before it is replaced.
const WARM_MAX_AGE: Duration = Duration::from_secs(300);

/// The longest run any caller can ask for (the project maximum), for the
/// expiry label of warm containers, whose run is not known yet.
const LONGEST_RUN: Duration = Duration::from_secs(120);
/// How long starting one warm container may take.
const WARM_START_TIME: Duration = Duration::from_secs(60);
/// Spec changes a plugin may make in a minute; more are refused.
pub(super) const TEMPLATE_CHANGES_PER_MINUTE: usize = 6;

/// Which pool: single runs' (snippets), projects', or sessions'. Runs and
/// projects each keep the operator's pool size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Which {
    Runs,
    Projects,
    Sessions,
}

impl Which {
    pub(super) const ALL: [Which; 3] = [Which::Runs, Which::Projects, Which::Sessions];
}

#[derive(Default)]
pub(super) struct Pool {
    pub(super) template: Option<Approved>,
    pub(super) warm: VecDeque<Warm>,
    /// Warm containers being started right now, so top-ups do not overshoot.
    pub(super) starting: u32,
    /// Set at shutdown: nothing more is started.
    pub(super) closed: bool,
    /// Warm containers no longer wanted (an old spec, an outage, too old),
    /// alive until removed.
    pub(super) orphans: Vec<String>,
    /// When the spec last changed, within the last minute.
    changes: VecDeque<Instant>,
    /// Whether the template is a pre-boot declaration, whose containers
    /// run its command at once rather than behind the gate (`idle`).
    pub(super) booted: bool,
    /// Pre-booted containers removed as unfit, recently, and until when
    /// pre-booting is paused after too many (`idle`).
    pub(super) strikes: Strikes,
}

impl DockerEngine {
    /// Registers the spec single runs use and starts keeping warm containers
    /// of it, behind the gate or (`booted`, for a pre-boot declaration)
    /// with its command running. Returns the pool size.
    pub(super) fn prewarm_spec(&self, which: Which, spec: Approved, booted: bool) -> u32 {
        let size = self.pool_size(which);
        if size == 0 {
            return 0;
        }
        let Ok(mut pool) = self.pool_of(which).lock() else {
            return 0;
        };
        if pool.template.as_ref() != Some(&spec) || pool.booted != booted {
            let now = Instant::now();
            while pool
                .changes
                .front()
                .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(60))
            {
                pool.changes.pop_front();
            }
            if pool.changes.len() >= TEMPLATE_CHANGES_PER_MINUTE {
                tracing::warn!(
                    target: "plimsoll::engine",
                    "a plugin changed its warm-container spec too often; the change was refused"
                );
                return 0;
            }
            pool.changes.push_back(now);
            // Warm containers of the old spec are of no use: removed before
            // any of the new one starts.
            let old: Vec<String> = pool.warm.drain(..).map(|w| w.id).collect();
            pool.orphans.extend(old);
            pool.template = Some(spec);
            pool.booted = booted;
        }
        drop(pool);
        let engine = self.clone();
        tokio::spawn(async move {
            engine.remove_orphans(which).await;
            engine.top_up(which).await;
        });
        size
    }

    pub(super) fn pool_of(&self, which: Which) -> &std::sync::Mutex<Pool> {
        match which {
            Which::Runs => &self.pool,
            Which::Projects => &self.project_pool,
            Which::Sessions => &self.session_pool,
        }
    }

    fn pool_size(&self, which: Which) -> u32 {
        match which {
            Which::Runs | Which::Projects => self.settings.pool,
            Which::Sessions => self.settings.session_pool,
        }
    }

    /// How a warm container of this pool is labelled: long enough for the
    /// longest use it may be taken for.
    fn warm_life(&self, which: Which) -> Life {
        match which {
            Which::Runs | Which::Projects => Life::run(expiry(WARM_MAX_AGE + LONGEST_RUN)),
            Which::Sessions => Life {
                expires: expiry(WARM_MAX_AGE + self.settings.session_lifetime),
                session: true,
            },
        }
    }

    /// Tops up every pool.
    pub(super) async fn top_up_all(&self) {
        for which in Which::ALL {
            self.top_up(which).await;
        }
    }

    pub(super) async fn top_up(&self, which: Which) {
        let size = self.pool_size(which);
        loop {
            let template = {
                let Ok(mut pool) = self.pool_of(which).lock() else {
                    return;
                };
                // Age out containers that waited too long.
                // Aged-out containers go to the orphans, which maintenance
                // removes: dropped here they would linger until their expiry.
                let (young, old): (VecDeque<Warm>, VecDeque<Warm>) = pool
                    .warm
                    .drain(..)
                    .partition(|w| w.born.elapsed() < WARM_MAX_AGE);
                pool.warm = young;
                pool.orphans.extend(old.into_iter().map(|w| w.id));
                // Everything alive counts: waiting, starting, and unwanted
                // ones not yet removed.
                let have = pool.warm.len() as u32 + pool.starting + pool.orphans.len() as u32;
                match pool.template.clone() {
                    Some(t) if have < size && !pool.closed => {
                        pool.starting += 1;
                        (t, pool.boots())
                    }
                    _ => return,
                }
            };
            let (template, booted) = template;
            let started = self
                .start_waiting(
                    &template,
                    booted,
                    self.warm_life(which),
                    None,
                    tokio::time::Instant::now() + WARM_START_TIME,
                )
                .await
                .map_err(
                    |(EngineFailure::BeforeStart(e)
                     | EngineFailure::OutOfTime(e)
                     | EngineFailure::AfterStart(e))| e,
                );
            // The lock is never held across an await. A container that is
            // no longer wanted (shutdown, a new template) is removed before
            // `starting` drops, so shutdown, which waits for `starting` to
            // reach 0, never exits with it still in the engine.
            let unwanted = {
                let Ok(mut pool) = self.pool_of(which).lock() else {
                    return;
                };
                match started {
                    Ok(warm)
                        if pool.template.as_ref() == Some(&template)
                            && pool.boots() == booted
                            && !pool.closed =>
                    {
                        pool.warm.push_back(warm);
                        pool.starting = pool.starting.saturating_sub(1);
                        None
                    }
                    Ok(warm) => Some(warm.id),
                    Err(why) => {
                        pool.starting = pool.starting.saturating_sub(1);
                        tracing::warn!(why = %why, "starting a warm container failed");
                        return;
                    }
                }
            };
            if let Some(name) = unwanted {
                self.remove(&name).await;
                if let Ok(mut pool) = self.pool_of(which).lock() {
                    pool.starting = pool.starting.saturating_sub(1);
                }
                return;
            }
        }
    }

    /// At shutdown: starts no more warm containers and removes the ones
    /// waiting, so a daemon stopped cleanly leaves nothing behind.
    pub(super) async fn close_pool(&self) {
        for which in Which::ALL {
            if let Ok(mut pool) = self.pool_of(which).lock() {
                pool.closed = true;
            }
        }
        // A warm container being started now would be created after the
        // drain and outlive the daemon: wait for those starts to end (they
        // remove what they started once they see the pool closed).
        // Runs answered before their container was removed are waited for
        // too, so the daemon does not exit with their containers present.
        let deadline = Instant::now() + Duration::from_secs(30);
        let starting = |w| self.pool_of(w).lock().is_ok_and(|p| p.starting > 0);
        let removing = || self.removing.load(std::sync::atomic::Ordering::SeqCst) > 0;
        while (Which::ALL.into_iter().any(starting) || removing()) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.drain_pool().await;
    }

    /// Removes every waiting container, and every unwanted one, of both.
    pub(super) async fn drain_pool(&self) {
        self.orphan_warm();
        for which in Which::ALL {
            self.remove_orphans(which).await;
        }
    }

    /// Removes the containers no longer wanted; the ones the engine would
    /// not remove stay orphans (and count as alive) until it does.
    /// An orphan leaves the list only once it is gone, so it counts as
    /// alive while it is being removed.
    pub(super) async fn remove_orphans(&self, which: Which) {
        let orphans: Vec<String> = match self.pool_of(which).lock() {
            Ok(pool) => pool.orphans.clone(),
            Err(_) => return,
        };
        for name in orphans {
            if self.remove(&name).await
                && let Ok(mut pool) = self.pool_of(which).lock()
            {
                pool.orphans.retain(|o| *o != name);
            }
        }
    }

    /// Refuses, before anything is created, once shutdown has begun. A
    /// poisoned lock counts as closing: the daemon then starts nothing more.
    pub(super) fn refuse_when_closing(&self) -> Result<(), EngineFailure> {
        if self.pool_of(Which::Runs).lock().map_or(true, |p| p.closed) {
            return Err(EngineFailure::BeforeStart(
                "the daemon is shutting down".into(),
            ));
        }
        Ok(())
    }

    /// A warm container for a run of exactly `spec`. Each is checked first
    /// (nothing printed, its stream open, and pre-booted, within its CPU
    /// budget): an unfit one is removed (a pre-booted one counted), and the
    /// next is tried.
    pub(super) fn take_warm(&self, which: Which, spec: &Approved) -> Option<Warm> {
        let per_sec = self.idle_per_sec();
        let mut pool = self.pool_of(which).lock().ok()?;
        if pool.template.as_ref() != Some(spec) {
            return None;
        }
        while let Some(mut w) = pool.warm.pop_front() {
            if w.born.elapsed() >= WARM_MAX_AGE {
                pool.orphans.push(w.id);
                continue;
            }
            match w.fit(per_sec) {
                Ok(()) => return Some(w),
                Err(reason) => pool.discard(w, reason),
            }
        }
        None
    }

    /// Hands a container the engine would not remove to the pool's
    /// orphans, which maintenance removes once the engine answers.
    pub(super) fn orphan(&self, which: Which, id: String) {
        if let Ok(mut pool) = self.pool_of(which).lock() {
            pool.orphans.push(id);
        }
    }

    /// Sends every waiting container to the orphans (removed once the
    /// engine answers): their attached streams may be dead.
    pub(super) fn orphan_warm(&self) {
        for which in Which::ALL {
            if let Ok(mut pool) = self.pool_of(which).lock() {
                let stale: Vec<String> = pool.warm.drain(..).map(|w| w.id).collect();
                pool.orphans.extend(stale);
            }
        }
    }
}

impl Pool {
    /// Whether containers started now are pre-booted.
    pub(super) fn boots(&self) -> bool {
        self.booted && !self.strikes.paused()
    }

    /// Sends every waiting container that is no longer fit to the orphans.
    pub(super) fn weed(&mut self, per_sec: Duration) {
        let mut unfit = Vec::new();
        let mut kept = VecDeque::new();
        for mut w in self.warm.drain(..) {
            match w.fit(per_sec) {
                Ok(()) => kept.push_back(w),
                Err(reason) => unfit.push((w, reason)),
            }
        }
        // The fit are back in place first: a pause the strikes start sends
        // every pre-booted one waiting to the orphans.
        self.warm = kept;
        for (w, reason) in unfit {
            self.discard(w, reason);
        }
    }

    /// Sends an unfit warm container to the orphans. Only a pre-booted one
    /// counts against pre-booting; a gated one whose stream ended (an
    /// engine restart) just goes.
    fn discard(&mut self, w: Warm, reason: Reason) {
        if w.end.is_some() {
            self.strike(&w.id, reason);
        }
        self.orphans.push(w.id);
    }

    /// Counts one pre-booted container removed for `reason`.
    fn strike(&mut self, id: &str, reason: Reason) {
        REMOVED.with_label_values(&[reason.name()]).inc();
        tracing::warn!(target: "plimsoll::engine", container = %id, reason = reason.name(), "a pre-booted warm container was removed before any run took it");
        if !self.booted {
            return;
        }
        if let Some(pause) = self.strikes.record() {
            // The pre-booted ones go; the gate keeps the rest.
            let booted: Vec<String> = self.warm.drain(..).map(|w| w.id).collect();
            self.orphans.extend(booted);
            STOPPED.inc();
            let minutes = pause.as_secs() / 60;
            tracing::warn!(target: "plimsoll::engine", minutes, "pre-booted warm containers kept failing their idle checks; this pool keeps its containers behind the gate for the next {minutes} minutes");
        }
    }
}

impl DockerEngine {
    /// Checks every waiting pre-booted container of `which`; the unfit go
    /// to the orphans, which maintenance removes.
    pub(super) fn weed_pool(&self, which: Which) {
        let per_sec = self.idle_per_sec();
        if let Ok(mut pool) = self.pool_of(which).lock() {
            pool.weed(per_sec);
        }
    }

    /// The idle budget per second of this engine's containers.
    pub(super) fn idle_per_sec(&self) -> Duration {
        idle::idle_per_sec(self.settings.gvisor())
    }
}
