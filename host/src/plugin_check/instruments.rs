//! What the checker puts around a plugin's capabilities: a recorder shown
//! every request (`Watch`), a backend wrapper that counts the containers it
//! starts and ends, a trip wire that stops the plugin right after its first
//! successful use of a capability (as its own trap would), and, for
//! `plimsoll plugin describe`, a backend that runs nothing.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use crate::live::Live;
use crate::outcome::{NotReady, ProcessOutput};
use crate::plugin_host::call::TripWire;
use crate::plugin_host::capabilities::container_engine::backend::{
    Approved, BackendFacts, ContainerBackend, EngineFailure, Envelope, GrantMount, PrebootKind,
    SessionContainer,
};
use crate::plugin_host::capabilities::http::watch::{Sent, Watch};
use crate::tier::Tier;

/// Header names that carry a credential: one of these on a plain-http
/// request would put it on the wire in clear.
fn credential_like(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    matches!(
        n.as_str(),
        "authorization" | "proxy-authorization" | "cookie" | "x-api-key"
    ) || [
        "token", "secret", "password", "api-key", "apikey", "session",
    ]
    .iter()
    .any(|w| n.contains(w))
}

/// The trip wire, and whether it is set to go off at the next capability
/// use that succeeds.
#[derive(Clone, Default)]
pub struct Trip {
    pub wire: Arc<TripWire>,
    armed: Arc<AtomicBool>,
}

impl Trip {
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Disarmed and reset, for the next scenario.
    pub fn reset(&self) {
        self.armed.store(false, Ordering::SeqCst);
        self.wire.reset();
    }

    fn used(&self) {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.wire.pull();
        }
    }

    pub fn went_off(&self) -> bool {
        self.wire.pulled()
    }
}

/// What the plugin sent, as far as the checker may see it.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    pub sent: usize,
    pub answered_ok: usize,
    /// Rules the policy refused requests under.
    pub refused: Vec<String>,
    /// Credential-shaped header names the plugin put on plain-http requests.
    pub plain_credentials: Vec<String>,
}

pub struct Recorder {
    trip: Trip,
    seen: Mutex<Seen>,
}

impl Recorder {
    pub fn new(trip: Trip) -> Arc<Recorder> {
        Arc::new(Recorder {
            trip,
            seen: Mutex::default(),
        })
    }

    pub fn seen(&self) -> Seen {
        self.seen.lock().expect("recorder lock").clone()
    }
}

impl Watch for Recorder {
    fn sent(&self, request: Sent<'_>) {
        let mut seen = self.seen.lock().expect("recorder lock");
        seen.sent += 1;
        if !request.https {
            for name in request.header_names.iter().filter(|n| credential_like(n)) {
                if !seen.plain_credentials.iter().any(|s| s == name) {
                    seen.plain_credentials.push(name.to_string());
                }
            }
        }
    }

    fn answered(&self, status: u16) {
        if (200..300).contains(&status) {
            self.seen.lock().expect("recorder lock").answered_ok += 1;
            self.trip.used();
        }
    }

    fn refused(&self, rule: &str) {
        let mut seen = self.seen.lock().expect("recorder lock");
        if !seen.refused.iter().any(|r| r == rule) {
            seen.refused.push(rule.to_string());
        }
    }
}

/// Container runs started and ended through the wrapped backend (the
/// checker opens no sessions).
#[derive(Default)]
pub struct Counts {
    pub started: AtomicUsize,
    pub ended: AtomicUsize,
}

/// Counts on drop, so a run whose future is dropped mid-way (the plugin's
/// call abandoned) still counts as ended once the backend let go of it.
struct Ends(Arc<Counts>);

impl Drop for Ends {
    fn drop(&mut self) {
        self.0.ended.fetch_add(1, Ordering::SeqCst);
    }
}

pub struct Counting {
    inner: Arc<dyn ContainerBackend>,
    pub counts: Arc<Counts>,
    trip: Trip,
}

impl Counting {
    pub fn wrap(inner: Arc<dyn ContainerBackend>, trip: Trip) -> Arc<Counting> {
        Arc::new(Counting {
            inner,
            counts: Arc::default(),
            trip,
        })
    }
}

impl ContainerBackend for Counting {
    fn facts(&self) -> &BackendFacts {
        self.inner.facts()
    }

    fn ready(&self) -> Result<(), NotReady> {
        self.inner.ready()
    }

    fn check_ready(&self) -> BoxFuture<'_, Result<(), NotReady>> {
        self.inner.check_ready()
    }

    fn run(
        &self,
        spec: Approved,
        stdin: Vec<u8>,
        timeout: Duration,
        output_limit: usize,
        grant: Option<GrantMount>,
        live: Option<Live>,
    ) -> BoxFuture<'static, Result<ProcessOutput, EngineFailure>> {
        self.counts.started.fetch_add(1, Ordering::SeqCst);
        let ends = Ends(self.counts.clone());
        let run = self
            .inner
            .run(spec, stdin, timeout, output_limit, grant, live);
        let trip = self.trip.clone();
        Box::pin(async move {
            let _ends = ends;
            let out = run.await;
            trip.used();
            out
        })
    }

    fn prewarm(&self, spec: Approved) -> u32 {
        self.inner.prewarm(spec)
    }

    fn preboot(&self, kind: PrebootKind, spec: Approved) -> u32 {
        self.inner.preboot(kind, spec)
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        self.inner.shutdown()
    }

    fn start_session(
        &self,
        spec: Approved,
        lifetime: Duration,
        deadline: Instant,
        grant_dir: Option<PathBuf>,
    ) -> BoxFuture<'static, Result<Box<dyn SessionContainer>, EngineFailure>> {
        self.inner
            .start_session(spec, lifetime, deadline, grant_dir)
    }

    fn prewarm_sessions(&self, spec: Approved) -> u32 {
        self.inner.prewarm_sessions(spec)
    }
}

/// A backend that runs nothing, for `plimsoll plugin describe`: a plugin
/// that drives a container engine can describe itself without one.
pub struct RunsNothing {
    facts: BackendFacts,
}

impl RunsNothing {
    pub fn new() -> Arc<RunsNothing> {
        Arc::new(RunsNothing {
            facts: BackendFacts {
                image: "sha256:none".into(),
                configured_image: "none (plimsoll plugin describe)".into(),
                image_env: vec![],
                guest_uid: 61000,
                runtime: String::new(),
                runtime_version: String::new(),
                languages: vec![],
                tier: Tier::Container,
                checks: vec![],
                envelope: Envelope {
                    memory_mb: 0,
                    cpus: 0.0,
                    pids: 0,
                    disk_mb: 0,
                },
            },
        })
    }
}

impl ContainerBackend for RunsNothing {
    fn facts(&self) -> &BackendFacts {
        &self.facts
    }

    fn ready(&self) -> Result<(), NotReady> {
        Ok(())
    }

    fn check_ready(&self) -> BoxFuture<'_, Result<(), NotReady>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn run(
        &self,
        _spec: Approved,
        _stdin: Vec<u8>,
        _timeout: Duration,
        _output_limit: usize,
        _grant: Option<GrantMount>,
        _live: Option<Live>,
    ) -> BoxFuture<'static, Result<ProcessOutput, EngineFailure>> {
        Box::pin(std::future::ready(Err(EngineFailure::BeforeStart(
            "plimsoll plugin describe runs nothing".into(),
        ))))
    }

    fn prewarm(&self, _spec: Approved) -> u32 {
        0
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_names_are_recognised() {
        for yes in [
            "Authorization",
            "cookie",
            "X-Api-Key",
            "x-auth-token",
            "client-secret",
        ] {
            assert!(credential_like(yes), "{yes}");
        }
        for no in ["content-type", "accept", "te", "x-request-id"] {
            assert!(!credential_like(no), "{no}");
        }
    }

    #[test]
    fn the_trip_wire_goes_off_once_armed_and_used() {
        let trip = Trip::default();
        let r = Recorder::new(trip.clone());
        r.answered(200);
        assert!(!trip.went_off(), "not armed");
        trip.arm();
        r.answered(503);
        assert!(!trip.went_off(), "a failure is not a use");
        r.answered(201);
        assert!(trip.went_off());
        trip.reset();
        assert!(!trip.went_off());
    }
}
