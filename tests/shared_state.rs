//! Several replicas, one set of limits: three real daemons share a real
//! `redis-server` (PLIMSOLL_STATE_URL), and a caller's concurrency, rate and
//! paid seconds hold across all three exactly as on one daemon. Also: a
//! killed replica's places free themselves, a store that goes away refuses
//! runs (marked) and over-admits nothing when it is back, and the embedded
//! store keeps the day's paid seconds over a restart.

use std::path::Path;
use std::time::{Duration, Instant};

use plimsoll_tests::redis_server::RedisServer;
use plimsoll_tests::{Daemon, Scratch};
use serde_json::{Value, json};

/// A clients file with these callers (ID, paid seconds per day); returns
/// each caller's token, in order.
fn clients(file: &Path, callers: &[(&str, Option<u64>)]) -> Vec<String> {
    let mut entries = Vec::new();
    let mut tokens = Vec::new();
    for (id, paid) in callers {
        let token = plimsoll::callers::new_token().expect("token");
        let mut e = json!({
            "id": id,
            "token_sha256": plimsoll::callers::fingerprint(&token),
            "scopes": ["code:run"],
        });
        if let Some(p) = paid {
            e["paid_seconds_per_day"] = json!(p);
        }
        entries.push(e);
        tokens.push(token);
    }
    std::fs::write(file, json!({ "clients": entries }).to_string()).expect("clients file");
    tokens
}

struct Answer {
    status: u16,
    /// The not-dispatched mark, if the answer carries it.
    mark: Option<String>,
    body: Value,
}

async fn run(d: &Daemon, token: &str, code: &str) -> Answer {
    run_at(d.url("/plimsoll.v1.SandboxService/Run"), token, code).await
}

async fn run_at(url: String, token: &str, code: &str) -> Answer {
    let r = plimsoll_tests::client()
        .post(url)
        .header("authorization", format!("Bearer {token}"))
        .json(&json!({"protocol": 4, "javascript": {"code": code}, "timeoutMs": 20000}))
        .send()
        .await
        .expect("sent");
    answer_of(r).await
}

/// The status, the not-dispatched mark and the body of an answer.
async fn answer_of(r: reqwest::Response) -> Answer {
    let status = r.status().as_u16();
    let mark = r
        .headers()
        .get("plimsoll-not-dispatched")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = r.json().await.unwrap_or(Value::Null);
    Answer { status, mark, body }
}

/// A snippet that keeps its run (and its concurrency place) for `ms`.
fn busy(ms: u64) -> String {
    format!("const t = Date.now(); while (Date.now() - t < {ms}) {{}} 1")
}

fn replicas(n: usize, env: &[(&str, &str)]) -> Vec<Daemon> {
    (0..n).map(|_| Daemon::start(env)).collect()
}

/// Every answer in `answers` that was refused is a marked `capacity`
/// refusal; returns (admitted, refused).
fn tally(answers: &[Answer]) -> (usize, usize) {
    let mut ok = 0;
    let mut refused = 0;
    for a in answers {
        match a.status {
            200 => ok += 1,
            429 => {
                assert_eq!(a.mark.as_deref(), Some("capacity"), "{:?}", a.body);
                refused += 1;
            }
            s => panic!("unexpected answer {s}: {:?}", a.body),
        }
    }
    (ok, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_hold_a_caller_to_one_concurrency_cap_and_one_rate() {
    let redis = RedisServer::start("caps");
    let dir = Scratch::new("shared-caps");
    let file = dir.path("clients.json");
    let tokens = clients(&file, &[("alice", None), ("bob", None)]);
    let (f, url) = (file.display().to_string(), redis.url());
    let ds = replicas(
        3,
        &[
            ("SANDBOX_PROVIDER", "wasm"),
            ("PLIMSOLL_CLIENTS_FILE", &f),
            ("PLIMSOLL_STATE_URL", &url),
            ("SANDBOX_PER_KEY_CONCURRENT", "2"),
            ("SANDBOX_RATE_PER_MIN", "1"),
            ("SANDBOX_RATE_BURST", "8"),
        ],
    );

    // Nine runs at once, three on each replica: two places in the fleet.
    let answers = at_once(&ds, 9, &tokens[0], &busy(3000)).await;
    let (ok, refused) = tally(&answers);
    assert_eq!((ok, refused), (2, 7), "one cap of 2 across three replicas");
    // The rate: the bucket of 8 was charged by the two admitted runs only
    // (a run refused for concurrency does not spend the caller's rate), so
    // six more pass, spread over the replicas, and the seventh is refused.
    let mut seq = Vec::new();
    for i in 0..7 {
        seq.push(run(&ds[i % 3], &tokens[0], "1").await);
    }
    assert_eq!(tally(&seq), (6, 1), "one bucket across three replicas");
    let last = seq.last().expect("seven");
    assert!(
        last.body.to_string().contains("rate"),
        "the rate refused: {:?}",
        last.body
    );
    // bob has buckets and places of his own.
    assert_eq!(run(&ds[2], &tokens[1], "1").await.status, 200);
    // The store holds counters under caller IDs, and nothing else: no
    // token, no code.
    let keys = redis.command(&["KEYS", "*"]).expect("keys");
    assert!(!keys.is_empty());
    for key in keys.lines() {
        assert!(key.starts_with("plimsoll:"), "{key}");
        assert!(!tokens.iter().any(|t| key.contains(t.as_str())), "{key}");
    }
}

/// `n` runs of `code` sent at once, spread round the replicas, each on a
/// connection of its own; the answers in order.
async fn at_once(ds: &[Daemon], n: usize, token: &str, code: &str) -> Vec<Answer> {
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let url = ds[i % ds.len()].url("/plimsoll.v1.SandboxService/Run");
            let (token, code) = (token.to_string(), code.to_string());
            tokio::spawn(async move { run_at(url, &token, &code).await })
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

/// A plugin provider the operator declared metered: the example plugin,
/// forwarding to an upstream wasm daemon.
fn metered_env(upstream: &Daemon) -> Vec<(String, String)> {
    vec![
        ("SANDBOX_PROVIDER".into(), "remote-plimsoll".into()),
        (
            "PLIMSOLL_PLUGIN_DIR".into(),
            plimsoll_tests::plugin_dir().display().to_string(),
        ),
        (
            "SANDBOX_PLUGIN_HTTP_ORIGINS".into(),
            format!("http://{}", upstream.addr),
        ),
        ("SANDBOX_PLUGIN_METERED".into(), "1".into()),
    ]
}

fn borrowed(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paid_seconds_are_one_allowance_across_replicas() {
    let upstream = Daemon::start(&[("SANDBOX_PROVIDER", "wasm")]);
    let redis = RedisServer::start("paid");
    let dir = Scratch::new("shared-paid");
    let file = dir.path("clients.json");
    let tokens = clients(&file, &[("alice", Some(3))]);
    let mut env = metered_env(&upstream);
    env.push(("PLIMSOLL_CLIENTS_FILE".into(), file.display().to_string()));
    env.push(("PLIMSOLL_STATE_URL".into(), redis.url()));
    let ds = replicas(3, &borrowed(&env));

    // Each run books its whole budget (20 s) before it runs, so of six
    // sent at once across the fleet (each long enough to overlap the
    // others) exactly one is admitted.
    let answers = at_once(&ds, 6, &tokens[0], &busy(1500)).await;
    assert_eq!(tally(&answers), (1, 5));
    // It kept its wall time in whole seconds, rounded up (2, or 3 on a slow
    // day); the rest of the allowance of three is spent one second at a
    // time on whichever replica, then nothing is admitted anywhere.
    let used = |r: &RedisServer| -> u64 {
        r.command(&["HGET", "plimsoll:paid:alice", "used"])
            .and_then(|v| v.parse().ok())
            .expect("a count")
    };
    let first = used(&redis);
    assert!((2..=3).contains(&first), "the long run kept {first} s");
    let mut admitted = 0;
    for i in 0..5 {
        let a = run(&ds[i % 3], &tokens[0], "1").await;
        match a.status {
            200 => admitted += 1,
            _ => assert_eq!(a.mark.as_deref(), Some("capacity"), "{:?}", a.body),
        }
    }
    assert_eq!(admitted, 3 - first, "exactly the rest of the allowance");
    assert_eq!(
        used(&redis),
        3,
        "every second counted once, across the three"
    );
}

/// A Redis, and wasm replicas' environment in which alice may have one run
/// in flight across the fleet, with leases of `lease` seconds.
fn one_place(tag: &str, lease: &str) -> (RedisServer, Scratch, Vec<String>, Vec<(String, String)>) {
    let redis = RedisServer::start(tag);
    let dir = Scratch::new(tag);
    let file = dir.path("clients.json");
    let tokens = clients(&file, &[("alice", None)]);
    let env = [
        ("SANDBOX_PROVIDER", "wasm".to_string()),
        ("PLIMSOLL_CLIENTS_FILE", file.display().to_string()),
        ("PLIMSOLL_STATE_URL", redis.url()),
        ("SANDBOX_PER_KEY_CONCURRENT", "1".into()),
        ("PLIMSOLL_STATE_LEASE_SECONDS", lease.into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    (redis, dir, tokens, env)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_replicas_places_free_themselves_when_its_leases_expire() {
    let (redis, _dir, tokens, env) = one_place("lease", "3");
    let mut doomed = Daemon::start(&borrowed(&env));
    let survivor = Daemon::start(&borrowed(&env));
    let _ = &redis;
    let long = {
        let url = doomed.url("/plimsoll.v1.SandboxService/Run");
        let token = tokens[0].clone();
        tokio::spawn(async move { run_at(url, &token, &busy(8000)).await })
    };
    // The long run holds alice's one place, seen from the other replica
    // (not probed before it has had time to be admitted: a probe holding
    // the place would refuse it).
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!long.is_finished(), "the long run ended early");
    let a = run(&survivor, &tokens[0], "1").await;
    assert_eq!((a.status, a.mark.as_deref()), (429, Some("capacity")));
    // The replica dies mid-run: nobody gives its place back, and nobody
    // renews it. Still refused at once; free within the lease (3 s) plus
    // the margin of one renewal period.
    doomed.kill();
    let killed = Instant::now();
    assert_eq!(run(&survivor, &tokens[0], "1").await.status, 429);
    loop {
        let a = run(&survivor, &tokens[0], "1").await;
        if a.status == 200 {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(6),
            "the dead replica's lease did not expire"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(killed.elapsed() >= Duration::from_secs(1));
    let _ = long.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_goes_away_refuses_runs_marked_and_over_admits_nothing_after() {
    let (mut redis, _dir, tokens, env) = one_place("outage", "30");
    let ds = replicas(2, &borrowed(&env));
    let ready = |d: &Daemon| {
        let url = d.url("/readyz");
        async move {
            let r = plimsoll_tests::client()
                .get(url)
                .send()
                .await
                .expect("readyz");
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        }
    };
    assert_eq!(ready(&ds[1]).await.0, 200);
    let audited = ds[1].audit_runs();

    // A long run on replica 0 holds alice's one place.
    let long = {
        let url = ds[0].url("/plimsoll.v1.SandboxService/Run");
        let token = tokens[0].clone();
        tokio::spawn(async move { run_at(url, &token, &busy(12000)).await })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(run(&ds[1], &tokens[0], "1").await.status, 429);

    // The store dies: every run is refused, marked, and nothing runs.
    redis.kill();
    for d in &ds {
        let a = run(d, &tokens[0], "1").await;
        assert_eq!((a.status, a.mark.as_deref()), (429, Some("capacity")));
        assert!(
            a.body.to_string().contains("did not answer"),
            "{:?}",
            a.body
        );
    }
    let (status, text) = ready(&ds[1]).await;
    assert_eq!(status, 503);
    assert!(text.contains("state_store_unreachable"), "{text}");
    assert_eq!(ds[1].audit_runs(), audited, "nothing ran on replica 1");

    // Back, with what it held: the long run's lease is still there, so
    // alice is still refused everywhere until it ends; then admitted.
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ready(&ds[0]).await.0 != 200 || ready(&ds[1]).await.0 != 200 {
        assert!(Instant::now() < deadline, "readiness did not recover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !long.is_finished(),
        "the long run ended before the check it exists for"
    );
    for d in &ds {
        let a = run(d, &tokens[0], "1").await;
        assert_eq!(a.status, 429, "over-admitted after the store came back");
        assert!(a.body.to_string().contains("at once"), "{:?}", a.body);
    }
    let a = long.await.expect("long run");
    assert_eq!(a.status, 200, "{:?}", a.body);
    // Its release reaches the store (retried if the first attempt met a
    // connection the restart broke), and alice has her place back.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let a = run(&ds[1], &tokens[0], "1").await;
        if a.status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the long run's place never came back: {:?}",
            a.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_embedded_store_keeps_the_days_paid_seconds_over_a_restart() {
    let upstream = Daemon::start(&[("SANDBOX_PROVIDER", "wasm")]);
    let dir = Scratch::new("embedded-paid");
    let file = dir.path("clients.json");
    let tokens = clients(&file, &[("alice", Some(2)), ("bob", Some(100))]);
    let state = dir.path("state");
    let mut env = metered_env(&upstream);
    env.push(("PLIMSOLL_CLIENTS_FILE".into(), file.display().to_string()));
    env.push(("PLIMSOLL_STATE_DIR".into(), state.display().to_string()));
    let d = Daemon::start(&borrowed(&env));
    assert_eq!(run(&d, &tokens[0], "1").await.status, 200);
    assert_eq!(run(&d, &tokens[0], "1").await.status, 200);
    assert_eq!(run(&d, &tokens[0], "1").await.status, 429);
    drop(d);
    // The directory is the daemon's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&state)
        .expect("state dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);

    let d = Daemon::start(&borrowed(&env));
    let a = run(&d, &tokens[0], "1").await;
    assert_eq!(
        (a.status, a.mark.as_deref()),
        (429, Some("capacity")),
        "a restart handed alice a fresh allowance"
    );
    assert!(a.body.to_string().contains("paid seconds"), "{:?}", a.body);
    assert_eq!(run(&d, &tokens[1], "1").await.status, 200);
}

/// The control for the test above: the same three replicas without a
/// shared store each count alone, so the fleet admits three times the cap.
/// (What the shared store is for, and proof that the test above can fail.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_shared_store_each_replica_counts_alone() {
    let dir = Scratch::new("unshared-caps");
    let file = dir.path("clients.json");
    let tokens = clients(&file, &[("alice", None)]);
    let f = file.display().to_string();
    let ds = replicas(
        3,
        &[
            ("SANDBOX_PROVIDER", "wasm"),
            ("PLIMSOLL_CLIENTS_FILE", &f),
            ("SANDBOX_PER_KEY_CONCURRENT", "2"),
        ],
    );
    let answers = at_once(&ds, 9, &tokens[0], &busy(3000)).await;
    assert_eq!(tally(&answers), (6, 3));
}

/// POSTs `body` to `procedure` on `d` as the holder of `token`.
async fn post(d: &Daemon, token: &str, procedure: &str, body: Value) -> Answer {
    let url = d.url(&format!("/plimsoll.v1.SandboxService/{procedure}"));
    post_at(url, token, body).await
}

async fn post_at(url: String, token: &str, body: Value) -> Answer {
    let r = plimsoll_tests::client()
        .post(url)
        .header("authorization", format!("Bearer {token}"))
        .json(&body)
        .send()
        .await
        .expect("sent");
    answer_of(r).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_holds_its_callers_place_in_the_fleet_and_its_calls_spend_the_shared_rate() {
    let redis = RedisServer::start("sessions");
    let dir = Scratch::new("shared-sessions");
    let file = dir.path("clients.json");
    let tokens = clients(&file, &[("alice", None)]);
    let (f, url) = (file.display().to_string(), redis.url());
    let ds = replicas(
        2,
        &[
            ("SANDBOX_PROVIDER", "wasm"),
            ("PLIMSOLL_CLIENTS_FILE", &f),
            ("PLIMSOLL_STATE_URL", &url),
            ("SANDBOX_MAX_SESSIONS", "2"),
            ("SANDBOX_PER_KEY_CONCURRENT", "1"),
            ("SANDBOX_RATE_PER_MIN", "1"),
            ("SANDBOX_RATE_BURST", "4"),
        ],
    );
    // The open takes alice's one place and one token of four.
    let opened = post(&ds[0], &tokens[0], "OpenSession", json!({"protocol": 4})).await;
    assert_eq!(opened.status, 200, "{:?}", opened.body);
    let sid = opened.body["sessionId"].as_str().expect("id").to_string();
    // The session holds the place while it is open: no run on the other
    // replica.
    let a = run(&ds[1], &tokens[0], "1").await;
    assert_eq!((a.status, a.mark.as_deref()), (429, Some("capacity")));
    assert!(a.body.to_string().contains("at once"), "{:?}", a.body);
    // Each call spends a token from the same bucket: three are left.
    let call = |code: &str| json!({"protocol": 4, "sessionId": sid, "cell": {"language": "javascript", "code": code}});
    for code in ["1", "2", "3"] {
        let a = post(&ds[0], &tokens[0], "SessionRun", call(code)).await;
        assert_eq!(a.status, 200, "{:?}", a.body);
    }
    let a = post(&ds[0], &tokens[0], "SessionRun", call("4")).await;
    assert_eq!((a.status, a.mark.as_deref()), (429, Some("capacity")));
    assert!(a.body.to_string().contains("rate"), "{:?}", a.body);
    // Closed, the session gives its place back to the fleet.
    let closed = post(
        &ds[0],
        &tokens[0],
        "CloseSession",
        json!({"protocol": 4, "sessionId": sid}),
    )
    .await;
    assert_eq!(closed.status, 200, "{:?}", closed.body);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let a = run(&ds[1], &tokens[0], "1").await;
        // The place is back once the close has settled; the rate is spent.
        if a.body.to_string().contains("rate") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the place never came back: {:?}",
            a.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A free loopback port, for a replica whose address its peers must know
/// before it starts.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// What a cell printed, from a SessionRun answer.
fn cell_stdout(a: &Answer) -> String {
    use base64::Engine;
    let out = a
        .body
        .pointer("/run/cell/stdout")
        .and_then(Value::as_str)
        .unwrap_or("");
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(out)
            .expect("base64"),
    )
    .expect("utf-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_opened_on_one_replica_is_used_and_closed_through_the_others() {
    let redis = RedisServer::start("forward");
    let dir = Scratch::new("shared-forward");
    let file = dir.path("clients.json");
    let tokens = clients(&file, &[("alice", None), ("bob", None)]);
    let secret = dir.path("replica-secret");
    let secret_text = plimsoll::callers::new_token().expect("secret");
    std::fs::write(&secret, &secret_text).expect("secret");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let base = [
        ("SANDBOX_PROVIDER", "wasm".to_string()),
        ("PLIMSOLL_CLIENTS_FILE", file.display().to_string()),
        ("PLIMSOLL_STATE_URL", redis.url()),
        ("PLIMSOLL_REPLICA_SECRET_FILE", secret.display().to_string()),
        ("SANDBOX_MAX_SESSIONS", "4".into()),
    ];
    let addrs: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let mut ds: Vec<Daemon> = addrs
        .iter()
        .map(|addr| {
            let mut env: Vec<(String, String)> = base
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect();
            env.push(("PLIMSOLL_ADDR".into(), addr.to_string()));
            env.push(("PLIMSOLL_REPLICA_URL".into(), format!("http://{addr}")));
            Daemon::start(&borrowed(&env))
        })
        .collect();
    let cell = |sid: &str, code: &str| json!({"protocol": 4, "sessionId": sid, "cell": {"language": "javascript", "code": code}});

    // Opened on replica 0, used through 1 and 2: one interpreter, one
    // state, whichever replica the call reached.
    let opened = post(&ds[0], &tokens[0], "OpenSession", json!({"protocol": 4})).await;
    assert_eq!(opened.status, 200, "{:?}", opened.body);
    let sid = opened.body["sessionId"].as_str().expect("id").to_string();
    let audited = ds[0].audit_runs();
    let a = post(
        &ds[1],
        &tokens[0],
        "SessionRun",
        cell(&sid, "globalThis.x = 41; 0"),
    )
    .await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    let a = post(&ds[2], &tokens[0], "SessionRun", cell(&sid, "x + 1")).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(cell_stdout(&a), "42\n", "{:?}", a.body);
    assert_eq!(
        a.body["run"]["record"]["sequence"], "2",
        "{:?}",
        a.body["run"]
    );
    // Another caller presenting the ID gets what an unknown ID gets.
    let unknown = "0".repeat(32);
    let b = post(&ds[1], &tokens[1], "SessionRun", cell(&sid, "x")).await;
    let u = post(&ds[1], &tokens[1], "SessionRun", cell(&unknown, "x")).await;
    assert_eq!(
        (b.status, b.mark.clone()),
        (u.status, u.mark.clone()),
        "{:?}",
        b.body
    );
    assert_eq!(b.body["code"], u.body["code"]);
    assert!(!b.body.to_string().contains("41"));

    // Forwarded calls without the secret's signature are refused before a
    // byte of the body is read (a request that never sends its body is
    // answered at once) and before anything runs.
    let forge = |tag: String, at: u64| {
        let body = serde_json::to_vec(&cell(&sid, "x")).expect("json");
        let digest = {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(&body))
        };
        plimsoll_tests::client()
            .post(ds[0].url("/plimsoll.v1.SandboxService/SessionRun"))
            .header("content-type", "application/json")
            .header("plimsoll-forwarded-for", "alice")
            .header("plimsoll-forwarded-at", at.to_string())
            .header("plimsoll-forwarded-body-sha256", digest)
            .header("plimsoll-forwarded-tag", tag)
            .body(body)
            .send()
    };
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as u64
    };
    let forged = forge("00".repeat(32), now()).await.expect("sent");
    assert_eq!(forged.status().as_u16(), 401);
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut sock = tokio::net::TcpStream::connect(&ds[0].addr)
            .await
            .expect("connect");
        let head = format!(
            "POST /plimsoll.v1.SandboxService/SessionRun HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\nplimsoll-forwarded-for: alice\r\nplimsoll-forwarded-at: {}\r\nplimsoll-forwarded-body-sha256: {}\r\nplimsoll-forwarded-tag: {}\r\n\r\n",
            now(),
            "0".repeat(64),
            "0".repeat(64)
        );
        sock.write_all(head.as_bytes()).await.expect("write");
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(3), sock.read(&mut buf))
            .await
            .expect("answered without waiting for the body")
            .expect("read");
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 401"));
    }
    // A peer's genuine signature is taken once; the same call again, or
    // the same tag spelt in capitals, is refused.
    let signer = plimsoll::replicas::Secret::new(&secret_text).expect("secret");
    let body = serde_json::to_vec(&cell(&sid, "x")).expect("json");
    let digest = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&body))
    };
    let at = now();
    let tag = signer.sign_call(
        &format!("http://{}", addrs[0]),
        "SessionRun",
        "alice",
        at,
        &digest,
    );
    let genuine = forge(tag.clone(), at).await.expect("sent");
    assert_eq!(genuine.status().as_u16(), 200);
    assert_eq!(
        forge(tag.clone(), at)
            .await
            .expect("sent")
            .status()
            .as_u16(),
        401,
        "a replay"
    );
    assert_eq!(
        forge(tag.to_ascii_uppercase(), at)
            .await
            .expect("sent")
            .status()
            .as_u16(),
        401,
        "a replay spelt differently"
    );

    // Closed through replica 2; the holder has ended it.
    let closed = post(
        &ds[2],
        &tokens[0],
        "CloseSession",
        json!({"protocol": 4, "sessionId": sid}),
    )
    .await;
    assert_eq!(closed.status, 200, "{:?}", closed.body);
    let after = post(&ds[1], &tokens[0], "SessionRun", cell(&sid, "x")).await;
    assert!(
        after.body.to_string().contains("plimsoll.v1.SessionEnded"),
        "{:?}",
        after.body
    );
    // Log lines arrive on their own stream: wait for the four, then make
    // sure no fifth follows.
    let deadline = Instant::now() + Duration::from_secs(5);
    while ds[0].audit_runs() < audited + 4 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        ds[0].audit_runs(),
        audited + 4,
        "the holder logged the two calls, the genuine forward and the close, and nothing for the forgeries"
    );

    // The store holds the session's fingerprint, never its ID.
    let keys = redis.command(&["KEYS", "*"]).expect("keys");
    let record = format!("plimsoll:session:{}", plimsoll::sessions::fingerprint(&sid));
    assert!(keys.lines().any(|k| k == record), "{keys}");
    for key in keys.lines() {
        assert!(!key.contains(&sid), "{key}");
        if key.starts_with("plimsoll:session:") {
            let v = redis.command(&["GET", key]).unwrap_or_default();
            assert!(!v.contains(&sid), "{v}");
        }
    }

    // The holder dies with a session open: a call through another replica
    // is told the session ended, marked (nothing ran).
    let opened = post(&ds[0], &tokens[0], "OpenSession", json!({"protocol": 4})).await;
    let sid = opened.body["sessionId"].as_str().expect("id").to_string();
    ds[0].kill();
    let a = post(&ds[1], &tokens[0], "SessionRun", cell(&sid, "1")).await;
    assert_eq!(a.mark.as_deref(), Some("environment"), "{:?}", a.body);
    let text = a.body.to_string();
    assert!(
        text.contains("plimsoll.v1.SessionEnded") && text.contains("ended"),
        "{text}"
    );
    // And forgotten: the next call does not try the dead replica again.
    let again = post(&ds[2], &tokens[0], "SessionRun", cell(&sid, "1")).await;
    let unknown = post(&ds[2], &tokens[0], "SessionRun", cell(&"0".repeat(32), "1")).await;
    assert_eq!(
        (again.status, again.body["code"].clone()),
        (unknown.status, unknown.body["code"].clone())
    );
    assert_eq!(
        redis
            .command(&[
                "EXISTS",
                &format!("plimsoll:session:{}", plimsoll::sessions::fingerprint(&sid))
            ])
            .as_deref(),
        Some("0")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_callers_session_cap_holds_across_replicas_and_a_dead_replicas_sessions_stop_counting() {
    let redis = RedisServer::start("session-cap");
    let dir = Scratch::new("shared-session-cap");
    let file = dir.path("clients.json");
    let tokens = clients(&file, &[("alice", None), ("bob", None)]);
    let (f, url) = (file.display().to_string(), redis.url());
    let env = [
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_CLIENTS_FILE", f.as_str()),
        ("PLIMSOLL_STATE_URL", url.as_str()),
        ("PLIMSOLL_STATE_LEASE_SECONDS", "3"),
        ("SANDBOX_MAX_SESSIONS", "4"),
        ("SANDBOX_MAX_SESSIONS_PER_CALLER", "1"),
    ];
    let mut ds = replicas(2, &env);
    let open = |d: &Daemon, token: &str| {
        let (url, token) = (
            d.url("/plimsoll.v1.SandboxService/OpenSession"),
            token.to_string(),
        );
        async move { post_at(url, &token, json!({"protocol": 4})).await }
    };
    // One session for alice in the whole fleet.
    let first = open(&ds[0], &tokens[0]).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    let second = open(&ds[1], &tokens[0]).await;
    assert_eq!(
        (second.status, second.mark.as_deref()),
        (429, Some("capacity"))
    );
    assert!(
        second.body.to_string().contains("open sessions"),
        "{:?}",
        second.body
    );
    assert_eq!(
        open(&ds[1], &tokens[1]).await.status,
        200,
        "bob has his own"
    );
    // Held while the session is open: renewed past twice its lease.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let still = open(&ds[1], &tokens[0]).await;
    assert_eq!(
        (still.status, still.mark.as_deref()),
        (429, Some("capacity"))
    );
    assert!(
        still.body.to_string().contains("open sessions"),
        "{:?}",
        still.body
    );
    // Closed on one replica, the place is free on the other.
    let sid = first.body["sessionId"].as_str().expect("id").to_string();
    let closed = post(
        &ds[0],
        &tokens[0],
        "CloseSession",
        json!({"protocol": 4, "sessionId": sid}),
    )
    .await;
    assert_eq!(closed.status, 200, "{:?}", closed.body);
    let again = open(&ds[1], &tokens[0]).await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    // The replica holding it dies: its session stops counting within the
    // lease (3 s), and alice may open one elsewhere.
    ds[1].kill();
    let killed = Instant::now();
    let refused = open(&ds[0], &tokens[0]).await;
    assert_eq!(
        (refused.status, refused.mark.as_deref()),
        (429, Some("capacity"))
    );
    loop {
        let a = open(&ds[0], &tokens[0]).await;
        if a.status == 200 {
            break;
        }
        assert!(killed.elapsed() < Duration::from_secs(8), "{:?}", a.body);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
