//! One run's container, from the warm pool or created for it, to its
//! removal: the answer reaches the caller as soon as the run has all it
//! will keep, and every exit path (a failure, a panic, an outage) still
//! gives the container back.

use std::time::Duration;

use super::envelope::Life;
use super::lifecycle::Removal;
use super::{DockerEngine, MAX_ANSWERED_UNREMOVED, expiry, metrics, pool};
use crate::live::Live;
use crate::outcome::ProcessOutput;
use crate::plugin_host::capabilities::container_engine::backend::{
    Approved, EngineFailure, GrantMount,
};

impl DockerEngine {
    /// Runs one approved container to completion or its deadline.
    /// Long on purpose: one container's life, create to removal, where each
    /// exit path must give the container back.
    pub(super) async fn run_container(
        &self,
        spec: Approved,
        stdin: Vec<u8>,
        timeout: Duration,
        output_limit: usize,
        grant: Option<GrantMount>,
        live: Option<Live>,
    ) -> Result<ProcessOutput, EngineFailure> {
        if let Err(why) = self.last_verdict() {
            return Err(EngineFailure::BeforeStart(why.detail));
        }
        // One deadline for the container's whole life, fixed before it is
        // created: start, the run and the exit wait all count against it.
        let deadline = tokio::time::Instant::now() + timeout;
        let engine = self.clone();
        let (answer, answered) = tokio::sync::oneshot::channel();
        // Own task: if the caller's future is dropped, this still finishes
        // and removes the container. It counts as a removal in flight from
        // here, so shutdown waits for it.
        let removal = Removal::begin(&self.removing);
        // Checked after counting: shutdown closes the pool before it counts
        // the removals in flight, so either it waits for this run or this
        // run sees it closing and starts nothing that could outlive it.
        self.refuse_when_closing()?;
        tokio::spawn(async move {
            let _removal = removal;
            // A granted run needs its own mount: never a warm container.
            // Otherwise the pool whose spec this is (a snippet's or a
            // project's runner) may have one.
            let taken = [pool::Which::Runs, pool::Which::Projects]
                .into_iter()
                .filter(|_| grant.is_none())
                .find_map(|which| engine.take_warm(which, &spec).map(|w| (which, w)));
            let refill = taken.as_ref().map(|(which, _)| *which);
            let taken = taken.map(|(_, w)| w);
            match &taken {
                Some(w) if w.end.is_some() => metrics::Taken::Booted,
                Some(_) => metrics::Taken::Gated,
                None => metrics::Taken::Cold,
            }
            .count();
            let warm = match taken {
                Some(w) => w,
                None => {
                    let mut spec = spec;
                    if let Some(g) = &grant {
                        spec.env.extend(g.env.iter().cloned());
                    }
                    // Creating and starting can be slow on a loaded engine;
                    // a run whose budget goes on that never opens the gate.
                    // On failure `start_waiting` has removed what it made.
                    let started = engine
                        .start_waiting(
                            &spec,
                            false,
                            Life::run(expiry(timeout)),
                            grant.as_ref().map(|g| g.dir.as_path()),
                            deadline,
                        )
                        .await;
                    match started {
                        Ok(w) => w,
                        Err(why) => {
                            let _ = answer.send(Err(why));
                            return;
                        }
                    }
                }
            };
            let name = warm.id.clone();
            // Should anything below panic, the container still goes: the
            // guard hands it to the pool's maintenance as it unwinds.
            let unremoved = Unremoved {
                engine: engine.clone(),
                name: Some(name.clone()),
            };
            let result = engine
                .drive(warm, stdin, deadline, output_limit, live)
                .await;
            // Once the engine has reported the exit status the container is
            // dead: nothing more runs in it, and the caller need not wait for
            // its filesystem to go. Once a pre-booted process has sent its
            // end frame, the run has all it will keep: the process may still
            // be exiting (or a guest that forged the frame, spinning) until
            // the forced removal below kills it, moments later. A failed run
            // may have left it alive (its exit status never came): that is
            // removed before the caller hears. The caller's admission slot is
            // freed with the answer, so the containers awaiting removal are
            // bounded here instead: past `MAX_ANSWERED_UNREMOVED` (a slow
            // engine), a run is answered only once its container is gone.
            let early = if result.is_ok() {
                Removal::begin_bounded(&engine.answered_unremoved, MAX_ANSWERED_UNREMOVED)
            } else {
                None
            };
            let pending = if early.is_some() {
                let _ = answer.send(result);
                None
            } else {
                Some((answer, result))
            };
            // The pool is refilled once the run is over: starting a
            // container costs the engine about as much CPU as the run's own
            // boot, and on a small machine the two would slow each other.
            if let Some(which) = refill {
                let refill = engine.clone();
                tokio::spawn(async move { refill.top_up(which).await });
            }
            if engine.remove(&name).await {
                unremoved.gone();
            } else {
                // The engine did not answer (an outage): the guard hands the
                // container to the pool's maintenance, which retries until
                // it is gone, and shutdown tries once more.
                drop(unremoved);
            }
            drop(early);
            if let Some((answer, result)) = pending {
                let _ = answer.send(result);
            }
        });
        answered.await.map_err(|_| {
            EngineFailure::AfterStart("the container task ended without an answer".into())
        })?
    }
}

/// A run's container not yet known to be removed. Dropped without
/// `gone` (a failed removal, or a panic unwinding the run's task), it
/// becomes an orphan of the run pool, which maintenance removes.
struct Unremoved {
    engine: DockerEngine,
    name: Option<String>,
}

impl Unremoved {
    fn gone(mut self) {
        self.name = None;
    }
}

impl Drop for Unremoved {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            self.engine.orphan(pool::Which::Runs, name);
        }
    }
}
