//! The daemon's API as the command line calls it: one Connect JSON call per
//! procedure, the caller's token from PLIMSOLL_TOKEN, and every answer
//! sorted into a result, a refusal the daemon marked not-dispatched (nothing
//! ran), or anything else (it may have run).

use std::time::Duration;

use base64::Engine;
use plimsoll::refusal::Reason;
use reqwest::StatusCode;
use serde_json::Value;

pub const DEFAULT_URL: &str = "http://127.0.0.1:8746";
/// The largest streamed message read.
const MAX_MESSAGE: u32 = 64 << 20;
/// How long an answer may take past the run's own budget.
const SLACK: Duration = Duration::from_secs(30);

pub struct Api {
    base: String,
    token: Option<String>,
    client: reqwest::Client,
}

pub enum Failure {
    /// The daemon's statement that nothing ran, with its reason.
    NotDispatched { reason: Reason, message: String },
    /// The daemon has no such procedure (404, marked unsupported): nothing
    /// ran, and an older procedure may serve instead.
    NoSuchProcedure(String),
    /// A session call that may have run and has no answer: the daemon's
    /// error as received, whose `UnansweredCall` detail holds the call's
    /// record.
    Unanswered { error: Value },
    /// Anything else: an unmarked error answer, or no answer at all.
    Unknown(String),
}

impl Api {
    pub fn new(url: Option<String>) -> Result<Api, String> {
        let base = url
            .or_else(|| std::env::var("PLIMSOLL_URL").ok())
            .unwrap_or_else(|| DEFAULT_URL.to_string());
        let base = base.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(format!("{base:?} is not an http(s) URL"));
        }
        let token = std::env::var("PLIMSOLL_TOKEN")
            .ok()
            .filter(|t| !t.is_empty());
        // A token goes over plain http only to this machine.
        if token.is_some() && base.starts_with("http://") && !is_loopback(&base) {
            return Err(format!(
                "{base} is plain http off this machine: the token would travel in clear; use https"
            ));
        }
        // No proxy, ever: reqwest would otherwise route by HTTP_PROXY,
        // ALL_PROXY and friends, which on plain http hands the token and the
        // code in clear to whatever the environment names, and that is not
        // the daemon the loopback check above approved. The daemon is
        // reached directly or not at all.
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("http client: {e}"))?;
        Ok(Api {
            base,
            token,
            client,
        })
    }

    /// A POST to `path` on the daemon, with the caller's token.
    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        let req = self.client.post(format!("{}{path}", self.base));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// Calls `procedure` with `body`; waits at most `budget` plus a margin.
    pub async fn call(
        &self,
        procedure: &str,
        body: &Value,
        budget: Duration,
    ) -> Result<Value, Failure> {
        let mut req = self
            .client
            .post(format!(
                "{}/plimsoll.v1.SandboxService/{procedure}",
                self.base
            ))
            .header("content-type", "application/json")
            .timeout(budget + SLACK)
            .json(body);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| Failure::Unknown(format!("no answer from {}: {e}", self.base)))?;
        let status = resp.status();
        let answer: Value = resp.json().await.map_err(|e| {
            Failure::Unknown(format!("the answer is not JSON (HTTP {status}): {e}"))
        })?;
        if status.is_success() {
            return Ok(answer);
        }
        Err(failure(Some(status), &answer))
    }
}

impl Api {
    /// Calls `RunStream` with `body`: each piece of output the run writes is
    /// sent to `output` as it arrives (`true` for stderr), and the answer is
    /// `Run`'s. Waits at most `budget` plus a margin.
    pub async fn stream(
        &self,
        body: &Value,
        budget: Duration,
        output: tokio::sync::mpsc::UnboundedSender<(bool, Vec<u8>)>,
    ) -> Result<Value, Failure> {
        let message = serde_json::to_vec(body).map_err(|e| Failure::Unknown(e.to_string()))?;
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(&message);
        let mut req = self
            .client
            .post(format!(
                "{}/plimsoll.v1.SandboxService/RunStream",
                self.base
            ))
            .header("content-type", "application/connect+json")
            .timeout(budget + SLACK)
            .body(framed);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let mut resp = req
            .send()
            .await
            .map_err(|e| Failure::Unknown(format!("no answer from {}: {e}", self.base)))?;
        let status = resp.status();
        if !status.is_success() {
            // Refused before the stream began: a unary Connect error.
            let answer: Value = resp.json().await.map_err(|e| {
                Failure::Unknown(format!("the answer is not JSON (HTTP {status}): {e}"))
            })?;
            return Err(failure(Some(status), &answer));
        }
        let mut pending: Vec<u8> = Vec::new();
        let mut result = None;
        loop {
            // Every whole message received so far.
            while pending.len() >= 5 {
                let len = u32::from_be_bytes([pending[1], pending[2], pending[3], pending[4]]);
                // The daemon's messages are a few bytes of output or one
                // answer (at most a few MiB); anything larger is not its.
                if len > MAX_MESSAGE {
                    return Err(Failure::Unknown(
                        "a streamed message is larger than any answer; the run may have happened"
                            .into(),
                    ));
                }
                let end = 5 + len as usize;
                if pending.len() < end {
                    break;
                }
                let flags = pending[0];
                let message: Value = serde_json::from_slice(&pending[5..end]).map_err(|e| {
                    Failure::Unknown(format!("a streamed message is not JSON: {e}"))
                })?;
                pending.drain(..end);
                if flags & 0x02 != 0 {
                    return match (message.get("error"), result) {
                        (Some(error), _) => Err(failure(None, error)),
                        (None, Some(answer)) => Ok(answer),
                        (None, None) => Err(Failure::Unknown(
                            "the stream ended without an answer".into(),
                        )),
                    };
                }
                if let Some(out) = message.get("output") {
                    for (key, stderr) in [("stdout", false), ("stderr", true)] {
                        if let Some(v) = out.get(key) {
                            let _ = output.send((stderr, bytes(v)));
                        }
                    }
                } else if let Some(answer) = message.get("result") {
                    result = Some(answer.clone());
                }
            }
            match resp.chunk().await {
                Ok(Some(chunk)) => pending.extend_from_slice(&chunk),
                Ok(None) => {
                    return Err(Failure::Unknown(
                        "the stream was cut before its end; the run may have happened".into(),
                    ));
                }
                Err(e) => return Err(Failure::Unknown(format!("the stream broke: {e}"))),
            }
        }
    }
}

/// A Connect error as a failure: not-dispatched when the daemon marked it.
/// `status` is the HTTP status of an error answered before any stream
/// began (None for a stream's closing error).
fn failure(status: Option<StatusCode>, error: &Value) -> Failure {
    let message = error["message"].as_str().unwrap_or("").to_string();
    let code = error["code"].as_str().unwrap_or("unknown");
    match not_dispatched(error) {
        Some(Reason::Unsupported) if status == Some(StatusCode::NOT_FOUND) => {
            Failure::NoSuchProcedure(message)
        }
        Some(reason) => Failure::NotDispatched { reason, message },
        None if carries(error, "plimsoll.v1.UnansweredCall") => Failure::Unanswered {
            error: error.clone(),
        },
        None => Failure::Unknown(format!("{code}: {message}")),
    }
}

/// Whether the error carries a detail of this type.
fn carries(error: &Value, type_: &str) -> bool {
    error["details"]
        .as_array()
        .is_some_and(|d| d.iter().any(|d| d["type"].as_str() == Some(type_)))
}

/// The reason a refusal names, if the daemon marked it not-dispatched.
fn not_dispatched(answer: &Value) -> Option<Reason> {
    let details = answer["details"].as_array()?;
    let detail = details
        .iter()
        .find(|d| d["type"].as_str() == Some("plimsoll.v1.NotDispatched"))?;
    let value = detail["value"].as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(value.trim_end_matches('='))
        .ok()?;
    match bytes.as_slice() {
        [0x08, n] => Reason::from_number(*n),
        _ => None,
    }
}

/// A bytes field of an answer (standard base64; absent is empty).
pub fn bytes(v: &Value) -> Vec<u8> {
    v.as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .unwrap_or_default()
}

/// Whether an http URL's host is a loopback address or `localhost`.
fn is_loopback(url: &str) -> bool {
    let Ok(parsed) = reqwest::Url::parse(url) else {
        return false;
    };
    match parsed.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// Text from an answer (or an error carrying one) as this CLI's own lines
/// show it: a control character or a bidirectional override could
/// otherwise rewrite what the terminal shows (a summary line claiming
/// another tier), so each becomes U+FFFD. The program's own output is
/// printed as it is: it is the program's, and said to be.
pub(crate) fn shown(text: &str) -> String {
    text.chars()
        .map(|c| {
            let bidi = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
            if c.is_control() || bidi { '\u{fffd}' } else { c }
        })
        .collect()
}
