//! The HTTP surface of the real binary: protocol gate, refusals and their
//! marks, request binding, bad input, the Disabled default, the CLI, and
//! who may call at all (the Host and Origin rules against web pages).

use plimsoll_tests::{
    Daemon, REQUEST_ID, call, call_raw, client, js_run, run_to_exit, wasm_daemon,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Reason numbers of plimsoll.v1.NotDispatchedReason.
const REQUEST: u8 = 1;
const PROTOCOL: u8 = 3;
const UNSUPPORTED: u8 = 4;
const ISOLATION: u8 = 5;
const CAPACITY: u8 = 6;

#[tokio::test]
async fn disabled_is_the_default_and_runs_nothing() {
    let d = Daemon::start(&[]);
    let info = call(&d, "Describe", &json!({})).await;
    assert_eq!(info.status, 200);
    assert_eq!(info.body["sandbox"], "disabled");
    assert_eq!(info.body["isolation"], "none");
    assert_eq!(info.body["protocol"], 4);

    for floor in ["", "process"] {
        let mut req = js_run("console.log('must not run')");
        req["minimumIsolation"] = json!(floor);
        let a = call(&d, "Run", &req).await;
        assert_eq!(a.code(), "failed_precondition", "{:?}", a.body);
        assert_eq!(a.mark(), Some("unsupported"));
        assert_eq!(a.detail_reason(), Some(UNSUPPORTED));
    }
    // `disabled` by name is the same provider.
    let d2 = Daemon::start(&[("SANDBOX_PROVIDER", "disabled")]);
    let a = call(&d2, "Run", &js_run("1")).await;
    assert_eq!(a.mark(), Some("unsupported"));
    assert_eq!(
        d.audit_runs() + d2.audit_runs(),
        0,
        "nothing may be recorded as run"
    );
}

#[tokio::test]
async fn protocol_gate_comes_before_the_payload() {
    let d = wasm_daemon();
    // Missing protocol: invalid_argument, marked protocol.
    let a = call(&d, "Run", &json!({"javascript": {"code": "1"}})).await;
    assert_eq!(
        (a.code(), a.mark(), a.detail_reason()),
        ("invalid_argument", Some("protocol"), Some(PROTOCOL))
    );
    // Another number: unimplemented, marked protocol, even with a payload
    // this daemon could not parse.
    for p in [json!(3), json!(5), json!("2")] {
        let a = call(
            &d,
            "Run",
            &json!({"protocol": p, "javascript": {"code": 1, "x": true}}),
        )
        .await;
        assert_eq!(
            (a.code(), a.mark()),
            ("unimplemented", Some("protocol")),
            "{p}"
        );
    }
    assert_eq!(
        d.audit_after_sentinel().await,
        1,
        "a refused request was recorded as run"
    );
}

#[tokio::test]
async fn bad_input_is_refused_marked_and_harmless() {
    let d = wasm_daemon();
    let big_code = "x".repeat(256 * 1024 + 1);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("malformed json", b"{\"protocol\":4,".to_vec(), "invalid_argument"),
        ("not an object", b"[4]".to_vec(), "invalid_argument"),
        ("unknown top-level field", br#"{"protocol":4,"javascript":{"code":"1"},"extra":1}"#.to_vec(), "invalid_argument"),
        ("unknown payload field", br#"{"protocol":4,"javascript":{"code":"1","cwd":"/"}}"#.to_vec(), "invalid_argument"),
        ("duplicate key", br#"{"protocol":4,"timeoutMs":1,"timeoutMs":2,"javascript":{"code":"1"}}"#.to_vec(), "invalid_argument"),
        ("wrong type", br#"{"protocol":4,"javascript":{"code":["1"]}}"#.to_vec(), "invalid_argument"),
        ("empty payload", br#"{"protocol":4}"#.to_vec(), "invalid_argument"),
        ("two payloads", br#"{"protocol":4,"javascript":{"code":"1"},"project":{"steps":["true"]}}"#.to_vec(), "invalid_argument"),
        ("cell through Run", br#"{"protocol":4,"cell":{"language":"javascript","code":"1"}}"#.to_vec(), "invalid_argument"),
        ("empty code", br#"{"protocol":4,"javascript":{"code":""}}"#.to_vec(), "invalid_argument"),
        ("NUL in code", br#"{"protocol":4,"javascript":{"code":"1\u0000"}}"#.to_vec(), "invalid_argument"),
        ("floor none", br#"{"protocol":4,"minimumIsolation":"none","javascript":{"code":"1"}}"#.to_vec(), "invalid_argument"),
        ("floor unknown", br#"{"protocol":4,"minimumIsolation":"VM","javascript":{"code":"1"}}"#.to_vec(), "invalid_argument"),
        ("bad software rule", br#"{"protocol":4,"softwareRule":{"mode":"exact","identities":[]},"javascript":{"code":"1"}}"#.to_vec(), "invalid_argument"),
        ("code over 256 KiB", serde_json::to_vec(&js_run(&big_code)).expect("json"), "invalid_argument"),
        ("positional array", br#"[4,"","",0,null,{"code":"console.log(1)"}]"#.to_vec(), "invalid_argument"),
        ("positional payload", br#"{"protocol":4,"javascript":["console.log(1)",""]}"#.to_vec(), "invalid_argument"),
    ];
    for (name, body, code) in cases {
        let a = call_raw(&d, "Run", body).await;
        assert_eq!(a.code(), code, "{name}: {:?}", a.body);
        assert_eq!(a.mark(), Some("request"), "{name}");
        assert_eq!(a.detail_reason(), Some(REQUEST), "{name}");
        assert_eq!(a.request_id(), Some(REQUEST_ID), "{name}: answer not bound");
    }

    // Wrong content type: refused before the body is considered.
    let a = plimsoll_tests::answer(
        client()
            .post(d.url("/plimsoll.v1.SandboxService/Run"))
            .header("content-type", "application/proto")
            .header("plimsoll-request-id", REQUEST_ID)
            .body(serde_json::to_vec(&js_run("1")).expect("json"))
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!((a.status, a.mark()), (415, Some("request")));

    // A chunked body over 8 MiB, with no Content-Length to refuse it by.
    let head = raw_chunked_over_limit(&d).await;
    assert!(head.starts_with("http/1.1 413"), "{head}");
    assert!(head.contains("plimsoll-not-dispatched: request"), "{head}");

    // Nothing of the above ran, and the daemon still serves.
    assert_eq!(
        d.audit_after_sentinel().await,
        1,
        "a refused request was recorded as run"
    );
    let ok = call(&d, "Run", &js_run("console.log('still here')")).await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.stdout(), "still here\n");
}

/// Streams 9 MiB in 1 MiB chunks; returns the lower-cased answer head.
async fn raw_chunked_over_limit(d: &Daemon) -> String {
    let mut s = tokio::net::TcpStream::connect(&d.addr)
        .await
        .expect("connect");
    let head = format!(
        "POST /plimsoll.v1.SandboxService/Run HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Plimsoll-Request-Id: {REQUEST_ID}\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.expect("write head");
    let chunk = vec![b' '; 1 << 20];
    for _ in 0..9 {
        // The daemon may answer and close before all of it is sent.
        if s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .await
            .is_err()
            || s.write_all(&chunk).await.is_err()
            || s.write_all(b"\r\n").await.is_err()
        {
            break;
        }
    }
    let _ = s.write_all(b"0\r\n\r\n").await;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("answered")
        .expect("read");
    String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase()
}

#[tokio::test]
async fn oversized_content_length_is_refused_before_the_body() {
    let d = wasm_daemon();
    // Declare 9 MiB and send no body at all: the answer must come from the
    // header alone, without waiting for bytes that never arrive.
    let mut s = tokio::net::TcpStream::connect(&d.addr)
        .await
        .expect("connect");
    let head = format!(
        "POST /plimsoll.v1.SandboxService/Run HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Plimsoll-Request-Id: {REQUEST_ID}\r\nContent-Length: {}\r\n\r\n",
        9 << 20
    );
    s.write_all(head.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("answered without reading the body")
        .expect("read");
    let text = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 413"), "{text}");
    assert!(text.contains("plimsoll-not-dispatched: request"), "{text}");
    assert!(
        text.contains(&format!("plimsoll-request-id: {REQUEST_ID}")),
        "{text}"
    );
}

#[tokio::test]
async fn unknown_procedures_and_paths_are_unsupported() {
    let d = wasm_daemon();
    for path in [
        "/plimsoll.v1.SandboxService/Exec",
        "/plimsoll.v2.SandboxService/Run",
        "/nope",
    ] {
        let a = plimsoll_tests::answer(
            client()
                .post(d.url(path))
                .header("content-type", "application/json")
                .header("plimsoll-request-id", REQUEST_ID)
                .body("{}")
                .send()
                .await
                .expect("sent"),
        )
        .await;
        assert_eq!(a.status, 404, "{path}");
        assert_eq!(a.mark(), Some("unsupported"), "{path}");
        assert_eq!(a.request_id(), Some(REQUEST_ID), "{path}");
    }
    // Sessions exist in the protocol but not on this provider.
    let a = call(&d, "OpenSession", &json!({"protocol": 4})).await;
    assert_eq!((a.code(), a.mark()), ("unimplemented", Some("unsupported")));
    // GET on a procedure is not a Connect unary call.
    let resp = client()
        .get(d.url("/plimsoll.v1.SandboxService/Run"))
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status().as_u16(), 405);
    assert_eq!(
        resp.headers()
            .get("plimsoll-not-dispatched")
            .map(|v| v.as_bytes()),
        Some(&b"request"[..])
    );
}

#[tokio::test]
async fn floors_are_enforced_against_current_evidence() {
    let d = wasm_daemon();
    for floor in ["container", "kernel", "vm"] {
        let mut req = js_run("console.log('ran')");
        req["minimumIsolation"] = json!(floor);
        let a = call(&d, "Run", &req).await;
        assert_eq!(
            (a.code(), a.mark(), a.detail_reason()),
            ("failed_precondition", Some("isolation"), Some(ISOLATION))
        );
    }
    assert_eq!(
        d.audit_after_sentinel().await,
        1,
        "a run below its floor was dispatched"
    );
    let mut req = js_run("console.log('ran')");
    req["minimumIsolation"] = json!("process");
    let a = call(&d, "Run", &req).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body["isolation"], "process");
    assert_eq!(a.body["record"]["isolation"], "process");
    assert_eq!(a.stdout(), "ran\n");
}

#[tokio::test]
async fn software_rule_outside_the_engine_is_refused() {
    let d = wasm_daemon();
    let mut req = js_run("1");
    req["softwareRule"] =
        json!({"mode": "exact", "identities": ["oci-manifest:linux/amd64@sha256:00"]});
    let a = call(&d, "Run", &req).await;
    assert_eq!(
        (a.code(), a.mark()),
        ("failed_precondition", Some("environment"))
    );
}

#[tokio::test]
async fn grant_profiles_do_not_exist_yet() {
    let d = wasm_daemon();
    let a = call(
        &d,
        "Run",
        &json!({"protocol": 4, "javascript": {"code": "1", "grantProfile": "inventory"}}),
    )
    .await;
    assert_eq!(
        (a.code(), a.mark()),
        ("permission_denied", Some("permission"))
    );
}

#[tokio::test]
async fn every_answer_is_bound_to_its_request() {
    let d = wasm_daemon();
    for (proc_, body) in [
        ("Describe", json!({})),
        ("Run", js_run("1")),
        ("Run", json!({"protocol": 9})),
    ] {
        let a = call(&d, proc_, &body).await;
        assert_eq!(a.request_id(), Some(REQUEST_ID), "{proc_} {body}");
    }
    // A malformed ID is not reflected.
    let resp = client()
        .post(d.url("/plimsoll.v1.SandboxService/Describe"))
        .header("content-type", "application/json")
        .header("plimsoll-request-id", "<script>")
        .body("{}")
        .send()
        .await
        .expect("sent");
    assert!(resp.headers().get("plimsoll-request-id").is_none());
}

#[tokio::test]
async fn h2c_prior_knowledge_is_served() {
    let d = wasm_daemon();
    let c = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    let resp = c
        .post(d.url("/plimsoll.v1.SandboxService/Run"))
        .header("content-type", "application/json")
        .json(&js_run("console.log(40+2)"))
        .send()
        .await
        .expect("sent over h2c");
    assert_eq!(resp.version(), reqwest::Version::HTTP_2);
    let a = plimsoll_tests::answer(resp).await;
    assert_eq!(a.stdout(), "42\n");
}

#[tokio::test]
async fn health_and_readiness() {
    let d = wasm_daemon();
    for path in ["/healthz", "/readyz"] {
        let resp = client().get(d.url(path)).send().await.expect("sent");
        assert_eq!(resp.status().as_u16(), 200, "{path}");
    }
}

#[tokio::test]
async fn capacity_is_refused_not_queued() {
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("SANDBOX_MAX_CONCURRENT", "1"),
    ]);
    let busy = {
        let mut req = js_run("while(true){}");
        req["timeoutMs"] = json!(1500);
        let url = d.url("/plimsoll.v1.SandboxService/Run");
        tokio::spawn(async move {
            client()
                .post(url)
                .header("content-type", "application/json")
                .json(&req)
                .send()
                .await
        })
    };
    plimsoll_tests::wait_inflight(&d, 1).await;
    let a = call(&d, "Run", &js_run("1")).await;
    assert_eq!(
        (a.code(), a.mark(), a.detail_reason()),
        ("resource_exhausted", Some("capacity"), Some(CAPACITY))
    );
    // Capacity comes before the floor: a request that would also fail its
    // floor is refused for capacity, never told about the tier.
    let mut floored = js_run("1");
    floored["minimumIsolation"] = json!("vm");
    let a = call(&d, "Run", &floored).await;
    assert_eq!(a.mark(), Some("capacity"), "{:?}", a.body);
    let first = plimsoll_tests::answer(busy.await.expect("join").expect("sent")).await;
    assert_eq!(first.body["javascript"]["timedOut"], true);
    // The slot is free again.
    assert_eq!(
        call(&d, "Run", &js_run("console.log(1)")).await.stdout(),
        "1\n"
    );
}

#[test]
fn command_line_is_closed() {
    let (code, text) = run_to_exit(&["--addr", "0.0.0.0:1"], &[]);
    assert_eq!(code, Some(2), "{text}");
    let (code, text) = run_to_exit(&["-h"], &[]);
    assert_eq!(code, Some(0));
    for var in [
        "SANDBOX_PROVIDER",
        "PLIMSOLL_ADDR",
        "SANDBOX_MEMORY_MB",
        "SANDBOX_MAX_CONCURRENT",
    ] {
        assert!(text.contains(var), "-h does not list {var}");
    }
}

#[test]
fn unknown_provider_is_a_startup_error_listing_known_ones() {
    let (code, text) = run_to_exit(&[], &[("SANDBOX_PROVIDER", "dokcer")]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("disabled") && text.contains("wasm"), "{text}");
}

#[test]
fn unknown_variables_are_warned_about() {
    let mut d = Daemon::start(&[("SANDBOX_PROVIDR", "wasm"), ("PLIMSOLL_TOKN", "x")]);
    let log = d.log_lines().join("\n");
    assert!(
        log.contains("SANDBOX_PROVIDR") && log.contains("PLIMSOLL_TOKN"),
        "{log}"
    );
    // The typo means the provider stayed Disabled, which is the safe reading.
    assert!(log.contains("\"sandbox\":\"disabled\""), "{log}");
    assert!(d.is_running());
}

#[tokio::test]
async fn a_caller_that_hangs_up_does_not_free_the_slot_or_skip_the_audit() {
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("SANDBOX_MAX_CONCURRENT", "1"),
    ]);
    let mut req = js_run("while (true) {}");
    req["timeoutMs"] = json!(1500);
    req["traceId"] = json!("hung-up-run");
    // Send the run, then drop the request after 300 ms: the connection closes.
    let url = d.url("/plimsoll.v1.SandboxService/Run");
    let _ = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        client()
            .post(url)
            .header("content-type", "application/json")
            .json(&req)
            .send(),
    )
    .await;
    // The run is still going and still holds the only slot.
    let a = call(&d, "Run", &js_run("1")).await;
    assert_eq!(
        a.mark(),
        Some("capacity"),
        "the slot was released while the run went on: {:?}",
        a.body
    );
    // When it ends, it is audited like any other run.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !d.log_lines().iter().any(|l| l.contains("hung-up-run")) {
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned run was never audited"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let line = d
        .log_lines()
        .into_iter()
        .find(|l| l.contains("hung-up-run"))
        .expect("audit line");
    assert!(line.contains("\"timed_out\":true"), "{line}");
    assert_eq!(
        call(&d, "Run", &js_run("console.log(2)")).await.stdout(),
        "2\n"
    );
}

#[tokio::test]
async fn logs_carry_no_code_output_or_request_content() {
    let d = wasm_daemon();
    const IN_CODE: &str = "CANARYc0de5e7a";
    const IN_OUTPUT: &str = "CANARY0u7b9c2d";
    const IN_PROFILE: &str = "CANARYpr0f11e";
    const IN_BAD_TRACE: &str = "CANARY tr4ce";
    let code = format!(
        "// {IN_CODE}\nconsole.log('{}' + '{}'); throw new Error('{IN_CODE}')",
        &IN_OUTPUT[..6],
        &IN_OUTPUT[6..]
    );
    let mut req = js_run(&code);
    req["traceId"] = json!(IN_BAD_TRACE);
    let a = call(&d, "Run", &req).await;
    assert_eq!(a.stdout(), format!("{IN_OUTPUT}\n"));
    // Refused requests carrying canaries: a profile, a malformed body.
    let _ = call(
        &d,
        "Run",
        &json!({"protocol": 4, "javascript": {"code": IN_CODE, "grantProfile": IN_PROFILE}}),
    )
    .await;
    let _ = call_raw(
        &d,
        "Run",
        format!("{{\"protocol\":4,\"javascript\":{{\"code\":\"{IN_CODE}\",\"x\":1}}}}"),
    )
    .await;
    d.audit_after_sentinel().await;
    let log = d.log_lines().join("\n");
    for canary in [IN_CODE, IN_OUTPUT, IN_PROFILE, "CANARY"] {
        assert!(!log.contains(canary), "{canary} reached the log:\n{log}");
    }
    assert!(log.contains("\"trace_id_rejected\":true"), "{log}");
}

/// One request over a fresh HTTP/1.1 connection with exactly the headers
/// given (a client library writes its own `Host`): the status and the
/// whole answer, lower-cased. The request is small and sent in one write,
/// so it arrives whole even when the daemon answers before reading the
/// body, and closing the connection does not reset it.
async fn exact_request(
    d: &Daemon,
    method: &str,
    target: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(&d.addr)
        .await
        .expect("connect");
    let mut request = format!(
        "{method} {target} HTTP/1.1\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    )
    .into_bytes();
    for (name, value) in headers {
        request.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    request.extend_from_slice(b"\r\n");
    request.extend_from_slice(body);
    s.write_all(&request).await.expect("request");
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        s.read_to_end(&mut answer),
    )
    .await
    .expect("answered in time")
    .expect("read");
    let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, text)
}

/// In open mode no token tells a caller from a web page whose name was
/// rebound to 127.0.0.1 (DNS rebinding): every procedure and `/mcp` take a
/// request only under a loopback name and without an `Origin`, refuse it
/// before its body with the `permission` mark, repeat nothing it sent, and
/// nothing runs. Loopback names, with or without a port, still work.
#[tokio::test]
async fn without_callers_only_this_machine_calls_and_no_web_page() {
    let d = Daemon::start(&[("SANDBOX_PROVIDER", "wasm"), ("SANDBOX_MAX_SESSIONS", "1")]);
    let port = d.addr.rsplit_once(':').expect("port").1.to_string();
    let run = serde_json::to_vec(&js_run("console.log('ran')")).expect("json");
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(run.len()).expect("small").to_be_bytes());
    framed.extend_from_slice(&run);
    let mcp_call = serde_json::to_vec(&json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "run_javascript", "arguments": {"code": "console.log('ran')"}},
    }))
    .expect("json");
    let calls: [(&str, &str, Vec<u8>); 5] = [
        (
            "/plimsoll.v1.SandboxService/Run",
            "application/json",
            run.clone(),
        ),
        (
            "/plimsoll.v1.SandboxService/RunStream",
            "application/connect+json",
            framed,
        ),
        (
            "/plimsoll.v1.SandboxService/Describe",
            "application/json",
            b"{}".to_vec(),
        ),
        (
            "/plimsoll.v1.SandboxService/OpenSession",
            "application/json",
            br#"{"protocol":4}"#.to_vec(),
        ),
        ("/mcp", "application/json", mcp_call),
    ];
    let loopback = format!("127.0.0.1:{port}");
    // (target prefix, headers): a rebound name with and without a port, a
    // look-alike, a page's Origin (null too) under a loopback name, no
    // name at all, and a loopback Host with a foreign absolute target.
    let foreign: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("", vec![("host", "evil.example".into())]),
        ("", vec![("host", format!("evil.example:{port}"))]),
        ("", vec![("host", format!("localhost.evil.example:{port}"))]),
        (
            "",
            vec![
                ("host", loopback.clone()),
                ("origin", "http://evil.example".into()),
            ],
        ),
        (
            "",
            vec![
                ("host", format!("localhost:{port}")),
                ("origin", "null".into()),
            ],
        ),
        ("", vec![]),
        ("http://evil.example", vec![("host", loopback.clone())]),
    ];
    for (path, content_type, body) in &calls {
        for (prefix, headers) in &foreign {
            let mut headers = headers.clone();
            headers.push(("content-type", (*content_type).to_string()));
            headers.push(("accept", "application/json, text/event-stream".into()));
            let target = format!("{prefix}{path}");
            let (status, answer) = exact_request(&d, "POST", &target, &headers, body).await;
            assert_eq!(status, 403, "{target} {headers:?}: {answer}");
            assert!(
                answer.contains("plimsoll-not-dispatched: permission"),
                "{target} {headers:?}: {answer}"
            );
            assert!(
                !answer.contains("evil.example"),
                "the refusal repeats what was sent: {answer}"
            );
        }
    }
    assert_eq!(
        d.audit_after_sentinel().await,
        1,
        "a request under a foreign name or from a page ran"
    );

    // This machine's names, with or without a port, in any case.
    let names = [
        loopback.clone(),
        format!("localhost:{port}"),
        format!("LOCALHOST:{port}"),
        format!("[::1]:{port}"),
        "localhost".to_string(),
        "127.0.0.1".to_string(),
    ];
    for host in &names {
        let headers = [
            ("host", host.clone()),
            ("content-type", "application/json".to_string()),
        ];
        let (status, answer) = exact_request(
            &d,
            "POST",
            "/plimsoll.v1.SandboxService/Run",
            &headers,
            &run,
        )
        .await;
        assert_eq!(status, 200, "{host}: {answer}");
    }
    let (status, answer) = exact_request(
        &d,
        "POST",
        "/mcp",
        &[
            ("host", loopback.clone()),
            ("content-type", "application/json".into()),
            ("accept", "application/json, text/event-stream".into()),
        ],
        &calls[4].2,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("completed"), "{answer}");
    assert_eq!(
        d.audit_after_sentinel().await,
        1 + names.len() + 1 + 1,
        "each run under a loopback name is one audit line"
    );

    // The health endpoints run nothing and answer a fixed word: an
    // orchestrator may probe them by any name.
    for path in ["/healthz", "/readyz"] {
        let (status, answer) =
            exact_request(&d, "GET", path, &[("host", "evil.example".into())], b"").await;
        assert_eq!(status, 200, "{path}: {answer}");
    }
}

/// `/mcp` on its own in open mode: a tool call that would run code, under
/// a name that is not this machine's (a rebound name, with and without a
/// port, look-alikes, no name at all, a foreign absolute target), is
/// refused before the MCP SDK sees it, marked `permission`, repeating
/// nothing it sent, and runs nothing. The snippet is a canary: its size,
/// which no other request here has, is in the audit line of any run that
/// carries it, as the same call under a loopback name shows at the end.
#[tokio::test]
async fn mcp_without_callers_refuses_a_foreign_host_and_runs_nothing() {
    let d = wasm_daemon();
    let port = d.addr.rsplit_once(':').expect("port").1.to_string();
    const CANARY_BYTES: usize = 7777;
    let mut code = String::from("console.log('ran') // ");
    while code.len() < CANARY_BYTES {
        code.push('x');
    }
    let canary = format!("\"code_bytes\":{CANARY_BYTES}");
    let tool_call = serde_json::to_vec(&json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "run_javascript", "arguments": {"code": code}},
    }))
    .expect("json");
    let loopback = format!("127.0.0.1:{port}");
    // (target prefix, Host)
    let foreign: Vec<(&str, Option<String>)> = vec![
        ("", Some("evil.example".into())),
        ("", Some(format!("evil.example:{port}"))),
        ("", Some(format!("localhost.evil.example:{port}"))),
        ("", Some(format!("127.0.0.1.evil.example:{port}"))),
        ("", None),
        ("http://evil.example", Some(loopback.clone())),
    ];
    for (prefix, host) in &foreign {
        let mut headers = vec![
            ("content-type", "application/json".to_string()),
            ("accept", "application/json, text/event-stream".to_string()),
        ];
        if let Some(host) = host {
            headers.push(("host", host.clone()));
        }
        let target = format!("{prefix}/mcp");
        let (status, answer) = exact_request(&d, "POST", &target, &headers, &tool_call).await;
        assert_eq!(status, 403, "{target} {host:?}: {answer}");
        assert!(
            answer.contains("plimsoll-not-dispatched: permission"),
            "{target} {host:?}: {answer}"
        );
        assert!(
            !answer.contains("evil.example"),
            "the refusal repeats what was sent: {answer}"
        );
    }
    assert_eq!(
        d.audit_after_sentinel().await,
        1,
        "a tool call under a foreign name ran"
    );
    assert!(
        !d.log_lines().iter().any(|l| l.contains(&canary)),
        "a tool call under a foreign name ran"
    );

    // The control: the same call under this machine's name runs, and its
    // audit line carries the canary, so the check above could fail.
    let (status, answer) = exact_request(
        &d,
        "POST",
        "/mcp",
        &[
            ("host", loopback),
            ("content-type", "application/json".into()),
            ("accept", "application/json, text/event-stream".into()),
        ],
        &tool_call,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("completed"), "{answer}");
    assert_eq!(d.audit_after_sentinel().await, 3);
    assert!(
        d.log_lines().iter().any(|l| l.contains(&canary)),
        "the canary's size is not in its run's audit line"
    );
}

/// With callers the token is the defence, and the daemon's name is the
/// operator's to choose: a caller with a token is served under any `Host`.
/// `/mcp` alone still refuses a page's `Origin`, token or not, as MCP's
/// transport rules ask.
#[tokio::test]
async fn with_callers_the_token_decides_and_mcp_still_refuses_pages() {
    const TOKEN: &str = "api-test-token-0123456789abcdef0123456789";
    let d = Daemon::start(&[("SANDBOX_PROVIDER", "wasm"), ("PLIMSOLL_TOKEN", TOKEN)]);
    let run = serde_json::to_vec(&js_run("console.log('ran')")).expect("json");
    let named = |auth: bool| {
        let mut h = vec![
            ("host", "sandbox.example.internal:8746".to_string()),
            ("content-type", "application/json".to_string()),
        ];
        if auth {
            h.push(("authorization", format!("Bearer {TOKEN}")));
        }
        h
    };
    let (status, answer) = exact_request(
        &d,
        "POST",
        "/plimsoll.v1.SandboxService/Run",
        &named(true),
        &run,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let (status, _) = exact_request(
        &d,
        "POST",
        "/plimsoll.v1.SandboxService/Run",
        &named(false),
        &run,
    )
    .await;
    assert_eq!(status, 401);
    let mcp_call = serde_json::to_vec(&json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/list",
    }))
    .expect("json");
    let mut paged = named(true);
    paged.push(("accept", "application/json, text/event-stream".into()));
    paged.push(("origin", "http://page.example".into()));
    let (status, answer) = exact_request(&d, "POST", "/mcp", &paged, &mcp_call).await;
    assert_eq!(status, 403, "{answer}");
    assert!(
        answer.contains("plimsoll-not-dispatched: permission"),
        "{answer}"
    );
}
