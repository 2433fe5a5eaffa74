//! The wasi:http hooks alone, against a real HTTP server on loopback: no
//! daemon, no component. What leaves, with what, and when the call is
//! marked as possibly dispatched.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};

use super::*;
use crate::plugin_host::capabilities::http::HttpAllowance;
use crate::plugin_host::capabilities::http::metered::{Budget, Direction, Flags, Metered};
use crate::plugin_host::dispatch_mark::DispatchMark;

use crate::plugin_host::capabilities::http::tests::server;

fn hooks(origin: &str, mark: &DispatchMark) -> OutgoingHooks {
    let capability = HttpCapability::new(HttpAllowance {
        origins: vec![policy::Origin::parse(origin).expect("origin")],
        api_key: Some((
            HeaderName::from_static("x-provider-key"),
            HeaderValue::from_static("host-held-key"),
        )),
        key_origins: vec![],
        tls: Default::default(),
        exchange: None,
    })
    .expect("capability");
    OutgoingHooks::new(
        Some(Arc::new(capability)),
        Arc::from("test"),
        Instant::now() + Duration::from_secs(10),
        mark.elsewhere(),
    )
}

fn get(url: &str, headers: &[(&str, &str)]) -> http::Request<WasiBody> {
    let mut b = http::Request::get(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Empty::<Bytes>::new().map_err(|n| match n {}).boxed_unsync())
        .expect("request")
}

fn no_io() -> Box<dyn std::future::Future<Output = Result<(), Error>> + Send> {
    Box::new(async { Ok(()) })
}

#[tokio::test]
async fn an_allowed_request_carries_the_key_and_marks_the_call() {
    let (origin, seen) = server().await;
    let mark = DispatchMark::default();
    let mut h = hooks(&origin, &mark);
    let sending = h.send_request(get(&format!("{origin}/v1/x?q=1"), &[]), None, no_io());
    // Marked before it is sent, not after it answers.
    assert!(mark.may_have_started());
    let (answer, conn) = Pin::from(sending).await.expect("sent");
    tokio::spawn(Pin::from(conn));
    assert_eq!(answer.status(), 200);
    let body = answer.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"answer");
    assert_eq!(
        *seen.lock().expect("lock"),
        vec![("/v1/x".to_string(), Some("host-held-key".to_string()))]
    );
}

#[tokio::test]
async fn a_refused_request_is_not_sent_and_leaves_the_mark_alone() {
    let (origin, seen) = server().await;
    let mark = DispatchMark::default();
    let mut h = hooks(&origin, &mark);
    for req in [
        get("http://127.0.0.1:1/x", &[]),
        get("http://localhost/x", &[]),
        // Headers the fields would already refuse, checked again here.
        get(
            &format!("{origin}/x"),
            &[("authorization", "Bearer stolen")],
        ),
        get(
            &format!("{origin}/x"),
            &[("x-provider-key", "plugin-chosen")],
        ),
    ] {
        let refused = Pin::from(h.send_request(req, None, no_io())).await;
        assert!(matches!(refused, Err(Error::HttpRequestDenied)));
    }
    assert!(!mark.may_have_started());
    assert!(seen.lock().expect("lock").is_empty());
    // The same names are refused where a plugin builds its fields.
    let filter = h.forbidden_header_filter();
    for name in ["authorization", "x-provider-key", "host", "x-forwarded-for"] {
        assert!(filter(&HeaderName::from_static(name)), "{name}");
    }
    // `te` is judged at the send, by its value.
    assert!(!filter(&HeaderName::from_static("te")));
    assert!(!filter(&HeaderName::from_static("content-type")));
}

#[tokio::test]
async fn a_call_holds_at_most_eight_requests_at_once() {
    let (origin, _seen) = server().await;
    let mark = DispatchMark::default();
    let mut h = hooks(&origin, &mark);
    let mut held = Vec::new();
    for _ in 0..policy::MAX_CALL_REQUESTS_IN_FLIGHT {
        let (answer, conn) =
            Pin::from(h.send_request(get(&format!("{origin}/"), &[]), None, no_io()))
                .await
                .expect("sent");
        tokio::spawn(Pin::from(conn));
        held.push(answer);
    }
    let ninth = Pin::from(h.send_request(get(&format!("{origin}/"), &[]), None, no_io())).await;
    assert!(matches!(ninth, Err(Error::ConnectionLimitReached)));
    // A finished answer gives its slot back.
    let first = held.remove(0);
    first.into_body().collect().await.expect("body");
    let tenth = Pin::from(h.send_request(get(&format!("{origin}/"), &[]), None, no_io())).await;
    assert!(tenth.is_ok());
}

fn metered(
    bytes: &'static [u8],
    direction: Direction,
    budget: u64,
    flags: Flags,
) -> Metered<WasiBody> {
    let capability = HttpCapability::new(HttpAllowance {
        origins: vec![],
        api_key: None,
        key_origins: vec![],
        tls: Default::default(),
        exchange: None,
    })
    .expect("capability");
    let body = http_body_util::Full::new(Bytes::from_static(bytes))
        .map_err(|n| match n {})
        .boxed_unsync();
    Metered::new(
        body,
        direction,
        Budget::new(budget),
        flags,
        tokio::time::Instant::now() + Duration::from_secs(10),
        Arc::new(capability),
        None,
    )
}

#[tokio::test]
async fn a_body_past_the_budget_fails_and_says_so() {
    let flags = Flags::default();
    let out = metered(b"12345", Direction::Out, 4, flags.clone());
    assert!(matches!(
        out.collect().await,
        Err(Error::HttpRequestBodySize(_))
    ));
    assert!(flags.overflowed.load(Ordering::SeqCst));
    let back = metered(b"12345", Direction::In, 4, Flags::default());
    assert!(matches!(
        back.collect().await,
        Err(Error::HttpResponseBodySize(_))
    ));
    // Exactly the budget passes.
    let exact = metered(b"12345", Direction::Out, 5, Flags::default());
    assert_eq!(
        &exact.collect().await.expect("fits").to_bytes()[..],
        b"12345"
    );
}

#[tokio::test]
async fn an_unfinished_body_at_the_calls_end_is_not_sent_as_finished() {
    let flags = Flags::default();
    flags.call_closed.store(true, Ordering::SeqCst);
    let out = metered(b"half", Direction::Out, 100, flags);
    assert!(matches!(out.collect().await, Err(Error::HttpRequestDenied)));
    // An answer read after the end is simply over.
    let flags = Flags::default();
    flags.call_closed.store(true, Ordering::SeqCst);
    let back = metered(b"half", Direction::In, 100, flags);
    assert!(back.collect().await.is_ok());
}

/// A plain HTTP/1.1 server on loopback that counts the connections it
/// accepts; the first `hang_up_first` of them it answers once and hangs up
/// on (without saying so in a header, as an idle timeout would).
async fn counting_server(hang_up_first: usize) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let origin = format!("http://{}", listener.local_addr().expect("addr"));
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let close_after_one = counted.fetch_add(1, Ordering::SeqCst) < hang_up_first;
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = tcp.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    // Bodiless requests: each ends at its blank line.
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if tcp.write_all(answer).await.is_err() {
                            return;
                        }
                        if close_after_one {
                            let _ = tcp.shutdown().await;
                            return;
                        }
                    }
                }
            });
        }
    });
    (origin, accepted)
}

/// One GET through the hooks, its answer read to the end.
async fn get_ok(h: &mut OutgoingHooks, url: &str) {
    let (answer, conn) = Pin::from(h.send_request(get(url, &[]), None, no_io()))
        .await
        .expect("sent");
    tokio::spawn(Pin::from(conn));
    assert_eq!(answer.status(), 200);
    let body = answer.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"ok");
}

#[tokio::test]
async fn a_call_reuses_its_connection_and_no_other_call_shares_it() {
    let (origin, accepted) = counting_server(0).await;
    let mark = DispatchMark::default();
    let mut call = hooks(&origin, &mark);
    for _ in 0..3 {
        get_ok(&mut call, &format!("{origin}/x")).await;
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one connection per call"
    );
    // Another call to the same origin opens its own.
    let mut other = hooks(&origin, &mark);
    get_ok(&mut other, &format!("{origin}/x")).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    // The first call's end closes what it kept: its next request would
    // need a new connection, and the pool is empty.
    call.close();
    assert!(call.pool.take(&origin).is_none());
}

#[tokio::test]
async fn a_kept_connection_the_server_closed_is_not_used_again() {
    let (origin, accepted) = counting_server(usize::MAX).await;
    let mark = DispatchMark::default();
    let mut call = hooks(&origin, &mark);
    for i in 1..=3 {
        get_ok(&mut call, &format!("{origin}/x")).await;
        assert_eq!(accepted.load(Ordering::SeqCst), i);
        // Time for the hang-up to arrive before the next request.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `n` GETs sent at once through the hooks, their answers read to the end.
async fn get_ok_at_once(h: &mut OutgoingHooks, url: &str, n: usize) {
    let sends: Vec<_> = (0..n)
        .map(|_| Pin::from(h.send_request(get(url, &[]), None, no_io())))
        .collect();
    let mut answers = Vec::new();
    for sent in futures_util::future::join_all(sends).await {
        let (answer, conn) = sent.expect("sent");
        tokio::spawn(Pin::from(conn));
        answers.push(answer);
    }
    for answer in answers {
        let body = answer.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"ok");
    }
}

#[tokio::test]
async fn a_call_keeps_up_to_four_idle_connections_per_origin() {
    let (origin, accepted) = counting_server(0).await;
    let mark = DispatchMark::default();
    let mut call = hooks(&origin, &mark);
    let url = format!("{origin}/x");
    // Five at once need five connections; four are kept afterwards, so five
    // at once again need one more.
    get_ok_at_once(&mut call, &url, 5).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 5);
    tokio::time::sleep(Duration::from_millis(50)).await;
    get_ok_at_once(&mut call, &url, 5).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 6);
}

#[tokio::test]
async fn connections_that_hung_up_do_not_crowd_out_live_ones() {
    // The first five connections are hung up on after one answer; the pool
    // must drop them, or they would fill its four places and the live sixth
    // would not be kept.
    let (origin, accepted) = counting_server(5).await;
    let mark = DispatchMark::default();
    let mut call = hooks(&origin, &mark);
    let url = format!("{origin}/x");
    for _ in 0..6 {
        get_ok(&mut call, &url).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 6);
    get_ok(&mut call, &url).await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        6,
        "the live connection was not kept"
    );
}
