//! The broker: one session per granted run, the only path from guest code to
//! the operator's API.
//!
//! A session holds the frozen profile, the credential minted for this run,
//! the run's budgets and its CallTrace. Every decision is made here, from the
//! method and path the guest named: the route check (see `route`), the call
//! budget (denied attempts count too, so probing is not free), the body and
//! response caps, the in-flight cap, and a breaker that sheds calls fast
//! once the API has asked for back-off. The request that leaves is built by
//! the host, to exactly the approved path, with the credential attached
//! here, no redirects and no proxy.
//!
//! What is recorded is metadata by construction: the trace's fields have no
//! room for a path, query, body or credential, only the route template that
//! matched.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderValue;
use serde::Serialize;
use tokio::sync::Semaphore;

use super::Profile;
use super::mint::{MintError, Scope};
use super::route;

/// Most request body a call may carry.
pub const MAX_REQUEST_BODY: usize = 1 << 20;
/// Most response body a call may bring back.
pub const MAX_RESPONSE_BODY: usize = 4 << 20;
/// Calls of one run waiting on the API at once.
pub const MAX_IN_FLIGHT: usize = 16;
/// Longest one upstream call may take, headers and body.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Rows a trace keeps; further calls are counted as dropped.
pub const MAX_TRACE_ROWS: usize = 256;
/// Past the run's time, how long its end waits for a call's answer to be
/// recorded.
const FINISH_MARGIN: Duration = Duration::from_secs(1);
/// Longest the breaker stays open on an API's say-so.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Least time between two health probes of one run's breaker.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// Longest a health probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a call got no upstream answer. Texts are fixed, never the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    NotPermitted(&'static str),
    Budget(&'static str),
    Shed,
    Upstream(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// One call, as recorded: no path, query, body or credential can be here.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CallRow {
    pub seq: u32,
    pub method: &'static str,
    /// The allow entry's path template that matched, e.g. `/items/*`.
    pub route: String,
    /// The upstream status; 0 when none came back.
    #[serde(skip_serializing_if = "is_zero_u16")]
    pub status: u16,
    /// Whether the answer was handed to the guest.
    pub delivered: bool,
    #[serde(skip_serializing_if = "is_zero_u64", serialize_with = "as_string")]
    pub request_bytes: u64,
    #[serde(skip_serializing_if = "is_zero_u64", serialize_with = "as_string")]
    pub response_bytes: u64,
    #[serde(skip_serializing_if = "is_zero_u64", serialize_with = "as_string")]
    pub latency_ms: u64,
    /// Which allow entry matched, for advice; not part of the trace's
    /// wire form (the route says the same to a reader).
    #[serde(skip)]
    pub allow_index: u32,
}

/// Everything a run's calls leave behind.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CallTrace {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<CallRow>,
    /// Calls made after the trace was full.
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub dropped: u32,
    /// Attempts refused by the route check or a budget.
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub denied: u32,
    /// Calls refused fast while the breaker was open.
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub shed: u32,
}

impl CallTrace {
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty() && self.dropped == 0 && self.denied == 0 && self.shed == 0
    }
}

fn is_zero_u16(v: &u16) -> bool {
    *v == 0
}
fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}
fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}
/// proto3 JSON writes 64-bit integers as strings.
fn as_string<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

#[derive(Default)]
struct State {
    attempts: u32,
    per_route: HashMap<String, u32>,
    trace: CallTrace,
    seq: u32,
    breaker_until: Option<Instant>,
    /// The status that opened the breaker.
    opened_by: u16,
    last_probe: Option<Instant>,
    probing: bool,
}

/// Held while a probe is out; clears the flag when dropped.
struct ProbeInFlight<'a>(&'a Mutex<State>);

impl Drop for ProbeInFlight<'_> {
    fn drop(&mut self) {
        if let Ok(mut s) = self.0.lock() {
            s.probing = false;
        }
    }
}

/// What the breaker says about one call.
enum Breaker {
    Closed,
    Shed,
    /// Open on a 503, with a health check to ask: this call probes.
    Probe,
}

impl State {
    fn breaker(&mut self, profile: &Profile, now: Instant) -> Breaker {
        match self.breaker_until {
            Some(until) if now < until => {}
            _ => return Breaker::Closed,
        }
        // Only a 503 is probed: a 429 is about this caller's rate, which a
        // probe would only spend further.
        let due = self
            .last_probe
            .is_none_or(|t| now.duration_since(t) >= PROBE_EVERY);
        if self.opened_by == 503 && profile.health_check.is_some() && !self.probing && due {
            self.probing = true;
            self.last_probe = Some(now);
            return Breaker::Probe;
        }
        Breaker::Shed
    }
}

/// One run's broker.
pub struct Session {
    profile: Arc<Profile>,
    credential: Option<HeaderValue>,
    client: reqwest::Client,
    in_flight: Semaphore,
    /// Set when the run is over (`finish`): no call starts after it.
    closed: AtomicBool,
    ends: Instant,
    state: Mutex<State>,
}

impl Session {
    /// Mints the run's credential and opens its budgets. `budget` is the
    /// run's wall time; no call outlives it.
    pub fn open(
        profile: Arc<Profile>,
        caller: &str,
        budget: Duration,
        client: reqwest::Client,
    ) -> Result<Session, MintError> {
        let credential = profile.token.mint(&Scope {
            subject: caller,
            scopes: &profile.scopes,
            run_budget: budget,
        })?;
        Ok(Session {
            profile,
            credential,
            client,
            in_flight: Semaphore::new(MAX_IN_FLIGHT),
            closed: AtomicBool::new(false),
            ends: Instant::now() + budget,
            state: Mutex::new(State::default()),
        })
    }

    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Whether the run's time is left: past it, no call is made.
    pub fn is_live(&self) -> bool {
        Instant::now() < self.ends
    }

    pub fn profile_arc(&self) -> Arc<Profile> {
        self.profile.clone()
    }

    /// Ends the run's calls and reads its trace: no call starts from now,
    /// and every call that started (it may have reached the API) is waited
    /// for, so the trace holds it. A call is made in a task of its own,
    /// which a run's end does not stop, but none outlives the run's time
    /// (its timeout is what is left of it): the wait ends by then, a
    /// moment after, whatever the sandbox did.
    pub async fn finish(&self) -> CallTrace {
        let within = self.ends.saturating_duration_since(Instant::now()) + FINISH_MARGIN;
        self.closed.store(true, Ordering::SeqCst);
        let _ =
            tokio::time::timeout(within, self.in_flight.acquire_many(MAX_IN_FLIGHT as u32)).await;
        self.trace()
    }

    /// The run's trace so far.
    pub fn trace(&self) -> CallTrace {
        self.state
            .lock()
            .map(|s| s.trace.clone())
            .unwrap_or_default()
    }

    fn deny(&self, why: CallError) -> Result<Response, CallError> {
        if let Ok(mut s) = self.state.lock() {
            match why {
                CallError::Shed => s.trace.shed += 1,
                _ => s.trace.denied += 1,
            }
        }
        Err(why)
    }

    /// The elected call of an open breaker: asks the profile's health check
    /// whether the API is back. A 2xx closes the breaker and the call goes
    /// on through every check again (charged once: the attempt this call
    /// already made is given back); anything else sheds it. The probe is the
    /// host's, not the guest's: it is not traced or charged to a budget.
    async fn probe_then(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Response, CallError> {
        // Cleared however the probe ends, abandoned midway included, so a
        // dropped call cannot leave the breaker never probed again.
        let probing = ProbeInFlight(&self.state);
        let healthy = self.probe().await;
        drop(probing);
        {
            let Ok(mut s) = self.state.lock() else {
                return Err(CallError::Upstream("the broker failed".into()));
            };
            if !healthy {
                drop(s);
                return self.deny(CallError::Shed);
            }
            s.breaker_until = None;
            s.attempts -= 1;
        }
        self.checked_call(method, path, body).await
    }

    async fn probe(&self) -> bool {
        let Some(check) = &self.profile.health_check else {
            return false;
        };
        let remaining = self.ends.saturating_duration_since(Instant::now());
        let Some(req) = self.outgoing("GET", check.path_template(), PROBE_TIMEOUT.min(remaining))
        else {
            return false;
        };
        matches!(req.send().await, Ok(r) if r.status().is_success())
    }

    /// The request for `method` and `path` on the profile's origin, with
    /// the run's credential: `None` unless the URL, parsed back, carries
    /// exactly the approved path, so what goes on the wire is byte for byte
    /// what was approved. Every request the broker sends is made here.
    fn outgoing(
        &self,
        method: &'static str,
        path: &str,
        timeout: Duration,
    ) -> Option<reqwest::RequestBuilder> {
        let origin = self.profile.base_url.as_str().trim_end_matches('/');
        let url = url::Url::parse(&format!("{origin}{path}"))
            .ok()
            .filter(|u| u.path() == path && u.query().is_none())?;
        let method = reqwest::Method::from_bytes(method.as_bytes()).ok()?;
        let mut req = self.client.request(method, url).timeout(timeout);
        if let Some(c) = &self.credential {
            req = req.header(reqwest::header::AUTHORIZATION, c.clone());
        }
        Some(req)
    }

    /// One call the guest asked for. Its slot is taken before anything is
    /// counted against a route, so a call refused for want of one spends
    /// no route's cap; and the close is checked after the slot, so a run's
    /// `finish`, which waits for every slot, either sees the call through
    /// or keeps it from starting.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Response, CallError> {
        let Ok(_permit) = self.in_flight.try_acquire() else {
            if let Ok(mut s) = self.state.lock() {
                s.attempts += 1;
            }
            return self.deny(CallError::Budget("16 calls are already in flight"));
        };
        if self.closed.load(Ordering::SeqCst) {
            return self.deny(CallError::NotPermitted("the run is over"));
        }
        self.checked_call(method, path, body).await
    }

    /// A call holding its slot.
    /// Long on purpose: the grant's checks in the order the promise states
    /// them, each counted in the CallTrace.
    async fn checked_call(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Response, CallError> {
        // Checks, in an order that charges every attempt. `None` is the
        // breaker electing this call to probe, done once the lock is let go.
        let checked = {
            let Ok(mut s) = self.state.lock() else {
                return Err(CallError::Upstream("the broker failed".into()));
            };
            s.attempts += 1;
            if s.attempts > self.profile.max_calls {
                drop(s);
                return self.deny(CallError::Budget("the run's call budget is spent"));
            }
            let (allow_index, route) = match route::find_index(&self.profile.allow, method, path) {
                Ok(i) => (i, self.profile.allow[i].clone()),
                Err(d) => {
                    drop(s);
                    return self.deny(CallError::NotPermitted(d.text()));
                }
            };
            if body.as_ref().is_some_and(|b| b.len() > MAX_REQUEST_BODY) {
                drop(s);
                return self.deny(CallError::Budget("the request body is over 1 MiB"));
            }
            match s.breaker(&self.profile, Instant::now()) {
                Breaker::Closed => {
                    if let Some(cap) = self.profile.route_max_calls.get(route.template()) {
                        let used = s.per_route.entry(route.template().to_string()).or_insert(0);
                        if *used >= *cap {
                            drop(s);
                            return self.deny(CallError::Budget("this route's call cap is spent"));
                        }
                        *used += 1;
                    }
                    Some((allow_index, route))
                }
                Breaker::Shed => {
                    drop(s);
                    return self.deny(CallError::Shed);
                }
                Breaker::Probe => None,
            }
        };
        let Some((allow_index, route)) = checked else {
            return Box::pin(self.probe_then(method, path, body)).await;
        };
        let remaining = self.ends.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return self.deny(CallError::Budget("the run's time is spent"));
        }

        let method_name = route.method;
        let Some(mut req) = self.outgoing(method_name, path, CALL_TIMEOUT.min(remaining)) else {
            return self.deny(CallError::NotPermitted(route::Denied::NotCanonical.text()));
        };
        let request_bytes = body.as_ref().map_or(0, Vec::len) as u64;
        if let Some(b) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b);
        }
        let started = Instant::now();
        let result = send(req).await;
        let latency_ms = started.elapsed().as_millis() as u64;

        let Ok(mut s) = self.state.lock() else {
            return Err(CallError::Upstream("the broker failed".into()));
        };
        s.seq += 1;
        let mut row = CallRow {
            seq: s.seq,
            allow_index: allow_index as u32,
            method: method_name,
            route: route.path_template().to_string(),
            request_bytes,
            latency_ms,
            ..CallRow::default()
        };
        let answer = match result {
            Ok((status, retry_after, body)) => {
                if let Some(wait) = backoff(status, retry_after) {
                    let now = Instant::now();
                    s.breaker_until = Some(now + wait);
                    s.opened_by = status;
                    // The first probe waits as long as any later one.
                    s.last_probe = Some(now);
                }
                row.status = status;
                row.delivered = true;
                row.response_bytes = body.len() as u64;
                Ok(Response { status, body })
            }
            Err(e) => Err(e),
        };
        if s.trace.calls.len() < MAX_TRACE_ROWS {
            s.trace.calls.push(row);
        } else {
            s.trace.dropped += 1;
        }
        answer
    }
}

/// How long the breaker opens after an answer: only for 429 and 503, for
/// the API's Retry-After (1 s without one), never longer than MAX_BACKOFF.
fn backoff(status: u16, retry_after: Option<Duration>) -> Option<Duration> {
    (status == 429 || status == 503).then(|| {
        retry_after
            .unwrap_or(Duration::from_secs(1))
            .min(MAX_BACKOFF)
    })
}

/// Sends and reads at most MAX_RESPONSE_BODY. Error texts are the host's,
/// never the upstream's or the URL.
async fn send(req: reqwest::RequestBuilder) -> Result<(u16, Option<Duration>, Vec<u8>), CallError> {
    let resp = req.send().await.map_err(|e| {
        CallError::Upstream(if e.is_timeout() {
            "the API did not answer in time".into()
        } else {
            "the API could not be reached".into()
        })
    })?;
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_RESPONSE_BODY as u64)
    {
        return Err(CallError::Upstream("the API's answer is over 4 MiB".into()));
    }
    let mut body = Vec::new();
    let mut resp = resp;
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|_| CallError::Upstream("the API's answer broke off".into()))?
    {
        if body.len() + chunk.len() > MAX_RESPONSE_BODY {
            return Err(CallError::Upstream("the API's answer is over 4 MiB".into()));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((status, retry_after, body))
}

#[cfg(test)]
#[path = "broker_tests.rs"]
mod tests;
