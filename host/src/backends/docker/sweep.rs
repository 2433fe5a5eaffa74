//! Upkeep for the daemon's life: readiness re-checked, the warm pool topped
//! up, and run containers left behind removed, whichever daemon left them
//! (one that crashed, or was killed mid-run): those past their expiry, and
//! those whose maker this host can prove dead (see `owner`). Neither rule
//! takes a container from a daemon that still runs, so a second daemon on
//! the same engine never loses one it is using.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use bollard::query_parameters::ListContainersOptionsBuilder;

use super::pool::Which;
use super::verify::PidsCgroup;
use super::{DockerEngine, EXPIRES_LABEL, LABEL, PROCESS_LABEL, owner, short, unix_now};

/// How often the pool is topped up and aged, and readiness re-checked.
const MAINTAIN_EVERY: Duration = Duration::from_secs(2);
/// How often the host looks for run containers left past their expiry.
pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(60);

impl DockerEngine {
    /// Keeps readiness current, the pool topped up, and expired containers
    /// swept, for the daemon's life.
    pub(super) fn spawn_maintenance(&self, sweep_every: Duration) {
        let engine = self.clone();
        tokio::spawn(async move {
            let mut last_sweep: Option<Instant> = None;
            loop {
                let ready = engine.check_ready_now().await.is_ok();
                if !ready {
                    // Warm containers may be dead, and their attached
                    // streams are: drop them (removed now, or once the
                    // engine answers again).
                    engine.drain_pool().await;
                } else {
                    // Pre-booted containers that printed, died or spent
                    // CPU while idle join the orphans first. Only the
                    // orphans go: the healthy warm ones stay.
                    for which in Which::ALL {
                        engine.weed_pool(which);
                        engine.remove_orphans(which).await;
                    }
                    engine.top_up_all().await;
                }
                if last_sweep.is_none_or(|t| t.elapsed() >= sweep_every) {
                    last_sweep = Some(Instant::now());
                    match engine.sweep().await {
                        Ok(0) => {}
                        Ok(n) => {
                            tracing::warn!(
                                removed = n,
                                "removed run containers left behind (expired, or their daemon is gone)"
                            )
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "sweeping for leftover run containers failed")
                        }
                    }
                }
                tokio::time::sleep(MAINTAIN_EVERY).await;
            }
        });
    }

    /// Removes every container this host's label marks whose expiry has
    /// passed or whose maker is provably gone: the ones a daemon that
    /// crashed, or was killed, left behind. Mere presence never decides, so
    /// a second daemon on the same engine never loses a container it is
    /// still running. Returns how many were removed.
    async fn sweep(&self) -> Result<usize, String> {
        let filters = HashMap::from([("label", vec![format!("{LABEL}=1")])]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let found = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|e| short(&e))?;
        let now = unix_now();
        let mut leftovers = Vec::new();
        for c in found {
            let labels = c.labels.as_ref();
            let orphaned = labels
                .and_then(|l| l.get(PROCESS_LABEL))
                .is_some_and(|p| owner::is_gone(p));
            let expires = labels
                .and_then(|l| l.get(EXPIRES_LABEL))
                .and_then(|v| v.parse::<u64>().ok())
                // A container with our run label but no readable expiry is
                // not one this host made whole; it is old enough to go.
                .unwrap_or(0);
            let Some(id) = c.id else { continue };
            if expires <= now || orphaned {
                leftovers.push(id);
            }
        }
        // Removed together: a removal can wait seconds for a busy cgroup,
        // and this loop also keeps readiness current.
        let removed = futures_util::future::join_all(leftovers.iter().map(|id| self.remove(id)))
            .await
            .into_iter()
            .filter(|r| *r)
            .count();
        self.sweep_cgroups().await;
        Ok(removed)
    }

    /// Under gVisor: host cgroups of sandboxes whose container is gone and
    /// that no task is in any more (one whose release timed out). The
    /// directories are listed before the containers, and a cgroup is made
    /// only after its container exists, so a cgroup of a container being
    /// set up now is never taken (by this or any daemon on this engine; a
    /// container manager other than the engine sharing its cgroup parent is
    /// not one this host supports). A busy one cannot be removed at all.
    async fn sweep_cgroups(&self) {
        let PidsCgroup::Host { root, .. } = &self.pids else {
            return;
        };
        let names: Vec<String> = match root.entries() {
            Ok(entries) => entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()))
                .collect(),
            Err(_) => return,
        };
        if names.is_empty() {
            return;
        }
        let options = ListContainersOptionsBuilder::default().all(true).build();
        let Ok(live) = self.docker.list_containers(Some(options)).await else {
            return;
        };
        let live: HashSet<String> = live.into_iter().filter_map(|c| c.id).collect();
        for name in names.iter().filter(|n| !live.contains(*n)) {
            match root.remove_dir(name) {
                Ok(()) => {
                    tracing::info!(cgroup = %name, "swept a sandbox's host cgroup left behind")
                }
                Err(e) => {
                    tracing::debug!(cgroup = %name, error = %e, "a left host cgroup is still busy")
                }
            }
        }
    }
}
