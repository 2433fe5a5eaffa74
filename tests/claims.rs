//! Claims in the docs that had no test: authentication before any body byte
//! is read, the Connect header rules, refused-token logging, TLS versions
//! and /metrics over TLS, a bad certificate at start, every /metrics
//! series the docs name, and `/mcp` weighing a message before its SDK
//! parses it and answering without repeating what it was sent.

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
        // Refused before its body was read: marked, so a client knows
        // nothing ran.
        assert_eq!(
            r.headers()
                .get("plimsoll-not-dispatched")
                .and_then(|v| v.to_str().ok()),
            Some("permission")
        );
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
    let text = plimsoll_tests::metrics_text(&d).await;
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

/// POSTs a message to `/mcp` with the caller's token: the status, the
/// not-dispatched mark and the whole answer as text.
async fn mcp_post(
    d: &Daemon,
    body: Vec<u8>,
    extra: &[(&str, &str)],
) -> (u16, Option<String>, String) {
    let mut req = plimsoll_tests::client()
        .post(d.url("/mcp"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body);
    for (name, value) in extra {
        req = req.header(*name, *value);
    }
    tokio::time::timeout(Duration::from_secs(60), async {
        let r = req.send().await.expect("sent");
        let status = r.status().as_u16();
        let mark = r
            .headers()
            .get("plimsoll-not-dispatched")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        (status, mark, r.text().await.expect("answer"))
    })
    .await
    .expect("answered in time")
}

/// The process's peak resident memory so far (VmHWM), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmHWM line")
}

/// A body just under the 8 MiB cap: `head`, then `unit` repeated, then
/// `tail`.
fn near_cap(head: &str, unit: &str, tail: &str) -> Vec<u8> {
    let cap = (8 << 20) - 4096;
    let mut b = head.as_bytes().to_vec();
    while b.len() + unit.len() + tail.len() <= cap {
        b.extend_from_slice(unit.as_bytes());
    }
    b.extend_from_slice(tail.as_bytes());
    b
}

/// A run through the API with the token: its status, and how long the
/// answer took.
async fn timed_run(d: &Daemon, code: &str) -> (u16, Duration) {
    let started = Instant::now();
    let r = plimsoll_tests::client()
        .post(d.url("/plimsoll.v1.SandboxService/Run"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(js_run(code).to_string())
        .send()
        .await
        .expect("sent");
    (r.status().as_u16(), started.elapsed())
}

/// An MCP message is weighed before the MCP SDK parses it, while its body
/// slot is held. Bodies of millions of tiny values (each cost the SDK
/// hundreds of MiB and a second of CPU) or nested past any real message
/// are refused 400, marked, four at a time, and the daemon's peak memory
/// hardly moves; a run afterwards is answered at once. Against a daemon
/// that hands such bodies to the SDK, the answers are 415 or 200 and the
/// peak grows by hundreds of MiB.
#[tokio::test]
async fn mcp_weighs_a_message_before_its_sdk_parses_it() {
    let d = wasm_with_token(&[]);
    let pid = d.pid().expect("pid");
    // One run first, so the peak read below is a serving daemon's.
    assert_eq!(timed_run(&d, "console.log(1)").await.0, 200);
    let before = peak_rss_kib(pid);
    let mut many_keys = br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"k":0"#.to_vec();
    for i in 0.. {
        let key = format!(r#","k{i}":0"#);
        if many_keys.len() + key.len() + 2 > (8 << 20) - 4096 {
            break;
        }
        many_keys.extend_from_slice(key.as_bytes());
    }
    many_keys.extend_from_slice(b"}}");
    let shapes: Vec<(&str, Vec<u8>)> = vec![
        ("8 MiB of [", vec![b'['; (8 << 20) - 4096]),
        (
            "a tools/call of empty arrays",
            near_cap(
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"describe","arguments":{"x":["#,
                "[],",
                "[]]}}}",
            ),
        ),
        (
            "params first",
            near_cap(
                r#"{"params":{"x":["#,
                "[],",
                r#"[]]},"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
            ),
        ),
        ("an array of empty arrays", near_cap("[", "[],", "[]]")),
        ("an object of many keys", many_keys),
        (
            "objects nested 100 deep",
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{}1{}}}"#,
                r#"{"a":"#.repeat(100),
                "}".repeat(100)
            )
            .into_bytes(),
        ),
    ];
    for (name, body) in shapes {
        let started = Instant::now();
        let answers =
            futures_util::future::join_all((0..4).map(|_| mcp_post(&d, body.clone(), &[]))).await;
        for (status, mark, text) in answers {
            assert_eq!(status, 400, "{name}: {text}");
            assert_eq!(mark.as_deref(), Some("request"), "{name}");
            let v: serde_json::Value = serde_json::from_str(&text).expect("a JSON-RPC error");
            assert!(v["id"].is_null(), "{name}: {text}");
            assert!(
                matches!(v["error"]["code"].as_i64(), Some(-32600 | -32700)),
                "{name}: {text}"
            );
        }
        // A sanity bound for a loaded machine; the memory check below is
        // what tells the SDK's parse from the weighing.
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{name}: four refusals took {:?}",
            started.elapsed()
        );
    }
    let grown = peak_rss_kib(pid).saturating_sub(before);
    assert!(
        grown < 128 << 10,
        "the daemon's peak memory grew by {grown} KiB refusing these bodies"
    );
    let (status, took) = timed_run(&d, "console.log(2)").await;
    assert_eq!(status, 200);
    assert!(
        took < Duration::from_secs(5),
        "a run afterwards took {took:?}"
    );
}

/// `/mcp` answers a body that is not JSON with JSON-RPC's parse error and
/// HTTP 400 (not the SDK's 415), and no answer repeats what the caller
/// chose: not an unknown method's name, a tool's, an argument's, a
/// protocol version from a header or a body.
#[tokio::test]
async fn mcp_answers_bad_messages_400_and_repeats_none_of_them() {
    let d = wasm_with_token(&[]);
    let (status, mark, text) = mcp_post(&d, br#"{"jsonrpc":"2.0","#.to_vec(), &[]).await;
    assert_eq!((status, mark.as_deref()), (400, Some("request")), "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("a JSON-RPC error");
    assert_eq!(v["error"]["code"], -32700, "{text}");
    assert!(v["id"].is_null(), "{text}");

    let canary = format!("echo-canary-{}", std::process::id());
    let call = |method: &str, params: serde_json::Value| {
        serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}))
            .expect("json")
    };
    // (what, body, extra header, the status it must have, if fixed)
    type Case<'a> = (&'a str, Vec<u8>, Vec<(&'a str, &'a str)>, Option<u16>);
    let cases: Vec<Case> = vec![
        ("an unknown method", call(&canary, json!({})), vec![], None),
        (
            "an unknown tool",
            call("tools/call", json!({"name": canary, "arguments": {}})),
            vec![],
            None,
        ),
        (
            "an unknown argument",
            call(
                "tools/call",
                json!({"name": "run_javascript", "arguments": {"code": "1", canary.as_str(): 1}}),
            ),
            vec![],
            None,
        ),
        (
            "JSON that is no JSON-RPC message",
            serde_json::to_vec(&json!({"jsonrpc": canary, "id": 1, "method": "ping"}))
                .expect("json"),
            vec![],
            Some(400),
        ),
        (
            "an unknown protocol version header",
            call("ping", json!({})),
            vec![("mcp-protocol-version", canary.as_str())],
            Some(400),
        ),
        (
            "an initialize whose version the header contradicts",
            call(
                "initialize",
                json!({"protocolVersion": canary, "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}),
            ),
            vec![("mcp-protocol-version", "2025-06-18")],
            Some(400),
        ),
    ];
    for (what, body, extra, want) in cases {
        let (status, _, text) = mcp_post(&d, body, &extra).await;
        if let Some(want) = want {
            assert_eq!(status, want, "{what}: {text}");
        }
        assert!(
            !text.contains(&canary),
            "{what}: the answer repeats what was sent: {text}"
        );
    }
}
