//! A provider key the service will not take as is: the host trades it for a
//! short-lived access token and sends that instead.
//!
//! Docker's Sandboxes API refuses a personal access token; it wants the JWT
//! that Docker Hub's token endpoint issues for the account name and the
//! token (`POST {"identifier", "secret"}` -> `{"access_token"}`). The trade
//! happens here, in the host, so the plugin holds neither the personal
//! token nor the access token: the host puts `Authorization: Bearer <JWT>`
//! on the plugin's requests to the origins that receive the key, exactly as
//! it does with a key that needs no trade.
//!
//! The access token is kept until 60 s before the `exp` its payload states
//! (counted on the monotonic clock from the trade, so a wall clock that
//! jumps cannot stretch it) and fetched again after; one trade at a time,
//! callers waiting for it no longer than their own deadline. A failed trade
//! is remembered for 10 s and answered from memory meanwhile, so a bad key
//! is not sent again for every request. The exchange goes through the
//! host's own sender (no redirects, no proxy settings, TLS verified against
//! the system's roots and the CA named for the exchange alone, no client
//! certificate). Neither token ever reaches a log: a failure says which
//! step failed and the HTTP status, nothing the service wrote.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use reqwest::Url;
use reqwest::header::HeaderValue;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_rustls::rustls::ClientConfig;
use wasmtime_wasi_http::Error;

use super::pool::CallConnections;
use super::sender::{self, CallTasks};

/// How long before its stated expiry a token is replaced.
const REFRESH_EARLY: Duration = Duration::from_secs(60);
/// Longest the exchange itself may take, whatever the caller's deadline.
const EXCHANGE_TIME: Duration = Duration::from_secs(15);
/// How long a failed trade is answered from memory.
const FAILURE_KEPT: Duration = Duration::from_secs(10);
/// Most of the exchange's answer the host reads.
const ANSWER_BYTES: usize = 64 << 10;

type ExchangeBody = http_body_util::combinators::BoxBody<Bytes, Error>;

/// The operator's secret and where to trade it.
pub struct KeyExchange {
    url: Url,
    /// The JSON body of the trade, built once; it holds the secret.
    request: Bytes,
    tls: Arc<ClientConfig>,
    current: Mutex<Option<Held>>,
}

enum Held {
    Token {
        header: HeaderValue,
        /// When the token is traded again.
        replace_at: Instant,
    },
    Failed {
        why: String,
        until: Instant,
    },
}

impl std::fmt::Debug for KeyExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The body holds the secret: only the URL is ever printed.
        f.debug_struct("KeyExchange")
            .field("url", &self.url.as_str())
            .finish_non_exhaustive()
    }
}

impl KeyExchange {
    pub fn new(url: Url, identifier: &str, secret: &str, tls: Arc<ClientConfig>) -> KeyExchange {
        let request = serde_json::json!({"identifier": identifier, "secret": secret}).to_string();
        KeyExchange {
            url,
            request: Bytes::from(request),
            tls,
            current: Mutex::new(None),
        }
    }

    /// The `Authorization` value for a request that must leave by
    /// `deadline`: the held token while it is fresh, else a new trade.
    pub async fn bearer(&self, deadline: Instant) -> Result<HeaderValue, String> {
        let mut current = tokio::time::timeout_at(deadline, self.current.lock())
            .await
            .map_err(|_| "the token exchange was busy past the request's deadline".to_string())?;
        let now = Instant::now();
        match current.as_ref() {
            Some(Held::Token { header, replace_at }) if now < *replace_at => {
                return Ok(header.clone());
            }
            Some(Held::Failed { why, until }) if now < *until => return Err(why.clone()),
            _ => {}
        }
        *current = None;
        let ends = deadline.min(now + EXCHANGE_TIME);
        let traded = self.trade(ends).await.and_then(|token| {
            let mut header = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| "the token exchange answered a token that is not a header value")?;
            header.set_sensitive(true);
            Ok((token, header))
        });
        let (token, header) = match traded {
            Ok(t) => t,
            Err(why) => {
                *current = Some(Held::Failed {
                    why: why.clone(),
                    until: Instant::now() + FAILURE_KEPT,
                });
                return Err(why);
            }
        };
        // The lifetime the token states, counted from now on the monotonic
        // clock; a token whose expiry cannot be read serves this request
        // only.
        let lifetime = expiry(&token)
            .and_then(|exp| exp.duration_since(SystemTime::now()).ok())
            .and_then(|left| left.checked_sub(REFRESH_EARLY));
        if let Some(left) = lifetime {
            *current = Some(Held::Token {
                header: header.clone(),
                replace_at: now + left,
            });
        }
        Ok(header)
    }

    async fn trade(&self, ends: Instant) -> Result<String, String> {
        let body: ExchangeBody = Full::new(self.request.clone())
            .map_err(|never| match never {})
            .boxed();
        let req = http::Request::builder()
            .method(http::Method::POST)
            .uri(self.url.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json")
            .body(body)
            .map_err(|_| "the token exchange URL is not a request target")?;
        let tasks = CallTasks::default();
        let outcome = async {
            let (answer, _conn) = sender::send(
                self.tls.clone(),
                &self.url,
                req,
                ends,
                tasks.clone(),
                CallConnections::default(),
            )
            .await
            .map_err(|e| format!("the token exchange could not be reached: {e}"))?;
            let status = answer.status().as_u16();
            let limited = http_body_util::Limited::new(answer.into_body(), ANSWER_BYTES);
            let bytes = tokio::time::timeout_at(ends, limited.collect())
                .await
                .map_err(|_| "the token exchange timed out".to_string())?
                .map_err(|_| "the token exchange's answer failed or was too large".to_string())?
                .to_bytes();
            Ok::<_, String>((status, bytes))
        }
        .await;
        // The connection task ends with the trade.
        tasks.abort_all();
        let (status, bytes) = outcome?;
        match status {
            200 => {}
            401 | 403 => {
                return Err(format!(
                    "the token exchange refused the operator's key (HTTP {status})"
                ));
            }
            s => return Err(format!("the token exchange failed (HTTP {s})")),
        }
        let answer: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|_| "the token exchange's answer is not JSON")?;
        answer
            .get("access_token")
            .and_then(|t| t.as_str())
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .ok_or_else(|| "the token exchange's answer has no access_token".to_string())
    }
}

/// The `exp` a JWT's payload states, unverified: the host only uses it to
/// know when to trade again; the service verifies the token.
fn expiry(token: &str) -> Option<SystemTime> {
    let payload = token.split('.').nth(1)?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&json).ok()?;
    let exp = claims.get("exp")?.as_u64()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(exp))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: serde_json::Value) -> String {
        let enc = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        format!(
            "{}.{}.sig",
            enc(br#"{"alg":"none"}"#),
            enc(claims.to_string().as_bytes())
        )
    }

    #[test]
    fn the_expiry_is_read_from_the_payload_and_nothing_else() {
        let at = 2_000_000_000u64;
        assert_eq!(
            expiry(&jwt(serde_json::json!({"exp": at}))),
            Some(UNIX_EPOCH + Duration::from_secs(at))
        );
        for bad in [
            "opaque".to_string(),
            "a.b.c".to_string(),
            jwt(serde_json::json!({"exp": "soon"})),
            jwt(serde_json::json!({"sub": "x"})),
        ] {
            assert_eq!(expiry(&bad), None, "{bad}");
        }
    }
}
