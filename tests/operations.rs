//! Running it for real: callers and tokens (made with the `plimsoll` CLI),
//! per-caller limits under load from another process, /metrics, TLS, and
//! hardened mode. Tokens are canaries: none may appear in a log line or a
//! metric.

use std::path::{Path, PathBuf};
use std::process::Command;

use plimsoll_tests::{
    Daemon, Scratch, call, certificate, js_run, metrics_url, run_to_exit, test_ca,
};
use serde_json::{Value, json};

fn cli() -> PathBuf {
    plimsoll_tests::plimsolld_path().with_file_name("plimsoll")
}

/// `plimsoll callers create`: returns the printed token.
fn create(file: &Path, id: &str, extra: &[&str]) -> String {
    let out = Command::new(cli())
        .args(["callers", "create", "--file"])
        .arg(file)
        .args(["--id", id])
        .args(extra)
        .output()
        .expect("plimsoll callers create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_string();
    assert_eq!(token.len(), 64, "a 32-byte hex token");
    token
}

async fn post(
    d: &Daemon,
    token: Option<&str>,
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = plimsoll_tests::client()
        .post(d.url("/plimsoll.v1.SandboxService/Run"))
        .header("content-type", "application/json")
        .json(body);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let r = req.send().await.expect("sent");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let body = r.json().await.unwrap_or(Value::Null);
    (status, headers, body)
}

/// The daemon's /metrics, as text.
async fn scrape(d: &Daemon) -> String {
    reqwest::get(metrics_url(d))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

fn assert_not_logged(d: &Daemon, secret: &str) {
    for line in d.log_lines() {
        assert!(!line.contains(secret), "the log holds a token: {line}");
    }
}

#[tokio::test]
async fn callers_authenticate_and_their_tokens_appear_nowhere() {
    let dir = Scratch::new("callers");
    let file = dir.path("clients.json");
    let alice = create(&file, "alice", &[]);
    let bob = create(&file, "bob", &[]);
    let reader = create(&file, "reader", &["--scope", "read"]);
    // The file is the owner's only, and holds digests, not tokens.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).expect("file").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let text = std::fs::read_to_string(&file).expect("file");
    assert!(!text.contains(&alice) && !text.contains(&bob));
    let listed = Command::new(cli())
        .args(["callers", "list", "--file"])
        .arg(&file)
        .output()
        .expect("list");
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    assert_eq!(listed, "alice\tcode:run\nbob\tcode:run\nreader\tread\n");

    let f = file.display().to_string();
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_CLIENTS_FILE", f.as_str()),
    ]);
    let wrong = "canarywrongtoken0123456789abcdef0123456789abcdef";
    let (status, h, body) = post(&d, None, &js_run("console.log(1)")).await;
    assert_eq!(status, 401);
    assert_eq!(body["code"], "unauthenticated");
    assert_eq!(
        h.get("www-authenticate").map(|v| v.as_bytes()),
        Some(&b"Bearer"[..])
    );
    assert_eq!(
        post(&d, Some(wrong), &js_run("console.log(1)")).await.0,
        401
    );
    let (status, h, _) = post(&d, Some(&reader), &js_run("console.log(1)")).await;
    assert_eq!(status, 403, "a token without code:run");
    assert_eq!(
        h.get("plimsoll-not-dispatched").map(|v| v.as_bytes()),
        Some(&b"permission"[..])
    );
    let (status, _, body) = post(&d, Some(&alice), &js_run("console.log(6*7)")).await;
    assert_eq!(status, 200, "{body:?}");
    // The log is read on its own thread: wait for alice's line, boundedly.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !d.log_lines().iter().any(|l| l.contains("plimsoll::audit")) {
        assert!(std::time::Instant::now() < deadline, "no audit line");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let audit: Vec<String> = d
        .log_lines()
        .into_iter()
        .filter(|l| l.contains("plimsoll::audit"))
        .collect();
    assert_eq!(audit.len(), 1, "refused requests ran nothing: {audit:?}");
    assert!(audit[0].contains("\"caller\":\"alice\""), "{}", audit[0]);

    for secret in [&alice, &bob, &reader, &wrong.to_string()] {
        assert_not_logged(&d, secret);
        let metrics = scrape(&d).await;
        assert!(!metrics.contains(secret.as_str()));
    }

    // Rotation: the old token stops working at the next start.
    let rotated = Command::new(cli())
        .args(["callers", "rotate", "--file"])
        .arg(&file)
        .args(["--id", "alice"])
        .output()
        .expect("rotate");
    assert!(rotated.status.success());
    let new_alice = String::from_utf8(rotated.stdout)
        .expect("utf-8")
        .trim()
        .to_string();
    drop(d);
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_CLIENTS_FILE", f.as_str()),
    ]);
    assert_eq!(post(&d, Some(&alice), &js_run("1")).await.0, 401);
    assert_eq!(post(&d, Some(&new_alice), &js_run("1")).await.0, 200);
    // Revocation.
    let revoked = Command::new(cli())
        .args(["callers", "revoke", "--file"])
        .arg(&file)
        .args(["--id", "bob"])
        .status()
        .expect("revoke");
    assert!(revoked.success());
    assert!(
        !std::fs::read_to_string(&file)
            .expect("file")
            .contains("\"bob\"")
    );
    // A revoked token is refused by the daemon started after it.
    drop(d);
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_CLIENTS_FILE", f.as_str()),
    ]);
    assert_eq!(post(&d, Some(&bob), &js_run("1")).await.0, 401);
    // Import takes a token the operator made (on stdin, never an argument),
    // and list --json shows ids and scopes, never tokens or digests.
    let imported = "an-imported-token-0123456789abcdef0123456789";
    let mut import = Command::new(cli())
        .args(["callers", "import", "--file"])
        .arg(&file)
        .args(["--id", "carol", "--scope", "code:run"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("import");
    {
        use std::io::Write;
        import
            .stdin
            .take()
            .expect("stdin")
            .write_all(imported.as_bytes())
            .expect("token");
    }
    assert!(import.wait().expect("import").success());
    let json_list = Command::new(cli())
        .args(["callers", "list", "--json", "--file"])
        .arg(&file)
        .output()
        .expect("list --json");
    let listed: Value = serde_json::from_slice(&json_list.stdout).expect("json");
    let mut ids: Vec<&str> = listed
        .as_array()
        .expect("array")
        .iter()
        .map(|c| c["id"].as_str().expect("id"))
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["alice", "carol", "reader"]);
    let raw = String::from_utf8_lossy(&json_list.stdout);
    assert!(!raw.contains(imported) && !raw.contains("sha256") && !raw.contains(&new_alice));
    drop(d);
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_CLIENTS_FILE", f.as_str()),
    ]);
    assert_eq!(post(&d, Some(imported), &js_run("1")).await.0, 200);
    // A symlinked file is refused.
    let link = dir.path("link.json");
    std::os::unix::fs::symlink(&file, &link).expect("symlink");
    let refused = Command::new(cli())
        .args(["callers", "create", "--file"])
        .arg(&link)
        .args(["--id", "mallory"])
        .output()
        .expect("create");
    assert!(!refused.status.success());
    // And the daemon reads it through a handle on its directory too: a
    // symlinked clients file stops it at start.
    let link_path = link.display().to_string();
    let (code, text) = run_to_exit(
        &[],
        &[
            ("SANDBOX_PROVIDER", "wasm"),
            ("PLIMSOLL_CLIENTS_FILE", link_path.as_str()),
        ],
    );
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("PLIMSOLL_CLIENTS_FILE"), "{text}");
}

/// Runs the load generator (its own process) and returns its answers.
fn load(url: &str, plan: &Value) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("load/load.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(url)
        .arg(plan.to_string())
        .output()
        .expect("python3 load.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

/// A wasm daemon with two callers, alice and bob, and `extra` settings.
fn alice_and_bob(tag: &str, extra: &[(&str, &str)]) -> (Scratch, String, String, Daemon) {
    let dir = Scratch::new(tag);
    let file = dir.path("clients.json");
    let alice = create(&file, "alice", &[]);
    let bob = create(&file, "bob", &[]);
    let f = file.display().to_string();
    let mut env = vec![
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_CLIENTS_FILE", f.as_str()),
    ];
    env.extend_from_slice(extra);
    let d = Daemon::start(&env);
    (dir, alice, bob, d)
}

fn count(results: &[Value], caller: &str, status: u64) -> usize {
    results
        .iter()
        .filter(|r| r["caller"] == caller && r["status"] == status)
        .count()
}

#[tokio::test]
async fn per_caller_limits_hold_under_load_and_others_are_served() {
    let (_dir, alice, bob, d) = alice_and_bob(
        "limits",
        &[
            ("SANDBOX_MAX_CONCURRENT", "8"),
            ("SANDBOX_PER_KEY_CONCURRENT", "2"),
        ],
    );
    let url = d.url("/plimsoll.v1.SandboxService/Run");
    // Six long runs from alice at once, and bob's short runs meanwhile.
    let busy = "const t = Date.now(); while (Date.now() - t < 2000) {}";
    let results = load(
        &url,
        &json!([
            {"token": alice, "caller": "alice", "code": busy, "count": 6, "parallel": true},
            {"token": bob, "caller": "bob", "code": "console.log(1)", "count": 4, "parallel": false},
        ]),
    );
    assert_eq!(count(&results, "alice", 200), 2, "{results:?}");
    assert_eq!(count(&results, "alice", 429), 4, "{results:?}");
    assert!(
        results
            .iter()
            .filter(|r| r["status"] == 429)
            .all(|r| r["mark"] == "capacity"),
        "every refusal is a marked capacity refusal"
    );
    assert_eq!(
        count(&results, "bob", 200),
        4,
        "bob kept being served: {results:?}"
    );

    let metrics = scrape(&d).await;
    assert!(
        metrics.contains("plimsoll_shed_total{reason=\"per_key\"} 4"),
        "{metrics}"
    );
    assert!(metrics.contains("plimsoll_runs_total 6"), "{metrics}");
    assert!(!metrics.contains(&alice) && !metrics.contains(&bob));
    assert_not_logged(&d, &alice);
    assert_not_logged(&d, &bob);
}

#[tokio::test]
async fn the_rate_limit_allows_the_burst_and_refuses_the_rest() {
    let (_dir, alice, bob, d) = alice_and_bob(
        "rate",
        &[("SANDBOX_RATE_PER_MIN", "6"), ("SANDBOX_RATE_BURST", "3")],
    );
    let url = d.url("/plimsoll.v1.SandboxService/Run");
    let results = load(
        &url,
        &json!([
            {"token": alice, "caller": "alice", "code": "1", "count": 5, "parallel": false},
            {"token": bob, "caller": "bob", "code": "1", "count": 3, "parallel": false},
        ]),
    );
    assert_eq!(count(&results, "alice", 200), 3, "{results:?}");
    assert_eq!(count(&results, "alice", 429), 2, "{results:?}");
    assert_eq!(count(&results, "bob", 200), 3, "{results:?}");
    let metrics = scrape(&d).await;
    assert!(
        metrics.contains("plimsoll_shed_total{reason=\"rate\"} 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_metered_provider_stops_a_caller_at_its_daily_allowance() {
    // The example plugin forwards to an upstream daemon; the operator states
    // that this service bills by the second.
    let upstream = Daemon::start(&[("SANDBOX_PROVIDER", "wasm")]);
    let dir = Scratch::new("paid");
    let file = dir.path("clients.json");
    let alice = create(&file, "alice", &["--paid-seconds-per-day", "1"]);
    let bob = create(&file, "bob", &["--paid-seconds-per-day", "100"]);
    let f = file.display().to_string();
    let origin = format!("http://{}", upstream.addr);
    let plugins = plimsoll_tests::plugin_dir().display().to_string();
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "remote-plimsoll"),
        ("PLIMSOLL_PLUGIN_DIR", plugins.as_str()),
        ("SANDBOX_PLUGIN_HTTP_ORIGINS", origin.as_str()),
        ("SANDBOX_PLUGIN_METERED", "1"),
        ("PLIMSOLL_CLIENTS_FILE", f.as_str()),
    ]);
    assert_eq!(post(&d, Some(&alice), &js_run("1")).await.0, 200);
    let (status, h, _) = post(&d, Some(&alice), &js_run("1")).await;
    assert_eq!(status, 429, "alice's one paid second is spent");
    assert_eq!(
        h.get("plimsoll-not-dispatched").map(|v| v.as_bytes()),
        Some(&b"capacity"[..])
    );
    assert_eq!(post(&d, Some(&bob), &js_run("1")).await.0, 200);
    let metrics = scrape(&d).await;
    assert!(
        metrics.contains("plimsoll_shed_total{reason=\"paid_caller\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn tls_serves_http1_and_http2_and_refuses_cleartext() {
    let dir = Scratch::new("tls");
    let (cert, key) = certificate(&dir);
    let token = "t".repeat(40);
    let (c, k) = (cert.display().to_string(), key.display().to_string());
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_TOKEN", token.as_str()),
        ("PLIMSOLL_TLS_CERT", c.as_str()),
        ("PLIMSOLL_TLS_KEY", k.as_str()),
    ]);
    let _ = &cert;
    let root = test_ca(&dir);
    let url = format!("https://{}/plimsoll.v1.SandboxService/Run", d.addr);
    for http2 in [false, true] {
        let mut b = reqwest::Client::builder().add_root_certificate(root.clone());
        if !http2 {
            b = b.http1_only();
        }
        let client = b.build().expect("client");
        let r = client
            .post(&url)
            .bearer_auth(&token)
            .json(&js_run("console.log(6*7)"))
            .send()
            .await
            .expect("https");
        assert_eq!(r.status().as_u16(), 200);
        let want = if http2 {
            reqwest::Version::HTTP_2
        } else {
            reqwest::Version::HTTP_11
        };
        assert_eq!(r.version(), want, "ALPN");
    }
    // Cleartext to the TLS port gets no answer.
    let plain = plimsoll_tests::client()
        .post(d.url("/plimsoll.v1.SandboxService/Run"))
        .bearer_auth(&token)
        .json(&js_run("1"))
        .send()
        .await;
    assert!(plain.is_err() || !plain.expect("answer").status().is_success());
    assert_not_logged(&d, &token);
}

/// A configuration that passes every hardened-mode check.
/// A record signing key made by `plimsoll attest keygen` in `dir`.
fn record_key(dir: &Scratch) -> String {
    let prefix = dir.path("records");
    let out = Command::new(cli())
        .args(["attest", "keygen", "--out"])
        .arg(&prefix)
        .output()
        .expect("plimsoll attest keygen");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    prefix.with_extension("key").display().to_string()
}

fn hardened_env(dir: &Scratch) -> (Vec<(String, String)>, String, PathBuf) {
    let file = dir.path("clients.json");
    let alice = create(&file, "alice", &[]);
    let (cert, key) = certificate(dir);
    let record_key = record_key(dir);
    let env = [
        ("PLIMSOLL_HARDENED", "1".to_string()),
        ("SANDBOX_PROVIDER", "docker".into()),
        ("SANDBOX_DOCKER_RUNTIME", "runsc".into()),
        ("SANDBOX_DOCKER_IMAGE", plimsoll_tests::sandbox_image()),
        ("SANDBOX_DOCKER_POOL", "1".into()),
        ("SANDBOX_MEMORY_MB", "256".into()),
        ("SANDBOX_CPUS", "1".into()),
        ("SANDBOX_PIDS", "256".into()),
        ("SANDBOX_DISK_MB", "160".into()),
        ("SANDBOX_MAX_CONCURRENT", "4".into()),
        ("SANDBOX_PER_KEY_CONCURRENT", "2".into()),
        ("SANDBOX_RATE_PER_MIN", "60".into()),
        ("SANDBOX_RATE_BURST", "10".into()),
        ("PLIMSOLL_CLIENTS_FILE", file.display().to_string()),
        ("PLIMSOLL_TLS_CERT", cert.display().to_string()),
        ("PLIMSOLL_TLS_KEY", key.display().to_string()),
        ("PLIMSOLL_RECORD_SIGNING_KEY", record_key),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    (env, alice, cert)
}

#[test]
fn hardened_mode_names_every_missing_safeguard() {
    let dir = Scratch::new("hardened-refusals");
    let (good, _, _) = hardened_env(&dir);
    type Change = fn(&mut Vec<(String, String)>);
    fn set(env: &mut Vec<(String, String)>, k: &str, v: &str) {
        env.retain(|(x, _)| x != k);
        env.push((k.into(), v.into()));
    }
    fn unset(env: &mut Vec<(String, String)>, k: &str) {
        env.retain(|(x, _)| x != k);
    }
    // Each violation alone: refused before anything starts, and named.
    let alone: &[(Change, &str)] = &[
        (
            |e| {
                e.retain(|(k, _)| {
                    !k.starts_with("SANDBOX_DOCKER")
                        && !["SANDBOX_CPUS", "SANDBOX_PIDS", "SANDBOX_DISK_MB"]
                            .contains(&k.as_str())
                });
                set(e, "SANDBOX_PROVIDER", "wasm");
            },
            "SANDBOX_PROVIDER=wasm",
        ),
        (
            |e| unset(e, "SANDBOX_DOCKER_RUNTIME"),
            "SANDBOX_DOCKER_RUNTIME",
        ),
        (
            |e| unset(e, "PLIMSOLL_RECORD_SIGNING_KEY"),
            "PLIMSOLL_RECORD_SIGNING_KEY",
        ),
        (
            |e| {
                unset(e, "PLIMSOLL_CLIENTS_FILE");
                set(e, "PLIMSOLL_TOKEN", "0123456789abcdef0123456789abcdef");
            },
            "PLIMSOLL_TOKEN",
        ),
        (|e| set(e, "PLIMSOLL_INSECURE", "1"), "PLIMSOLL_INSECURE"),
        (
            |e| {
                unset(e, "PLIMSOLL_TLS_CERT");
                unset(e, "PLIMSOLL_TLS_KEY");
                set(e, "PLIMSOLL_ADDR", "0.0.0.0:0");
            },
            "the API listens on 0.0.0.0:0 without TLS",
        ),
        (
            |e| {
                unset(e, "PLIMSOLL_TLS_CERT");
                unset(e, "PLIMSOLL_TLS_KEY");
                set(e, "PLIMSOLL_METRICS_ADDR", "0.0.0.0:0");
            },
            "PLIMSOLL_METRICS_ADDR: /metrics has no authentication",
        ),
        (
            |e| set(e, "SANDBOX_DOCKER_IMAGE", "plimsoll/sandbox:bookworm"),
            "SANDBOX_DOCKER_IMAGE",
        ),
        (|e| unset(e, "SANDBOX_PIDS"), "SANDBOX_PIDS"),
        (|e| unset(e, "SANDBOX_MEMORY_MB"), "SANDBOX_MEMORY_MB"),
        (|e| set(e, "SANDBOX_RATE_BURST", "61"), "SANDBOX_RATE_BURST"),
        (
            |e| {
                unset(e, "SANDBOX_RATE_PER_MIN");
                unset(e, "SANDBOX_RATE_BURST");
            },
            "SANDBOX_RATE_PER_MIN",
        ),
        (
            |e| set(e, "SANDBOX_PER_KEY_CONCURRENT", "4"),
            "SANDBOX_PER_KEY_CONCURRENT",
        ),
        // Sessions on with no per-caller cap, or one that is no cap.
        (
            |e| set(e, "SANDBOX_MAX_SESSIONS", "2"),
            "SANDBOX_MAX_SESSIONS_PER_CALLER",
        ),
        (
            |e| {
                set(e, "SANDBOX_MAX_SESSIONS", "2");
                set(e, "SANDBOX_MAX_SESSIONS_PER_CALLER", "2");
            },
            "SANDBOX_MAX_SESSIONS_PER_CALLER",
        ),
    ];
    for (change, named) in alone {
        let mut env = good.clone();
        change(&mut env);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let (code, text) = run_to_exit(&[], &env);
        assert_eq!(code, Some(2), "{named}: {text}");
        assert!(text.contains(named), "{named} not named in:\n{text}");
        assert!(
            text.contains("(1 problems)"),
            "{named} was not alone:\n{text}"
        );
    }
    // Everything missing at once: all named together.
    let (code, text) = run_to_exit(
        &[],
        &[("PLIMSOLL_HARDENED", "1"), ("SANDBOX_PROVIDER", "docker")],
    );
    assert_eq!(code, Some(2));
    for named in [
        "SANDBOX_DOCKER_RUNTIME",
        "PLIMSOLL_CLIENTS_FILE",
        "SANDBOX_DOCKER_IMAGE",
        "SANDBOX_MEMORY_MB",
        "SANDBOX_CPUS",
        "SANDBOX_PIDS",
        "SANDBOX_DISK_MB",
        "SANDBOX_RATE_PER_MIN",
        "SANDBOX_PER_KEY_CONCURRENT",
        "PLIMSOLL_RECORD_SIGNING_KEY",
    ] {
        assert!(text.contains(named), "{named} not named in:\n{text}");
    }
}

/// A hardened configuration for the hostile test plugin, granted the
/// container engine under runc: everything hardened mode checks before the
/// provider starts holds, so the daemon goes on to start it.
fn hardened_plugin_env(dir: &Scratch) -> Vec<(String, String)> {
    let file = dir.path("clients.json");
    create(&file, "alice", &["--paid-seconds-per-day", "60"]);
    let plugins = plimsoll_tests::test_plugin_dir();
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(
            std::fs::read(plugins.join("hostile.wasm")).expect("hostile plugin"),
        ))
    };
    [
        ("PLIMSOLL_HARDENED", "1".to_string()),
        ("SANDBOX_PROVIDER", "hostile".into()),
        ("PLIMSOLL_PLUGIN_DIR", plugins.display().to_string()),
        ("SANDBOX_PLUGIN_SHA256", sha),
        ("SANDBOX_PLUGIN_MAX_TIER", "kernel".into()),
        ("SANDBOX_PLUGIN_HTTP_ORIGINS", "http://127.0.0.1:9".into()),
        ("SANDBOX_PLUGIN_CONTAINER_ENGINE", "1".into()),
        ("SANDBOX_PLUGIN_METERED", "1".into()),
        ("SANDBOX_DOCKER_IMAGE", plimsoll_tests::sandbox_image()),
        ("SANDBOX_DOCKER_POOL", "0".into()),
        ("SANDBOX_MEMORY_MB", "64".into()),
        ("SANDBOX_CPUS", "1".into()),
        ("SANDBOX_PIDS", "256".into()),
        ("SANDBOX_DISK_MB", "160".into()),
        ("SANDBOX_MAX_CONCURRENT", "4".into()),
        ("SANDBOX_PER_KEY_CONCURRENT", "2".into()),
        ("SANDBOX_RATE_PER_MIN", "60".into()),
        ("PLIMSOLL_CLIENTS_FILE", file.display().to_string()),
        ("PLIMSOLL_RECORD_SIGNING_KEY", record_key(dir)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The checks that had no test: an unknown variable, a grant open to every
/// caller, a metered provider with a caller without an allowance, and a
/// plugin's pin and tier; each alone, then all together.
#[test]
fn hardened_mode_names_the_plugin_grant_and_allowance_checks() {
    let dir = Scratch::new("hardened-plugin");
    let good = hardened_plugin_env(&dir);
    let grants = dir.path("grants.json");
    std::fs::write(
        &grants,
        r#"{"profiles":{"open":{"base_url":"http://127.0.0.1:9","allow":["GET /x"],"allowed_callers":["*"]}}}"#,
    )
    .expect("grants");
    let grants = grants.display().to_string();
    let unpaid = dir.path("unpaid.json");
    create(&unpaid, "bob", &[]);
    let unpaid = unpaid.display().to_string();
    let alices = dir.path("alices.json");
    std::fs::write(
        &alices,
        r#"{"profiles":{"mine":{"base_url":"http://127.0.0.1:9","allow":["GET /x"],"allowed_callers":["alice"]}}}"#,
    )
    .expect("grants");
    let alices = alices.display().to_string();
    let with = |changes: &[(&str, Option<&str>)]| {
        let mut env = good.clone();
        for (k, v) in changes {
            env.retain(|(x, _)| x != k);
            if let Some(v) = v {
                env.push((k.to_string(), v.to_string()));
            }
        }
        env
    };
    let cases: Vec<(Vec<(String, String)>, &str)> = vec![
        (
            with(&[("SANDBOX_PIDZ", Some("256"))]),
            "SANDBOX_PIDZ is not a plimsolld variable",
        ),
        (
            with(&[("SANDBOX_PLUGIN_SHA256", None)]),
            "SANDBOX_PLUGIN_SHA256",
        ),
        (
            with(&[("SANDBOX_PLUGIN_MAX_TIER", Some("container"))]),
            "SANDBOX_PLUGIN_MAX_TIER",
        ),
        (
            with(&[("PLIMSOLL_CLIENTS_FILE", Some(unpaid.as_str()))]),
            "caller bob has no paid_seconds_per_day",
        ),
        (
            with(&[
                ("PLIMSOLL_GRANTS_FILE", Some(alices.as_str())),
                ("PLIMSOLL_GUARD_ADDR", Some("127.0.0.1:0")),
                ("PLIMSOLL_GUARD_URL", Some("https://guard.example.com")),
            ]),
            "the guard must serve TLS itself",
        ),
    ];
    for (env, named) in &cases {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let (code, text) = run_to_exit(&[], &env);
        assert_eq!(code, Some(2), "{named}: {text}");
        assert!(text.contains(named), "{named} not named in:\n{text}");
        assert!(
            text.contains("(1 problems)"),
            "{named} was not alone:\n{text}"
        );
    }
    // Open grants need a provider that carries grants: docker, hardened.
    let docker_dir = Scratch::new("hardened-open-grants");
    let (docker, _, _) = hardened_env(&docker_dir);
    let mut env = docker.clone();
    env.push(("PLIMSOLL_GRANTS_FILE".into(), grants.clone()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (code, text) = run_to_exit(&[], &env);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("profile open admits every caller"), "{text}");
    assert!(text.contains("(1 problems)"), "{text}");
    // All of the plugin's at once.
    let env = with(&[
        ("SANDBOX_PIDZ", Some("256")),
        ("SANDBOX_PLUGIN_SHA256", None),
        ("SANDBOX_PLUGIN_MAX_TIER", Some("container")),
        ("PLIMSOLL_CLIENTS_FILE", Some(unpaid.as_str())),
        ("PLIMSOLL_GRANTS_FILE", Some(alices.as_str())),
        ("PLIMSOLL_GUARD_ADDR", Some("127.0.0.1:0")),
        ("PLIMSOLL_GUARD_URL", Some("https://guard.example.com")),
    ]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (code, text) = run_to_exit(&[], &env);
    assert_eq!(code, Some(2), "{text}");
    for (_, named) in &cases {
        assert!(text.contains(named), "{named} not named in:\n{text}");
    }
    assert!(text.contains("(5 problems)"), "{text}");
}

/// A plugin allowed kernel whose backend can only stand behind container
/// (runc) passes every check made before it starts, and is refused after:
/// the tier it reaches is what counts.
#[test]
fn hardened_mode_checks_the_tier_a_started_provider_reaches() {
    let dir = Scratch::new("hardened-tier");
    let env = hardened_plugin_env(&dir);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (code, text) = run_to_exit(&[], &env);
    assert_ne!(code, Some(0), "{text}");
    assert!(
        text.contains(
            "the provider's verified tier is container; hardened mode needs kernel or vm"
        ),
        "{text}"
    );
    assert!(!text.contains("plimsolld listening"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fully_hardened_daemon_starts_and_serves() {
    let dir = Scratch::new("hardened");
    let (env, alice, cert) = hardened_env(&dir);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let d = Daemon::start(&env);
    let _ = &cert;
    let root = test_ca(&dir);
    let client = reqwest::Client::builder()
        .add_root_certificate(root)
        .build()
        .expect("client");
    let mut req = js_run("console.log(require('os').release() !== '')");
    req["minimumIsolation"] = json!("kernel");
    let r = client
        .post(format!("https://{}/plimsoll.v1.SandboxService/Run", d.addr))
        .bearer_auth(&alice)
        .json(&req)
        .send()
        .await
        .expect("https");
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["isolation"], "kernel");
    assert_not_logged(&d, &alice);
    // The client goes first: its idle HTTP/2 connection would otherwise
    // hold the daemon's graceful shutdown while this thread waits on it.
    drop(client);
    // Counted before the stopped daemon is reaped, so no other daemon's
    // sweep can have taken a container it left (`Daemon::stop_then`).
    assert_eq!(
        d.stop_counting_leftovers(),
        0,
        "containers were left behind"
    );
}

/// The compiled components a daemon keeps between starts
/// (PLIMSOLL_COMPILE_CACHE): a second start uses the first's compilation
/// (the file is not rewritten) and runs the same code under the same
/// identity; a damaged file is rebuilt, never loaded; a cache another user
/// could write is not used at all.
#[tokio::test]
async fn the_compile_cache_is_reused_checked_and_refused_when_others_could_write_it() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let s = Scratch::new("compile-cache");
    let cache = s.path("cache");
    let cache_str = cache.to_str().expect("utf-8").to_string();
    let env = [
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_COMPILE_CACHE", cache_str.as_str()),
    ];
    let entries = || -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(&cache)
            .expect("cache dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
            .collect();
        v.sort();
        v
    };
    let run_and_identity = |d: Daemon| async move {
        let a = call(&d, "Run", &js_run("console.log(6 * 7)")).await;
        assert_eq!(a.stdout(), "42\n");
        let describe = call(&d, "Describe", &serde_json::json!({})).await;
        let id = describe.body["javascriptEnvironment"]["identity"]
            .as_str()
            .expect("identity")
            .to_string();
        (id, d.log_lines().join("\n"))
    };

    let (first_id, _) = run_and_identity(Daemon::start(&env)).await;
    let files = entries();
    assert_eq!(files.len(), 1, "one compiled snapshot: {files:?}");
    let meta = std::fs::metadata(&files[0]).expect("meta");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::metadata(&cache).expect("dir").permissions().mode() & 0o777,
        0o700
    );

    // Loaded, not rebuilt: the same file (inode) is there afterwards.
    let (second_id, log) = run_and_identity(Daemon::start(&env)).await;
    assert_eq!(first_id, second_id);
    assert!(!log.contains("compile cache"), "{log}");
    assert_eq!(entries(), files);
    assert_eq!(
        std::fs::metadata(&files[0]).expect("meta").ino(),
        meta.ino()
    );

    // A damaged file: refused before wasmtime sees it, then rebuilt.
    let mut bytes = std::fs::read(&files[0]).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&files[0], &bytes).expect("damage");
    let damaged_ino = std::fs::metadata(&files[0]).expect("meta").ino();
    let (third_id, log) = run_and_identity(Daemon::start(&env)).await;
    assert_eq!(third_id, first_id);
    assert!(log.contains("damaged"), "{log}");
    assert_ne!(
        std::fs::metadata(&files[0]).expect("meta").ino(),
        damaged_ino,
        "rewritten"
    );

    // A cache directory others could write: not used, and said so.
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let kept_ino = std::fs::metadata(&files[0]).expect("meta").ino();
    let (fourth_id, log) = run_and_identity(Daemon::start(&env)).await;
    assert_eq!(fourth_id, first_id);
    assert!(log.contains("the compile cache is not used"), "{log}");
    assert_eq!(std::fs::metadata(&files[0]).expect("meta").ino(), kept_ino);
    let _ = std::fs::remove_dir_all(&s.0);
}
