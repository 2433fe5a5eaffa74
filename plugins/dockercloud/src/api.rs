//! Docker's Sandboxes REST API (v1), management side: create a sandbox and
//! wait until it runs, read its network policy, mint its endpoint
//! credential, delete it, and sweep the ones this plugin labelled.
//!
//! Every management request goes to the first allowed origin under
//! `/sandboxes` (where Docker serves the API); the host adds the access
//! token. A 429 on a read or a mint is retried (at most 4 attempts, the
//! pause the service asks for up to 5 s, and only inside the run's budget);
//! nothing else is, since a repeated create or delete could act twice.

use serde_json::{Value, json};
use wasi::clocks::monotonic_clock::Instant;
use wasi::http::types::Method;

use crate::bindings::plimsoll::provider::types::{Refusal, RunError};
use crate::checks;
use crate::settings;
use crate::wire::session::Standing;
use crate::wire::{self, Failure};

/// The image every sandbox boots: node and a POSIX shell with coreutils'
/// `timeout` and `head`, which the command wrapper needs.
/// Where Docker serves the API on its origin.
const API_PREFIX: &str = "/sandboxes/v1";
/// Labels every sandbox of ours carries: who made it, and the wall-clock
/// second after which no run of any instance can still be using it.
const LABEL_OWNER: (&str, &str) = ("created-by", "plimsoll");
const LABEL_DEADLINE: &str = "plimsoll-deadline";
/// Seconds past the run's budget the service keeps the sandbox: the
/// backstop that deletes it if every delete of ours is lost.
const TTL_MARGIN_S: u64 = 30;
/// Most of a management answer read.
const ANSWER_BYTES: usize = 1 << 20;
const POLL_MS: u64 = 250;
const READ_ATTEMPTS: u32 = 4;
const MAX_PAUSE_S: u64 = 5;

#[derive(Clone)]
pub struct Service {
    /// `scheme://host:port` of the management API.
    pub api: String,
    /// Every origin the operator allowed, as the host states them.
    pub allowed: Vec<String>,
}

/// A sandbox the service made for this run (or session).
pub struct Sandbox {
    pub uid: String,
    /// The display name it was created with (the service must report it).
    pub name: String,
    /// Its endpoint, as the service reported it (checked to be allowed).
    pub endpoint: String,
}

/// A management answer: status, parsed body, the ETag and `Retry-After`.
pub struct Answer {
    pub status: u16,
    pub body: Value,
    pub etag: Option<String>,
    retry_after: Option<u64>,
}

impl Service {
    pub fn configured(origins: Vec<String>) -> Result<Service, String> {
        let api = origins.first().cloned().ok_or(
            "no origin is allowed: set SANDBOX_PLUGIN_HTTP_ORIGINS to Docker's API origin, then the sandbox endpoints' origin",
        )?;
        Ok(Service {
            api,
            allowed: origins,
        })
    }

    /// Creates a sandbox kept by the service for `lifetime_s` plus a
    /// margin, and waits until it runs. Every check of what the service
    /// made is passed before this returns; a sandbox that fails one is
    /// deleted first.
    pub fn create(&self, lifetime_s: u64, deadline: Instant) -> Result<Sandbox, RunError> {
        let name = format!("plimsoll-{:016x}", wasi::random::random::get_random_u64());
        let ttl = lifetime_s + TTL_MARGIN_S;
        let body = json!({
            "displayName": name,
            "imageRef": settings::image(),
            "platform": {"os": "linux", "architecture": "amd64"},
            "resources": {"cpus": settings::cpus(), "memoryMib": settings::memory_mib()},
            // The image's own command would exit; this keeps the VM up.
            "startupExecution": {"rawImage": {"start": {"argv": ["tail", "-f", "/dev/null"]}}},
            "features": {"timeouts": {"timeout": format!("{ttl}s"), "onTimeout": "delete", "autoResume": false}},
            "labels": {
                LABEL_OWNER.0: LABEL_OWNER.1,
                LABEL_DEADLINE: (wall_seconds() + ttl).to_string(),
            },
        })
        .to_string();
        // The name doubles as the idempotency key: a create whose answer is
        // lost can be found by it, and a repeat makes nothing new.
        let answer = self.call(
            Method::Post,
            "/sandboxes",
            &[("idempotency-key", name.as_str())],
            body.as_bytes(),
            deadline,
        );
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                self.reap_named(&name);
                return Err(lost(e, "create"));
            }
        };
        if !matches!(answer.status, 201 | 202) {
            // A failure inside the service, or a success off the document,
            // may still have made one.
            if answer.status >= 500 || (200..300).contains(&answer.status) {
                self.reap_named(&name);
            }
            return Err(RunError::NotDispatched(refusal("create", &answer)));
        }
        let Some(uid) = answer.body["uid"].as_str().filter(|u| valid_uid(u)) else {
            self.reap_named(&name);
            return Err(not_started(
                "Docker answered the create without a sandbox uid",
            ));
        };
        let uid = uid.to_string();
        let fail = |why: String| {
            self.delete(&uid);
            Err(not_started(&why))
        };
        let mut current = answer.body;
        loop {
            match current["core"]["status"].as_str().unwrap_or("") {
                "running" if current["core"]["endpoint"]["uri"].is_string() => break,
                s @ ("failed" | "stopping" | "stopped" | "deleting" | "degraded") => {
                    return fail(format!("the sandbox reached status {s} instead of running"));
                }
                _ => {}
            }
            if wire::remaining_ms(deadline) < POLL_MS {
                return fail("the sandbox did not start within the run's budget".into());
            }
            sleep_ms(POLL_MS);
            match self.read(&format!("/sandboxes/{uid}"), deadline) {
                Ok(a) if a.status == 200 => current = a.body,
                Ok(a) if a.status == 404 && is_api_error(&a.body) => {
                    return fail("the sandbox disappeared while starting".into());
                }
                Ok(a) => return fail(format!("reading the new sandbox answered {}", a.status)),
                Err(e) => return fail(format!("reading the new sandbox failed: {e:?}")),
            }
        }
        match checks::sandbox(&current, &name, &self.allowed) {
            Ok(endpoint) => Ok(Sandbox {
                uid,
                name,
                endpoint,
            }),
            Err(why) => fail(why),
        }
    }

    /// Where a session's sandbox stands at a call, read again: running and
    /// still what was checked at open (its endpoint as reported now), or
    /// why not.
    pub fn standing(&self, uid: &str, name: &str, deadline: Instant) -> Standing<Sandbox> {
        let answer = match self.read(&format!("/sandboxes/{uid}"), deadline) {
            Ok(a) => a,
            Err(e) => return Standing::Unknown(format!("reading the sandbox failed: {e:?}")),
        };
        match answer.status {
            404 if is_api_error(&answer.body) => return Standing::Gone,
            200 => {}
            n => return Standing::Unknown(format!("reading the sandbox answered {n}")),
        }
        match answer.body["core"]["status"].as_str().unwrap_or("") {
            "running" => match checks::sandbox(&answer.body, name, &self.allowed) {
                Ok(endpoint) => Standing::Running(Sandbox {
                    uid: uid.to_string(),
                    name: name.to_string(),
                    endpoint,
                }),
                Err(why) => Standing::Changed(why),
            },
            // Its timeout's delete action under way: the service ended it.
            "deleting" => Standing::Gone,
            s @ ("failed" | "stopping" | "stopped" | "degraded") => {
                Standing::Ended(format!("the sandbox is {s}"))
            }
            s => Standing::Unknown(format!("the sandbox is {}, not running", checks::short(s))),
        }
    }

    /// Before any guest code: the sandbox's effective network policy must
    /// be deny-all with no allow rule, read back on every run; then the one
    /// endpoint credential the run uses.
    pub fn ready(&self, sandbox: &Sandbox, deadline: Instant) -> Result<String, RunError> {
        let path = format!("/sandboxes/{}/network-policies", sandbox.uid);
        let answer = self
            .read(&path, deadline)
            .map_err(|e| lost(e, "network-policy read"))?;
        if answer.status != 200 {
            return Err(not_started(&format!(
                "reading the sandbox's network policy answered {}",
                answer.status
            )));
        }
        checks::deny_all(&answer.body).map_err(|why| {
            RunError::NotDispatched(Refusal::Isolation(format!(
                "the sandbox's network policy is not deny-all: {why}"
            )))
        })?;
        self.mint(&sandbox.uid, deadline)
    }

    /// One scoped credential for the sandbox's endpoint: exec and files,
    /// for the longest the service gives (300 s).
    fn mint(&self, uid: &str, deadline: Instant) -> Result<String, RunError> {
        let body = json!({
            "permissions": ["sandboxesExec", "sandboxesFilesWrite", "sandboxesFilesRead"],
            "ttl": "300s",
        })
        .to_string();
        let path = format!("/sandboxes/{uid}/endpoint-credentials");
        let answer = retrying(deadline, || {
            self.call(Method::Post, &path, &[], body.as_bytes(), deadline)
        })
        .map_err(|e| lost(e, "credential mint"))?;
        if answer.status != 200 {
            return Err(RunError::NotDispatched(refusal("credential mint", &answer)));
        }
        answer.body["token"]
            .as_str()
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .map(str::to_string)
            .ok_or_else(|| not_started("the credential mint answered no token"))
    }

    /// Deletes the sandbox and waits until it is gone; true once it is
    /// (absent counts as deleted). Bounded by the call's cleanup deadline.
    pub fn delete(&self, uid: &str) -> bool {
        let deadline = wire::cleanup_deadline();
        let path = format!("/sandboxes/{uid}");
        // A stale ETag (the sandbox changed between the read and the
        // delete) is read again, a few times.
        for _ in 0..5 {
            let etag = match self.read(&path, deadline) {
                Ok(a) if a.status == 404 => return true,
                Ok(a) if a.status == 200 => match a.etag {
                    Some(e) => e,
                    None => return false,
                },
                _ => return false,
            };
            let answer = self.call(
                Method::Delete,
                &format!("{path}?force=true"),
                &[("if-match", etag.as_str())],
                b"",
                deadline,
            );
            match answer {
                Ok(a) if a.status == 204 => return self.gone(&path, deadline),
                Ok(a) if a.status == 202 => return self.gone(&path, deadline),
                Ok(a) if a.status == 412 => continue,
                _ => return false,
            }
        }
        false
    }

    /// Reads until the sandbox answers 404 (the API's own, not a proxy's).
    fn gone(&self, path: &str, deadline: Instant) -> bool {
        loop {
            match self.read(path, deadline) {
                Ok(a) if a.status == 404 && is_api_error(&a.body) => return true,
                Ok(a) if a.status == 200 => {}
                _ => return false,
            }
            if wire::remaining_ms(deadline) < POLL_MS {
                return false;
            }
            sleep_ms(POLL_MS);
        }
    }

    /// Deletes every sandbox labelled ours whose labelled deadline passed,
    /// whichever instance made it. Returns how many were deleted.
    pub fn sweep(&self, deadline: Instant) -> Result<usize, String> {
        let now = wall_seconds();
        let mut expired = Vec::new();
        let mut token = String::new();
        for _ in 0..50 {
            let path = format!(
                "/sandboxes?pageSize=100{}",
                if token.is_empty() {
                    String::new()
                } else {
                    format!("&pageToken={}", encode(&token))
                }
            );
            let a = self.read(&path, deadline).map_err(|e| format!("{e:?}"))?;
            if a.status != 200 {
                return Err(format!("listing sandboxes answered {}", a.status));
            }
            for s in a.body["sandboxes"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                let labels = &s["core"]["labels"];
                let ours = labels[LABEL_OWNER.0].as_str() == Some(LABEL_OWNER.1);
                let past = labels[LABEL_DEADLINE]
                    .as_str()
                    .and_then(|d| d.parse::<u64>().ok())
                    .is_none_or(|d| d < now);
                if ours
                    && past
                    && let Some(uid) = s["uid"].as_str().filter(|u| valid_uid(u))
                {
                    expired.push(uid.to_string());
                }
            }
            token = a.body["nextPageToken"].as_str().unwrap_or("").to_string();
            if token.is_empty() {
                break;
            }
        }
        Ok(expired.iter().filter(|uid| self.delete(uid)).count())
    }

    /// A create whose answer was lost: find the sandbox by its display name
    /// and delete it.
    fn reap_named(&self, name: &str) {
        let path = format!(
            "/sandboxes?pageSize=100&filter={}",
            encode(&format!("display_name={name}"))
        );
        if let Ok(a) = self.read(&path, wire::cleanup_deadline()) {
            for s in a.body["sandboxes"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                // The filter is the service's; the name is checked here too.
                if s["displayName"].as_str() == Some(name)
                    && let Some(uid) = s["uid"].as_str().filter(|u| valid_uid(u))
                {
                    self.delete(uid);
                }
            }
        }
    }

    /// A GET, retried on 429.
    pub fn read(&self, path: &str, deadline: Instant) -> Result<Answer, Failure> {
        retrying(deadline, || {
            self.call(Method::Get, path, &[], b"", deadline)
        })
    }

    fn call(
        &self,
        method: Method,
        path: &str,
        extra: &[(&str, &str)],
        body: &[u8],
        deadline: Instant,
    ) -> Result<Answer, Failure> {
        let mut headers: Vec<(&str, Vec<u8>)> = vec![("accept", b"application/json".to_vec())];
        if !body.is_empty() {
            headers.push(("content-type", b"application/json".to_vec()));
        }
        for (k, v) in extra {
            headers.push((k, v.as_bytes().to_vec()));
        }
        let mut r = wire::send_to(
            &self.api,
            method,
            &format!("{API_PREFIX}{path}"),
            headers,
            body,
            deadline,
        )?;
        let retry_after = r.retry_after();
        let etag = r.header("etag").map(str::to_string);
        let bytes = r.read_all(ANSWER_BYTES, deadline)?;
        Ok(Answer {
            status: r.status,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            etag,
            retry_after,
        })
    }
}

/// `call` made again while the service answers 429: at most
/// `READ_ATTEMPTS` in all, after the pause the service asks for (up to
/// `MAX_PAUSE_S`), and only while the pause fits the budget. For a read or
/// a mint, which cannot act twice.
fn retrying(
    deadline: Instant,
    call: impl Fn() -> Result<Answer, Failure>,
) -> Result<Answer, Failure> {
    let mut attempt = 1;
    loop {
        let answer = call()?;
        if answer.status != 429 || attempt >= READ_ATTEMPTS {
            return Ok(answer);
        }
        let pause_s = answer
            .retry_after
            .unwrap_or(u64::from(attempt))
            .min(MAX_PAUSE_S);
        // A pause that would outlast the budget is not taken: the 429 is
        // the answer.
        if pause_s * 1000 + 500 > wire::remaining_ms(deadline) {
            return Ok(answer);
        }
        sleep_ms(pause_s * 1000);
        attempt += 1;
    }
}

/// Whether a body is the API's own error JSON: a 404 without it is a route
/// not served (a proxy's page), never a missing sandbox.
pub fn is_api_error(v: &Value) -> bool {
    v["code"].as_str().is_some_and(|c| !c.is_empty())
}

/// A refusal by the service, by its status and code (never its message,
/// which could echo anything).
pub fn refusal(what: &str, a: &Answer) -> Refusal {
    let code: String = a.body["code"]
        .as_str()
        .unwrap_or("")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(40)
        .collect();
    let text = format!(
        "Docker refused the {what} (HTTP {}{})",
        a.status,
        if code.is_empty() {
            String::new()
        } else {
            format!(", {code}")
        }
    );
    match (a.status, code.as_str()) {
        (401 | 403, _) | (_, "unauthenticated" | "permissionDenied") => Refusal::Permission(text),
        (429, _) | (_, "resourceExhausted") => Refusal::Capacity(text),
        (400 | 409 | 412 | 428, _) => Refusal::Request(text),
        _ => Refusal::Environment(text),
    }
}

/// Sandbox uids go into URL paths: only short runs of safe characters.
pub fn valid_uid(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

pub use crate::wire::{encode, lost, not_started, sleep_ms, wall_seconds};
