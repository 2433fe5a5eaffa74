//! The capability alone, against a real HTTP server on loopback: no daemon,
//! no component. Which requests leave, with what, and when the call's
//! not-dispatched mark is set.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderName, HeaderValue};

use super::*;
use crate::plugin_host::capabilities::CallContext;

/// What the recording server saw: each request's path and key header.
pub(super) type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A loopback server that records the path and the key header of every
/// request it receives (the wasi:http hooks' tests use it too).
pub(super) async fn server() -> (String, Seen) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let log = log.clone();
        async move {
            let key = req
                .headers()
                .get("x-provider-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            log.lock()
                .expect("lock")
                .push((req.uri().path().to_string(), key));
            "answer"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), seen)
}

fn capability(origin: &str) -> HttpCapability {
    HttpCapability::new(HttpAllowance {
        origins: vec![policy::Origin::parse(origin).expect("origin")],
        api_key: Some((
            HeaderName::from_static("x-provider-key"),
            HeaderValue::from_static("host-held-key"),
        )),
        key_origins: vec![],
        tls: Default::default(),
        exchange: None,
    })
    .expect("capability")
}

fn call() -> CallContext {
    CallContext::new(Arc::from("test"), Instant::now() + Duration::from_secs(10))
}

fn get(url: &str) -> Request {
    Request {
        method: "GET".into(),
        url: url.into(),
        headers: vec![],
        body: None,
    }
}

#[tokio::test]
async fn an_allowed_request_carries_the_host_key_and_sets_the_mark() {
    let (origin, seen) = server().await;
    let cap = capability(&origin);
    let mut c = call();
    let answer = send(&mut c, Some(&cap), get(&format!("{origin}/v1/x")))
        .await
        .expect("sent");
    assert_eq!(
        (answer.status, answer.body.as_slice()),
        (200, &b"answer"[..])
    );
    assert_eq!(
        *seen.lock().expect("lock"),
        [("/v1/x".to_string(), Some("host-held-key".to_string()))]
    );
    assert!(c.mark.may_have_started());
}

#[tokio::test]
async fn refused_requests_leave_nothing_and_keep_the_mark_clear() {
    let (origin, seen) = server().await;
    let cap = capability(&origin);
    let mut c = call();
    let port: u16 = origin
        .rsplit(':')
        .next()
        .expect("port")
        .parse()
        .expect("port");
    let refused = [
        get(&format!("http://127.0.0.1:{}/", port + 1)),
        get(&format!("http://localhost:{port}/")),
        get(&format!("{origin}\\@evil.example/")),
        Request {
            method: "CONNECT".into(),
            ..get(&format!("{origin}/"))
        },
        Request {
            headers: vec![("x-provider-key".into(), "mine".into())],
            ..get(&format!("{origin}/"))
        },
        Request {
            headers: vec![("host".into(), "evil.example".into())],
            ..get(&format!("{origin}/"))
        },
    ];
    for r in refused {
        let url = r.url.clone();
        let answer = send(&mut c, Some(&cap), r).await;
        assert!(
            matches!(answer, Err(http_if::HttpError::Forbidden(_))),
            "{url} was not refused"
        );
    }
    // Not granted at all.
    let answer = send(&mut c, None, get(&format!("{origin}/"))).await;
    assert!(matches!(answer, Err(http_if::HttpError::Forbidden(_))));
    assert!(
        seen.lock().expect("lock").is_empty(),
        "a refused request arrived"
    );
    assert!(!c.mark.may_have_started());
}

#[tokio::test]
async fn a_request_that_may_have_left_sets_the_mark_even_when_it_fails() {
    // Nothing listens on this port: the connection fails, but the host
    // cannot know what a service did with a request it may have received.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let origin = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let cap = capability(&origin);
    let mut c = call();
    let answer = send(&mut c, Some(&cap), get(&format!("{origin}/"))).await;
    assert!(matches!(answer, Err(http_if::HttpError::Transport(_))));
    assert!(c.mark.may_have_started());
}

/// An allowed origin that answers with a redirect to an off-list one: the
/// plugin gets the redirect, and the off-list origin sees nothing.
#[tokio::test]
async fn redirects_are_handed_back_never_followed() {
    let (decoy, decoyed) = server().await;
    let target = decoy.clone();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let target = target.clone();
        async move {
            let code: u16 = req
                .uri()
                .path()
                .trim_start_matches('/')
                .parse()
                .unwrap_or(302);
            (
                axum::http::StatusCode::from_u16(code).expect("code"),
                [("location", format!("{target}/stolen"))],
                "moved",
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let origin = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let cap = capability(&origin);
    for code in [301u16, 302, 303, 307, 308] {
        let mut c = call();
        let answer = send(&mut c, Some(&cap), get(&format!("{origin}/{code}")))
            .await
            .expect("answered");
        assert_eq!(answer.status, code);
    }
    assert!(
        decoyed.lock().expect("lock").is_empty(),
        "a redirect was followed"
    );
}
