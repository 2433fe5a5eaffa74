//! Admission against a shared store (issue 17): the same HTTP Run on
//! daemons with per-caller limits on, counting in the embedded store and in
//! a real `redis-server` on loopback, alternated run by run.

use std::time::Instant;

use plimsoll_tests::{Daemon, js_run};

use crate::SNIPPET;
use crate::stats::summary;

/// Admission with per-caller limits counted in the embedded store and in
/// Redis (synced every second, and on every write), side by side.
pub async fn admission(n: usize) {
    use plimsoll_tests::redis_server::RedisServer;
    let everysec = RedisServer::start_with("bench-everysec", "everysec");
    let always = RedisServer::start_with("bench-always", "always");
    let dir = plimsoll_tests::Scratch::new("bench-admission");
    let file = dir.path("clients.json");
    let token = plimsoll::callers::new_token().expect("token");
    let clients = serde_json::json!({"clients": [{
        "id": "bench", "token_sha256": plimsoll::callers::fingerprint(&token),
        "scopes": ["code:run"]}]});
    std::fs::write(&file, clients.to_string()).expect("clients file");
    let f = file.display().to_string();
    let limits = [
        ("SANDBOX_PROVIDER", "wasm"),
        ("SANDBOX_MAX_CONCURRENT", "16"),
        ("PLIMSOLL_CLIENTS_FILE", f.as_str()),
        // On, so every run is checked and booked; too high to refuse.
        ("SANDBOX_PER_KEY_CONCURRENT", "16"),
        ("SANDBOX_RATE_PER_MIN", "1000000"),
    ];
    let with = |r: &RedisServer| {
        let url = r.url();
        let mut env = limits.to_vec();
        env.push(("PLIMSOLL_STATE_URL", url.as_str()));
        Daemon::start(&env)
    };
    let daemons = [
        ("embedded store", Daemon::start(&limits), None),
        (
            "Redis on loopback, appendfsync everysec",
            with(&everysec),
            Some(&everysec),
        ),
        (
            "Redis on loopback, appendfsync always",
            with(&always),
            Some(&always),
        ),
    ];
    let c = plimsoll_tests::client();
    let body = serde_json::to_vec(&js_run(SNIPPET)).expect("json");
    let bearer = format!("Bearer {token}");
    let one = |d: &Daemon| {
        let req = c
            .post(d.url("/plimsoll.v1.SandboxService/Run"))
            .header("content-type", "application/json")
            .header("authorization", bearer.clone())
            .body(body.clone());
        async move {
            let t = Instant::now();
            let r = req.send().await.expect("sent");
            let ok = r.status().is_success();
            let _ = r.bytes().await;
            assert!(ok, "a benchmark run was refused");
            t.elapsed()
        }
    };
    let calls = |r: &RedisServer| -> u64 {
        let info = r.command(&["INFO", "commandstats"]).unwrap_or_default();
        info.lines()
            .filter(|l| l.starts_with("cmdstat_eval"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    };
    for _ in 0..200 {
        for (_, d, _) in &daemons {
            one(d).await;
        }
    }
    // Each Redis daemon alternated run by run with the embedded one (two
    // daemons at a time, as one replica and its store would share a
    // machine), so the machine's load falls on both alike.
    let embedded = &daemons[0].1;
    for (name, d, r) in &daemons[1..] {
        let Some(r) = r else { continue };
        let before = calls(r);
        let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            a.push(one(embedded).await);
            b.push(one(d).await);
        }
        let trips = (calls(r) - before) as f64 / n as f64;
        let pa = summary("HTTP Run with per-caller limits, embedded store", a);
        let pb = summary(&format!("HTTP Run with per-caller limits, {name}"), b);
        println!(
            "|   admission overhead of Redis (p50 difference) | | {:.3} ms | {trips:.2} store round trips per run | |",
            (pb.as_secs_f64() - pa.as_secs_f64()) * 1000.0
        );
    }
    for (name, d, _) in &daemons {
        let url = d.url("/plimsoll.v1.SandboxService/Run");
        let start = Instant::now();
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (c, url, body, bearer) = (c.clone(), url.clone(), body.clone(), bearer.clone());
                tokio::spawn(async move {
                    for _ in 0..n / 4 {
                        let r = c
                            .post(&url)
                            .header("content-type", "application/json")
                            .header("authorization", &bearer)
                            .body(body.clone())
                            .send()
                            .await
                            .expect("sent");
                        assert!(r.status().is_success(), "a benchmark run was refused");
                        let _ = r.bytes().await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("join");
        }
        println!(
            "| HTTP Run with per-caller limits, 4 clients, {name} | {} | {:.0} runs/s | | |",
            n / 4 * 4,
            (n / 4 * 4) as f64 / start.elapsed().as_secs_f64()
        );
    }
}
