//! Several replicas, one set of limits: three real daemons share a real
//! `redis-server` (PLIMSOLL_STATE_URL), and a caller's concurrency, rate and
//! paid seconds hold across all three exactly as on one daemon. Also: a
//! killed replica's places free themselves, a store that goes away refuses
//! runs (marked) and over-admits nothing when it is back, and the embedded
//! store keeps the day's paid seconds over a restart. Sessions across
//! replicas are in shared_sessions.rs.

use std::time::{Duration, Instant};

use plimsoll_tests::Answer;
use plimsoll_tests::canaries::{self, canary, logged};
use plimsoll_tests::fleet::{borrowed, clients, post, replicas, run, run_at};
use plimsoll_tests::redis_server::RedisServer;
use plimsoll_tests::{Daemon, Scratch};
use serde_json::json;

/// A snippet that keeps its run (and its concurrency place) for `ms`.
fn busy(ms: u64) -> String {
    format!("const t = Date.now(); while (Date.now() - t < {ms}) {{}} 1")
}

/// A run of `code` tagged `trace`, as the holder of `token`.
async fn run_traced(d: &Daemon, token: &str, code: &str, trace: &str) -> Answer {
    post(
        d,
        token,
        "Run",
        json!({"protocol": 4, "traceId": trace, "timeoutMs": 20000, "javascript": {"code": code}}),
    )
    .await
}

/// "Nothing ran" for the runs tagged `traces` (`canaries`), the sentinel a
/// run of `token`'s.
async fn assert_never_ran(d: &Daemon, token: &str, traces: &[&str]) {
    canaries::assert_never_ran(d, traces, |tag| async move {
        run_traced(d, token, "0", &tag).await
    })
    .await;
}

/// Runs the daemon has dispatched to its provider (`plimsoll_runs_total`,
/// counted before a run is handed over): its own count, read after an
/// answer, with no log to lag behind it.
async fn dispatched(d: &Daemon) -> u64 {
    canaries::metric(d, "plimsoll_runs_total").await
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
                assert_eq!(a.mark(), Some("capacity"), "{:?}", a.body);
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
    // token and no code, in its key names or in any value.
    // (bob runs the canary: alice's bucket is spent.)
    let canary = "store-canary-5f1d";
    assert_eq!(
        run(&ds[0], &tokens[1], &format!("console.log('{canary}')"))
            .await
            .status,
        200
    );
    let keys = redis.command(&["KEYS", "*"]).expect("keys");
    assert!(!keys.is_empty());
    for key in keys.lines() {
        assert!(key.starts_with("plimsoll:"), "{key}");
        let value = stored_value(&redis, key);
        for secret in tokens.iter().map(String::as_str).chain([canary]) {
            assert!(!key.contains(secret), "{key}");
            assert!(!value.contains(secret), "{key} holds {value}");
        }
    }
}

/// Everything one key holds, whatever its type, as text.
fn stored_value(redis: &RedisServer, key: &str) -> String {
    let kind = redis.command(&["TYPE", key]).expect("type");
    let read: &[&str] = match kind.as_str() {
        "string" => &["GET", key],
        "hash" => &["HGETALL", key],
        "zset" => &["ZRANGE", key, "0", "-1", "WITHSCORES"],
        "set" => &["SMEMBERS", key],
        "list" => &["LRANGE", key, "0", "-1"],
        // Gone between KEYS and TYPE (an expiring lease): nothing held.
        "none" => return String::new(),
        other => panic!("{key} is a {other}, which this check cannot read"),
    };
    redis.command(read).unwrap_or_default()
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
            _ => assert_eq!(a.mark(), Some("capacity"), "{:?}", a.body),
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
    // A 5 s lease, renewed every 1.7 s: a renewal delayed by a loaded
    // machine (the suite runs many daemons at once) must not free the
    // place before the kill does.
    let (redis, _dir, tokens, env) = one_place("lease", "5");
    let mut doomed = Daemon::start(&borrowed(&env));
    let survivor = Daemon::start(&borrowed(&env));
    let _ = &redis;
    let long = {
        let url = doomed.url("/plimsoll.v1.SandboxService/Run");
        let token = tokens[0].clone();
        tokio::spawn(async move { run_at(url, &token, &busy(8000)).await })
    };
    // The long run holds alice's one place, seen from the other replica
    // (not probed before it has been admitted: a probe holding the place
    // would refuse it; the in-flight gauge counts a run once the store
    // has admitted it).
    plimsoll_tests::wait_inflight(&doomed, 1).await;
    assert!(!long.is_finished(), "the long run ended early");
    let a = run(&survivor, &tokens[0], "1").await;
    assert_eq!((a.status, a.mark()), (429, Some("capacity")));
    // The replica dies mid-run: nobody gives its place back, and nobody
    // renews it. Still refused at once; free within the lease (5 s) plus
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
            killed.elapsed() < Duration::from_secs(9),
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

    // A long run on replica 0 holds alice's one place.
    let long = {
        let url = ds[0].url("/plimsoll.v1.SandboxService/Run");
        let token = tokens[0].clone();
        tokio::spawn(async move { run_at(url, &token, &busy(12000)).await })
    };
    // Admitted (by the store) once the in-flight gauge counts it.
    plimsoll_tests::wait_inflight(&ds[0], 1).await;
    assert_eq!(run(&ds[1], &tokens[0], "1").await.status, 429);

    // The store dies: every run is refused, marked, and nothing runs.
    // Each refused run wears a canary trace, looked for once a later run's
    // audit line is in (below, when runs are admitted again).
    redis.kill();
    let mut refused: Vec<Vec<String>> = vec![Vec::new(), Vec::new()];
    for (i, d) in ds.iter().enumerate() {
        let trace = canary("outage");
        let a = run_traced(d, &tokens[0], "console.log('ran')", &trace).await;
        assert_eq!((a.status, a.mark()), (429, Some("capacity")));
        assert!(
            a.body.to_string().contains("did not answer"),
            "{:?}",
            a.body
        );
        refused[i].push(trace);
    }
    let (status, text) = ready(&ds[1]).await;
    assert_eq!(status, 503);
    assert!(text.contains("state_store_unreachable"), "{text}");
    // The replicas' own counts of dispatched runs: the long run on
    // replica 0, nothing else anywhere.
    assert_eq!(
        (dispatched(&ds[0]).await, dispatched(&ds[1]).await),
        (1, 0),
        "a run was dispatched while the store was down"
    );

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
    for (i, d) in ds.iter().enumerate() {
        let trace = canary("over-admitted");
        let a = run_traced(d, &tokens[0], "console.log('ran')", &trace).await;
        assert_eq!(a.status, 429, "over-admitted after the store came back");
        assert!(a.body.to_string().contains("at once"), "{:?}", a.body);
        refused[i].push(trace);
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
    // None of the refused runs ran, on either replica.
    for (d, traces) in ds.iter().zip(&refused) {
        let traces: Vec<&str> = traces.iter().map(String::as_str).collect();
        assert_never_ran(d, &tokens[0], &traces).await;
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
        (a.status, a.mark()),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_over_tls_with_a_password_counts_and_one_it_cannot_trust_or_log_in_to_refuses() {
    let certs = Scratch::new("redis-tls");
    let (cert, key) = plimsoll_tests::certificate(&certs);
    let ca = certs.path("ca.pem").display().to_string();
    let password = "a-password-for-the-test-only";
    let redis = RedisServer::start_tls("tls", &cert, &key, password);
    let dir = Scratch::new("shared-tls");
    let file = dir.path("clients.json");
    let tokens = clients(&file, &[("alice", None)]);
    let f = file.display().to_string();
    let with = |url: String, trust: Option<&str>| {
        let mut env = vec![
            ("SANDBOX_PROVIDER".to_string(), "wasm".to_string()),
            ("PLIMSOLL_CLIENTS_FILE".into(), f.clone()),
            ("PLIMSOLL_STATE_URL".into(), url),
            ("SANDBOX_PER_KEY_CONCURRENT".into(), "1".into()),
        ];
        // The store's client trusts the system's roots; a private CA is
        // added the way it is for any rustls client here.
        if let Some(ca) = trust {
            env.push(("SSL_CERT_FILE".into(), ca.to_string()));
        }
        Daemon::start(&borrowed(&env))
    };

    // Trusted, logged in: counted in the store, over TLS. A first run
    // makes the connection (TLS, login, scripts), so the long one below
    // is admitted at once.
    let d = with(redis.tls_url(password), Some(&ca));
    assert_eq!(run(&d, &tokens[0], "1").await.status, 200);
    let long = {
        let url = d.url("/plimsoll.v1.SandboxService/Run");
        let token = tokens[0].clone();
        tokio::spawn(async move { run_at(url, &token, &busy(3000)).await })
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    while redis.command(&["ZCARD", "plimsoll:lease:alice"]).as_deref() != Some("1") {
        assert!(Instant::now() < deadline, "the long run's lease never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a = run(&d, &tokens[0], "1").await;
    assert_eq!((a.status, a.mark()), (429, Some("capacity")));
    assert!(a.body.to_string().contains("at once"), "{:?}", a.body);
    let leases = redis
        .command(&["ZCARD", "plimsoll:lease:alice"])
        .expect("zcard");
    assert_eq!(leases, "1", "the run's lease is in the store");
    assert_eq!(long.await.expect("long").status, 200);

    // A certificate it cannot trust, or the wrong password: every run is
    // refused, marked, nothing run, and the log holds no password.
    for d in [
        with(redis.tls_url(password), None),
        with(redis.tls_url("not-the-password"), Some(&ca)),
    ] {
        let trace = canary("untrusted-store");
        let before = store_refusals(&d);
        let a = run_traced(&d, &tokens[0], "console.log('ran')", &trace).await;
        assert_eq!((a.status, a.mark()), (429, Some("capacity")));
        assert!(
            a.body.to_string().contains("did not answer"),
            "{:?}",
            a.body
        );
        // Nothing can run on this replica, so no run's audit line can be
        // the sentinel. What stands in for it is a later request's own
        // refusal line: the store's refusal is logged before it is
        // answered, and lines arrive in order, so once the second
        // refusal's line is in, any line the canary run logged is too.
        let b = run(&d, &tokens[0], "1").await;
        assert_eq!((b.status, b.mark()), (429, Some("capacity")));
        let deadline = Instant::now() + Duration::from_secs(10);
        while store_refusals(&d) < before + 2 {
            assert!(
                Instant::now() < deadline,
                "the store's refusals were never logged"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!logged(&d, &trace), "a run refused by the store ran");
        assert_eq!(dispatched(&d).await, 0, "a run was dispatched");
        assert!(
            d.log_lines()
                .iter()
                .all(|l| !l.contains("password-for-the-test") && !l.contains("not-the-password"))
        );
    }
}

/// Lines the daemon logged refusing a run because the shared store did
/// not answer (one for each such refusal, written before its answer).
fn store_refusals(d: &Daemon) -> usize {
    d.log_lines()
        .iter()
        .filter(|l| l.contains("the state store did not answer"))
        .count()
}
