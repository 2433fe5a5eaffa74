//! The guard: where code in a hosted sandbox (E2B, OpenShell, Docker Cloud)
//! reaches a granted run's broker, as a container reaches it through its
//! mounted socket.
//!
//! A hosted sandbox cannot mount the host's socket, so a granted run there
//! dials this endpoint instead, with a token made for that run alone. A
//! request is a call exactly as on the socket: its method and raw path are
//! the call, its body is sent as it came. The token is worth that run's
//! broker session and nothing more: the broker still decides every call,
//! and the token is dead once the run's session is gone (the run answered,
//! failed or was given up), its ticket dropped, or its time spent. The
//! table holds digests of tokens and weak references to sessions: it keeps
//! neither a token nor a credential alive.
//!
//! What is checked before any of a request's body is read: the token, the
//! run's slots (at most MAX_IN_FLIGHT of its requests at once) and the
//! declared length. The body is read within READ_BODY and MAX_REQUEST_BODY.
//!
//! The listener is the API's (`api::serve` and `api::guard`, with the
//! guard's own connection limits; TLS off loopback, `settings`); a plugin
//! admits a run through the `grant` capability, which hands the sandbox
//! what it needs (`channel`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Response, StatusCode};
use base64::Engine as _;
use http_body_util::{BodyExt, Limited};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use super::answer::{broker_answer, call_detached, call_of};
use super::broker::{MAX_IN_FLIGHT, MAX_REQUEST_BODY, Session};

mod channel;
pub mod settings;

pub use channel::{Channel, ChannelError};
pub use settings::GuardSettings;

/// The header the sandbox's client sends its run's token in.
pub const TOKEN_HEADER: &str = "x-plimsoll-guard";
/// Longest a request's body may take to arrive.
const READ_BODY: Duration = Duration::from_secs(10);
/// Bodies being read at once, over every run: what a flood of admitted
/// runs' sandboxes can make the guard hold in memory (at most this many
/// MiB).
const BODY_SLOTS: usize = 64;
/// Of those, what one run may hold: a few runs trickling bodies cannot
/// take every slot from the rest.
const BODY_SLOTS_PER_RUN: usize = 4;

type TokenDigest = [u8; 32];
/// Longest token the guard makes (43 base64url characters), with room.
const MAX_TOKEN: usize = 64;

struct Admitted {
    session: Weak<Session>,
    /// The run's requests being read, made or answered now: a slot is
    /// held until its answer is sent or dropped, so a run's unread answers
    /// are bounded too (16 of at most 4 MiB).
    slots: Arc<Semaphore>,
    /// The run's share of the guard's body slots.
    reading: Arc<Semaphore>,
}

/// Every run admitted now, by its token's digest, and how sandboxes dial
/// the guard.
pub struct Guard {
    admitted: Mutex<HashMap<TokenDigest, Admitted>>,
    bodies: Arc<Semaphore>,
    dial: Dial,
}

/// What a sandbox is told about reaching the guard.
#[derive(Debug, Clone, Default)]
pub struct Dial {
    /// The origin, without a trailing slash.
    pub url: String,
    pub host: String,
    pub port: u16,
    pub ca_pem: Option<String>,
}

impl Dial {
    pub fn from_settings(s: &GuardSettings) -> Dial {
        Dial {
            url: s.url.as_str().trim_end_matches('/').to_string(),
            host: s.host.clone(),
            port: s.port,
            ca_pem: s.ca_pem.clone(),
        }
    }
}

/// A run's token: shown only through `expose`, never by `Debug`.
pub struct Token(String);

impl Token {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// One run's admission; its token dies with it.
pub struct Ticket {
    guard: Arc<Guard>,
    digest: TokenDigest,
    pub token: Token,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.guard.table().remove(&self.digest);
    }
}

fn digest(token: &str) -> TokenDigest {
    Sha256::digest(token.as_bytes()).into()
}

impl Guard {
    pub fn new(dial: Dial) -> Arc<Guard> {
        Arc::new(Guard {
            admitted: Mutex::default(),
            bodies: Arc::new(Semaphore::new(BODY_SLOTS)),
            dial,
        })
    }

    pub fn dial(&self) -> &Dial {
        &self.dial
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<TokenDigest, Admitted>> {
        self.admitted.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits `session` until the ticket drops or the session is gone,
    /// under a fresh token of 256 random bits (base64url). Entries of runs
    /// that are over are cleared here too, so the table never outgrows the
    /// runs alive.
    pub fn admit(self: &Arc<Self>, session: &Arc<Session>) -> std::io::Result<Ticket> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| std::io::Error::other(e.to_string()))?;
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
        let digest = digest(&token);
        let mut table = self.table();
        table.retain(|_, a| a.session.upgrade().is_some_and(|s| s.is_live()));
        table.insert(
            digest,
            Admitted {
                session: Arc::downgrade(session),
                slots: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
                reading: Arc::new(Semaphore::new(BODY_SLOTS_PER_RUN)),
            },
        );
        Ok(Ticket {
            guard: self.clone(),
            digest,
            token: Token(token),
        })
    }

    /// The live session a token names, and its slots. A token longer
    /// than any the guard makes is nobody's, unhashed.
    fn admitted(&self, token: &str) -> Option<(Arc<Session>, Arc<Semaphore>, Arc<Semaphore>)> {
        if token.len() > MAX_TOKEN {
            return None;
        }
        let digest = digest(token);
        let table = self.table();
        let a = table.get(&digest)?;
        let s = a.session.upgrade().filter(|s| s.is_live())?;
        Some((s, a.slots.clone(), a.reading.clone()))
    }

    /// Whether `token` is a live run's (the listener trusts its connection).
    pub fn admits(&self, token: &str) -> bool {
        self.admitted(token).is_some()
    }

    /// The guard's service: every method and path is a call.
    pub fn router(self: Arc<Self>) -> axum::Router {
        axum::Router::new().fallback(call).with_state(self)
    }
}

async fn call(State(guard): State<Arc<Guard>>, req: Request) -> Response<Body> {
    let token = req
        .headers()
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some((session, slots, run_reading)) = guard.admitted(token) else {
        return broker_answer(
            StatusCode::FORBIDDEN,
            "not-permitted",
            "no grant is in force for this token",
        );
    };
    let Ok(slot) = slots.try_acquire_owned() else {
        return broker_answer(
            StatusCode::TOO_MANY_REQUESTS,
            "budget",
            "16 calls are already in flight",
        );
    };
    let too_large = || {
        broker_answer(
            StatusCode::PAYLOAD_TOO_LARGE,
            "budget",
            "the request body is over 1 MiB",
        )
    };
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_REQUEST_BODY as u64) {
        return too_large();
    }
    // A request with a body to read takes a body slot, the run's and the
    // guard's, while it is read; one without (a GET) takes neither.
    let has_body = declared != Some(0)
        && (declared.is_some()
            || req
                .headers()
                .contains_key(axum::http::header::TRANSFER_ENCODING));
    let reading = if has_body {
        let (Ok(mine), Ok(all)) = (
            run_reading.try_acquire_owned(),
            guard.bodies.clone().try_acquire_owned(),
        ) else {
            return broker_answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "shed",
                "the guard is reading as many bodies as it may",
            );
        };
        Some((mine, all))
    } else {
        None
    };
    let (method, target) = call_of(&req);
    let read = Limited::new(req.into_body(), MAX_REQUEST_BODY).collect();
    let body = match tokio::time::timeout(READ_BODY, read).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => return too_large(),
        Err(_) => {
            return broker_answer(
                StatusCode::REQUEST_TIMEOUT,
                "budget",
                "the request body did not arrive in time",
            );
        }
    };
    drop(reading);
    let body = (!body.is_empty()).then(|| body.to_vec());
    let answer = call_detached(session, method, target, body).await;
    // The slot goes when the answer has been sent or dropped.
    let (parts, body) = answer.into_parts();
    let body = body.map_frame(move |frame| {
        let _held = &slot;
        frame
    });
    Response::from_parts(parts, Body::new(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn serve(app: axum::Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    /// An upstream that answers every request with its method, path and
    /// body, as it got them.
    async fn upstream() -> String {
        serve(axum::Router::new().fallback(|req: Request| async move {
            let head = format!("{} {}", req.method(), req.uri().path());
            let body = axum::body::to_bytes(req.into_body(), 1 << 20)
                .await
                .unwrap_or_default();
            format!("{head} {}", String::from_utf8_lossy(&body))
        }))
        .await
    }

    fn session(origin: &str, budget: Duration) -> Arc<Session> {
        let text = format!(
            r#"{{"profiles":{{"p":{{"base_url":"{origin}","allow":["GET /items/*","POST /items"],"allowed_callers":["*"]}}}}}}"#
        );
        let grants = crate::grants::Grants::parse(&text, &|_| None, None).expect("grants");
        let profile = grants.for_caller("p", "me").expect("profile");
        let client = crate::outbound::client().expect("client");
        Arc::new(Session::open(profile, "me", budget, client).expect("session"))
    }

    async fn send(
        url: &str,
        token: &str,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> (u16, String, String) {
        let r = reqwest::Client::new()
            .request(
                reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                format!("{url}{path}"),
            )
            .header(TOKEN_HEADER, token)
            .body(body.to_vec())
            .send()
            .await
            .expect("send");
        let kind = r
            .headers()
            .get(super::super::answer::BROKER_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        (
            r.status().as_u16(),
            kind,
            r.text().await.unwrap_or_default(),
        )
    }

    async fn guard() -> (Arc<Guard>, String, String) {
        let guard = Guard::new(Dial::default());
        let url = serve(guard.clone().router()).await;
        (guard, url, upstream().await)
    }

    #[tokio::test]
    async fn a_ticket_is_worth_its_runs_grant_and_nothing_once_dropped() {
        let (guard, url, origin) = guard().await;
        let s = session(&origin, Duration::from_secs(30));
        let ticket = guard.admit(&s).expect("admit");
        let token = ticket.token.expose().to_string();
        assert_eq!(format!("{:?}", ticket.token), "Token(..)");

        let got = send(&url, &token, "GET", "/items/7", b"").await;
        assert_eq!(got, (200, "upstream".into(), "GET /items/7 ".into()));
        // The body goes as it came, byte for byte: no JSON rewriting.
        let body = br#"{"z":1,"a":12345678901234567890123,"a":2}"#;
        let got = send(&url, &token, "POST", "/items", body).await;
        assert_eq!(
            got.2,
            format!("POST /items {}", String::from_utf8_lossy(body))
        );
        // The broker still decides: an ungranted route is refused.
        let (status, kind, _) = send(&url, &token, "DELETE", "/items/7", b"").await;
        assert_eq!((status, kind.as_str()), (403, "not-permitted"));
        // Another token, or none, is nobody's.
        assert_eq!(send(&url, "guess", "GET", "/items/7", b"").await.0, 403);
        assert_eq!(send(&url, "", "GET", "/items/7", b"").await.0, 403);
        drop(ticket);
        // Replayed after its ticket: dead.
        assert_eq!(send(&url, &token, "GET", "/items/7", b"").await.0, 403);
        assert_eq!(s.trace().calls.len(), 2);
        assert_eq!(s.trace().denied, 1);
    }

    #[tokio::test]
    async fn a_token_dies_with_its_runs_session_or_time() {
        let (guard, url, origin) = guard().await;
        let s = session(&origin, Duration::from_secs(30));
        let ticket = guard.admit(&s).expect("admit");
        let token = ticket.token.expose().to_string();
        // The run's session gone (the run over), its ticket leaked: dead,
        // and the table does not keep the session alive.
        drop(s);
        assert_eq!(send(&url, &token, "GET", "/items/1", b"").await.0, 403);
        std::mem::forget(ticket);
        let short = session(&origin, Duration::from_millis(50));
        let ticket = guard.admit(&short).expect("admit");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let got = send(&url, ticket.token.expose(), "GET", "/items/1", b"").await;
        assert_eq!(got.0, 403);
        // Admitting clears runs that are over: the leaked entry is gone.
        let live = session(&origin, Duration::from_secs(30));
        let _t = guard.admit(&live).expect("admit");
        assert_eq!(guard.table().len(), 1);
    }

    #[tokio::test]
    async fn an_oversized_body_is_refused_and_no_token_no_read() {
        let (guard, url, origin) = guard().await;
        let s = session(&origin, Duration::from_secs(30));
        let ticket = guard.admit(&s).expect("admit");
        let big = vec![b'x'; MAX_REQUEST_BODY + 1];
        let got = send(&url, ticket.token.expose(), "POST", "/items", &big).await;
        assert_eq!((got.0, got.1.as_str()), (413, "budget"));
        assert_eq!(send(&url, "guess", "POST", "/items", &big).await.0, 403);
        assert!(s.trace().calls.is_empty());
    }
}
