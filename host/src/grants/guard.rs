//! The guard: where code in a hosted sandbox (E2B, OpenShell, Docker Cloud)
//! reaches a granted run's broker, as a container reaches it through its
//! mounted socket.
//!
//! A hosted sandbox cannot mount the host's socket, so a granted run there
//! dials this endpoint instead, with a token made for that run alone. The
//! token is worth that run's broker session and nothing more: the broker
//! still decides every call, and the token is dead once the run's ticket
//! drops (the run answered, failed or was given up) or the run's time is
//! spent, whichever comes first. The table holds digests of tokens, never
//! tokens, and no token is logged.
//!
//! One route, `POST /v1/call`, JSON `{method, path, body}` with the token
//! in `x-plimsoll-guard`; anything else is 404 (405 for another method on
//! that path).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Response, StatusCode};
use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::answer::{broker_answer, call_detached};
use super::broker::{MAX_REQUEST_BODY, Session};

/// The header the sandbox's client sends its run's token in.
pub const TOKEN_HEADER: &str = "x-plimsoll-guard";
/// The one route.
pub const CALL_PATH: &str = "/v1/call";
/// The largest request: a body of MAX_REQUEST_BODY bytes inside the JSON
/// envelope, where escaping can make each byte up to six characters.
const MAX_ENVELOPE: usize = MAX_REQUEST_BODY * 6 + 4096;

type TokenDigest = [u8; 32];

/// Every run admitted now, by its token's digest.
#[derive(Default)]
pub struct Guard {
    admitted: Mutex<HashMap<TokenDigest, Arc<Session>>>,
}

/// One run's admission: its token, taken back when dropped.
pub struct Ticket {
    guard: Arc<Guard>,
    digest: TokenDigest,
    /// For the sandbox (its environment), never for a log.
    pub token: String,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Ok(mut m) = self.guard.admitted.lock() {
            m.remove(&self.digest);
        }
    }
}

/// A call as the sandbox's client sends it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallShape {
    method: String,
    path: String,
    #[serde(default)]
    body: Option<serde_json::Value>,
}

fn digest(token: &str) -> TokenDigest {
    Sha256::digest(token.as_bytes()).into()
}

impl Guard {
    /// Admits `session` until the ticket drops, under a fresh token of 256
    /// random bits (base64url).
    pub fn admit(self: &Arc<Self>, session: Arc<Session>) -> std::io::Result<Ticket> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| std::io::Error::other(e.to_string()))?;
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
        let digest = digest(&token);
        self.admitted
            .lock()
            .map_err(|_| std::io::Error::other("the guard's table is poisoned"))?
            .insert(digest, session);
        Ok(Ticket {
            guard: self.clone(),
            digest,
            token,
        })
    }

    /// The live session a request's token names, if any.
    fn session(&self, headers: &HeaderMap) -> Option<Arc<Session>> {
        let token = headers.get(TOKEN_HEADER)?.to_str().ok()?;
        let s = self.admitted.lock().ok()?.get(&digest(token)).cloned()?;
        s.is_live().then_some(s)
    }

    /// The guard's routes, to be served on its own listener.
    pub fn router(self: Arc<Self>) -> axum::Router {
        axum::Router::new()
            .route(CALL_PATH, axum::routing::post(call))
            .layer(DefaultBodyLimit::max(MAX_ENVELOPE))
            .with_state(self)
    }
}

async fn call(State(guard): State<Arc<Guard>>, headers: HeaderMap, body: Bytes) -> Response<Body> {
    let Some(session) = guard.session(&headers) else {
        return broker_answer(
            StatusCode::FORBIDDEN,
            "not-permitted",
            "no grant is in force for this token",
        );
    };
    let Ok(shape) = serde_json::from_slice::<CallShape>(&body) else {
        return broker_answer(
            StatusCode::BAD_REQUEST,
            "not-permitted",
            "the call must be JSON {method, path, body}",
        );
    };
    let body = shape.body.map(|b| b.to_string().into_bytes());
    call_detached(session, shape.method, shape.path, body).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn serve(app: axum::Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    /// An upstream that answers every request with its path.
    async fn upstream() -> String {
        serve(
            axum::Router::new()
                .fallback(|uri: axum::http::Uri| async move { uri.path().to_string() }),
        )
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

    async fn post(url: &str, token: &str, body: serde_json::Value) -> (u16, String, String) {
        let r = reqwest::Client::new()
            .post(format!("{url}{CALL_PATH}"))
            .header(TOKEN_HEADER, token)
            .json(&body)
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

    #[tokio::test]
    async fn a_ticket_is_worth_its_runs_grant_and_nothing_once_dropped() {
        let origin = upstream().await;
        let guard = Arc::new(Guard::default());
        let url = serve(guard.clone().router()).await;
        let s = session(&origin, Duration::from_secs(30));
        let ticket = guard.admit(s.clone()).expect("admit");
        let call = json_call("GET", "/items/7");

        assert_eq!(
            post(&url, &ticket.token, call.clone()).await,
            (200, "upstream".into(), "/items/7".into())
        );
        // The broker still decides: an ungranted route is refused.
        let (status, kind, _) = post(&url, &ticket.token, json_call("DELETE", "/items/7")).await;
        assert_eq!((status, kind.as_str()), (403, "not-permitted"));
        // Another token, or none, is nobody's.
        assert_eq!(post(&url, "guess", call.clone()).await.0, 403);
        let token = ticket.token.clone();
        drop(ticket);
        // Replayed after its run: dead.
        assert_eq!(post(&url, &token, call).await.0, 403);
        assert_eq!(s.trace().calls.len(), 1);
        assert_eq!(s.trace().denied, 1);
    }

    #[tokio::test]
    async fn a_run_past_its_time_is_worth_nothing_even_admitted() {
        let origin = upstream().await;
        let guard = Arc::new(Guard::default());
        let url = serve(guard.clone().router()).await;
        let ticket = guard
            .admit(session(&origin, Duration::from_millis(50)))
            .expect("admit");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            post(&url, &ticket.token, json_call("GET", "/items/1"))
                .await
                .0,
            403
        );
    }

    #[tokio::test]
    async fn malformed_and_oversized_calls_and_other_routes_are_refused() {
        let origin = upstream().await;
        let guard = Arc::new(Guard::default());
        let url = serve(guard.clone().router()).await;
        let ticket = guard
            .admit(session(&origin, Duration::from_secs(30)))
            .expect("admit");
        let c = reqwest::Client::new();
        let sent = |path: &str, method: reqwest::Method, body: Vec<u8>| {
            c.request(method, format!("{url}{path}"))
                .header(TOKEN_HEADER, &ticket.token)
                .body(body)
                .send()
        };
        let status = |r: reqwest::Response| r.status().as_u16();
        assert_eq!(
            status(
                sent(CALL_PATH, reqwest::Method::POST, b"{\"method\":1}".to_vec())
                    .await
                    .unwrap()
            ),
            400
        );
        assert_eq!(
            status(
                sent(
                    CALL_PATH,
                    reqwest::Method::POST,
                    b"{\"method\":\"GET\",\"path\":\"/items/1\",\"extra\":1}".to_vec()
                )
                .await
                .unwrap()
            ),
            400
        );
        assert_eq!(
            status(
                sent(
                    CALL_PATH,
                    reqwest::Method::POST,
                    vec![b' '; MAX_ENVELOPE + 1]
                )
                .await
                .unwrap()
            ),
            413
        );
        assert_eq!(
            status(
                sent(CALL_PATH, reqwest::Method::GET, Vec::new())
                    .await
                    .unwrap()
            ),
            405
        );
        assert_eq!(
            status(
                sent("/v1/other", reqwest::Method::POST, Vec::new())
                    .await
                    .unwrap()
            ),
            404
        );
        // A JSON body reaches the API as JSON.
        let (status, kind, _) = post(
            &url,
            &ticket.token,
            serde_json::json!({"method": "POST", "path": "/items", "body": {"n": 1}}),
        )
        .await;
        assert_eq!((status, kind.as_str()), (200, "upstream"));
    }

    fn json_call(method: &str, path: &str) -> serde_json::Value {
        serde_json::json!({"method": method, "path": path})
    }
}
