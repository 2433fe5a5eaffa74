//! Warm containers: started and waiting on their stdin, so a single run of
//! the registered spec skips creation and start-up. Each serves one run and
//! is then removed; none waits longer than `WARM_MAX_AGE`; a new spec, an
//! unreachable engine or shutdown sends the waiting ones to be removed.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::lifecycle::Warm;
use super::{DockerEngine, expiry};
use crate::plugin_host::capabilities::container_engine::backend::{Approved, EngineFailure};

/// Longest a warm container waits for its run before it is replaced.
const WARM_MAX_AGE: Duration = Duration::from_secs(300);

/// The longest run any caller can ask for (the project maximum), for the
/// expiry label of warm containers, whose run is not known yet.
const LONGEST_RUN: Duration = Duration::from_secs(120);

#[derive(Default)]
pub(super) struct Pool {
    pub(super) template: Option<Approved>,
    pub(super) warm: VecDeque<Warm>,
    /// Warm containers being started right now, so top-ups do not overshoot.
    pub(super) starting: u32,
    /// Set at shutdown: nothing more is started.
    pub(super) closed: bool,
    /// Warm containers dropped while the engine was unreachable, removed
    /// once it answers again.
    pub(super) orphans: Vec<String>,
}

impl DockerEngine {
    /// Registers the spec single runs use and starts keeping warm containers
    /// of it. Returns the pool size.
    pub(super) fn prewarm_spec(&self, spec: Approved) -> u32 {
        if self.settings.pool == 0 {
            return 0;
        }
        if let Ok(mut pool) = self.pool.lock()
            && pool.template.as_ref() != Some(&spec)
        {
            // A new template: warm containers of the old one are of no use;
            // maintenance removes them.
            let old: Vec<String> = pool.warm.drain(..).map(|w| w.id).collect();
            pool.orphans.extend(old);
            pool.template = Some(spec);
        }
        let engine = self.clone();
        tokio::spawn(async move { engine.top_up().await });
        self.settings.pool
    }

    pub(super) async fn top_up(&self) {
        loop {
            let template = {
                let Ok(mut pool) = self.pool.lock() else {
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
                let have = pool.warm.len() as u32 + pool.starting;
                match pool.template.clone() {
                    Some(t) if have < self.settings.pool && !pool.closed => {
                        pool.starting += 1;
                        t
                    }
                    _ => return,
                }
            };
            let started = self
                .start_waiting(&template, expiry(WARM_MAX_AGE + LONGEST_RUN))
                .await
                .map_err(|(EngineFailure::BeforeStart(e) | EngineFailure::AfterStart(e))| e);
            // The lock is never held across an await. A container that is
            // no longer wanted (shutdown, a new template) is removed before
            // `starting` drops, so shutdown, which waits for `starting` to
            // reach 0, never exits with it still in the engine.
            let unwanted = {
                let Ok(mut pool) = self.pool.lock() else {
                    return;
                };
                match started {
                    Ok(warm) if pool.template.as_ref() == Some(&template) && !pool.closed => {
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
                if let Ok(mut pool) = self.pool.lock() {
                    pool.starting = pool.starting.saturating_sub(1);
                }
                return;
            }
        }
    }

    /// At shutdown: starts no more warm containers and removes the ones
    /// waiting, so a daemon stopped cleanly leaves nothing behind.
    pub(super) async fn close_pool(&self) {
        if let Ok(mut pool) = self.pool.lock() {
            pool.closed = true;
        }
        // A warm container being started now would be created after the
        // drain and outlive the daemon: wait for those starts to end (they
        // remove what they started once they see the pool closed).
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.pool.lock().is_ok_and(|p| p.starting > 0) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.drain_pool().await;
    }

    pub(super) async fn drain_pool(&self) {
        let drained: Vec<String> = match self.pool.lock() {
            Ok(mut pool) => {
                let mut names: Vec<String> = pool.warm.drain(..).map(|w| w.id).collect();
                names.append(&mut pool.orphans);
                names
            }
            Err(_) => return,
        };
        let mut failed = Vec::new();
        for name in drained {
            if !self.remove(&name).await {
                failed.push(name);
            }
        }
        if let Ok(mut pool) = self.pool.lock() {
            pool.orphans.extend(failed);
        }
    }

    pub(super) fn take_warm(&self, spec: &Approved) -> Option<Warm> {
        let mut pool = self.pool.lock().ok()?;
        if pool.template.as_ref() != Some(spec) {
            return None;
        }
        while let Some(w) = pool.warm.pop_front() {
            if w.born.elapsed() < WARM_MAX_AGE {
                return Some(w);
            }
            pool.orphans.push(w.id);
        }
        None
    }

    /// Sends every waiting container to the orphans (removed once the
    /// engine answers): their attached streams may be dead.
    pub(super) fn orphan_warm(&self) {
        if let Ok(mut pool) = self.pool.lock() {
            let stale: Vec<String> = pool.warm.drain(..).map(|w| w.id).collect();
            pool.orphans.extend(stale);
        }
    }
}
