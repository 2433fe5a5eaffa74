//! An owner's sessions across replicas sharing a real `redis-server`: they
//! live on one replica, so the per-owner cap and its replacement of the
//! least recently used idle session hold for the whole fleet.

use std::time::{Duration, Instant};

use plimsoll_tests::Answer;
use plimsoll_tests::fleet::{cell_stdout, post, post_at, wasm_forwarding};
use plimsoll_tests::redis_server::RedisServer;
use plimsoll_tests::{Daemon, Scratch};
use serde_json::json;

/// Opens a session for `owner` through `d`.
async fn open_for(d: &Daemon, token: &str, owner: &str) -> Answer {
    post(
        d,
        token,
        "OpenSession",
        json!({"protocol": 4, "owner": owner}),
    )
    .await
}

/// The URL of the replica the store names as a session's holder.
fn holder_of(redis: &RedisServer, sid: &str) -> String {
    let key = format!("plimsoll:session:{}", plimsoll::sessions::fingerprint(sid));
    let value = redis.command(&["GET", &key]).unwrap_or_default();
    value.split(' ').next().unwrap_or("").to_string()
}

fn id_of(a: &Answer) -> String {
    assert_eq!(a.status, 200, "{:?}", a.body);
    a.body["sessionId"].as_str().expect("id").to_string()
}

fn ended(a: &Answer) -> bool {
    a.body.to_string().contains("plimsoll.v1.SessionEnded")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_owners_sessions_live_on_one_replica_so_its_cap_replaces_across_the_fleet() {
    let redis = RedisServer::start("owners");
    let dir = Scratch::new("shared-owners");
    let extra = [
        ("PLIMSOLL_STATE_LEASE_SECONDS", "3".to_string()),
        ("SANDBOX_MAX_SESSIONS_PER_OWNER", "1".into()),
    ];
    let (mut ds, secret, tokens) = wasm_forwarding(3, redis.url(), &dir, &["alice"], &extra);
    let url = |d: &Daemon| format!("http://{}", d.addr);
    let alice = &tokens[0];
    let cell = |sid: &str, code: &str| json!({"protocol": 4, "sessionId": sid, "cell": {"language": "javascript", "code": code}});

    // The owner's first session opens where the open arrived.
    let first = id_of(&open_for(&ds[0], alice, "ws-1").await);
    assert_eq!(holder_of(&redis, &first), url(&ds[0]));
    // Past twice the lease, its place among the owner's is still there
    // (renewed): the second, opened through another replica, goes to the
    // same one, which replaces the idle first. One session for the owner
    // in the whole fleet, as on one daemon.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let second = id_of(&open_for(&ds[1], alice, "ws-1").await);
    assert_eq!(holder_of(&redis, &second), url(&ds[0]));
    let a = post(&ds[2], alice, "SessionRun", cell(&first, "1")).await;
    assert!(ended(&a), "{:?}", a.body);
    let a = post(&ds[2], alice, "SessionRun", cell(&second, "6 * 7")).await;
    assert_eq!(cell_stdout(&a), "42\n", "{:?}", a.body);
    // Another owner's sessions are held where they opened.
    let other = id_of(&open_for(&ds[2], alice, "ws-2").await);
    assert_eq!(holder_of(&redis, &other), url(&ds[2]));

    // Opens for a new owner through all three at once: whatever order
    // they meet in, one replica holds them all, and at most one of them
    // is a live session.
    let racing: Vec<Answer> = {
        let opens = ds.iter().map(|d| {
            let (u, t) = (
                d.url("/plimsoll.v1.SandboxService/OpenSession"),
                alice.clone(),
            );
            tokio::spawn(
                async move { post_at(u, &t, json!({"protocol": 4, "owner": "ws-race"})).await },
            )
        });
        let mut out = Vec::new();
        for o in opens.collect::<Vec<_>>() {
            out.push(o.await.expect("open"));
        }
        out
    };
    let opened: Vec<String> = racing
        .iter()
        .filter(|a| a.status == 200)
        .map(id_of)
        .collect();
    for a in racing.iter().filter(|a| a.status != 200) {
        assert_eq!(a.mark(), Some("capacity"), "{:?}", a.body);
    }
    assert!(
        !opened.is_empty(),
        "{:?}",
        racing.iter().map(|a| &a.body).collect::<Vec<_>>()
    );
    let holders: std::collections::HashSet<String> =
        opened.iter().map(|sid| holder_of(&redis, sid)).collect();
    assert_eq!(holders.len(), 1, "{holders:?}");
    let mut live = 0;
    for sid in &opened {
        if post(&ds[0], alice, "SessionRun", cell(sid, "1"))
            .await
            .status
            == 200
        {
            live += 1;
        }
    }
    assert_eq!(live, 1, "the owner cap held across the fleet");

    // The store names owners by a keyed digest only.
    let keys = redis.command(&["KEYS", "*"]).expect("keys");
    let signer = plimsoll::replicas::Secret::new(&secret).expect("secret");
    let key = format!(
        "plimsoll:owner:alice:{}",
        signer.owner_digest("alice", "ws-1")
    );
    assert!(keys.lines().any(|k| k == key), "{keys}");
    assert!(!keys.contains("ws-1") && !keys.contains("ws-2"), "{keys}");

    // A holder the replicas did not sign, written into the store, gets no
    // open sent to it: refused, marked, nothing opened, no connection.
    let trap = std::net::TcpListener::bind("127.0.0.1:0").expect("trap");
    trap.set_nonblocking(true).expect("nonblocking");
    let trap_url = format!("http://{}", trap.local_addr().expect("addr"));
    let forged_key = format!(
        "plimsoll:owner:alice:{}",
        signer.owner_digest("alice", "ws-3")
    );
    let forged = format!("x-o1 {trap_url} {}", "0".repeat(64));
    redis
        .command(&["ZADD", &forged_key, "99999999999999", &forged])
        .expect("zadd");
    let a = open_for(&ds[0], alice, "ws-3").await;
    assert_eq!(a.mark(), Some("environment"), "{:?}", a.body);
    assert!(a.body.to_string().contains("signed"), "{:?}", a.body);
    assert!(
        trap.accept().is_err(),
        "an open was sent to the forged holder"
    );

    // The owner's holder dies. An open for the owner elsewhere is refused
    // (marked: nothing ran) until the dead holder's places expire with
    // its leases (3 s), then held where it arrived; the cap holds there.
    ds[0].kill();
    let killed = Instant::now();
    let mut marked = 0;
    let third = loop {
        let a = open_for(&ds[1], alice, "ws-1").await;
        if a.status == 200 {
            break id_of(&a);
        }
        // Marked: nothing was sent. (One unmarked internal error is
        // possible if a kept-alive connection to the dead replica was
        // reused at the moment of its death: the open may have been sent.)
        match a.mark() {
            Some("environment") => marked += 1,
            None => assert_eq!(a.body["code"], "internal", "{:?}", a.body),
            other => panic!("{other:?}: {:?}", a.body),
        }
        assert!(killed.elapsed() < Duration::from_secs(10), "{:?}", a.body);
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        marked > 0,
        "refused until the dead holder's entries expired"
    );
    assert_eq!(holder_of(&redis, &third), url(&ds[1]));
    let fourth = id_of(&open_for(&ds[2], alice, "ws-1").await);
    assert_eq!(holder_of(&redis, &fourth), url(&ds[1]));
    let a = post(&ds[2], alice, "SessionRun", cell(&third, "1")).await;
    assert!(ended(&a), "{:?}", a.body);
    let a = post(&ds[2], alice, "SessionRun", cell(&fourth, "1")).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
}
