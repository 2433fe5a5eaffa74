//! One container's life: created with the envelope, attached, started
//! behind the host's gate (see `envelope`), opened and fed its input while
//! its output is read, killed at its deadline, removed.
//!
//! One absolute deadline, fixed before the container is created, bounds
//! creation, start, the run itself and the wait for its exit status, so a
//! slow engine cannot stretch a container's life past its run. Until the
//! host writes the gate's line only the gate runs, so every failure before
//! that is `BeforeStart` (nothing the plugin chose ran); from then on,
//! `AfterStart`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::time::{Instant as Deadline, timeout_at};

use bollard::container::{AttachContainerResults, LogOutput};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, InspectContainerOptions,
    KillContainerOptionsBuilder, RemoveContainerOptionsBuilder, WaitContainerOptions,
};
use futures_util::{FutureExt, StreamExt};
use tokio::io::AsyncWriteExt;

use super::envelope::{GATE_LINE, Life, Start};
use super::frames::{Framer, Stream};
use super::idle::{CpuProbe, Reason};
use super::verify::PidsCgroup;
use super::{DockerEngine, short};
use crate::live::{Channel, Live};
use crate::outcome::ProcessOutput;
use crate::plugin_host::capabilities::container_engine::backend::{Approved, EngineFailure};

/// Past the run's deadline, how long the exit status of a killed container
/// may take to arrive.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// A run's container not yet removed, counted from the moment the run
/// takes or creates one until its removal ends, so shutdown can wait for
/// removals that continue after the caller has its answer.
pub(super) struct Removal(Arc<AtomicUsize>);

impl Removal {
    pub(super) fn begin(count: &Arc<AtomicUsize>) -> Removal {
        count.fetch_add(1, Ordering::SeqCst);
        Removal(count.clone())
    }

    /// Counts one more only while fewer than `max` are counted.
    pub(super) fn begin_bounded(count: &Arc<AtomicUsize>, max: usize) -> Option<Removal> {
        count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Removal(count.clone()))
    }
}

impl Drop for Removal {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A container started and waiting on its stdin.
pub(super) struct Warm {
    /// The engine's ID for the container: every later call names it by
    /// this, and under gVisor it is also the name of its host cgroup.
    pub(super) id: String,
    pub(super) io: AttachContainerResults,
    pub(super) born: Instant,
    /// Pre-booted (its command already running): the nonce of its end
    /// frames. `None`: behind the gate.
    pub(super) end: Option<String>,
    /// Where a pre-booted container's CPU time is read.
    pub(super) cpu: Option<CpuProbe>,
}

impl Warm {
    /// Whether a waiting container is still fit to serve a run: nothing
    /// printed and its stream open (a gate prints nothing either; an engine
    /// that restarted has ended every stream), and, pre-booted, within its
    /// CPU budget.
    pub(super) fn fit(&mut self, per_sec: Duration) -> Result<(), Reason> {
        match self.io.output.next().now_or_never() {
            None => {}
            Some(Some(Ok(_))) => return Err(Reason::Dirty),
            Some(_) => return Err(Reason::Died),
        }
        if self.end.is_none() {
            return Ok(());
        }
        match self.cpu.as_mut() {
            Some(probe) => probe.within(self.born, per_sec),
            None => Err(Reason::Unmeasured),
        }
    }
}

impl DockerEngine {
    /// Creates, attaches and starts a container behind the gate, with every
    /// limit in place, by `deadline`. On any failure the container is
    /// removed and the gate was never opened.
    /// `booted`: launched at once rather than behind the gate, for a
    /// plugin's frozen pre-boot declaration only.
    pub(super) async fn start_waiting(
        &self,
        spec: &Approved,
        booted: bool,
        life: Life,
        grant_dir: Option<&Path>,
        deadline: Deadline,
    ) -> Result<Warm, EngineFailure> {
        let mut id = [0u8; 8];
        let _ = getrandom::fill(&mut id);
        let name = format!("plimsoll-{}", hex::encode(id));
        let end = booted.then(|| {
            let mut nonce = [0u8; 16];
            let _ = getrandom::fill(&mut nonce);
            hex::encode(nonce)
        });
        let start = match &end {
            Some(end) => Start::Booted { end },
            None => Start::Gated,
        };
        let body = self.create_body(spec, start, life, grant_dir);
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        let created = match timeout_at(deadline, self.docker.create_container(Some(options), body))
            .await
        {
            Ok(Ok(c)) => c,
            failed => {
                // The engine may have created it even so (a timeout on the
                // answer): remove by name, or it outlives every deadline.
                self.remove(&name).await;
                return Err(match failed {
                    Ok(Err(e)) => {
                        EngineFailure::BeforeStart(format!("creating the container: {}", short(&e)))
                    }
                    _ => EngineFailure::OutOfTime(
                        "creating the container took past the run's deadline".into(),
                    ),
                });
            }
        };
        match self.attach_and_start(&created.id, deadline).await {
            Ok(io) => {
                let cpu = match end {
                    Some(_) => timeout_at(deadline, self.cpu_probe(&created.id))
                        .await
                        .ok()
                        .flatten(),
                    None => None,
                };
                Ok(Warm {
                    id: created.id,
                    io,
                    born: Instant::now(),
                    end,
                    cpu,
                })
            }
            Err(why) => {
                self.remove(&created.id).await;
                Err(why)
            }
        }
    }

    /// Every failure here is `BeforeStart`: whatever the engine started is
    /// the gate, waiting for a line the host has not written.
    async fn attach_and_start(
        &self,
        id: &str,
        deadline: Deadline,
    ) -> Result<AttachContainerResults, EngineFailure> {
        if let PidsCgroup::Host { root, path, .. } = &self.pids {
            // Before start: the sandbox joins a cgroup that is already
            // limited, so there is no moment without the limit.
            limit_pids(root, id, self.settings.pids).map_err(|e| {
                EngineFailure::BeforeStart(format!(
                    "limiting the sandbox's host cgroup {}/{id}: {e}",
                    path.display()
                ))
            })?;
        }
        let attach = AttachContainerOptionsBuilder::default()
            .stream(true)
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .build();
        let late = || EngineFailure::OutOfTime("starting took past the run's deadline".into());
        let io = timeout_at(deadline, self.docker.attach_container(id, Some(attach)))
            .await
            .map_err(|_| late())?
            .map_err(|e| EngineFailure::BeforeStart(format!("attaching: {}", short(&e))))?;
        timeout_at(deadline, self.docker.start_container(id, None))
            .await
            .map_err(|_| late())?
            .map_err(|e| EngineFailure::BeforeStart(format!("starting: {}", short(&e))))?;
        if let PidsCgroup::Host { .. } = &self.pids {
            self.check_host_pids(id)
                .await
                .map_err(EngineFailure::BeforeStart)?;
        }
        Ok(io)
    }

    /// Where a pre-booted container's CPU time can be read; `None` keeps
    /// it from serving (its budget would be unenforced).
    async fn cpu_probe(&self, id: &str) -> Option<CpuProbe> {
        CpuProbe::of_pid(self.host_pid(id).await.ok()?)
    }

    /// The host process ID of a started container's first process (the
    /// command under runc, the sandbox under runsc), as the engine reports it.
    async fn host_pid(&self, id: &str) -> Result<i64, String> {
        let inspect = self
            .docker
            .inspect_container(id, None::<InspectContainerOptions>)
            .await
            .map_err(|e| format!("inspecting the sandbox: {}", short(&e)))?;
        inspect
            .state
            .and_then(|s| s.pid)
            .filter(|p| *p > 0)
            .ok_or_else(|| "the sandbox has no host process".to_string())
    }

    /// Under gVisor: the sandbox process is in the cgroup the host limited,
    /// and the limit is the configured one. Read from the host, where the
    /// sandbox cannot reach.
    async fn check_host_pids(&self, id: &str) -> Result<(), String> {
        let PidsCgroup::Host { root, parent, .. } = &self.pids else {
            return Ok(());
        };
        let pid = self.host_pid(id).await?;
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .map_err(|e| format!("reading the sandbox's cgroups: {e}"))?;
        let expected = format!("{parent}/{id}");
        let joined = cgroups.lines().any(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
            let is_pids =
                controllers.is_some_and(|c| c.is_empty() || c.split(',').any(|c| c == "pids"));
            is_pids && path == Some(expected.as_str())
        });
        if !joined {
            return Err(
                "the sandbox is not in the host cgroup that carries its process limit".into(),
            );
        }
        let max = crate::dirs::sub_nofollow(root, id)
            .and_then(|d| d.read_to_string("pids.max"))
            .map_err(|e| format!("reading the sandbox's process limit: {e}"))?;
        if max.trim() != self.settings.pids.to_string() {
            return Err(format!(
                "the sandbox's host process limit is {}, not {}",
                max.trim(),
                self.settings.pids
            ));
        }
        Ok(())
    }

    /// Removes a container, named by its ID (or by its name when create
    /// failed before an ID was known, when no cgroup was made either).
    pub(super) async fn remove(&self, name_or_id: &str) -> bool {
        let remove = RemoveContainerOptionsBuilder::default().force(true).build();
        let removed = match self.docker.remove_container(name_or_id, Some(remove)).await {
            Ok(()) => true,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => true,
            Err(e) => {
                // The reconciler removes it later by its label.
                tracing::warn!(container = %name_or_id, error = %short(&e), "removing a run container failed");
                false
            }
        };
        if let PidsCgroup::Host { root, .. } = &self.pids {
            release_cgroup(root, name_or_id).await;
        }
        removed
    }

    /// Opens the gate (a pre-booted container has none), feeds the
    /// container its input and collects its output until it exits, or
    /// sends its end frames, or reaches its deadline, when the whole
    /// container is killed.
    pub(super) async fn drive(
        &self,
        warm: Warm,
        stdin: Vec<u8>,
        deadline: Deadline,
        output_limit: usize,
        live: Option<Live>,
    ) -> Result<ProcessOutput, EngineFailure> {
        let mut out = ProcessOutput::default();
        let Warm {
            id: name, io, end, ..
        } = warm;
        let mut output = io.output;
        // Input is fed while output is read: a container that prints a lot
        // before it reads all its input must not stall until the deadline.
        let mut input = io.input;
        let gated = end.is_none();
        let mut feeder = tokio::spawn(async move {
            if gated {
                input.write_all(GATE_LINE).await?;
            }
            input.write_all(&stdin).await?;
            input.shutdown().await
        });
        // The exit status is asked for now, so it is in hand when the
        // output ends rather than a round trip later.
        let docker = self.docker.clone();
        let waited_for = name.clone();
        let waiter = tokio::spawn(async move {
            docker
                .wait_container(&waited_for, None::<WaitContainerOptions>)
                .next()
                .await
        });
        let mut framer = end.as_deref().map(Framer::new);
        let mut framed = None;
        let collect = async {
            while let Some(frame) = output.next().await {
                let (stream, message) = match frame {
                    Ok(LogOutput::StdOut { message }) => (Stream::Stdout, message),
                    Ok(LogOutput::StdErr { message }) => (Stream::Stderr, message),
                    Ok(_) => continue,
                    Err(_) => break,
                };
                match framer.as_mut() {
                    Some(f) => {
                        let visible = f.feed(stream, &message);
                        out.keep(stream, &visible, output_limit, live.as_ref());
                        if let Some(code) = f.ended() {
                            framed = Some(code);
                            return;
                        }
                    }
                    None => out.keep(stream, &message, output_limit, live.as_ref()),
                }
            }
        };
        let timed_out = tokio::time::timeout_at(deadline, collect).await.is_err();
        // The run ended without both frames: what was held back for a frame
        // is output after all.
        if let (None, Some(f)) = (framed, framer.as_mut()) {
            for stream in [Stream::Stdout, Stream::Stderr] {
                let held = f.flush(stream);
                out.keep(stream, &held, output_limit, live.as_ref());
            }
        }
        if let Some(code) = framed {
            waiter.abort();
            // An honest process frames only after it has read its input to
            // the end; the feeder's last step may still be finishing.
            let delivered = matches!(timeout_at(deadline, &mut feeder).await, Ok(Ok(Ok(()))));
            if !delivered {
                feeder.abort();
                self.kill(&name).await;
                return Err(EngineFailure::AfterStart(
                    "the run's input could not be delivered to the container".into(),
                ));
            }
            // The caller's answer comes now; the container, perhaps still
            // exiting, is killed and removed by the run's task after it.
            out.exit_code = code;
            return Ok(out);
        }
        // Input that never reached the container means this is not the
        // run's result (a stream cut under it); it may have run partly.
        let delivered = if feeder.is_finished() {
            matches!(feeder.await, Ok(Ok(())))
        } else {
            feeder.abort();
            // Still writing when output ended: only a timeout explains it.
            timed_out
        };
        if !delivered {
            waiter.abort();
            self.kill(&name).await;
            return Err(EngineFailure::AfterStart(
                "the run's input could not be delivered to the container".into(),
            ));
        }
        if timed_out {
            out.timed_out = true;
            self.kill(&name).await;
        }
        // The exit status of a container killed at the deadline arrives at
        // once; a short grace covers the engine's own bookkeeping.
        let mut waiter = waiter;
        let waited = timeout_at(deadline + EXIT_GRACE, &mut waiter).await;
        waiter.abort();
        out.exit_code = match waited {
            Ok(Ok(Some(Ok(w)))) => i32::try_from(w.status_code).unwrap_or(i32::MAX),
            // bollard reports a non-zero exit as an error carrying the code.
            Ok(Ok(Some(Err(bollard::errors::Error::DockerContainerWaitError {
                code, ..
            })))) => i32::try_from(code).unwrap_or(i32::MAX),
            _ => {
                return Err(EngineFailure::AfterStart(
                    "the container's exit status could not be read".into(),
                ));
            }
        };
        Ok(out)
    }

    /// Sends SIGKILL to a container; `remove` still has to remove it.
    pub(super) async fn kill(&self, name: &str) {
        let kill = KillContainerOptionsBuilder::default()
            .signal("SIGKILL")
            .build();
        let _ = self.docker.kill_container(name, Some(kill)).await;
    }
}

/// Makes the sandbox's host cgroup `id` under `root` and writes its
/// How long a sandbox's host cgroup may stay busy after its container's
/// forced removal was answered.
const CGROUP_RELEASE: Duration = Duration::from_secs(5);

/// Removes a sandbox's host cgroup once its last task has left. gVisor's
/// own processes can outlive the engine's answer to a forced removal by a
/// moment, and a cgroup cannot go while a task is in it (EBUSY), so a busy
/// one is tried again for a few seconds; one still busy after that is
/// named in the log, and the sweep removes it once it is empty.
pub(super) async fn release_cgroup(root: &crate::dirs::Dir, id: &str) {
    let until = Instant::now() + CGROUP_RELEASE;
    loop {
        match root.remove_dir(id) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if e.kind() == std::io::ErrorKind::ResourceBusy && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                tracing::warn!(cgroup = %id, error = %e, "a sandbox's host cgroup could not be removed; the sweep tries again");
                return;
            }
        }
    }
}

/// process limit, through handles: a symlink at `id` is refused, never
/// followed.
pub(super) fn limit_pids(root: &crate::dirs::Dir, id: &str, pids: i64) -> std::io::Result<()> {
    match root.create_dir(id) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    crate::dirs::sub_nofollow(root, id)?.write("pids.max", pids.to_string())
}

/// Keeps what fits of one stream's bytes in a run's output, and passes
/// what is kept to a watcher, as it arrives.
trait Keep {
    fn keep(&mut self, stream: Stream, data: &[u8], limit: usize, live: Option<&Live>);
}

impl Keep for ProcessOutput {
    fn keep(&mut self, stream: Stream, data: &[u8], limit: usize, live: Option<&Live>) {
        let (buf, truncated, channel) = match stream {
            Stream::Stdout => (
                &mut self.stdout,
                &mut self.stdout_truncated,
                Channel::Stdout,
            ),
            Stream::Stderr => (
                &mut self.stderr,
                &mut self.stderr_truncated,
                Channel::Stderr,
            ),
        };
        let kept = keep(buf, truncated, data, limit);
        if let Some(live) = live
            && !kept.is_empty()
        {
            live.send(channel, kept);
        }
    }
}

/// Keeps what fits of `data` and returns the part kept, for a watcher.
fn keep<'a>(buf: &mut Vec<u8>, truncated: &mut bool, data: &'a [u8], limit: usize) -> &'a [u8] {
    let room = limit.saturating_sub(buf.len());
    if data.len() > room {
        *truncated = true;
    }
    let kept = &data[..data.len().min(room)];
    buf.extend_from_slice(kept);
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removals_counted_past_the_bound_are_refused_until_one_ends() {
        let count = Arc::new(AtomicUsize::new(0));
        let a = Removal::begin_bounded(&count, 2).expect("first");
        let _b = Removal::begin_bounded(&count, 2).expect("second");
        assert!(Removal::begin_bounded(&count, 2).is_none());
        drop(a);
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert!(Removal::begin_bounded(&count, 2).is_some());
        assert_eq!(
            count.load(Ordering::SeqCst),
            1,
            "the one just made is dropped"
        );
    }

    #[test]
    fn a_cgroup_swapped_for_a_symlink_is_refused_and_nothing_is_written_outside() {
        let base = std::env::temp_dir().join(format!("plimsoll-cg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("root")).expect("root");
        std::fs::create_dir_all(base.join("outside")).expect("outside");
        let root = crate::dirs::open_nofollow(&base.join("root")).expect("open");
        limit_pids(&root, "abc", 256).expect("a fresh cgroup");
        assert_eq!(
            std::fs::read_to_string(base.join("root/abc/pids.max")).expect("read"),
            "256"
        );
        std::os::unix::fs::symlink(base.join("outside"), base.join("root/evil")).expect("link");
        assert!(limit_pids(&root, "evil", 256).is_err());
        assert!(!base.join("outside/pids.max").exists());
        assert!(limit_pids(&root, "../outside", 256).is_err());
        assert!(!base.join("outside/pids.max").exists());
        let _ = std::fs::remove_dir_all(&base);
    }
}
