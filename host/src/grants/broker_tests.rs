//! The broker's tests, beside it: kept apart so the broker reads as one
//! piece.

use super::*;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

/// An API that is down: /items answers 503 (Retry-After 30) until
/// /health has answered once, and /health answers 503 the first time
/// and 200 after; /limited always answers 429.
async fn flaky_api() -> (String, Arc<[AtomicU32; 3]>) {
    let hits: Arc<[AtomicU32; 3]> = Arc::new(Default::default());
    let seen = hits.clone();
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        let seen = seen.clone();
        async move {
            use axum::http::StatusCode;
            let down = (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "30")]);
            match uri.path() {
                "/items" => {
                    seen[0].fetch_add(1, SeqCst);
                    if seen[1].load(SeqCst) < 2 {
                        return (down.0, down.1, "down");
                    }
                    (StatusCode::OK, down.1, "items")
                }
                "/hang" => {
                    seen[1].fetch_add(1, SeqCst);
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    (StatusCode::OK, down.1, "late")
                }
                "/health" => {
                    if seen[1].fetch_add(1, SeqCst) == 0 {
                        return (down.0, down.1, "still down");
                    }
                    (StatusCode::OK, down.1, "ok")
                }
                _ => {
                    seen[2].fetch_add(1, SeqCst);
                    (StatusCode::TOO_MANY_REQUESTS, down.1, "slow down")
                }
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), hits)
}

fn session(origin: &str) -> Session {
    session_probing(origin, "/health")
}

fn session_probing(origin: &str, health: &str) -> Session {
    let text = format!(
        r#"{{"profiles":{{"p":{{"base_url":"{origin}","allow":["GET /items","GET /limited","GET {health}"],
            "allowed_callers":["*"],"health_check":"GET {health}"}}}}}}"#
    );
    let grants = crate::grants::Grants::parse(&text, &|_| None, None).expect("grants");
    let profile = grants.for_caller("p", "me").expect("profile");
    let client = crate::outbound::client().expect("client");
    Session::open(profile, "me", Duration::from_secs(30), client).expect("session")
}

#[tokio::test]
async fn an_open_breaker_probes_the_health_check_at_most_once_a_second() {
    let (origin, hits) = flaky_api().await;
    let s = session(&origin);
    let items = || s.call("GET", "/items", None);
    assert_eq!(items().await.map(|r| r.status), Ok(503));
    // Open: shed at once, nothing sent.
    assert_eq!(items().await, Err(CallError::Shed));
    assert_eq!((hits[0].load(SeqCst), hits[1].load(SeqCst)), (1, 0));
    // A second on: this call probes, the API is still down, it sheds.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(items().await, Err(CallError::Shed));
    assert_eq!((hits[0].load(SeqCst), hits[1].load(SeqCst)), (1, 1));
    assert_eq!(
        items().await,
        Err(CallError::Shed),
        "probed twice in a second"
    );
    assert_eq!(hits[1].load(SeqCst), 1);
    // Another second: the probe answers 200, the breaker closes and the
    // same call reaches the API.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(items().await.map(|r| r.status), Ok(200));
    assert_eq!((hits[0].load(SeqCst), hits[1].load(SeqCst)), (2, 2));
    let t = s.trace();
    assert_eq!(t.calls.len(), 2, "the probe is not traced");
    assert_eq!(t.shed, 3);
}

#[tokio::test]
async fn a_probe_abandoned_midway_does_not_stop_later_probes() {
    let (origin, hits) = flaky_api().await;
    let s = session_probing(&origin, "/hang");
    assert_eq!(
        s.call("GET", "/items", None).await.map(|r| r.status),
        Ok(503)
    );
    for probes in 1..=2 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        // The caller gives up while the probe waits on the API.
        let call = s.call("GET", "/items", None);
        assert!(
            tokio::time::timeout(Duration::from_millis(300), call)
                .await
                .is_err()
        );
        assert_eq!(hits[1].load(SeqCst), probes, "probe {probes} was not sent");
    }
}

#[tokio::test]
async fn a_429_is_never_probed() {
    let (origin, hits) = flaky_api().await;
    let s = session(&origin);
    assert_eq!(
        s.call("GET", "/limited", None).await.map(|r| r.status),
        Ok(429)
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(s.call("GET", "/limited", None).await, Err(CallError::Shed));
    assert_eq!(s.call("GET", "/items", None).await, Err(CallError::Shed));
    assert_eq!((hits[1].load(SeqCst), hits[2].load(SeqCst)), (0, 1));
}

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

/// An API whose /slow answers after `delay`, and /fast at once.
async fn slow_api(delay: Duration) -> String {
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| async move {
        if uri.path() == "/slow" {
            tokio::time::sleep(delay).await;
        }
        "{}"
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

fn capped_session(origin: &str) -> Arc<Session> {
    let text = format!(
        r#"{{"profiles":{{"p":{{"base_url":"{origin}","allow":["GET /slow","GET /fast"],
            "allowed_callers":["*"],"route_max_calls":{{"GET /fast":1}}}}}}}}"#
    );
    let grants = crate::grants::Grants::parse(&text, &|_| None, None).expect("grants");
    let profile = grants.for_caller("p", "me").expect("profile");
    let client = crate::outbound::client().expect("client");
    Arc::new(Session::open(profile, "me", Duration::from_secs(30), client).expect("session"))
}

#[tokio::test]
async fn a_runs_end_waits_for_a_call_in_flight_and_refuses_later_ones() {
    let s = capped_session(&slow_api(Duration::from_millis(400)).await);
    // A call made in a task of its own (as the socket and the guard make
    // them), still at the API when the run ends.
    let in_flight = tokio::spawn({
        let s = s.clone();
        async move { s.call("GET", "/slow", None).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let trace = s.finish().await;
    assert_eq!(
        trace.calls.len(),
        1,
        "the call that reached the API is traced"
    );
    assert!(in_flight.await.unwrap().is_ok());
    // After the end nothing starts.
    assert_eq!(
        s.call("GET", "/fast", None).await,
        Err(CallError::NotPermitted("the run is over"))
    );
}

#[tokio::test]
async fn a_call_refused_for_want_of_a_slot_spends_no_routes_cap() {
    let s = capped_session(&slow_api(Duration::from_millis(500)).await);
    let mut slow = Vec::new();
    for _ in 0..MAX_IN_FLIGHT {
        let s = s.clone();
        slow.push(tokio::spawn(
            async move { s.call("GET", "/slow", None).await },
        ));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        s.call("GET", "/fast", None).await,
        Err(CallError::Budget("16 calls are already in flight"))
    );
    for t in slow {
        assert!(t.await.unwrap().is_ok());
    }
    // The one call the route allows is still there.
    assert_eq!(
        s.call("GET", "/fast", None).await.map(|r| r.status),
        Ok(200)
    );
}
