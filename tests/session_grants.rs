//! Grants inside sessions: a docker session's container mounts a broker
//! directory made with it, which serves a granted call's broker session
//! while that call runs and nothing otherwise, under runc and runsc; and a
//! profile without `allow_in_sessions` is refused in a session as an
//! unknown one is.

use std::sync::{Arc, Mutex};

use base64::Engine as _;
use plimsoll_tests::{Answer, Daemon, call};
use serde_json::{Value, json};

type Log = Arc<Mutex<Vec<(String, String)>>>;

/// A loopback API that records each request's target and authorization.
async fn api() -> (String, Log) {
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let seen = log.clone();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let seen = seen.clone();
        async move {
            let target = req.uri().path().to_string();
            let auth = req
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            seen.lock().unwrap().push((target.clone(), auth));
            let id = target.rsplit('/').next().unwrap_or("").to_string();
            axum::Json(json!({ "id": id }))
        }
    });
    (plimsoll_tests::serve_loopback(app).await, log)
}

fn secret() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("canarysessiontoken{t:x}{}", std::process::id())
}

fn stdout_of(result: &Value) -> String {
    let b = base64::engine::general_purpose::STANDARD
        .decode(result["stdout"].as_str().unwrap_or(""))
        .expect("base64");
    String::from_utf8(b).expect("utf-8")
}

async fn session_call(d: &Daemon, sid: &str, mut payload: Value) -> Answer {
    payload["protocol"] = json!(4);
    payload["sessionId"] = json!(sid);
    payload["timeoutMs"] = json!(30000);
    call(d, "SessionRun", &payload).await
}

async fn granted_calls_in_a_docker_session(runtime: &str) {
    let (origin, log) = api().await;
    let token = secret();
    let grants = json!({"profiles": {
        "inventory": {
            "base_url": origin, "allow": ["GET /items/*"], "allowed_callers": ["anonymous"],
            "token": {"type": "static", "env": "INVENTORY_TOKEN"},
            "allow_in_sessions": true
        },
        "runs-only": {
            "base_url": origin, "allow": ["GET /items/*"], "allowed_callers": ["anonymous"]
        }
    }});
    let path = std::env::temp_dir().join(format!(
        "plimsoll-session-grants-{}-{runtime}.json",
        std::process::id()
    ));
    std::fs::write(&path, grants.to_string()).expect("grants file");
    let file = path.display().to_string();
    let image = plimsoll_tests::sandbox_image();
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_DOCKER_IMAGE", &image),
        ("SANDBOX_DOCKER_RUNTIME", runtime),
        ("SANDBOX_DOCKER_POOL", "0"),
        ("SANDBOX_MAX_SESSIONS", "2"),
        ("PLIMSOLL_GRANTS_FILE", &file),
        ("INVENTORY_TOKEN", &token),
    ]);

    let described = call(&d, "Describe", &json!({})).await;
    assert_eq!(described.body["supportsJavascriptGrants"], true);
    let opened = call(&d, "OpenSession", &json!({"protocol": 4})).await;
    assert_eq!(opened.status, 200, "{:?}", opened.body);
    let sid = opened.body["sessionId"].as_str().expect("id").to_string();

    // A granted snippet reaches the API through the session's socket, with
    // the credential added by the host.
    let a = session_call(
        &d,
        &sid,
        json!({"javascript": {"code": "host.get('/items/9').then(r => console.log(JSON.stringify(r)))", "grantProfile": "inventory"}}),
    )
    .await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    let js = &a.body["run"]["javascript"];
    assert_eq!(stdout_of(js), "{\"id\":\"9\"}\n", "{:?}", a.body);
    assert_eq!(js["callTrace"]["calls"][0]["route"], "/items/*");
    assert_eq!(
        log.lock().unwrap().clone(),
        vec![("/items/9".to_string(), format!("Bearer {token}"))]
    );

    // The next call has no grant: the socket is there (the container was
    // made with it) but serves nothing, and no client is preloaded.
    let raw = "const http = require('http'); \
        const r = http.request({socketPath: '/run/plimsoll/host.sock', path: '/items/1'}, res => { \
          let b = ''; res.on('data', d => b += d); res.on('end', () => console.log(res.statusCode, b, typeof host)); }); \
        r.on('error', e => console.log('error', e.code)); r.end();";
    let a = session_call(&d, &sid, json!({"javascript": {"code": raw}})).await;
    assert_eq!(
        stdout_of(&a.body["run"]["javascript"]),
        "403 no grant is in force for this call undefined\n",
        "{:?}",
        a.body
    );
    assert_eq!(
        log.lock().unwrap().len(),
        1,
        "a call without a grant reached the API"
    );

    // Python in a project step, granted; and the credential is nowhere the
    // container can look.
    let a = session_call(
        &d,
        &sid,
        json!({"project": {
            "files": [{"path": "main.py", "content": "print(host.get('/items/5')['id'])\n"}],
            "steps": ["python3 main.py", format!("env | grep -c {token} ; grep -rc {token} /run/plimsoll /work /tmp 2>/dev/null | grep -vc ':0$'")],
            "grantProfile": "inventory"}}),
    )
    .await;
    let p = &a.body["run"]["project"];
    assert_eq!(p["outcome"], "PROJECT_OUTCOME_COMPLETED", "{:?}", a.body);
    assert_eq!(stdout_of(&p["steps"][0]), "5\n");
    assert_eq!(stdout_of(&p["steps"][1]), "0\n0\n");
    assert_eq!(log.lock().unwrap().len(), 2);

    // A profile not allowed in sessions: the unknown-profile refusal,
    // marked, and nothing reaches the API.
    let a = session_call(
        &d,
        &sid,
        json!({"javascript": {"code": "host.get('/items/1')", "grantProfile": "runs-only"}}),
    )
    .await;
    assert_eq!(a.status, 403, "{:?}", a.body);
    assert_eq!(a.mark(), Some("permission"));
    assert_eq!(log.lock().unwrap().len(), 2);

    // Cells carry no grant: a cell's interpreter cannot use the socket.
    let a = session_call(
        &d,
        &sid,
        json!({"cell": {"language": "javascript", "code": "typeof host"}}),
    )
    .await;
    assert_eq!(
        stdout_of(&a.body["run"]["cell"]),
        "'undefined'\n",
        "{:?}",
        a.body
    );
    // And a cell that goes to the socket itself is answered 403, with
    // nothing reaching the upstream.
    let probe = "import socket\n\
        s = socket.socket(socket.AF_UNIX)\n\
        s.connect('/run/plimsoll/host.sock')\n\
        s.sendall(b'GET /items/1 HTTP/1.0\\r\\nHost: h\\r\\n\\r\\n')\n\
        print(s.recv(4096).decode().split(' ')[1])\n";
    let a = session_call(
        &d,
        &sid,
        json!({"cell": {"language": "python", "code": probe}}),
    )
    .await;
    assert_eq!(stdout_of(&a.body["run"]["cell"]), "403\n", "{:?}", a.body);
    assert_eq!(log.lock().unwrap().len(), 2, "a cell reached the upstream");

    for line in d.log_lines() {
        assert!(
            !line.contains(&token),
            "the daemon's log holds the token: {line}"
        );
    }
    let closed = call(
        &d,
        "CloseSession",
        &json!({"protocol": 4, "sessionId": sid}),
    )
    .await;
    assert_eq!(closed.status, 200);
    assert_eq!(closed.body["calls"], "5");
    let pid = d.pid().expect("pid");
    drop(d);
    let _ = std::fs::remove_file(&path);
    assert_eq!(plimsoll_tests::containers_of(pid), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_calls_in_a_runc_session() {
    granted_calls_in_a_docker_session("runc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_calls_in_a_runsc_session() {
    granted_calls_in_a_docker_session("runsc").await;
}
