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
/// Longest the breaker stays open on an API's say-so.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

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
}

/// One run's broker.
pub struct Session {
    profile: Arc<Profile>,
    credential: Option<HeaderValue>,
    client: reqwest::Client,
    in_flight: Semaphore,
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
            ends: Instant::now() + budget,
            state: Mutex::new(State::default()),
        })
    }

    pub fn profile(&self) -> &Profile {
        &self.profile
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

    /// One call the guest asked for.
    /// Long on purpose: the grant's checks in the order the promise states
    /// them, each counted in the CallTrace.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Response, CallError> {
        // Checks, in an order that charges every attempt.
        let route = {
            let Ok(mut s) = self.state.lock() else {
                return Err(CallError::Upstream("the broker failed".into()));
            };
            s.attempts += 1;
            if s.attempts > self.profile.max_calls {
                drop(s);
                return self.deny(CallError::Budget("the run's call budget is spent"));
            }
            let route = match route::find(&self.profile.allow, method, path) {
                Ok(r) => r.clone(),
                Err(d) => {
                    drop(s);
                    return self.deny(CallError::NotPermitted(d.text()));
                }
            };
            if body.as_ref().is_some_and(|b| b.len() > MAX_REQUEST_BODY) {
                drop(s);
                return self.deny(CallError::Budget("the request body is over 1 MiB"));
            }
            if let Some(until) = s.breaker_until
                && Instant::now() < until
            {
                drop(s);
                return self.deny(CallError::Shed);
            }
            if let Some(cap) = self.profile.route_max_calls.get(route.template()) {
                let used = s.per_route.entry(route.template().to_string()).or_insert(0);
                if *used >= *cap {
                    drop(s);
                    return self.deny(CallError::Budget("this route's call cap is spent"));
                }
                *used += 1;
            }
            route
        };
        let Ok(_permit) = self.in_flight.try_acquire() else {
            return self.deny(CallError::Budget("16 calls are already in flight"));
        };
        let remaining = self.ends.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return self.deny(CallError::Budget("the run's time is spent"));
        }

        // The URL is the origin and the approved path, parsed back to check
        // that what goes on the wire is byte for byte what was approved.
        let origin = self.profile.base_url.as_str().trim_end_matches('/');
        let url = match url::Url::parse(&format!("{origin}{path}")) {
            Ok(u) if u.path() == path && u.query().is_none() => u,
            _ => return self.deny(CallError::NotPermitted(route::Denied::NotCanonical.text())),
        };
        let method_name = route.method;
        let request_bytes = body.as_ref().map_or(0, Vec::len) as u64;
        let mut req = self
            .client
            .request(
                reqwest::Method::from_bytes(method_name.as_bytes()).unwrap_or(reqwest::Method::GET),
                url,
            )
            .timeout(CALL_TIMEOUT.min(remaining));
        if let Some(c) = &self.credential {
            req = req.header(reqwest::header::AUTHORIZATION, c.clone());
        }
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
            method: method_name,
            route: route.path_template().to_string(),
            request_bytes,
            latency_ms,
            ..CallRow::default()
        };
        let answer = match result {
            Ok((status, retry_after, body)) => {
                if let Some(wait) = backoff(status, retry_after) {
                    s.breaker_until = Some(Instant::now() + wait);
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
mod tests {
    use super::*;

    #[test]
    fn the_breaker_opens_only_on_back_off_answers_and_never_for_long() {
        assert_eq!(backoff(200, Some(Duration::from_secs(5))), None);
        assert_eq!(backoff(500, None), None);
        assert_eq!(backoff(503, None), Some(Duration::from_secs(1)));
        assert_eq!(
            backoff(429, Some(Duration::from_secs(5))),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            backoff(503, Some(Duration::from_secs(3600))),
            Some(MAX_BACKOFF)
        );
        assert_eq!(MAX_BACKOFF, Duration::from_secs(30));
    }
}
