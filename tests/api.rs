//! The HTTP surface of the real binary: protocol gate, refusals and their
//! marks, request binding, bad input, the Disabled default, and the CLI.

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
        "POST /plimsoll.v1.SandboxService/Run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
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
        "POST /plimsoll.v1.SandboxService/Run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
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
