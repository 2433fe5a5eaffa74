//! E2B's control plane: create a sandbox locked down, delete it, find the
//! ones this plugin labelled. Every sandbox carries three metadata labels:
//! who made it, a random nonce for this create (so a create whose answer is
//! lost can still be found and deleted), and the wall-clock second after
//! which no run or session of ours can still be using it (so any instance's
//! sweeper may reap it without tracking what other instances hold).

use std::collections::HashSet;

use serde_json::{Value, json};
use wasi::clocks::monotonic_clock::Instant;
use wasi::http::types::Method;

use crate::bindings::plimsoll::provider::types::{Refusal, RunError};
use crate::wire::{self, Failure};

/// The label every sandbox of ours carries, with this value.
pub const LABEL_OWNER: (&str, &str) = ("created-by", "plimsoll");
const LABEL_NONCE: &str = "plimsoll-nonce";
const LABEL_DEADLINE: &str = "plimsoll-deadline";
/// Oldest envd this plugin drives: 0.1.0 is where E2B's SDK draws the line
/// (older agents lack the process API it and this plugin use).
const MIN_ENVD: (u64, u64, u64) = (0, 1, 0);
/// Most of a control-plane answer this plugin reads.
const ANSWER_BYTES: usize = 1 << 20;
/// Seconds past a run's own budget the service keeps the sandbox, as the
/// backstop that reaps it if every delete of ours is lost.
const TTL_MARGIN_S: u64 = 10;
/// Sandboxes asked for per listing page: the most E2B's `limit` takes.
const LIST_LIMIT: u32 = 100;
/// Most pages one listing follows. A listing still unfinished after this
/// many fails (and a sweep then deletes nothing) rather than follow a
/// cursor that may never end.
const LIST_PAGES: usize = 50;
/// Longest page cursor this plugin sends back.
const MAX_TOKEN: usize = 1024;

/// A control-plane answer: the status, the parsed body, and the headers
/// this plugin reads.
struct Answer {
    status: u16,
    body: Value,
    /// `Retry-After`, in seconds.
    retry_after: Option<u64>,
    /// `X-Next-Token`: the cursor of a listing's next page; `None` when the
    /// header is absent or empty (the last page).
    next_token: Option<String>,
}

/// Where the service is: the API origin, and the edge that routes a request
/// to a sandbox's envd by its `E2b-Sandbox-Id` header.
#[derive(Clone)]
pub struct Service {
    pub api: String,
    pub edge: String,
}

/// A created sandbox: its ID, the token its envd demands, and the token
/// E2B's edge asks for on a sandbox whose public traffic is locked.
#[derive(Clone)]
pub struct Sandbox {
    pub id: String,
    pub token: String,
    pub traffic: String,
}

impl Service {
    /// The operator's origins: the first is the API, the second (if any) the
    /// sandbox edge; one origin serves both.
    pub fn configured(origins: Vec<String>) -> Result<Service, String> {
        let mut it = origins.into_iter();
        let api = it
            .next()
            .ok_or("no origin is allowed: set SANDBOX_PLUGIN_HTTP_ORIGINS to E2B's API")?;
        let edge = it.next().unwrap_or_else(|| api.clone());
        Ok(Service { api, edge })
    }

    /// Creates a sandbox with internet access off and inbound traffic
    /// locked, kept by the service for `lifetime_s` plus a margin. With
    /// `guard` (a granted run's), its egress allows that one destination.
    pub fn create(
        &self,
        lifetime_s: u64,
        deadline: Instant,
        guard: Option<(&str, u16)>,
    ) -> Result<Sandbox, RunError> {
        let network = egress(guard)?;
        let nonce = format!(
            "{:016x}{:016x}",
            wasi::random::random::get_random_u64(),
            wasi::random::random::get_random_u64()
        );
        let ttl = lifetime_s + TTL_MARGIN_S;
        let body = json!({
            "templateID": crate::settings::template(),
            "timeout": ttl,
            "secure": true,
            "allow_internet_access": false,
            "network": network,
            "metadata": {
                LABEL_OWNER.0: LABEL_OWNER.1,
                LABEL_NONCE: nonce,
                LABEL_DEADLINE: (wall_seconds() + ttl).to_string(),
            },
        })
        .to_string();
        let mut retried = false;
        loop {
            let answer = self.call(Method::Post, "/sandboxes", body.as_bytes(), deadline);
            let Answer {
                status,
                body: parsed,
                retry_after,
                ..
            } = match answer {
                Ok(a) => a,
                // The request may have created a sandbox whose answer was
                // lost: find it by its nonce and delete it.
                Err(e) => {
                    self.reap_nonce(&nonce);
                    return Err(lost(e, "create"));
                }
            };
            if status == 200 || status == 201 {
                return self.created(&parsed, &nonce);
            }
            // Busy: one retry when the service says when, and that fits
            // (the service's number is clamped before any arithmetic).
            let retry_after = retry_after.map(|s: u64| s.min(60));
            if let (429 | 503, Some(s), false) = (status, retry_after, retried)
                && s * 1000 + 1000 < wire::remaining_ms(deadline)
            {
                retried = true;
                sleep_ms(s * 1000);
                continue;
            }
            if status >= 500 && !matches!(status, 503) {
                // A failure inside the service may still have made one.
                self.reap_nonce(&nonce);
            }
            return Err(RunError::NotDispatched(refusal(status, &parsed)));
        }
    }

    /// A 2xx create answer, checked: anything missing and the sandbox (if
    /// any) is deleted before failing.
    fn created(&self, v: &Value, nonce: &str) -> Result<Sandbox, RunError> {
        let Some(id) = v["sandboxID"].as_str().filter(|s| valid_id(s)) else {
            self.reap_nonce(nonce);
            return Err(not_started("E2B answered the create without a sandbox ID"));
        };
        let id = id.to_string();
        let fail = |why: &str| {
            self.delete(&id);
            Err(not_started(why))
        };
        let Some(token) = v["envdAccessToken"].as_str().filter(|t| !t.is_empty()) else {
            return fail("E2B answered the create without an envd access token");
        };
        // Asked for with public traffic locked; without it the edge would
        // refuse every envd call.
        let Some(traffic) = v["trafficAccessToken"].as_str().filter(|t| !t.is_empty()) else {
            return fail("E2B answered the create without a traffic access token");
        };
        match v["envdVersion"].as_str().and_then(parse_version) {
            Some(version) if version >= MIN_ENVD => {}
            _ => return fail("the sandbox's envd is missing or older than 0.1.0"),
        }
        Ok(Sandbox {
            id,
            token: token.to_string(),
            traffic: traffic.to_string(),
        })
    }

    /// Sets a running sandbox's egress: everything denied, and with
    /// `guard`, that one destination allowed (a session's granted call).
    /// E2B replaces every rule with the body's, clearing what it omits, so
    /// the denial is sent every time: a body with only the allowance would
    /// leave the sandbox open to everything.
    pub fn set_egress(
        &self,
        id: &str,
        guard: Option<(&str, u16)>,
        deadline: Instant,
    ) -> Result<(), RunError> {
        let mut network = egress(guard)?;
        if let Some(n) = network.as_object_mut() {
            // Ingress is not the update's to say; the field is not in it.
            n.remove("allowPublicTraffic");
            n.insert("allow_internet_access".into(), Value::Bool(false));
        }
        let path = format!("/sandboxes/{id}/network");
        match self.call(Method::Put, &path, network.to_string().as_bytes(), deadline) {
            Ok(Answer {
                status: 204 | 200, ..
            }) => Ok(()),
            Ok(a) => Err(RunError::NotDispatched(refusal(a.status, &a.body))),
            Err(e) => Err(lost(e, "the egress update")),
        }
    }

    /// Deletes a sandbox: three tries, a 404 counts as done (its own
    /// timeout got there first). Best effort: the TTL is the backstop.
    pub fn delete(&self, id: &str) -> bool {
        let deadline = wire::cleanup_deadline();
        for _ in 0..3 {
            match self.call(Method::Delete, &format!("/sandboxes/{id}"), b"", deadline) {
                Ok(Answer {
                    status: 200 | 204 | 404,
                    ..
                }) => return true,
                Err(Failure::Deadline) => return false,
                _ => {}
            }
        }
        false
    }

    /// Whether the service still has the sandbox; `None` when it did not
    /// say.
    pub fn exists(&self, id: &str) -> Option<bool> {
        match self.call(
            Method::Get,
            &format!("/sandboxes/{id}"),
            b"",
            wire::cleanup_deadline(),
        ) {
            Ok(Answer { status: 200, .. }) => Some(true),
            Ok(Answer { status: 404, .. }) => Some(false),
            _ => None,
        }
    }

    /// Sandboxes carrying every `labels` pair, as `(id, metadata)`, from
    /// every page of E2B's listing (`GET /v2/sandboxes`), running and paused.
    /// Fails, rather than answer with part of the list, when a page fails or
    /// the pages do not end within `LIST_PAGES`.
    pub fn list(&self, labels: &[(&str, &str)]) -> Result<Vec<(String, Value)>, String> {
        // `state` is named although E2B's SDK says an omitted one means
        // both: the API's spec gives no default for it, and a paused
        // sandbox of ours must not be missed. Form style, unexploded, as the
        // spec declares it: one comma-separated value.
        let first = format!(
            "/v2/sandboxes?metadata={}&state=running,paused&limit={LIST_LIMIT}",
            encode(&metadata_filter(labels))
        );
        let mut found = Vec::new();
        let mut seen = HashSet::new();
        let mut token: Option<String> = None;
        for page in 1..=LIST_PAGES {
            let path = match &token {
                Some(t) => format!("{first}&nextToken={}", encode(t)),
                None => first.clone(),
            };
            let a = self
                .call(Method::Get, &path, b"", wire::cleanup_deadline())
                .map_err(|e| format!("listing page {page} failed: {e:?}"))?;
            if a.status != 200 {
                return Err(format!("listing page {page} answered {}", a.status));
            }
            let Some(items) = a.body.as_array() else {
                return Err(format!("listing page {page} was not a JSON array"));
            };
            if items.len() > LIST_LIMIT as usize {
                // More than was asked for: not E2B's listing, and what is
                // kept from it must stay bounded.
                return Err(format!(
                    "listing page {page} held more than {LIST_LIMIT} sandboxes"
                ));
            }
            for s in items {
                // The service filtered; check again here rather than trust
                // it with what gets deleted.
                let meta = &s["metadata"];
                if let Some(id) = s["sandboxID"].as_str().filter(|s| valid_id(s))
                    && labels.iter().all(|(k, v)| meta[*k].as_str() == Some(*v))
                    && seen.insert(id.to_string())
                {
                    found.push((id.to_string(), meta.clone()));
                }
            }
            match a.next_token {
                None => return Ok(found),
                Some(next) if next.len() > MAX_TOKEN => {
                    return Err(format!("listing page {page}: its cursor is too long"));
                }
                Some(next) if token.as_deref() == Some(next.as_str()) => {
                    return Err(format!("listing page {page}: its cursor did not move"));
                }
                Some(next) => token = Some(next),
            }
        }
        Err(format!(
            "the listing went on past {LIST_PAGES} pages of {LIST_LIMIT} sandboxes"
        ))
    }

    /// Deletes every sandbox of ours whose labelled deadline has passed,
    /// whichever instance made it. Returns how many were deleted. Every page
    /// is read before the first delete (deleting under an open cursor is not
    /// documented as safe); a listing that fails deletes nothing.
    pub fn sweep(&self) -> Result<usize, String> {
        let now = wall_seconds();
        let ours = self.list(&[LABEL_OWNER])?;
        Ok(ours
            .iter()
            .filter(|(_, meta)| {
                meta[LABEL_DEADLINE]
                    .as_str()
                    .and_then(|s| s.parse::<u64>().ok())
                    .is_none_or(|d| d < now)
            })
            .filter(|(id, _)| self.delete(id))
            .count())
    }

    fn reap_nonce(&self, nonce: &str) {
        if let Ok(found) = self.list(&[LABEL_OWNER, (LABEL_NONCE, nonce)]) {
            for (id, _) in found {
                self.delete(&id);
            }
        }
    }

    /// One control-plane call, its answer read whole.
    fn call(
        &self,
        method: Method,
        path: &str,
        body: &[u8],
        deadline: Instant,
    ) -> Result<Answer, Failure> {
        let mut headers = vec![];
        if !body.is_empty() {
            headers.push(("content-type", b"application/json".to_vec()));
        }
        let mut r = wire::send_to(&self.api, method, path, headers, body, deadline)?;
        let retry_after = r.retry_after();
        let next_token = r
            .header("x-next-token")
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string);
        let bytes = r.read_all(ANSWER_BYTES, deadline)?;
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok(Answer {
            status: r.status,
            body,
            retry_after,
            next_token,
        })
    }
}

/// The `network` of a create: everything out denied, nothing in without
/// the traffic token, and a granted run's guard allowed. E2B matches a
/// domain by the TLS name on port 443 (or the Host header on 80) and opens
/// an address on every port: a guard named by domain must be on 443.
fn egress(guard: Option<(&str, u16)>) -> Result<Value, RunError> {
    let mut network = json!({"denyOut": ["0.0.0.0/0"], "allowPublicTraffic": false});
    if let Some((host, port)) = guard {
        let is_address = host.parse::<std::net::Ipv4Addr>().is_ok();
        if !is_address && port != 443 {
            return Err(not_started(
                "E2B allows a domain only on port 443: give the guard a URL on 443, or an IPv4 address",
            ));
        }
        network["allowOut"] = json!([host]);
    }
    Ok(network)
}

/// The value of the listing's `metadata` query parameter: `key=value` pairs
/// joined by `&`, each key and value URL-encoded, as the spec asks (the
/// caller encodes the whole again as a query value). E2B's SDKs encode each
/// key and value once more; for the labels this plugin uses (unreserved
/// characters only) both give the same bytes.
fn metadata_filter(labels: &[(&str, &str)]) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// A refused create, by the service's status: the plugin's claim that
/// nothing ran (the host still answers unmarked once a request went out).
fn refusal(status: u16, v: &Value) -> Refusal {
    let what = format!(
        "E2B refused the create ({status}{})",
        v["error_code"]
            .as_str()
            .map(|c| format!(", {}", c.chars().take(64).collect::<String>()))
            .unwrap_or_default()
    );
    match status {
        401 | 403 => Refusal::Permission(what),
        429 | 503 => Refusal::Capacity(what),
        400 | 404 | 409 | 422 => Refusal::Request(what),
        _ => Refusal::Environment(what),
    }
}

/// Sandbox IDs are short lowercase alphanumerics; anything else is not put
/// in a URL path or header.
pub fn valid_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

fn parse_version(s: &str) -> Option<(u64, u64, u64)> {
    let mut it = s.trim_start_matches('v').split('.');
    let mut n = || it.next()?.split(['-', '+']).next()?.parse::<u64>().ok();
    Some((n()?, n()?, n().unwrap_or(0)))
}

pub use crate::wire::{encode, lost, not_started, sleep_ms, wall_seconds};
