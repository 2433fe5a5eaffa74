//! A session's container: the same envelope and start as a run's (created
//! with every limit, started behind the gate), but kept for the session's
//! calls. Its gate opens when the session opens; from then on its command
//! reads requests on stdin and answers on stdout, one exchange at a time.
//!
//! The host trusts nothing it reads: an exchange ends at a terminator the
//! plugin chose, within a byte limit and a deadline, and any failure after a
//! request may have reached the container (the deadline, too many bytes,
//! the stream ending) kills the container, so a session never continues
//! in a state the host cannot account for. It carries the session label and
//! an expiry past the session's lifetime, so the sweeper removes it after a
//! crash; it is removed on every other path by `end`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

use super::envelope::{GATE_LINE, Life};
use super::lifecycle::Warm;
use super::pool::Which;
use super::{DockerEngine, expiry};
use crate::plugin_host::capabilities::container_engine::backend::{
    Approved, EngineFailure, SessionContainer,
};

pub(super) struct DockerSession {
    engine: DockerEngine,
    id: String,
    io: Mutex<Option<Warm>>,
    alive: Arc<AtomicBool>,
}

impl DockerEngine {
    /// Starts a session's container and opens its gate.
    pub(super) async fn start_session_container(
        &self,
        spec: Approved,
        lifetime: Duration,
        deadline: Instant,
        grant_dir: Option<PathBuf>,
    ) -> Result<DockerSession, EngineFailure> {
        if let Err(why) = self.last_verdict() {
            return Err(EngineFailure::BeforeStart(why.detail));
        }
        self.refuse_when_closing()?;
        let deadline = tokio::time::Instant::from_std(deadline);
        let life = Life {
            expires: expiry(lifetime),
            session: true,
        };
        let engine = self.clone();
        // Its own task: a caller that goes away mid-start must not leave a
        // started container nobody will end.
        let task = tokio::spawn(async move {
            // A warm session container has no broker directory: a session
            // that needs one is started cold.
            let taken = match grant_dir {
                None => engine.take_warm(Which::Sessions, &spec),
                Some(_) => None,
            };
            let mut warm = match taken {
                Some(w) => {
                    let refill = engine.clone();
                    tokio::spawn(async move { refill.top_up(Which::Sessions).await });
                    w
                }
                None => {
                    engine
                        .start_waiting(&spec, false, life, grant_dir.as_deref(), deadline)
                        .await?
                }
            };
            // A pre-booted container has no gate: its agent is up, waiting
            // for the session's first request.
            let opened = match warm.end {
                Some(_) => Ok(Ok(())),
                None => tokio::time::timeout_at(deadline, warm.io.input.write_all(GATE_LINE)).await,
            };
            if !matches!(opened, Ok(Ok(()))) {
                engine.remove(&warm.id).await;
                return Err(EngineFailure::AfterStart(
                    "the session container's gate could not be opened".into(),
                ));
            }
            let alive = Arc::new(AtomicBool::new(true));
            engine.watch_exit(&warm.id, alive.clone());
            Ok(DockerSession {
                engine: engine.clone(),
                id: warm.id.clone(),
                io: Mutex::new(Some(warm)),
                alive,
            })
        });
        task.await
            .map_err(|e| EngineFailure::AfterStart(format!("the session start task failed: {e}")))?
    }
}

impl DockerEngine {
    /// Marks the session's container dead as soon as the engine reports it
    /// exited, so the session ends between calls, not at the next one.
    fn watch_exit(&self, id: &str, alive: Arc<AtomicBool>) {
        let docker = self.docker.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let mut wait =
                docker.wait_container(&id, None::<bollard::query_parameters::WaitContainerOptions>);
            let _ = wait.next().await;
            alive.store(false, Ordering::Release);
        });
    }
}

impl DockerSession {
    /// Kills the container at once; `end` removes it.
    async fn kill(&self) {
        self.alive.store(false, Ordering::Release);
        self.engine.kill(&self.id).await;
    }

    async fn exchange_inner(
        &self,
        request: Vec<u8>,
        until: Vec<u8>,
        deadline: Instant,
        limit: usize,
    ) -> Result<Vec<u8>, EngineFailure> {
        let mut guard = self.io.lock().await;
        let Some(io) = guard
            .as_mut()
            .filter(|_| self.alive.load(Ordering::Acquire))
        else {
            return Err(EngineFailure::BeforeStart(
                "the session container has ended".into(),
            ));
        };
        let deadline = tokio::time::Instant::from_std(deadline);
        let failed = |why: &str| EngineFailure::AfterStart(why.to_string());
        match tokio::time::timeout_at(deadline, io.io.input.write_all(&request)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(failed("writing to the session container failed")),
            Err(_) => {
                return Err(failed(
                    "writing to the session container took past the deadline",
                ));
            }
        }
        let mut buf: Vec<u8> = Vec::new();
        let read = async {
            while let Some(frame) = io.io.output.next().await {
                match frame {
                    Ok(LogOutput::StdOut { message }) => {
                        let from = buf.len().saturating_sub(until.len());
                        buf.extend_from_slice(&message);
                        if let Some(at) = find(&buf[from..], &until) {
                            buf.truncate(from + at);
                            return Ok(());
                        }
                        if buf.len() > limit {
                            return Err("the session container's answer is over its limit");
                        }
                    }
                    // Its stderr is not part of any answer.
                    Ok(_) => {}
                    Err(_) => return Err("the session container's output stream failed"),
                }
            }
            Err("the session container's output ended")
        };
        match tokio::time::timeout_at(deadline, read).await {
            Ok(Ok(())) => Ok(buf),
            Ok(Err(why)) => Err(failed(why)),
            Err(_) => Err(failed(
                "the session container did not answer by the deadline",
            )),
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl SessionContainer for DockerSession {
    fn exchange(
        &self,
        request: Vec<u8>,
        until: Vec<u8>,
        deadline: Instant,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<u8>, EngineFailure>> {
        Box::pin(async move {
            let answer = self.exchange_inner(request, until, deadline, limit).await;
            if matches!(answer, Err(EngineFailure::AfterStart(_))) {
                // Whatever state the container is in, no later call of the
                // session may run in it.
                self.kill().await;
            }
            answer
        })
    }

    fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    fn end(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.alive.store(false, Ordering::Release);
            // Dropping the streams closes the container's stdin too.
            drop(self.io.lock().await.take());
            let engine = self.engine.clone();
            let id = self.id.clone();
            // Removal finishes even if whoever ends the session stops waiting.
            let _ = tokio::spawn(async move { engine.remove(&id).await }).await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::find;

    #[test]
    fn the_terminator_is_found_across_frames_only_whole() {
        assert_eq!(
            find(b"abc{\"done\":\"1\"}\n", b"{\"done\":\"1\"}\n"),
            Some(3)
        );
        assert_eq!(find(b"abc{\"done\":\"1\"", b"{\"done\":\"1\"}\n"), None);
        assert_eq!(find(b"", b"x"), None);
    }
}
