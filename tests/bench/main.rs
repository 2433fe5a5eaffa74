//! `plimsoll-bench`: the numbers in docs/benchmarks.md.
//!
//! 1. bare: the wasm provider in this process, instantiate + run of a trivial
//!    snippet, no HTTP (what one run costs the engine).
//! 2. http: the same snippet end to end through the real daemon on loopback,
//!    sequentially (latency) and from several concurrent clients (throughput).
//! 3. a session cell: the same snippet as a JavaScript cell in a kept
//!    QuickJS instance, in process (no instantiation per call) and over
//!    HTTP (SessionRun), beside the HTTP Run above as its baseline.
//! 4. idle RSS of a freshly started daemon.
//! 5. the broker: a Run making one granted call, against the same Run
//!    making none and against the same call made directly to the API; the
//!    broker's overhead is the first minus the other two (medians).
//! 6. a plugin's HTTP: the same loopback GET through the `http` interface
//!    and through wasi:http, timed inside the hostile test plugin (which
//!    needs the container engine granted, so docker and the image).
//!
//! 7. native QuickJS: the same snippet in a fresh runtime and full context
//!    of QuickJS built natively from the sources the guest is built from,
//!    unsandboxed: the baseline the bare wasm run is measured against
//!    (issue 16), in the same run.
//!
//! 8. admission against a shared store: the same HTTP Run on two daemons
//!    with per-caller limits on, one counting in its embedded store, one
//!    in a real `redis-server` on loopback (issue 17), alternated run by
//!    run; the difference of the medians is what the store adds, and the
//!    server's own command counts give its round trips per run.
//!
//! 9. signed runs: the same HTTP Run, unsigned and signed into a bundle,
//!    alternated run by run (`attest.rs`).
//!
//! 10. a grant's SDK and advice: the same granted wasm run with and without
//!     the generated Petstore SDK, alternated; and advice over a full trace
//!     (`grants.rs`).
//!
//! Everything is bounded in count and time and only talks to 127.0.0.1.

mod admission;
mod attest;
mod grants;
mod native;
mod stats;

use std::time::{Duration, Instant};

use plimsoll::job::{CellInput, Job, Output, Payload};
use plimsoll::providers::ProviderSession;
use plimsoll::providers::wasm::WasmProvider;
use plimsoll_tests::{Daemon, js_run};

use admission::admission;
use native::{native_quickjs, ratio_line};
use stats::{faults_row, minor_faults, summary};

/// The snippet every wasm figure runs, natively too.
const SNIPPET: &str = "console.log(6*7)";

async fn bare(n: usize) -> Duration {
    let w = WasmProvider::new(256, 8, 64 << 10).expect("wasm provider");
    for _ in 0..200 {
        w.run(SNIPPET, Duration::from_secs(5)).await.ok();
    }
    let mut v = Vec::with_capacity(n);
    let faults = minor_faults();
    for _ in 0..n {
        let t = Instant::now();
        let out = w.run(SNIPPET, Duration::from_secs(5)).await.expect("run");
        v.push(t.elapsed());
        assert_eq!(out.stdout, b"42\n");
    }
    let p50 = summary("bare instantiate+run (in process)", v);
    faults_row(faults, n);
    p50
}

/// A cell in a kept instance, through the provider's session, no HTTP.
async fn bare_cell(n: usize) {
    let w = WasmProvider::new(256, 8, 64 << 10).expect("wasm provider");
    let s = w.open_session().await.map_err(|_| "open").expect("session");
    let job = || Job {
        payload: Payload::Cell(CellInput {
            language: "javascript".into(),
            code: "6*7".into(),
            files: vec![],
        }),
        timeout: Duration::from_secs(5),
        output_limit: 64 << 10,
        grant: None,
        live: None,
    };
    for _ in 0..200 {
        let _ = s.run(job()).await;
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let out = s.run(job()).await.map_err(|_| "cell").expect("cell");
        v.push(t.elapsed());
        match out {
            Output::Cell(c) => assert_eq!(c.output.stdout, b"42\n"),
            _ => panic!("a cell answered something else"),
        }
    }
    s.close().await;
    summary("session cell in a kept instance (in process)", v);
}

/// A cell over HTTP: one session, SessionRun after SessionRun on one
/// keep-alive connection.
async fn http_cell(d: &Daemon, n: usize) {
    let c = plimsoll_tests::client();
    let opened: serde_json::Value = c
        .post(d.url("/plimsoll.v1.SandboxService/OpenSession"))
        .header("content-type", "application/json")
        .body(r#"{"protocol":4}"#)
        .send()
        .await
        .expect("open")
        .json()
        .await
        .expect("open answer");
    let id = opened["sessionId"]
        .as_str()
        .expect("a session ID")
        .to_string();
    let url = d.url("/plimsoll.v1.SandboxService/SessionRun");
    let body = serde_json::to_vec(&serde_json::json!({
        "protocol": 4, "sessionId": id,
        "cell": {"language": "javascript", "code": "6*7"},
    }))
    .expect("json");
    let v = one_client(&c, &url, &body, n, "cell").await;
    summary("HTTP SessionRun cell, 1 client, keep-alive", v);
}

async fn http(d: &Daemon, n: usize) {
    let c = plimsoll_tests::client();
    let url = d.url("/plimsoll.v1.SandboxService/Run");
    let body = serde_json::to_vec(&js_run(SNIPPET)).expect("json");
    let v = one_client(&c, &url, &body, n, "run").await;
    summary("HTTP Run, 1 client, keep-alive", v);
}

async fn throughput(d: &Daemon, clients: usize, per_client: usize) {
    let url = d.url("/plimsoll.v1.SandboxService/Run");
    let body = serde_json::to_vec(&js_run(SNIPPET)).expect("json");
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (url, body) = (url.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let c = plimsoll_tests::client();
            let mut v = Vec::with_capacity(per_client);
            let mut refused = 0usize;
            for _ in 0..per_client {
                match timed_run(&c, &url, &body).await {
                    (elapsed, true) => v.push(elapsed),
                    (_, false) => refused += 1,
                }
            }
            (v, refused)
        }));
    }
    let mut all = Vec::new();
    let mut refused = 0;
    for t in tasks {
        let (v, r) = t.await.expect("join");
        all.extend(v);
        refused += r;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "| HTTP Run, {clients} concurrent clients | {} ok, {refused} refused | {:.0} runs/s | | |",
        all.len(),
        all.len() as f64 / secs
    );
    summary(&format!("  latency under {clients} clients"), all);
}

/// `n` calls back to back on one keep-alive connection, after 200 untimed
/// ones to warm it: each call's latency. `what` names the call if the
/// daemon refuses one.
async fn one_client(
    c: &reqwest::Client,
    url: &str,
    body: &[u8],
    n: usize,
    what: &str,
) -> Vec<Duration> {
    for _ in 0..200 {
        timed_run(c, url, body).await;
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let (elapsed, ok) = timed_run(c, url, body).await;
        assert!(ok, "a benchmark {what} was refused");
        v.push(elapsed);
    }
    v
}

/// One Run over HTTP, answer read to the end: its latency and whether it
/// succeeded.
async fn timed_run(c: &reqwest::Client, url: &str, body: &[u8]) -> (Duration, bool) {
    let t = Instant::now();
    let r = c
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_vec())
        .send()
        .await
        .expect("sent");
    let ok = r.status().is_success();
    let _ = r.bytes().await;
    (t.elapsed(), ok)
}

/// The broker's cost for one call, on a loopback API.
async fn broker(n: usize) {
    let app = axum::Router::new().fallback(|| async { "{\"id\":1}" });
    let origin = plimsoll_tests::serve_loopback(app).await;
    let grants = serde_json::json!({"profiles": {"bench": {
        "base_url": origin,
        "allow": ["GET /items/*"],
        "allowed_callers": ["anonymous"],
        "token": {"type": "static", "env": "BENCH_TOKEN"},
    }}});
    let file =
        std::env::temp_dir().join(format!("plimsoll-bench-grants-{}.json", std::process::id()));
    std::fs::write(&file, grants.to_string()).expect("grants file");
    let path = file.display().to_string();
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_GRANTS_FILE", path.as_str()),
        ("BENCH_TOKEN", "bench-token"),
    ]);
    let c = reqwest::Client::new();
    let url = d.url("/plimsoll.v1.SandboxService/Run");
    let mut with = js_run("await host.get('/items/1')");
    with["javascript"]["grantProfile"] = "bench".into();
    let mut without = js_run("await Promise.resolve(1)");
    without["javascript"]["grantProfile"] = "bench".into();
    let (with, without) = (
        with.to_string().into_bytes(),
        without.to_string().into_bytes(),
    );
    let direct_url = format!("{origin}/items/1");
    let (mut a, mut b, mut direct) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..200 {
        timed_run(&c, &url, &with).await;
    }
    // Interleaved, so drift on this noisy machine hits all three alike.
    for _ in 0..n {
        let (t, ok) = timed_run(&c, &url, &with).await;
        assert!(ok);
        a.push(t);
        let (t, ok) = timed_run(&c, &url, &without).await;
        assert!(ok);
        b.push(t);
        let t0 = Instant::now();
        let r = c
            .get(&direct_url)
            .header("authorization", "Bearer bench-token")
            .send()
            .await
            .expect("direct");
        let _ = r.bytes().await;
        direct.push(t0.elapsed());
    }
    let p50_with = summary("HTTP Run with one granted call", a).as_secs_f64();
    let p50_without = summary("HTTP Run with the grant, no call", b).as_secs_f64();
    let p50_direct = summary("the same call made directly", direct).as_secs_f64();
    println!(
        "| broker overhead per call (p50: with − without − direct) | | {:.3} ms | | |",
        (p50_with - p50_without - p50_direct) * 1e3
    );
    let _ = std::fs::remove_file(&file);
}

/// The plugin's two ways to send the same request, timed in the plugin.
async fn plugin_http() {
    let app = axum::Router::new().route("/small", axum::routing::get(|| async { "ok" }));
    let origin = plimsoll_tests::serve_loopback(app).await;
    let dir = plimsoll_tests::test_plugin_dir().display().to_string();
    let image = plimsoll_tests::sandbox_image();
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "hostile"),
        ("PLIMSOLL_PLUGIN_DIR", dir.as_str()),
        ("SANDBOX_PLUGIN_HTTP_ORIGINS", origin.as_str()),
        ("SANDBOX_PLUGIN_CONTAINER_ENGINE", "1"),
        ("SANDBOX_DOCKER_IMAGE", image.as_str()),
        ("SANDBOX_DOCKER_POOL", "0"),
    ]);
    let mut run = js_run("http-bench");
    run["timeoutMs"] = serde_json::json!(30_000);
    let a = plimsoll_tests::call(&d, "Run", &run).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    for line in a.stdout().lines() {
        println!("plugin {line} (500 requests each, alternated)");
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    // BENCH_ONLY=admission: the shared store's admission figures alone
    // (issue 17), without the rest of the run.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("admission") {
        admission(n).await;
        return;
    }
    // BENCH_ONLY=attest: what signing a run into a bundle adds, alone.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("attest") {
        println!("| what | runs | p50 | p99 | min |");
        println!("|---|---|---|---|---|");
        attest::attest(&plimsoll_tests::wasm_daemon(), n).await;
        return;
    }
    println!("| what | runs | p50 | p99 | min |");
    println!("|---|---|---|---|---|");
    // BENCH_ONLY=grants: what a grant's SDK and its advice cost, alone.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("grants") {
        grants::preamble(n).await;
        grants::advice(n * 5);
        return;
    }
    let wasm = bare(n).await;
    let native = native_quickjs(n);
    // BENCH_ONLY=wasm: the wasm run's own figures (bare, native, HTTP with
    // one and four clients), for measuring a change to the run path.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("wasm") {
        let d = Daemon::start(&[
            ("SANDBOX_PROVIDER", "wasm"),
            ("SANDBOX_MAX_CONCURRENT", "16"),
        ]);
        http(&d, n).await;
        throughput(&d, 4, n / 2).await;
        ratio_line(wasm, native);
        return;
    }
    bare_cell(n).await;
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("SANDBOX_MAX_CONCURRENT", "16"),
        ("SANDBOX_MAX_SESSIONS", "2"),
    ]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = d.pid().and_then(rss_kib);
    http(&d, n).await;
    http_cell(&d, n).await;
    throughput(&d, 4, n / 2).await;
    throughput(&d, 8, n / 4).await;
    broker(n / 2).await;
    grants::preamble(n / 2).await;
    grants::advice(n * 5);
    attest::attest(&d, n / 2).await;
    admission(n).await;
    println!();
    plugin_http().await;
    println!();
    match idle {
        Some(kib) => println!(
            "daemon idle RSS after start: {:.1} MiB",
            kib as f64 / 1024.0
        ),
        None => println!("daemon idle RSS: unavailable"),
    }
    ratio_line(wasm, native);
    if let Some(kib) = d.pid().and_then(rss_kib) {
        println!(
            "daemon RSS after the benchmark: {:.1} MiB",
            kib as f64 / 1024.0
        );
    }
}
