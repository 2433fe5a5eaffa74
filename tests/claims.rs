//! Claims in the docs that had no test: authentication before any body byte
//! is read, the Connect header rules, refused-token logging, TLS versions
//! and /metrics over TLS, a bad certificate at start, and every /metrics
//! series the docs name.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use plimsoll_tests::{Daemon, Scratch, call, certificate, js_run, test_ca};
use serde_json::json;

const TOKEN: &str = "claims-test-token-0123456789abcdef0123";

fn wasm_with_token(extra: &[(&str, &str)]) -> Daemon {
    let mut env = vec![("SANDBOX_PROVIDER", "wasm"), ("PLIMSOLL_TOKEN", TOKEN)];
    env.extend_from_slice(extra);
    Daemon::start(&env)
}

/// Sends request headers announcing a body that never comes (or is far too
/// big), then shows the answer arrived without the body and that the
/// daemon is not reading it: what the socket takes before it fails is no
/// more than its buffers.
fn unauthenticated_body(d: &Daemon, framing: &str) {
    let mut s = std::net::TcpStream::connect(&d.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.set_write_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(
        s,
        "POST /plimsoll.v1.SandboxService/Run HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{framing}\r\n"
    )
    .expect("headers");
    let mut answer = [0u8; 12];
    s.read_exact(&mut answer)
        .expect("an answer before any body byte");
    assert_eq!(
        &answer,
        b"HTTP/1.1 401",
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // Now push 64 MiB at it.
    let chunk = vec![b'x'; 64 << 10];
    let mut taken = 0usize;
    while taken < 64 << 20 {
        match s.write(&chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => taken += n,
        }
    }
    assert!(
        taken < 16 << 20,
        "the daemon took {taken} bytes of a body it should never read"
    );
}

#[test]
fn an_unauthenticated_body_is_never_read() {
    let d = wasm_with_token(&[]);
    unauthenticated_body(&d, "content-length: 1073741824\r\n");
    unauthenticated_body(&d, "transfer-encoding: chunked\r\n");
}

#[tokio::test]
async fn connect_protocol_version_and_encoding_rules() {
    let d = Daemon::start(&[("SANDBOX_PROVIDER", "wasm")]);
    let url = d.url("/plimsoll.v1.SandboxService/Run");
    let body = js_run("console.log(1)").to_string();
    let send = |headers: &[(&str, &str)]| {
        let mut req = plimsoll_tests::client()
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send()
    };
    let ok = send(&[
        ("connect-protocol-version", "1"),
        ("content-encoding", "identity"),
    ])
    .await
    .expect("sent");
    assert_eq!(ok.status(), 200);
    let r = send(&[("connect-protocol-version", "2")])
        .await
        .expect("sent");
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.headers()
            .get("plimsoll-not-dispatched")
            .map(|v| v.as_bytes()),
        Some(&b"request"[..])
    );
    let r = send(&[("content-encoding", "gzip")]).await.expect("sent");
    assert_eq!(r.status(), 415);
    assert_eq!(
        r.headers()
            .get("plimsoll-not-dispatched")
            .map(|v| v.as_bytes()),
        Some(&b"request"[..])
    );
}

/// A flood of bad tokens is one log line, counted, never what was sent.
#[tokio::test]
async fn refused_tokens_are_logged_as_a_count_at_most_every_30_seconds() {
    let d = wasm_with_token(&[]);
    let canary = "refused-canary-token-0000000000000000";
    for _ in 0..50 {
        let r = plimsoll_tests::client()
            .post(d.url("/plimsoll.v1.SandboxService/Run"))
            .bearer_auth(canary)
            .header("content-type", "application/json")
            .body(js_run("1").to_string())
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 401);
    }
    // An authenticated run's audit line is the sentinel: everything logged
    // before it has been read.
    let r = plimsoll_tests::client()
        .post(d.url("/plimsoll.v1.SandboxService/Run"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(
            json!({"protocol": 4, "traceId": "sentinel-claims", "javascript": {"code": "0"}})
                .to_string(),
        )
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.log_lines().iter().any(|l| l.contains("sentinel-claims")) {
        assert!(Instant::now() < deadline, "the sentinel never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lines = d.log_lines();
    let refused: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("missing or unknown token"))
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(lines.iter().all(|l| !l.contains(canary)));
}

#[tokio::test]
async fn tls_1_2_and_1_3_serve_the_api_and_metrics() {
    let dir = Scratch::new("claims-tls");
    let (cert, key) = certificate(&dir);
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let d = wasm_with_token(&[
        ("PLIMSOLL_TLS_CERT", cert.as_str()),
        ("PLIMSOLL_TLS_KEY", key.as_str()),
    ]);
    let port = d.addr.rsplit_once(':').expect("port").1.to_string();
    let metrics_port = plimsoll_tests::metrics_url(&d)
        .rsplit_once(':')
        .expect("port")
        .1
        .trim_end_matches("/metrics")
        .to_string();
    for version in [
        reqwest::tls::Version::TLS_1_2,
        reqwest::tls::Version::TLS_1_3,
    ] {
        let client = reqwest::Client::builder()
            .no_proxy()
            .add_root_certificate(test_ca(&dir))
            .min_tls_version(version)
            .max_tls_version(version)
            .build()
            .expect("client");
        let r = client
            .get(format!("https://localhost:{port}/healthz"))
            .send()
            .await
            .expect("healthz over TLS");
        assert_eq!(r.status(), 200, "{version:?}");
        let r = client
            .get(format!("https://localhost:{metrics_port}/metrics"))
            .send()
            .await
            .expect("metrics over TLS");
        assert_eq!(r.status(), 200, "{version:?}");
        assert!(
            r.text()
                .await
                .expect("text")
                .contains("plimsoll_runs_total")
        );
    }
}

#[test]
fn a_bad_certificate_stops_the_daemon_at_start() {
    let dir = Scratch::new("claims-badcert");
    std::fs::write(dir.path("cert.pem"), "not a certificate").expect("cert");
    std::fs::write(dir.path("key.pem"), "not a key").expect("key");
    let (cert, key) = (
        dir.path("cert.pem").display().to_string(),
        dir.path("key.pem").display().to_string(),
    );
    let (code, text) = plimsoll_tests::run_to_exit(
        &[],
        &[
            ("SANDBOX_PROVIDER", "wasm"),
            ("PLIMSOLL_TLS_CERT", cert.as_str()),
            ("PLIMSOLL_TLS_KEY", key.as_str()),
        ],
    );
    assert_ne!(code, Some(0), "{text}");
    assert!(!text.contains("plimsolld listening"), "{text}");
}

/// Every series docs/api.md names is served, once each has something to
/// count.
#[tokio::test]
async fn every_documented_metrics_series_is_served() {
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("SANDBOX_MAX_CONCURRENT", "1"),
    ]);
    assert_eq!(call(&d, "Run", &js_run("1")).await.status, 200);
    // A shed: the one slot is held.
    let busy = {
        let mut req = js_run("while(true){}");
        req["timeoutMs"] = json!(1000);
        let url = d.url("/plimsoll.v1.SandboxService/Run");
        tokio::spawn(async move {
            plimsoll_tests::client()
                .post(url)
                .header("content-type", "application/json")
                .json(&req)
                .send()
                .await
        })
    };
    plimsoll_tests::wait_inflight(&d, 1).await;
    assert_eq!(call(&d, "Run", &js_run("1")).await.mark(), Some("capacity"));
    busy.await.expect("join").expect("sent");
    let text = plimsoll_tests::client()
        .get(plimsoll_tests::metrics_url(&d))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/api.md"),
    )
    .expect("docs/api.md");
    let named: Vec<&str> = [
        "plimsoll_runs_total",
        "plimsoll_runs_failed_total",
        "plimsoll_inflight",
        "plimsoll_shed_total",
    ]
    .into_iter()
    .filter(|s| docs.contains(s))
    .collect();
    assert_eq!(named.len(), 4, "docs/api.md no longer names these series");
    for series in named {
        assert!(
            text.lines().any(|l| l.starts_with(series)),
            "{series} is not served:\n{text}"
        );
    }
    assert!(
        text.contains("plimsoll_shed_total{reason=\"at_capacity\"} 1"),
        "{text}"
    );
    // The host-call series carry a profile and a route template; they are
    // served once a granted call is made (tests/grants.rs scrapes them).
}
