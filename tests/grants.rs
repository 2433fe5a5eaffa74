//! Grants and the broker, against a real HTTP API on loopback (an axum
//! server that records every request it receives), through the wasm guest
//! and through containers under runc and runsc.
//!
//! The canary values (the credential, a path segment, a body) are random per
//! test process and are searched for everywhere the guest or an observer
//! can look: the run's output, the answer, the daemon's log (audit line
//! included) and the CallTrace.

use std::sync::{Arc, Mutex};

use base64::Engine as _;
use plimsoll_tests::{Answer, Daemon, call, js_run};
use serde_json::{Value, json};

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    authorization: String,
    body: Vec<u8>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// Calls to /slow/* in flight at the API now, and the most there ever were.
static SLOW_NOW: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static SLOW_MOST: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The operator's API: records, then answers by path.
async fn api() -> (String, Log) {
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let seen = log.clone();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let seen = seen.clone();
        async move {
            if let Some(ms) = req.uri().path().strip_prefix("/hang/") {
                let ms: u64 = ms.parse().unwrap_or(0);
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                return axum::response::IntoResponse::into_response(axum::Json(
                    json!({"slept": ms}),
                ));
            }
            if let Some(ms) = req.uri().path().strip_prefix("/slow/") {
                use std::sync::atomic::Ordering::SeqCst;
                let ms: u64 = ms.parse().unwrap_or(0);
                let now = SLOW_NOW.fetch_add(1, SeqCst) + 1;
                SLOW_MOST.fetch_max(now, SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                SLOW_NOW.fetch_sub(1, SeqCst);
                return axum::response::IntoResponse::into_response(axum::Json(
                    json!({"slept": ms}),
                ));
            }
            let method = req.method().to_string();
            let target = req
                .uri()
                .path_and_query()
                .map(|p| p.as_str().to_string())
                .unwrap_or_default();
            let authorization = req
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let body = axum::body::to_bytes(req.into_body(), 8 << 20)
                .await
                .map(|b| b.to_vec())
                .unwrap_or_default();
            seen.lock().expect("log").push(Seen {
                method: method.clone(),
                target: target.clone(),
                authorization,
                body: body.clone(),
            });
            use axum::http::StatusCode;
            use axum::response::IntoResponse;
            match (method.as_str(), target.as_str()) {
                ("GET", "/busy") => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [("retry-after", "5")],
                    "busy",
                )
                    .into_response(),
                ("GET", "/big") => vec![b'x'; 5 << 20].into_response(),
                ("GET", "/missing") => (StatusCode::NOT_FOUND, "no such thing").into_response(),
                // /moved/<code>/<port>: a redirect to an off-list origin.
                ("GET", t) if t.starts_with("/moved/") => {
                    let mut parts = t["/moved/".len()..].split('/');
                    let code = parts
                        .next()
                        .and_then(|c| c.parse::<u16>().ok())
                        .unwrap_or(302);
                    let port = parts.next().unwrap_or("1");
                    (
                        StatusCode::from_u16(code).unwrap_or(StatusCode::FOUND),
                        [("location", format!("http://127.0.0.1:{port}/stolen"))],
                        "moved",
                    )
                        .into_response()
                }
                ("POST", "/items") => (
                    StatusCode::CREATED,
                    axum::Json(json!({"received": body.len()})),
                )
                    .into_response(),
                ("GET", t) if t.starts_with("/items/") => {
                    axum::Json(json!({"id": &t["/items/".len()..]})).into_response()
                }
                ("GET", t) if t.starts_with("/canary/") => {
                    axum::Json(json!({"ok": true})).into_response()
                }
                _ => (StatusCode::NOT_FOUND, "nope").into_response(),
            }
        }
    });
    (plimsoll_tests::serve_loopback(app).await, log)
}

/// A value that can only be where the test put it.
fn canary(what: &str) -> String {
    format!("canary{what}{}", hex::encode(rand_bytes()))
}

struct Setup {
    d: Daemon,
    log: Log,
    token: String,
    _file: tempfile_path::TempFile,
}

mod tempfile_path {
    /// A file removed when dropped.
    pub struct TempFile(pub std::path::PathBuf);
    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

async fn setup(provider: &[(&str, &str)]) -> Setup {
    let (origin, log) = api().await;
    let token = canary("token");
    let grants = json!({"profiles": {
        "inventory": {
            "base_url": origin,
            "allow": ["GET /items/*", "POST /items", "GET /busy", "GET /big", "GET /missing", "GET /canary/*", "GET /moved/*/*", "GET /slow/*", "GET /hang/*"],
            "allowed_callers": ["anonymous"],
            "token": {"type": "static", "env": "INVENTORY_TOKEN"},
            "max_calls": 40,
            "route_max_calls": {"POST /items": 2},
            "health_check": "GET /canary/health"
        },
        "theirs": {
            "base_url": origin,
            "allow": ["GET /items/*"],
            "allowed_callers": ["someone-else"]
        }
    }});
    let path = std::env::temp_dir().join(format!(
        "plimsoll-grants-{}-{}.json",
        std::process::id(),
        hex::encode(rand_bytes())
    ));
    std::fs::write(&path, grants.to_string()).expect("grants file");
    let file = path.display().to_string();
    let bearer = token.clone();
    let mut env: Vec<(&str, &str)> = vec![
        ("PLIMSOLL_GRANTS_FILE", file.as_str()),
        ("INVENTORY_TOKEN", bearer.as_str()),
    ];
    env.extend_from_slice(provider);
    let d = Daemon::start(&env);
    Setup {
        d,
        log,
        token,
        _file: tempfile_path::TempFile(path),
    }
}

fn rand_bytes() -> [u8; 8] {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (t ^ (u64::from(std::process::id()) << 32)
        ^ N.fetch_add(1, Ordering::SeqCst)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15))
    .to_le_bytes()
}

fn granted(code: &str) -> Value {
    let mut r = js_run(code);
    r["javascript"]["grantProfile"] = json!("inventory");
    r
}

fn trace(a: &Answer) -> &Value {
    &a.body["javascript"]["callTrace"]
}

/// The whole answer and the whole log, searched for a secret.
fn assert_nowhere(s: &Setup, a: &Answer, secret: &str) {
    let body = a.body.to_string();
    assert!(!body.contains(secret), "the answer holds {secret}");
    assert!(!a.stdout().contains(secret), "stdout holds {secret}");
    assert!(!a.stderr().contains(secret), "stderr holds {secret}");
    for line in s.d.log_lines() {
        assert!(!line.contains(secret), "the log holds {secret}: {line}");
    }
}

fn wasm() -> [(&'static str, &'static str); 1] {
    [("SANDBOX_PROVIDER", "wasm")]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_call_reaches_the_api_with_the_credential_attached() {
    let s = setup(&wasm()).await;
    let a = call(
        &s.d,
        "Run",
        &granted("const r = await host.get('/items/42'); console.log(JSON.stringify(r)); const p = await host.post('/items', {n: 1}); console.log(JSON.stringify(p))"),
    )
    .await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(
        a.stdout(),
        "{\"id\":\"42\"}\n{\"received\":7}\n",
        "{}",
        a.stderr()
    );
    let seen = s.log.lock().expect("log").clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].method, "GET");
    assert_eq!(seen[0].target, "/items/42");
    assert_eq!(seen[0].authorization, format!("Bearer {}", s.token));
    assert_eq!(seen[1].body, b"{\"n\":1}");

    let t = trace(&a);
    assert_eq!(t["calls"][0]["route"], "/items/*");
    assert_eq!(t["calls"][0]["method"], "GET");
    assert_eq!(t["calls"][0]["status"], 200);
    assert_eq!(t["calls"][0]["delivered"], true);
    assert_eq!(t["calls"][1]["route"], "/items");
    assert_eq!(t["calls"][1]["status"], 201);
    assert_eq!(t["calls"][1]["requestBytes"], "7");
    assert_nowhere(&s, &a, &s.token);

    // A non-2xx answer rejects with its status; the trace says so.
    let a = call(
        &s.d,
        "Run",
        &granted("try { await host.get('/missing') } catch (e) { console.log(e.message) }"),
    )
    .await;
    assert_eq!(a.stdout(), "host api 404: no such thing\n");
    assert_eq!(trace(&a)["calls"][0]["status"], 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_grant_and_malformed_paths_never_reach_the_api() {
    let s = setup(&wasm()).await;
    let tricky = [
        ("GET", "/items/../admin"),
        ("GET", "/items/%2e%2e"),
        ("GET", "/items/%2E%2E/admin"),
        ("GET", "/items/..;/admin"),
        ("GET", "/items/1;x=y"),
        ("GET", "//items/1"),
        ("GET", "/items//1"),
        ("GET", "/items/1/"),
        ("GET", "/items%2f1"),
        ("GET", "/items/1%2fadmin"),
        ("GET", "/items/1?admin=1"),
        ("GET", "/items/1#x"),
        ("GET", "/items\\1"),
        ("GET", "/items/\u{ff0e}\u{ff0e}"),
        ("GET", "/items/\u{2215}admin"),
        ("GET", "/items/a:b"),
        ("GET", "/items/$batch"),
        ("GET", "/items/1/2"),
        ("GET", "/items"),
        ("DELETE", "/items/1"),
        ("HEAD", "/items/1"),
        ("GET ", "/items/1"),
        ("get\u{0}", "/items/1"),
        ("G\u{0130}T", "/items/1"),
        ("GET", "items/1"),
        ("GET", "/ITEMS/1"),
        ("GET", "/admin"),
        ("POST", "/items/1"),
    ];
    let cases = serde_json::to_string(&tricky).expect("json");
    let code = format!(
        "for (const [m, p] of {cases}) {{ try {{ await host.call(m, p); console.log('REACHED', m, p) }} catch (e) {{ console.log(e.message.startsWith('not permitted') ? 'denied' : 'other ' + e.message) }} }}"
    );
    let a = call(&s.d, "Run", &granted(&code)).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    let out = a.stdout();
    assert_eq!(
        out.lines().filter(|l| *l == "denied").count(),
        tricky.len(),
        "{out}"
    );
    assert!(
        s.log.lock().expect("log").is_empty(),
        "a tricky path reached the API"
    );
    assert_eq!(trace(&a)["denied"], tricky.len() as u64);
    assert!(trace(&a)["calls"].as_array().is_none());
    // Method case is not a trick: get is GET.
    let a = call(
        &s.d,
        "Run",
        &granted("console.log(JSON.stringify(await host.call('get', '/items/7')))"),
    )
    .await;
    assert_eq!(a.stdout(), "{\"id\":\"7\"}\n");
}

/// The broker follows no redirect, whatever the code, and uses no proxy,
/// whatever the environment says: the off-list origin and the proxy both see
/// nothing, and the guest gets the redirect itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_not_followed_and_proxies_are_not_used() {
    let (decoy, decoyed) = plimsoll_tests::recording_listener().await;
    let (proxy, proxied) = plimsoll_tests::recording_listener().await;
    let port = decoy.rsplit(':').next().expect("port").to_string();
    let proxies = plimsoll_tests::proxy_env(&proxy);
    let mut env: Vec<(&str, &str)> = wasm().to_vec();
    env.extend(proxies.iter().map(|(k, v)| (*k, v.as_str())));
    let s = setup(&env).await;
    let code = format!(
        "Promise.all([301, 302, 307, 308].map(c => host.get('/moved/' + c + '/{port}').then(() => 'FOLLOWED', e => e.message))).then(r => console.log(r.join('\\n')))"
    );
    let a = call(&s.d, "Run", &granted(&code)).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    let out = a.stdout();
    for c in ["301", "302", "307", "308"] {
        assert!(out.contains(&format!("host api {c}")), "{out}");
    }
    assert!(!out.contains("FOLLOWED"), "{out}");
    assert_eq!(
        s.log.lock().expect("log").len(),
        4,
        "each call reached the API once"
    );
    assert_eq!(
        decoyed.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a redirect was followed"
    );
    assert_eq!(
        proxied.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the proxy was used"
    );
    // The host-call series count them by route template, never by path.
    let text = plimsoll_tests::metrics_text(&s.d).await;
    assert!(
        text.contains(
            "plimsoll_host_calls_total{method=\"GET\",profile=\"inventory\",route=\"/moved/*/*\"} 4"
        ),
        "{text}"
    );
    assert!(
        text.contains("plimsoll_host_call_latency_seconds_bucket{"),
        "{text}"
    );
    assert!(!text.contains(&port), "a raw path reached /metrics");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_the_caller_may_not_use_is_the_same_refusal_as_an_unknown_one() {
    let s = setup(&wasm()).await;
    let mut unknown = js_run("console.log('ran')");
    unknown["javascript"]["grantProfile"] = json!("no-such-profile");
    let mut theirs = js_run("console.log('ran')");
    theirs["javascript"]["grantProfile"] = json!("theirs");
    let a = call(&s.d, "Run", &unknown).await;
    let b = call(&s.d, "Run", &theirs).await;
    assert_eq!(a.mark(), Some("permission"));
    assert_eq!(b.mark(), Some("permission"));
    assert_eq!(a.body["message"], b.body["message"]);
    // Without a grant there is no client at all.
    let a = call(&s.d, "Run", &js_run("console.log(typeof host)")).await;
    assert_eq!(a.stdout(), "undefined\n");
    assert!(a.body["javascript"]["callTrace"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_caps_and_the_breaker_hold() {
    let s = setup(&wasm()).await;
    // The route cap: POST /items twice only.
    let a = call(
        &s.d,
        "Run",
        &granted("for (let i = 0; i < 3; i++) { try { await host.post('/items', {}); console.log('ok') } catch (e) { console.log(e.message) } }"),
    )
    .await;
    assert_eq!(
        a.stdout(),
        "ok\nok\nhost call budget exhausted: this route's call cap is spent\n"
    );
    // Bodies over 1 MiB and answers over 4 MiB.
    let a = call(
        &s.d,
        "Run",
        &granted("try { await host.post('/items', 'x'.repeat(1100000)) } catch (e) { console.log(e.message) } try { await host.get('/big') } catch (e) { console.log(e.message) }"),
    )
    .await;
    assert_eq!(
        a.stdout(),
        "host call budget exhausted: the request body is over 1 MiB\nhost api call failed: the API's answer is over 4 MiB\n"
    );
    // The run's call budget (40), denied attempts included.
    let a = call(
        &s.d,
        "Run",
        &granted("let ok = 0, spent = 0; for (let i = 0; i < 50; i++) { try { await host.get(i % 2 ? '/items/1' : '/nope'); ok++ } catch (e) { if (e.message.includes('budget is spent')) spent++ } } console.log(ok, spent)"),
    )
    .await;
    assert_eq!(a.stdout(), "20 10\n", "{:?}", a.body);
    let before = s.log.lock().expect("log").len();
    // 503 opens the breaker: the next calls are shed without reaching it.
    let a = call(
        &s.d,
        "Run",
        &granted("for (let i = 0; i < 3; i++) { try { await host.get('/busy') } catch (e) { console.log(e.message) } }"),
    )
    .await;
    let out = a.stdout();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "host api 503: busy");
    assert!(lines[1].contains("shed"), "{lines:?}");
    assert_eq!(trace(&a)["shed"], 2);
    assert_eq!(s.log.lock().expect("log").len(), before + 1);

    // A second after a 503, the next call asks the profile's health check
    // first: it answers, the breaker closes and that call goes through. The
    // probe is the host's: not in the trace.
    let a = call(
        &s.d,
        "Run",
        &granted("try { await host.get('/busy') } catch (e) {} const t = Date.now(); while (Date.now() - t < 1100) {} console.log(JSON.stringify(await host.get('/items/3')))"),
    )
    .await;
    assert_eq!(a.stdout(), "{\"id\":\"3\"}\n", "{}", a.stderr());
    let seen: Vec<String> = s.log.lock().expect("log")[before + 1..]
        .iter()
        .map(|r| r.target.clone())
        .collect();
    assert_eq!(seen, ["/busy", "/canary/health", "/items/3"]);
    assert_eq!(trace(&a)["calls"].as_array().map(Vec::len), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_appear_nowhere_the_guest_or_an_observer_can_look() {
    let s = setup(&wasm()).await;
    let path_canary = canary("path");
    let body_canary = canary("body");
    let code = format!(
        "await host.get('/canary/{path_canary}'); await host.post('/items', {{secret: '{body_canary}'}}); \
         console.log(JSON.stringify(Object.getOwnPropertyNames(globalThis))); \
         for (const k of Object.getOwnPropertyNames(host)) console.log(k, String(host[k]))"
    );
    let a = call(&s.d, "Run", &granted(&code)).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_nowhere(&s, &a, &s.token);
    // The path and body went upstream, but no record of the call holds them.
    let t = trace(&a).to_string();
    assert!(
        !t.contains(&path_canary) && !t.contains(&body_canary),
        "{t}"
    );
    for line in s.d.log_lines() {
        assert!(
            !line.contains(&path_canary),
            "the log holds the path: {line}"
        );
        assert!(
            !line.contains(&body_canary),
            "the log holds the body: {line}"
        );
    }
    assert_eq!(s.log.lock().expect("log").len(), 2);
    // The audit line counts calls and names the profile, nothing more.
    s.d.audit_after_sentinel().await;
    let audit: Vec<String> =
        s.d.log_lines()
            .into_iter()
            .filter(|l| l.contains("host_calls\":2"))
            .collect();
    assert_eq!(audit.len(), 1, "{:?}", s.d.log_lines());
    assert!(audit[0].contains("\"grant_profile\":\"inventory\""));
}

// --- containers -------------------------------------------------------------

fn docker(runtime: &'static str) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("SANDBOX_PROVIDER", "docker".to_string()),
        ("SANDBOX_DOCKER_IMAGE", plimsoll_tests::sandbox_image()),
        ("SANDBOX_DOCKER_POOL", "1".to_string()),
    ];
    if !runtime.is_empty() {
        env.push(("SANDBOX_DOCKER_RUNTIME", runtime.to_string()));
    }
    env
}

async fn containers_reach_the_api_through_the_socket(runtime: &'static str) {
    let owned = docker(runtime);
    let env: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let s = setup(&env).await;

    // node, through the preloaded client.
    let a = call(
        &s.d,
        "Run",
        &granted("host.get('/items/9').then(r => console.log(JSON.stringify(r))).then(() => host.get('/items/../x')).catch(e => console.log(e.message))"),
    )
    .await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(
        a.stdout(),
        "{\"id\":\"9\"}\nnot permitted by sandbox capability: the path is not in canonical form\n",
        "{}",
        a.stderr()
    );
    assert_eq!(trace(&a)["calls"][0]["route"], "/items/*");
    assert_eq!(trace(&a)["denied"], 1);

    // python, in a project step; and the credential is nowhere in the
    // container: not its environment, not the mounted directory.
    let token = s.token.clone();
    let mut req = json!({"protocol": 4, "project": {
        "files": [{"path": "main.py", "content": "print(host.get('/items/5')['id'])\ntry:\n    host.get('/nope')\nexcept HostApiError as e:\n    print(e)\n"}],
        "steps": [
            "python3 main.py",
            format!("env | grep -c {token} ; grep -rc {token} /run/plimsoll /work /tmp /etc 2>/dev/null | grep -vc ':0$' ; node -e 'console.log(require(\"fs\").readdirSync(\"/run/plimsoll\").join(\"\\n\"))'"),
        ],
        "grantProfile": "inventory",
    }});
    req["timeoutMs"] = json!(60000);
    let a = call(&s.d, "Run", &req).await;
    let p = &a.body["project"];
    assert_eq!(p["outcome"], "PROJECT_OUTCOME_COMPLETED", "{:?}", a.body);
    let out = |i: usize| {
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(p["steps"][i]["stdout"].as_str().unwrap_or(""))
                .expect("b64"),
        )
        .expect("utf-8")
    };
    assert_eq!(
        out(0),
        "5\nnot permitted by sandbox capability: no route of the grant matches this method and path\n"
    );
    let lines: Vec<String> = out(1).lines().map(str::to_string).collect();
    assert_eq!(lines[0], "0", "the token is in the container's environment");
    assert_eq!(
        lines[1], "0",
        "the token is in a file the container can read"
    );
    assert!(lines.iter().any(|l| l == "host.sock"), "{lines:?}");
    assert_eq!(p["callTrace"]["calls"][0]["route"], "/items/*");

    // Without a grant: no socket, no client, no variable.
    let a = call(
        &s.d,
        "Run",
        &js_run("const fs = require('fs'); console.log(fs.existsSync('/run/plimsoll'), typeof host, process.env.HOST_API_SOCKET)"),
    )
    .await;
    assert_eq!(a.stdout(), "false undefined undefined\n");
    assert_nowhere(&s, &a, &s.token);
    // Counted before the stopped daemon is reaped, so no other daemon's
    // sweep can have taken a container it left (`Daemon::stop_then`).
    assert_eq!(
        s.d.stop_counting_leftovers(),
        0,
        "containers were left behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runc_containers_reach_the_api_through_the_socket() {
    containers_reach_the_api_through_the_socket("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runsc_containers_reach_the_api_through_the_socket() {
    containers_reach_the_api_through_the_socket("runsc").await;
}

/// At most 16 of one run's calls are in flight at once; the rest are
/// refused, not queued. (Concurrent calls need the container client: the
/// QuickJS guest's calls are one at a time.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_has_at_most_16_calls_in_flight() {
    let owned = docker("");
    let env: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let s = setup(&env).await;
    let code = "Promise.allSettled(Array.from({length: 20}, () => host.get('/slow/1500'))).then(r => { console.log('ok', r.filter(x => x.status === 'fulfilled').length); console.log('refused', r.filter(x => x.status === 'rejected' && /16 calls are already in flight/.test(x.reason.message)).length); })";
    let mut req = granted(code);
    req["timeoutMs"] = json!(20000);
    let a = call(&s.d, "Run", &req).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.stdout(), "ok 16\nrefused 4\n", "{}", a.stderr());
    assert_eq!(SLOW_MOST.load(std::sync::atomic::Ordering::SeqCst), 16);
}

/// A call gets what is left of the run, not the broker's whole minute: an
/// API that takes 10 s is cut at the run's 2 s deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_cut_at_the_runs_deadline() {
    let s = setup(&wasm()).await;
    let mut req = granted(
        "host.get('/hang/10000').then(() => console.log('ANSWERED'), e => console.log(e.message))",
    );
    req["timeoutMs"] = json!(2000);
    let t = std::time::Instant::now();
    let a = call(&s.d, "Run", &req).await;
    let took = t.elapsed();
    assert!(
        took < std::time::Duration::from_secs(5),
        "the run took {took:?}"
    );
    assert!(!a.stdout().contains("ANSWERED"), "{:?}", a.body);
    let calls = trace(&a)["calls"].as_array().cloned().unwrap_or_default();
    assert_eq!(calls.len(), 1, "{:?}", a.body);
    let latency: u64 = calls[0]["latencyMs"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(latency < 3000, "the call ran {latency} ms");
}
