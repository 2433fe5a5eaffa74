//! Grants inside sessions: a docker session's container mounts a broker
//! directory made with it, which serves a granted call's broker session
//! while that call runs and nothing otherwise, under runc and runsc; a
//! profile without `allow_in_sessions` is refused in a session as an
//! unknown one is; and with two profiles, each call is served its own
//! grant and no other.

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

fn secret(tag: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("canary{tag}token{t:x}{}", std::process::id())
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
    let token = secret("session");
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

    close_and_check(d, &sid, &[&token], "5", &path).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_calls_in_a_runc_session() {
    granted_calls_in_a_docker_session("runc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_calls_in_a_runsc_session() {
    granted_calls_in_a_docker_session("runsc").await;
}

/// Asks the session's broker socket for `/items/9` and then `/invoices/7`,
/// printing for each its status, the broker's word on it, and an
/// upstream's body.
const BOTH_ROUTES: &str = r#"
const http = require('http');
const get = p => new Promise(done => {
  const r = http.request({socketPath: '/run/plimsoll/host.sock', path: p}, res => {
    let b = '';
    res.on('data', d => b += d);
    res.on('end', () => done(p + ' ' + res.statusCode + ' ' + res.headers['plimsoll-broker'] + (res.statusCode === 200 ? ' ' + b : '')));
  });
  r.on('error', e => done(p + ' error ' + e.code));
  r.end();
});
(async () => { for (const p of ['/items/9', '/invoices/7']) console.log(await get(p)); })();
"#;

/// What `BOTH_ROUTES` prints under the inventory grant.
const INVENTORY_ONLY: &str =
    "/items/9 200 upstream {\"id\":\"9\"}\n/invoices/7 403 not-permitted\n";
/// What `BOTH_ROUTES` prints under the billing grant.
const BILLING_ONLY: &str = "/items/9 403 not-permitted\n/invoices/7 200 upstream {\"id\":\"7\"}\n";

/// Two profiles allowed in sessions, each on an upstream of its own with a
/// token of its own. In one session, a call granted `inventory` reaches
/// inventory's routes with inventory's token and none of billing's (the
/// broker refuses them, and billing's upstream sees nothing); the next
/// call, granted `billing`, reaches billing's only; and the one after,
/// granted `inventory` again, inventory's only. The socket serves the
/// call's grant and no other, whichever came before it. A socket that
/// kept serving the first grant, or that served both, fails at the second
/// call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_session_call_is_served_its_own_grant_and_no_other() {
    let (items_origin, items_log) = api().await;
    let (invoices_origin, invoices_log) = api().await;
    let (items_token, invoices_token) = (secret("items"), secret("invoices"));
    let grants = json!({"profiles": {
        "inventory": {
            "base_url": items_origin, "allow": ["GET /items/*"], "allowed_callers": ["anonymous"],
            "token": {"type": "static", "env": "INVENTORY_TOKEN"},
            "allow_in_sessions": true
        },
        "billing": {
            "base_url": invoices_origin, "allow": ["GET /invoices/*"], "allowed_callers": ["anonymous"],
            "token": {"type": "static", "env": "BILLING_TOKEN"},
            "allow_in_sessions": true
        }
    }});
    let path = std::env::temp_dir().join(format!(
        "plimsoll-session-two-grants-{}.json",
        std::process::id()
    ));
    std::fs::write(&path, grants.to_string()).expect("grants file");
    let file = path.display().to_string();
    let image = plimsoll_tests::sandbox_image();
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_DOCKER_IMAGE", &image),
        ("SANDBOX_DOCKER_RUNTIME", "runc"),
        ("SANDBOX_DOCKER_POOL", "0"),
        ("SANDBOX_MAX_SESSIONS", "1"),
        ("PLIMSOLL_GRANTS_FILE", &file),
        ("INVENTORY_TOKEN", &items_token),
        ("BILLING_TOKEN", &invoices_token),
    ]);
    let opened = call(&d, "OpenSession", &json!({"protocol": 4})).await;
    assert_eq!(opened.status, 200, "{:?}", opened.body);
    let sid = opened.body["sessionId"].as_str().expect("id").to_string();
    let seen = |log: &Log| log.lock().unwrap().clone();
    let hit = |target: &str, token: &str| (target.to_string(), format!("Bearer {token}"));

    let a = session_call(
        &d,
        &sid,
        json!({"javascript": {"code": BOTH_ROUTES, "grantProfile": "inventory"}}),
    )
    .await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(
        stdout_of(&a.body["run"]["javascript"]),
        INVENTORY_ONLY,
        "{:?}",
        a.body
    );
    assert_eq!(seen(&items_log), vec![hit("/items/9", &items_token)]);
    assert!(
        seen(&invoices_log).is_empty(),
        "a call granted inventory reached billing's upstream: {:?}",
        seen(&invoices_log)
    );

    let a = session_call(
        &d,
        &sid,
        json!({"javascript": {"code": BOTH_ROUTES, "grantProfile": "billing"}}),
    )
    .await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(
        stdout_of(&a.body["run"]["javascript"]),
        BILLING_ONLY,
        "{:?}",
        a.body
    );
    assert_eq!(
        seen(&items_log).len(),
        1,
        "a call granted billing reached inventory's upstream"
    );
    assert_eq!(
        seen(&invoices_log),
        vec![hit("/invoices/7", &invoices_token)]
    );

    let a = session_call(
        &d,
        &sid,
        json!({"javascript": {"code": BOTH_ROUTES, "grantProfile": "inventory"}}),
    )
    .await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(
        stdout_of(&a.body["run"]["javascript"]),
        INVENTORY_ONLY,
        "{:?}",
        a.body
    );
    assert_eq!(
        seen(&items_log),
        vec![hit("/items/9", &items_token), hit("/items/9", &items_token)]
    );
    assert_eq!(
        seen(&invoices_log).len(),
        1,
        "a call granted inventory reached billing's upstream"
    );

    close_and_check(d, &sid, &[&items_token, &invoices_token], "3", &path).await;
}

/// The end every test here shares: no token in the daemon's log, the
/// session closed counting `calls`, and, counted before the stopped daemon
/// is reaped (so no other daemon's sweep can have taken a container it
/// left, `Daemon::stop_then`), no container left.
async fn close_and_check(
    d: Daemon,
    sid: &str,
    tokens: &[&str],
    calls: &str,
    grants: &std::path::Path,
) {
    for line in d.log_lines() {
        assert!(
            !tokens.iter().any(|t| line.contains(t)),
            "the daemon's log holds a token: {line}"
        );
    }
    let closed = call(
        &d,
        "CloseSession",
        &json!({"protocol": 4, "sessionId": sid}),
    )
    .await;
    assert_eq!(closed.status, 200);
    assert_eq!(closed.body["calls"], calls);
    let left = d.stop_counting_leftovers();
    let _ = std::fs::remove_file(grants);
    assert_eq!(left, 0, "containers were left behind");
}
