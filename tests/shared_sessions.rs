//! Sessions across replicas sharing a real `redis-server`: a session holds
//! its caller's place in the fleet, is used and closed through any replica
//! (forwarded to the one holding it), and a caller's session cap holds
//! across them. An owner's sessions are in shared_owners.rs.

use std::time::{Duration, Instant};

use plimsoll_tests::fleet::{
    borrowed, cell_stdout, clients, forwarding_env, post, post_at, replicas, run, start_forwarding,
    wasm_forwarding,
};
use plimsoll_tests::redis_server::RedisServer;
use plimsoll_tests::{Answer, Daemon, Scratch};
use serde_json::{Value, json};

/// A forwarded call's nonce, as a test forging one writes it.
const NONCE: &str = "0123456789abcdef0123456789abcdef";

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
    assert_eq!((a.status, a.mark()), (429, Some("capacity")));
    assert!(a.body.to_string().contains("at once"), "{:?}", a.body);
    // Each call spends a token from the same bucket: three are left.
    let call = |code: &str| json!({"protocol": 4, "sessionId": sid, "cell": {"language": "javascript", "code": code}});
    for code in ["1", "2", "3"] {
        let a = post(&ds[0], &tokens[0], "SessionRun", call(code)).await;
        assert_eq!(a.status, 200, "{:?}", a.body);
    }
    let a = post(&ds[0], &tokens[0], "SessionRun", call("4")).await;
    assert_eq!((a.status, a.mark()), (429, Some("capacity")));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_opened_on_one_replica_is_used_and_closed_through_the_others() {
    let redis = RedisServer::start("forward");
    let dir = Scratch::new("shared-forward");
    let (mut ds, secret_text, tokens) =
        wasm_forwarding(3, redis.url(), &dir, &["alice", "bob"], &[]);
    let cell = |sid: &str, code: &str| json!({"protocol": 4, "sessionId": sid, "cell": {"language": "javascript", "code": code}});

    // Opened on replica 0, used through 1 and 2: one interpreter, one
    // state, whichever replica the call reached.
    let opened = post(&ds[0], &tokens[0], "OpenSession", json!({"protocol": 4})).await;
    assert_eq!(opened.status, 200, "{:?}", opened.body);
    let sid = opened.body["sessionId"].as_str().expect("id").to_string();
    // The open's own audit line is read before the count starts (lines
    // arrive on their own stream, after the answer).
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ds[0].log_lines().iter().any(|l| l.contains("session_open")) {
        assert!(
            Instant::now() < deadline,
            "the open's audit line never came"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
        (b.status, b.mark().map(str::to_string)),
        (u.status, u.mark().map(str::to_string)),
        "{:?}",
        b.body
    );
    assert_eq!(b.body["code"], u.body["code"]);
    assert!(!b.body.to_string().contains("41"));

    // Forwarded calls without the secret's signature are refused before a
    // byte of the body is read (a request that never sends its body is
    // answered at once) and before anything runs.
    let forge = |tag: String, at: u64, nonce: Option<&str>| {
        let body = serde_json::to_vec(&cell(&sid, "x")).expect("json");
        let digest = {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(&body))
        };
        let mut req = plimsoll_tests::client()
            .post(ds[0].url("/plimsoll.v1.SandboxService/SessionRun"))
            .header("content-type", "application/json")
            .header("plimsoll-forwarded-for", "alice")
            .header("plimsoll-forwarded-at", at.to_string());
        if let Some(n) = nonce {
            req = req.header("plimsoll-forwarded-nonce", n.to_string());
        }
        req.header("plimsoll-forwarded-body-sha256", digest)
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
    let forged = forge("00".repeat(32), now(), Some(NONCE))
        .await
        .expect("sent");
    assert_eq!(forged.status().as_u16(), 401);
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut sock = tokio::net::TcpStream::connect(&ds[0].addr)
            .await
            .expect("connect");
        let head = format!(
            "POST /plimsoll.v1.SandboxService/SessionRun HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\nplimsoll-forwarded-for: alice\r\nplimsoll-forwarded-at: {}\r\nplimsoll-forwarded-nonce: {NONCE}\r\nplimsoll-forwarded-body-sha256: {}\r\nplimsoll-forwarded-tag: {}\r\n\r\n",
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
    let holder = format!("http://{}", ds[0].addr);
    let tag = signer.sign_call(&plimsoll::replicas::mac::Call {
        holder: &holder,
        procedure: "SessionRun",
        caller: "alice",
        at_ms: at,
        nonce: NONCE,
        body_sha256: &digest,
    });
    let genuine = forge(tag.clone(), at, Some(NONCE)).await.expect("sent");
    assert_eq!(genuine.status().as_u16(), 200);
    assert_eq!(
        forge(tag.clone(), at, Some(NONCE))
            .await
            .expect("sent")
            .status()
            .as_u16(),
        401,
        "a replay"
    );
    assert_eq!(
        forge(tag.to_ascii_uppercase(), at, Some(NONCE))
            .await
            .expect("sent")
            .status()
            .as_u16(),
        401,
        "a replay spelt differently"
    );
    // The same call again under a fresh nonce is another call (two
    // replicas may forward the same body in the same millisecond): taken.
    // A nonce that is missing, or not as a replica writes it, is refused.
    let signed_with = |nonce: &str| {
        signer.sign_call(&plimsoll::replicas::mac::Call {
            holder: &holder,
            procedure: "SessionRun",
            caller: "alice",
            at_ms: at,
            nonce,
            body_sha256: &digest,
        })
    };
    let fresh = "fedcba9876543210fedcba9876543210";
    let status = |r: reqwest::Result<reqwest::Response>| r.expect("sent").status().as_u16();
    assert_eq!(
        status(forge(signed_with(fresh), at, Some(fresh)).await),
        200
    );
    let shouted = fresh.to_ascii_uppercase();
    assert_eq!(
        status(forge(signed_with(&shouted), at, Some(&shouted)).await),
        401
    );
    assert_eq!(status(forge(signed_with(""), at, None).await), 401);

    // MCP's session tools travel between replicas under internal
    // procedures that exist only for a forwarded call: a caller with a
    // token gets what an unknown procedure gets.
    let direct = post(&ds[0], &tokens[0], "McpSessionRun", cell(&sid, "x")).await;
    let unknown = post(&ds[0], &tokens[0], "NoSuchProcedure", cell(&sid, "x")).await;
    assert_eq!(direct.status, 404, "{:?}", direct.body);
    assert_eq!(direct.body, unknown.body);

    // While it is open, the store holds the session's fingerprint, never
    // its ID (nor the forwarded calls' nonces: they are named by a keyed
    // digest).
    let keys = redis.command(&["KEYS", "*"]).expect("keys");
    let record = format!("plimsoll:session:{}", plimsoll::sessions::fingerprint(&sid));
    assert!(keys.lines().any(|k| k == record), "{keys}");
    for key in keys.lines() {
        assert!(!key.contains(&sid), "{key}");
        assert!(!key.contains(NONCE) && !key.contains(fresh), "{key}");
        if key.starts_with("plimsoll:session:") {
            let v = redis.command(&["GET", key]).unwrap_or_default();
            assert!(!v.contains(&sid), "{v}");
        }
    }

    // Closed through replica 2; the holder has ended it, and its record
    // is gone by the time the close is answered.
    let closed = post(
        &ds[2],
        &tokens[0],
        "CloseSession",
        json!({"protocol": 4, "sessionId": sid}),
    )
    .await;
    assert_eq!(closed.status, 200, "{:?}", closed.body);
    assert_eq!(
        redis.command(&["EXISTS", &record]).as_deref(),
        Some("0"),
        "the closed session's holder record is still in the store"
    );
    let after = post(&ds[1], &tokens[0], "SessionRun", cell(&sid, "x")).await;
    assert!(
        after.body.to_string().contains("plimsoll.v1.SessionEnded"),
        "{:?}",
        after.body
    );
    // Log lines arrive in order on their own stream: once a sentinel run's
    // line (found by its trace ID) is in, every line logged before it is,
    // so a sixth line for a forgery would be counted too.
    let tag = format!("sentinel-forward-{}", std::process::id());
    let sentinel = post(
        &ds[0],
        &tokens[0],
        "Run",
        json!({"protocol": 4, "javascript": {"code": "0"}, "traceId": tag}),
    )
    .await;
    assert_eq!(sentinel.status, 200, "{:?}", sentinel.body);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ds[0].log_lines().iter().any(|l| l.contains(&tag)) {
        assert!(
            Instant::now() < deadline,
            "the sentinel's audit line never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        ds[0].audit_runs(),
        audited + 6,
        "the holder logged the two calls, the two genuine forwards, the close and the sentinel, and nothing for the forgeries"
    );

    // The holder dies with a session open: a call through another replica
    // is told the session ended, marked (nothing ran).
    let opened = post(&ds[0], &tokens[0], "OpenSession", json!({"protocol": 4})).await;
    let sid = opened.body["sessionId"].as_str().expect("id").to_string();
    ds[0].kill();
    let a = post(&ds[1], &tokens[0], "SessionRun", cell(&sid, "1")).await;
    assert_eq!(a.mark(), Some("environment"), "{:?}", a.body);
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
    assert_eq!((second.status, second.mark()), (429, Some("capacity")));
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
    assert_eq!((still.status, still.mark()), (429, Some("capacity")));
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
    assert_eq!((refused.status, refused.mark()), (429, Some("capacity")));
    loop {
        let a = open(&ds[0], &tokens[0]).await;
        if a.status == 200 {
            break;
        }
        assert!(killed.elapsed() < Duration::from_secs(8), "{:?}", a.body);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The store's record of which replica holds the session `sid`.
fn record_of(sid: &str) -> String {
    format!("plimsoll:session:{}", plimsoll::sessions::fingerprint(sid))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

/// A forwarded call exactly as a peer sends it to the holder at `holder`
/// (its URL): the body, and the headers signed with the replicas' secret.
/// Kept, it is what someone who captured the call on its way would replay.
struct Captured {
    url: String,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

impl Captured {
    fn sign(secret: &str, holder: &str, procedure: &str, nonce: &str, body: &Value) -> Captured {
        use sha2::Digest;
        let body = serde_json::to_vec(body).expect("json");
        let digest = hex::encode(sha2::Sha256::digest(&body));
        let at = now_ms();
        let signer = plimsoll::replicas::Secret::new(secret).expect("secret");
        let tag = signer.sign_call(&plimsoll::replicas::mac::Call {
            holder,
            procedure,
            caller: "alice",
            at_ms: at,
            nonce,
            body_sha256: &digest,
        });
        Captured {
            url: format!("{holder}/plimsoll.v1.SandboxService/{procedure}"),
            headers: vec![
                ("content-type", "application/json".into()),
                ("plimsoll-forwarded-for", "alice".into()),
                ("plimsoll-forwarded-at", at.to_string()),
                ("plimsoll-forwarded-nonce", nonce.into()),
                ("plimsoll-forwarded-body-sha256", digest),
                ("plimsoll-forwarded-tag", tag),
            ],
            body,
        }
    }

    /// How long ago it was signed, in milliseconds.
    fn age_ms(&self) -> u64 {
        let at: u64 = self.headers[2].1.parse().expect("at");
        now_ms().saturating_sub(at)
    }

    async fn send(&self) -> Answer {
        let mut req = plimsoll_tests::client().post(&self.url);
        for (name, value) in &self.headers {
            req = req.header(*name, value);
        }
        let resp = req.body(self.body.clone()).send().await.expect("sent");
        plimsoll_tests::answer(resp).await
    }
}

/// Issue 31, item 9: a forwarded OpenSession captured on its way and
/// replayed to its holder after the holder restarted (within the call's
/// 30 s) opened a session, because the holder's memory of the calls it
/// had taken went with the process. The nonce is recorded in the store,
/// so the replay is refused; and with the store out of reach, a forwarded
/// call is refused, marked, rather than taken unchecked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forwarded_open_replayed_after_its_holder_restarts_is_refused() {
    let mut redis = RedisServer::start("replay-restart");
    let dir = Scratch::new("shared-replay-restart");
    let file = dir.path("clients.json");
    clients(&file, &[("alice", None)]);
    let base = [
        ("SANDBOX_PROVIDER", "wasm".to_string()),
        ("PLIMSOLL_CLIENTS_FILE", file.display().to_string()),
        ("PLIMSOLL_STATE_URL", redis.url()),
        ("SANDBOX_MAX_SESSIONS", "4".into()),
    ];
    let (mut envs, secret) = forwarding_env(1, &dir, &base);
    let mut holder = start_forwarding(&mut envs[0]);
    let url = format!("http://{}", holder.addr);
    let held = || {
        redis
            .command(&["KEYS", "plimsoll:session:*"])
            .expect("keys")
            .lines()
            .filter(|k| !k.is_empty())
            .count()
    };

    // A peer's forwarded open, taken once, opens a session.
    let open = json!({"protocol": 4});
    let captured = Captured::sign(&secret, &url, "OpenSession", NONCE, &open);
    let first = captured.send().await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    assert!(first.body["sessionId"].is_string(), "{:?}", first.body);
    assert_eq!(held(), 1);

    // The holder is killed and started again: same address, same secret,
    // same store, nothing else kept. (The address must stay the same, so
    // there is no other port to try: a restart that found it taken in the
    // moment it was free would fail here, naming the address in use.)
    holder.kill();
    let holder = Daemon::start(&borrowed(&envs[0]));
    assert_eq!(holder.url(""), url, "restarted at the same address");
    let age = captured.age_ms();
    assert!(
        age < 25_000,
        "the restart took too long ({age} ms) for the replay to be inside the call's 30 s"
    );

    // The same call again: refused as any failed forward is, and no
    // session opened (no second holder record).
    let replayed = captured.send().await;
    assert_eq!(replayed.status, 401, "{:?}", replayed.body);
    assert!(
        replayed.body.get("sessionId").is_none(),
        "{:?}",
        replayed.body
    );
    assert_eq!(held(), 1, "the replay opened a session");
    // What refused it: the nonce's record, under a keyed digest (the nonce
    // itself is nowhere in the store), kept for no longer than the call
    // could pass the holder's age check.
    let nonces = redis.command(&["KEYS", "plimsoll:nonce:*"]).expect("keys");
    let nonces: Vec<&str> = nonces.lines().filter(|k| !k.is_empty()).collect();
    assert_eq!(nonces.len(), 1, "{nonces:?}");
    assert!(!nonces[0].contains(NONCE), "{}", nonces[0]);
    let ttl: i64 = redis
        .command(&["PTTL", nonces[0]])
        .and_then(|t| t.parse().ok())
        .expect("pttl");
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");

    // A new call (another nonce) is taken by the restarted holder: it was
    // the replay that was refused, not the restart's first call.
    let fresh = Captured::sign(
        &secret,
        &url,
        "OpenSession",
        "fedcba9876543210fedcba9876543210",
        &open,
    );
    let taken = fresh.send().await;
    assert_eq!(taken.status, 200, "{:?}", taken.body);
    assert_eq!(held(), 2);

    // The store out of reach: a genuine forwarded call cannot be checked
    // against the calls taken before, so it is refused, marked (nothing
    // ran), as a run the store cannot count is.
    redis.kill();
    let unchecked = Captured::sign(
        &secret,
        &url,
        "OpenSession",
        "00112233445566778899aabbccddeeff",
        &open,
    );
    let refused = unchecked.send().await;
    assert_eq!(
        (refused.status, refused.mark()),
        (429, Some("capacity")),
        "{:?}",
        refused.body
    );
    assert!(
        refused.body.get("sessionId").is_none(),
        "{:?}",
        refused.body
    );
    assert!(
        refused.body.to_string().contains("store"),
        "{:?}",
        refused.body
    );
    drop(holder);
}

/// Issue 31, item 10: a session's holder record stayed in the store for
/// the session's whole lifetime, however early the session ended. It
/// leaves as soon as nobody can reach the session through it: at its
/// close (through any replica), when its holder stops, and for a session
/// that ended by itself, when its caller collects its summary (until then
/// it lives no longer than the holder keeps that summary).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sessions_holder_record_leaves_the_store_with_the_session() {
    let redis = RedisServer::start("holder-records");
    let dir = Scratch::new("shared-holder-records");
    let (mut ds, _, tokens) = wasm_forwarding(2, redis.url(), &dir, &["alice"], &[]);
    let alice = &tokens[0];
    let exists = |key: &str| redis.command(&["EXISTS", key]);
    let pttl = |key: &str| -> i64 {
        redis
            .command(&["PTTL", key])
            .and_then(|t| t.parse().ok())
            .unwrap_or(-2)
    };
    let close = |sid: &str| json!({"protocol": 4, "sessionId": sid});

    // Opened on replica 0, closed through replica 1: the record is gone by
    // the time the close is answered.
    let opened = post(&ds[0], alice, "OpenSession", json!({"protocol": 4})).await;
    assert_eq!(opened.status, 200, "{:?}", opened.body);
    let sid = opened.body["sessionId"].as_str().expect("id").to_string();
    let record = record_of(&sid);
    assert_eq!(exists(&record).as_deref(), Some("1"));
    let closed = post(&ds[1], alice, "CloseSession", close(&sid)).await;
    assert_eq!(closed.status, 200, "{:?}", closed.body);
    assert_eq!(
        exists(&record).as_deref(),
        Some("0"),
        "closed, and its holder record still in the store"
    );

    // Ended by its idle timeout (1 s) of a 30-minute lifetime: the holder
    // keeps its summary for ten minutes, and the record no longer than
    // that; the caller's close, through the other replica, still reaches
    // the holder, collects the summary, and the record goes with it.
    let opened = post(
        &ds[0],
        alice,
        "OpenSession",
        json!({"protocol": 4, "idleTimeoutMs": 1000}),
    )
    .await;
    assert_eq!(opened.status, 200, "{:?}", opened.body);
    let sid = opened.body["sessionId"].as_str().expect("id").to_string();
    let record = record_of(&sid);
    let ten_minutes = 600_000;
    assert!(pttl(&record) > ten_minutes, "written for its lifetime");
    let deadline = Instant::now() + Duration::from_secs(5);
    while pttl(&record) > ten_minutes {
        assert!(
            Instant::now() < deadline,
            "idled out, and its holder record kept for the rest of its lifetime ({} ms)",
            pttl(&record)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(pttl(&record) > 0, "kept while its summary can be collected");
    let closed = post(&ds[1], alice, "CloseSession", close(&sid)).await;
    assert_eq!(closed.status, 200, "{:?}", closed.body);
    assert_eq!(
        closed.body["ended"], "SESSION_END_EXPIRED",
        "{:?}",
        closed.body
    );
    assert_eq!(
        exists(&record).as_deref(),
        Some("0"),
        "collected, and its holder record still in the store"
    );

    // The holder stopped (SIGTERM) with a session open: it ends the session
    // and takes the record with it.
    let opened = post(&ds[0], alice, "OpenSession", json!({"protocol": 4})).await;
    assert_eq!(opened.status, 200, "{:?}", opened.body);
    let sid = opened.body["sessionId"].as_str().expect("id").to_string();
    let record = record_of(&sid);
    assert_eq!(exists(&record).as_deref(), Some("1"));
    assert!(ds[0].terminate(), "SIGTERM sent");
    let deadline = Instant::now() + Duration::from_secs(20);
    while ds[0].is_running() {
        assert!(Instant::now() < deadline, "the holder did not stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        exists(&record).as_deref(),
        Some("0"),
        "stopped, and its holder record still in the store"
    );
}

/// A call through a replica that does not hold its session keeps the
/// meaning of what happened to it. A refusal the holder gives (403: the
/// grant is not the caller's) reaches the caller as the holder gave it,
/// not as a forward the holder would not take. And when the store cannot
/// say which replica holds the session, the call is refused as load
/// (capacity, marked, retry): never "no such session", which tells a
/// client its session is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forwarded_calls_refusal_keeps_its_meaning() {
    let mut redis = RedisServer::start("forward-meaning");
    let dir = Scratch::new("shared-forward-meaning");
    let (ds, _, tokens) = wasm_forwarding(2, redis.url(), &dir, &["alice"], &[]);
    let alice = &tokens[0];
    let opened = post(&ds[0], alice, "OpenSession", json!({"protocol": 4})).await;
    assert_eq!(opened.status, 200, "{:?}", opened.body);
    let sid = opened.body["sessionId"].as_str().expect("id").to_string();

    let granted = json!({"protocol": 4, "sessionId": sid, "javascript": {"code": "1", "grantProfile": "inventory"}});
    let denied = post(&ds[1], alice, "SessionRun", granted).await;
    assert_eq!(
        (denied.status, denied.mark()),
        (403, Some("permission")),
        "{:?}",
        denied.body
    );
    assert!(
        denied.body["message"]
            .as_str()
            .is_some_and(|m| m.contains("grant profile")),
        "the holder's refusal, not a failed forward: {:?}",
        denied.body
    );

    redis.kill();
    let cell =
        json!({"protocol": 4, "sessionId": sid, "cell": {"language": "javascript", "code": "1"}});
    let unsure = post(&ds[1], alice, "SessionRun", cell).await;
    assert_eq!(
        (unsure.status, unsure.mark()),
        (429, Some("capacity")),
        "{:?}",
        unsure.body
    );
    assert!(
        unsure.body.to_string().contains("store"),
        "{:?}",
        unsure.body
    );
    let close = json!({"protocol": 4, "sessionId": sid});
    let unsure = post(&ds[1], alice, "CloseSession", close).await;
    assert_eq!(
        (unsure.status, unsure.mark()),
        (429, Some("capacity")),
        "{:?}",
        unsure.body
    );
}
