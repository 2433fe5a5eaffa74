//! wasm sessions: one QuickJS instance kept for a session's calls.
//!
//! The instance comes from the same pre-initialized component as single
//! runs (so it starts with a ready engine) and lives in a `Store` the
//! session owns. Each call gets its own epoch deadline and output budget;
//! the memory cap holds over the session's whole life, since the store's
//! limiter is the session's. Calls continue the engine's global state.
//!
//! A trap (the deadline, the memory cap, a stack overflow) leaves the
//! instance in no state to continue from: the call reports what happened,
//! the instance is dropped at once, and the session ends with it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use wasmtime::{Store, Trap};

use super::output::Capped;
use super::store::{self, RunState};
use super::{EXIT_ENGINE_TRAP, EXIT_OUT_OF_MEMORY, EXIT_TIMED_OUT, WasmProvider, generated};
use crate::grants::broker;
use crate::job::{Ended, Job, Output, Payload};
use crate::outcome::{CellOutput, ProcessOutput, RunFailure};
use crate::providers::{ProviderSession, SessionOffer, not_offered};
use crate::refusal::Refusal;
use crate::wire::SessionEnd;

/// What wasm sessions run: JavaScript snippets and JavaScript cells, both
/// in the session's engine; no projects (there is no filesystem).
pub fn offer() -> SessionOffer {
    SessionOffer {
        javascript: true,
        project: false,
        cell_languages: vec!["javascript".to_string()],
        javascript_grants: true,
        project_grants: false,
        software_identity: None,
    }
}

struct Live {
    store: Store<RunState>,
    guest: generated::Guest,
    /// No call has run yet: the next one starts from the pristine engine.
    fresh: bool,
}

pub struct WasmSession {
    provider: WasmProvider,
    /// Held across a call (an async lock: the call awaits inside it), so a
    /// session's calls run one at a time.
    live: tokio::sync::Mutex<Option<Live>>,
    ended: Mutex<Option<Ended>>,
}

impl WasmProvider {
    /// A fresh instance for a session. Instantiation runs no caller code,
    /// so a failure here is a refusal (usually the pool is full).
    pub async fn open_session(&self) -> Result<WasmSession, RunFailure> {
        let mut state = RunState::new(self.memory_limit, self.output_limit);
        // Instantiation runs the component's own start-up, never a
        // caller's code; each call sets its own deadline afterwards.
        state.ends = Instant::now() + Duration::from_secs(5);
        let mut store = store::new(&self.engine, state);
        let guest = self.pre.instantiate_async(&mut store).await.map_err(|e| {
            tracing::warn!(error = %format!("{e:#}"), "wasm session instantiation failed");
            RunFailure::NotDispatched(Refusal::capacity(
                "no wasm instance could be created for this session",
            ))
        })?;
        Ok(WasmSession {
            provider: self.clone(),
            live: tokio::sync::Mutex::new(Some(Live {
                store,
                guest,
                fresh: true,
            })),
            ended: Mutex::new(None),
        })
    }
}

/// What one call did to the session.
enum Called {
    Done(ProcessOutput, bool),
    /// The instance trapped: the output so far, and why the session ends.
    Trapped(ProcessOutput, bool, String),
}

impl WasmSession {
    async fn call(
        &self,
        code: String,
        cell: bool,
        grant: Option<Arc<broker::Session>>,
        timeout: Duration,
    ) -> Result<Called, RunFailure> {
        let mut slot = self.live.lock().await;
        let Some(live) = slot.as_mut() else {
            return Err(RunFailure::NotDispatched(Refusal::request(
                "the session's instance has ended",
            )));
        };
        let p = &self.provider;
        let client = match grant.as_deref() {
            Some(session) => Some(self.provider.grant_client(session).await?),
            None => None,
        };
        // Each call has its own output budget and its own deadline.
        let state = live.store.data_mut();
        state.stdout = Capped::new(p.output_limit);
        state.stderr = Capped::new(p.output_limit);
        state.broker = grant;
        state.ends = Instant::now() + timeout;
        live.store.set_epoch_deadline(1);
        let started = std::mem::replace(&mut live.fresh, false);
        let result = live
            .guest
            .call_session_run(&mut live.store, &code, cell, client.as_ref())
            .await;
        let state = live.store.data_mut();
        state.broker = None;
        let (mut out, mut err) = (
            std::mem::replace(&mut state.stdout, Capped::new(0)),
            std::mem::replace(&mut state.stderr, Capped::new(0)),
        );
        let denied = state.limits.denied();
        let (exit_code, timed_out, trapped) = match result {
            Ok(code) => (code, false, None),
            Err(e) => {
                let trap = e.downcast_ref::<Trap>().copied();
                if trap == Some(Trap::Interrupt) {
                    err.push_notice("plimsoll: the call was stopped at its deadline\n");
                    (
                        EXIT_TIMED_OUT,
                        true,
                        Some("the interpreter was stopped at a call's deadline"),
                    )
                } else if denied {
                    err.push_notice(&format!(
                        "plimsoll: the session reached its memory limit of {} MiB\n",
                        p.memory_limit >> 20
                    ));
                    (
                        EXIT_OUT_OF_MEMORY,
                        false,
                        Some("the interpreter reached the session's memory limit"),
                    )
                } else if trap.is_some() {
                    err.push_notice("plimsoll: the engine stopped the call (a trap)\n");
                    (EXIT_ENGINE_TRAP, false, Some("the engine trapped"))
                } else {
                    // Not a trap: the host failed the call; the instance
                    // cannot be trusted to continue either, and the session
                    // ends with it (not a session that refuses every call
                    // while it holds its slots).
                    end(&mut slot).await;
                    *self.ended.lock().unwrap_or_else(|p| p.into_inner()) = Some(Ended {
                        reason: SessionEnd::MainProcessEnded,
                        detail: "the engine failed the call".into(),
                    });
                    return Err(RunFailure::MayHaveRun(format!("{e:#}")));
                }
            }
        };
        let output = ProcessOutput {
            stdout_truncated: out.truncated,
            stderr_truncated: err.truncated,
            stdout: std::mem::take(&mut out.buf),
            stderr: std::mem::take(&mut err.buf),
            exit_code,
            timed_out,
        };
        Ok(match trapped {
            None => Called::Done(output, started),
            Some(why) => {
                end(&mut slot).await;
                Called::Trapped(output, started, why.to_string())
            }
        })
    }
}

impl ProviderSession for WasmSession {
    fn run(&self, job: Job) -> BoxFuture<'_, Result<Output, RunFailure>> {
        let (code, cell) = match job.payload {
            Payload::JavaScript(code) => (code, false),
            Payload::Cell(c) if c.language == "javascript" && c.files.is_empty() => (c.code, true),
            Payload::Cell(_) => {
                return Box::pin(std::future::ready(Err(RunFailure::NotDispatched(
                    Refusal::unsupported(
                        "wasm sessions run javascript cells without files (there is no filesystem)",
                    ),
                ))));
            }
            Payload::Project(_) => return Box::pin(std::future::ready(Err(not_offered()))),
        };
        Box::pin(async move {
            let called = self.call(code, cell, job.grant, job.timeout).await;
            let (output, started, ended) = match called? {
                Called::Done(o, s) => (o, s, false),
                Called::Trapped(o, s, why) => {
                    *self.ended.lock().unwrap_or_else(|p| p.into_inner()) = Some(Ended {
                        reason: SessionEnd::MainProcessEnded,
                        detail: why,
                    });
                    (o, s, true)
                }
            };
            Ok(if cell {
                Output::Cell(CellOutput {
                    output,
                    interpreter_started: started,
                    interpreter_ended: ended,
                })
            } else {
                Output::JavaScript(output)
            })
        })
    }

    fn ended(&self) -> Option<Ended> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            // A call under way holds the lock, so the close waits for it.
            end(&mut *self.live.lock().await).await;
        })
    }
}

/// Ends the session's instance: the store is released (see `store::release`)
/// and the instance goes back to the pool before the session gives up its
/// slots.
async fn end(slot: &mut Option<Live>) {
    if let Some(live) = slot.take() {
        // A release that failed on its blocking thread has dropped the store
        // there all the same; there is nothing left to hand back.
        let _ = store::release(live.store).await;
    }
}
