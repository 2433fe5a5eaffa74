//! A grant's SDK where agents meet it: the profile and SDK generated from the
//! real Petstore document (tests/fixtures/openapi), loaded by the daemon
//! from its grants directory, run before the snippet in QuickJS and in node
//! (a run and a session's calls), reaching a loopback API with only the
//! generated routes; an SDK edited to call elsewhere still refused by the
//! broker; a preamble that throws stopping the run before the snippet.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use plimsoll::grants::specgen::{Format, Options, generate};
use plimsoll_tests::{Answer, Daemon, call, js_run};
use serde_json::{Value, json};

type Log = Arc<Mutex<Vec<(String, String)>>>;

/// The Petstore API, as far as these tests ask: `GET /v2/pet/N` answers a
/// pet, anything else 404. Records method and path.
async fn petstore_api() -> (String, Log) {
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let seen = log.clone();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let seen = seen.clone();
        async move {
            use axum::response::IntoResponse;
            let method = req.method().to_string();
            let path = req.uri().path().to_string();
            seen.lock().unwrap().push((method.clone(), path.clone()));
            match path.strip_prefix("/v2/pet/") {
                Some(id) if method == "GET" && !id.contains('/') => {
                    axum::Json(json!({"id": id, "name": "doggie"})).into_response()
                }
                _ => (axum::http::StatusCode::NOT_FOUND, "nope").into_response(),
            }
        }
    });
    (plimsoll_tests::serve_loopback(app).await, log)
}

/// A grants directory holding the generated profile and SDK, removed when
/// dropped.
struct GrantsDir(PathBuf);

impl Drop for GrantsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl GrantsDir {
    fn file(&self) -> String {
        self.0.join("petstore.profile.json").display().to_string()
    }
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/openapi")
        .join(name)
}

/// Generates the Petstore profile for `origin` into a fresh directory;
/// `edit` may change the profile JSON before it is written.
fn generated(origin: &str, tag: &str, edit: impl FnOnce(&mut Value)) -> GrantsDir {
    let text = std::fs::read_to_string(fixture("petstore.yaml")).expect("fixture");
    let out = generate(
        &text,
        Format::Yaml,
        &Options {
            base_url: origin.to_string(),
            profile: "petstore".into(),
            global: "petstore".into(),
            callers: vec!["anonymous".into()],
            renames: Default::default(),
            health_check: None,
            batches: Default::default(),
            skip_refs: false,
        },
    )
    .expect("the Petstore document generates");
    let dir = std::env::temp_dir().join(format!("plimsoll-sdk-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let mut profile: Value = serde_json::from_str(&out.profile_json).expect("profile json");
    edit(&mut profile);
    std::fs::write(dir.join("petstore.profile.json"), profile.to_string()).expect("profile");
    std::fs::write(dir.join("petstore.sdk.js"), &out.sdk_js).expect("sdk");
    GrantsDir(dir)
}

fn granted(code: &str) -> Value {
    let mut r = js_run(code);
    r["javascript"]["grantProfile"] = json!("petstore");
    r
}

/// What an agent writes against the SDK: one pet, then two arguments the
/// SDK refuses before any call.
const AGENT: &str = "const p = await petstore.getPetById(7); \
    console.log(JSON.stringify(p), Object.isFrozen(petstore)); \
    for (const bad of ['a/b', '..']) { try { await petstore.getPetById(bad) } catch (e) { console.log(e.name) } } \
    const kept = petstore.getPetById; petstore.getPetById = null; console.log(petstore.getPetById === kept)";

const AGENT_SAYS: &str = "{\"id\":\"7\",\"name\":\"doggie\"} true\nTypeError\nTypeError\ntrue\n";

fn assert_only_pet_7(log: &Log) {
    assert_eq!(
        log.lock().unwrap().clone(),
        vec![("GET".to_string(), "/v2/pet/7".to_string())],
        "the API saw more than the one call the SDK allowed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generated_sdk_runs_in_quickjs() {
    let (origin, log) = petstore_api().await;
    let dir = generated(&origin, "wasm", |_| {});
    let file = dir.file();
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_GRANTS_FILE", &file),
    ]);
    let a = call(&d, "Run", &granted(AGENT)).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.stdout(), AGENT_SAYS, "{}", a.stderr());
    assert_only_pet_7(&log);
    assert_eq!(
        a.body["javascript"]["callTrace"]["calls"][0]["route"],
        "/v2/pet/*"
    );

    // Without the grant, neither the client nor its SDK exists.
    let a = call(&d, "Run", &js_run("console.log(typeof petstore)")).await;
    assert_eq!(a.stdout(), "undefined\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_sdk_is_still_held_to_the_generated_routes() {
    let (origin, log) = petstore_api().await;
    let dir = generated(&origin, "edited", |_| {});
    // Someone rewrites the SDK after generation: a route the document never
    // offered, and the per-item route without the argument check.
    std::fs::write(
        dir.0.join("petstore.sdk.js"),
        "globalThis.petstore.wipe = () => petstore.call('DELETE', '/v2/pets'); \
         globalThis.petstore.raw = (id) => petstore.get('/v2/pet/' + id);",
    )
    .expect("edit");
    let file = dir.file();
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_GRANTS_FILE", &file),
    ]);
    let a = call(
        &d,
        "Run",
        &granted(
            "for (const f of [() => petstore.wipe(), () => petstore.raw('a/b'), () => petstore.raw('..')]) \
             { try { await f() } catch (e) { console.log(e.message.split(':')[0]) } }",
        ),
    )
    .await;
    assert_eq!(
        a.stdout(),
        "not permitted by sandbox capability\n".repeat(3),
        "{}",
        a.stderr()
    );
    assert_eq!(a.body["javascript"]["callTrace"]["denied"], 3);
    assert!(
        log.lock().unwrap().is_empty(),
        "a refused call reached the API"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preamble_that_throws_stops_the_run_before_the_snippet() {
    let (origin, log) = petstore_api().await;
    let dir = generated(&origin, "throws", |p| {
        let profile = &mut p["profiles"]["petstore"];
        profile.as_object_mut().unwrap().remove("preamble_file");
        profile["preamble"] = json!("throw new Error('the SDK is broken')");
    });
    let file = dir.file();
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_GRANTS_FILE", &file),
    ]);
    let a = call(&d, "Run", &granted("console.log('the snippet ran')")).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.exit_code(), 1);
    assert_eq!(a.stdout(), "");
    assert!(
        a.stderr()
            .starts_with("plimsoll: the grant's preamble failed: Error: the SDK is broken"),
        "{}",
        a.stderr()
    );
    assert!(log.lock().unwrap().is_empty());
}

/// A preamble QuickJS cannot compile is a mistake in the grants file: the
/// daemon does not start, as for any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preamble_that_does_not_compile_stops_the_start() {
    let (origin, _log) = petstore_api().await;
    let dir = generated(&origin, "syntax", |p| {
        let profile = &mut p["profiles"]["petstore"];
        profile.as_object_mut().unwrap().remove("preamble_file");
        profile["preamble"] = json!("globalThis.petstore.x = (;");
    });
    let file = dir.file();
    let log = match Daemon::try_start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_GRANTS_FILE", &file),
    ]) {
        Ok(_) => panic!("the daemon started with a preamble that does not compile"),
        Err(log) => log,
    };
    assert!(
        log.contains("grant profile \\\"petstore\\\": its preamble does not compile")
            || log.contains("grant profile \"petstore\": its preamble does not compile"),
        "{log}"
    );
}

/// The preamble is compiled at start, so a granted call never needs an
/// instance beyond its own: with the only slot held by a session, that
/// session's granted calls still run, and runs after it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_does_not_break_a_profiles_preamble() {
    let (origin, log) = petstore_api().await;
    let dir = generated(&origin, "pool", |p| {
        p["profiles"]["petstore"]["allow_in_sessions"] = json!(true);
    });
    let file = dir.file();
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("SANDBOX_MAX_CONCURRENT", "1"),
        ("SANDBOX_MAX_SESSIONS", "1"),
        ("PLIMSOLL_GRANTS_FILE", &file),
    ]);
    let opened = call(&d, "OpenSession", &json!({"protocol": 4})).await;
    assert_eq!(opened.status, 200, "{:?}", opened.body);
    let sid = opened.body["sessionId"].as_str().expect("id").to_string();
    let a = session_call(&d, &sid, AGENT).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(
        stdout_of(&a.body["run"]["javascript"]),
        AGENT_SAYS,
        "{:?}",
        a.body
    );
    assert_only_pet_7(&log);
    let closed = call(
        &d,
        "CloseSession",
        &json!({"protocol": 4, "sessionId": sid}),
    )
    .await;
    assert_eq!(closed.status, 200, "{:?}", closed.body);
    log.lock().unwrap().clear();
    let a = call(&d, "Run", &granted(AGENT)).await;
    assert_eq!(a.stdout(), AGENT_SAYS, "{:?}", a.body);
}

fn stdout_of(result: &Value) -> String {
    let b = base64::engine::general_purpose::STANDARD
        .decode(result["stdout"].as_str().unwrap_or(""))
        .expect("base64");
    String::from_utf8(b).expect("utf-8")
}

async fn session_call(d: &Daemon, sid: &str, code: &str) -> Answer {
    let payload = json!({"protocol": 4, "sessionId": sid, "timeoutMs": 30000,
        "javascript": {"code": code, "grantProfile": "petstore"}});
    call(d, "SessionRun", &payload).await
}

/// node in a container: the preloaded client runs the same SDK, in a run
/// and in each granted call of a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generated_sdk_runs_in_node_in_a_run_and_a_session() {
    let (origin, log) = petstore_api().await;
    let token = format!("canarypetstoretoken{}", std::process::id());
    let dir = generated(&origin, "node", |p| {
        p["profiles"]["petstore"]["allow_in_sessions"] = json!(true);
        p["profiles"]["petstore"]["token"] = json!({"type": "static", "env": "PETSTORE_TOKEN"});
    });
    let file = dir.file();
    let image = plimsoll_tests::sandbox_image();
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_DOCKER_IMAGE", &image),
        ("SANDBOX_DOCKER_POOL", "0"),
        ("SANDBOX_MAX_SESSIONS", "1"),
        ("PLIMSOLL_GRANTS_FILE", &file),
        ("PETSTORE_TOKEN", &token),
    ]);
    // node runs a snippet as a script without top-level await.
    let node_agent = format!("(async () => {{ {AGENT} }})()");
    let a = call(&d, "Run", &granted(&node_agent)).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.stdout(), AGENT_SAYS, "{}", a.stderr());
    assert_only_pet_7(&log);
    log.lock().unwrap().clear();

    // The SDK sits in the run's mount beside the client; the credential is
    // in neither, nor in the environment.
    let look = format!(
        "const fs = require('fs'); const d = '/run/plimsoll'; \
         const names = fs.readdirSync(d).sort(); \
         const held = names.filter(n => !n.endsWith('.sock') && fs.readFileSync(d + '/' + n, 'utf8').includes('{token}')); \
         console.log(names.join(' '), held.length, JSON.stringify(process.env).includes('{token}'))"
    );
    let a = call(&d, "Run", &granted(&look)).await;
    assert_eq!(
        a.stdout(),
        "host.cjs host.sock preamble.petstore.js sitecustomize.py 0 false\n",
        "{}",
        a.stderr()
    );
    assert!(!a.body.to_string().contains(&token));
    for line in d.log_lines() {
        assert!(!line.contains(&token), "the log holds the token: {line}");
    }

    let opened = call(&d, "OpenSession", &json!({"protocol": 4})).await;
    assert_eq!(opened.status, 200, "{:?}", opened.body);
    let sid = opened.body["sessionId"].as_str().expect("id").to_string();
    for _ in 0..2 {
        let a = session_call(&d, &sid, &node_agent).await;
        assert_eq!(a.status, 200, "{:?}", a.body);
        let js = &a.body["run"]["javascript"];
        assert_eq!(stdout_of(js), AGENT_SAYS, "{:?}", a.body);
        assert_only_pet_7(&log);
        log.lock().unwrap().clear();
    }
    let closed = call(
        &d,
        "CloseSession",
        &json!({"protocol": 4, "sessionId": sid}),
    )
    .await;
    assert_eq!(closed.status, 200, "{:?}", closed.body);
    assert_eq!(
        d.stop_counting_leftovers(),
        0,
        "containers were left behind"
    );
}
