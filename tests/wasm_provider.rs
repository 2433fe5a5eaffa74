//! The wasm provider through the real daemon: what a snippet sees, how it
//! ends, and that its limits hold without disturbing anything beside it.

use plimsoll_tests::{Daemon, call, guest_wasm_path, js_run, wasm_daemon};
use serde_json::json;
use sha2::{Digest, Sha256};

#[tokio::test]
async fn console_and_exit_codes() {
    let d = wasm_daemon();
    let a = call(&d, "Run", &js_run("console.log('a', 1, {b: [2]}, null, undefined); console.info('i'); console.warn('w'); console.error('e')")).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.stdout(), "a 1 {\"b\":[2]} null undefined\ni\n");
    assert_eq!(a.stderr(), "w\ne\n");
    assert_eq!(a.exit_code(), 0);

    let a = call(
        &d,
        "Run",
        &js_run("console.log('before'); throw new TypeError('bad thing')"),
    )
    .await;
    assert_eq!(a.exit_code(), 1);
    assert_eq!(a.stdout(), "before\n");
    let err = a.stderr();
    assert!(err.starts_with("Uncaught TypeError: bad thing\n"), "{err}");
    assert!(err.contains("snippet.js"), "stack missing: {err}");

    let a = call(&d, "Run", &js_run("throw 'plain'")).await;
    assert_eq!(
        (a.exit_code(), a.stderr()),
        (1, "Uncaught plain\n".to_string())
    );
}

#[tokio::test]
async fn promises_settle_before_the_run_ends() {
    let d = wasm_daemon();
    let a = call(&d, "Run", &js_run("const v = await new Promise(r => r(7)); Promise.resolve().then(() => console.log('then', v)); console.log('tla')")).await;
    assert_eq!(
        (a.exit_code(), a.stdout()),
        (0, "tla\nthen 7\n".to_string())
    );

    let a = call(
        &d,
        "Run",
        &js_run("async function f() { throw new Error('async boom') } await f()"),
    )
    .await;
    assert_eq!(a.exit_code(), 1);
    assert!(a.stderr().contains("Error: async boom"), "{}", a.stderr());

    // A rejection nobody handles fails the run, as in node.
    let a = call(
        &d,
        "Run",
        &js_run("Promise.reject(new Error('lost')); console.log('after')"),
    )
    .await;
    assert_eq!(a.exit_code(), 1);
    assert!(
        a.stderr().contains("Uncaught (in promise) Error: lost"),
        "{}",
        a.stderr()
    );
    // One handled later in the same turn does not.
    let a = call(&d, "Run", &js_run("const p = Promise.reject(new Error('x')); p.catch(e => console.log('caught', e.message))")).await;
    assert_eq!((a.exit_code(), a.stdout()), (0, "caught x\n".to_string()));

    // A top-level await that can never settle ends with node's code 13.
    let a = call(
        &d,
        "Run",
        &js_run("await new Promise(() => {}); console.log('never')"),
    )
    .await;
    assert_eq!(a.exit_code(), 13);
    assert_eq!(a.stdout(), "");
}

#[tokio::test]
async fn no_ambient_capabilities() {
    let d = wasm_daemon();
    let probe = r#"
        const names = ['require', 'process', 'fetch', 'XMLHttpRequest', 'WebSocket', 'Deno', 'Bun', 'os', 'std', 'module'];
        console.log(names.filter(n => typeof globalThis[n] !== 'undefined').join(',') || 'none');
        let imported = 'no';
        try { await import('fs'); imported = 'yes'; } catch (e) {}
        console.log('import fs:', imported);
    "#;
    let a = call(&d, "Run", &js_run(probe)).await;
    assert_eq!(a.exit_code(), 0, "{}", a.stderr());
    assert_eq!(a.stdout(), "none\nimport fs: no\n");

    // Without a grant there is no client at all: no transport exists.
    let a = call(
        &d,
        "Run",
        &js_run("console.log(typeof host, typeof globalThis.host)"),
    )
    .await;
    assert_eq!(a.stdout(), "undefined undefined\n");
}

#[tokio::test]
async fn deadline_stops_the_run_and_spares_its_neighbours() {
    // Twice as many spinning runs as the daemon has async workers (one per
    // core): a run is an async call that yields at every epoch tick, so a
    // neighbour is served while they spin. A run that held its thread would
    // leave the neighbour waiting for the spinners' deadline.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let spinners = 2 * cores;
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("SANDBOX_MAX_CONCURRENT", &(spinners + 1).to_string()),
    ]);
    let mut spin = js_run("console.log('started'); while (true) {}");
    spin["timeoutMs"] = json!(3000);
    let spinning = futures_util::future::join_all((0..spinners).map(|_| call(&d, "Run", &spin)));
    // Sent once every spinner runs (the daemon's own gauge), and answered
    // before any of them ends: the gauge read after its answer still
    // counts them all. That is the promise, whatever this machine's speed:
    // a run holding its thread would leave the neighbour waiting for a
    // spinner's deadline, 3 s away, and the gauge short by then.
    let neighbour = async {
        plimsoll_tests::wait_inflight(&d, spinners).await;
        let b = call(&d, "Run", &js_run("console.log('neighbour')")).await;
        (b, plimsoll_tests::inflight(&d).await)
    };
    let (all, (b, running)) = tokio::join!(spinning, neighbour);
    assert_eq!((b.exit_code(), b.stdout()), (0, "neighbour\n".to_string()));
    // (At least: the neighbour may not have left the gauge yet.)
    assert!(
        running >= spinners,
        "the neighbour was answered only after a spinner ended ({running} of {spinners} still in flight)"
    );
    for a in all {
        assert_eq!(a.body["javascript"]["timedOut"], true);
        assert_eq!(a.exit_code(), 124);
        assert_eq!(
            a.stdout(),
            "started\n",
            "output before the deadline is kept"
        );
        assert!(a.stderr().contains("deadline of 3000 ms"), "{}", a.stderr());
        let ms: u64 = a.body["durationMs"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("duration");
        // Stopped at its deadline, not before; the upper bound only tells
        // a deadline that fired from one that never did (the maximum is
        // 30 s), with room for a busy machine.
        assert!((3000..8000).contains(&ms), "stopped after {ms} ms");
    }
    // The request's timeout is clamped to the maximum, never refused.
    let mut long = js_run("console.log('ok')");
    long["timeoutMs"] = json!(i32::MAX);
    assert_eq!(call(&d, "Run", &long).await.stdout(), "ok\n");
}

#[tokio::test]
async fn memory_cap_is_a_hard_stop() {
    let d = Daemon::start(&[("SANDBOX_PROVIDER", "wasm"), ("SANDBOX_MEMORY_MB", "64")]);
    // Catching the failure must not help: growth past the cap traps.
    let bomb = "let a = []; try { while (true) a.push(new Array(100000).fill(1.5)) } catch (e) { console.log('caught it') }";
    let a = call(&d, "Run", &js_run(bomb)).await;
    assert_eq!(a.exit_code(), 137, "{:?}", a.body);
    assert!(!a.stdout().contains("caught it"));
    assert!(
        a.stderr().contains("memory limit of 64 MiB"),
        "{}",
        a.stderr()
    );
    assert_eq!(a.body["javascript"]["timedOut"], serde_json::Value::Null);
    // The engine's own string limit is an ordinary exception.
    let a = call(&d, "Run", &js_run("let s = 'x'; while (true) s = s + s")).await;
    assert_eq!(a.exit_code(), 1);
    // Runaway recursion ends the one instance (QuickJS has no stack check
    // under WASI, so it cannot be a RangeError) and never the daemon.
    let a = call(
        &d,
        "Run",
        &js_run(
            "function f(n) { return f(n + 1) + 1 } try { f(0) } catch (e) { console.log(e.name) }",
        ),
    )
    .await;
    assert_eq!(a.exit_code(), 134, "{:?}", a.body);
    assert!(a.stderr().contains("exhausted its stack"), "{}", a.stderr());
    // Ordinary recursion a few thousand deep is fine.
    let a = call(
        &d,
        "Run",
        &js_run("function f(n) { return n === 0 ? 0 : 1 + f(n - 1) } console.log(f(5000))"),
    )
    .await;
    assert_eq!(
        (a.exit_code(), a.stdout()),
        (0, "5000\n".to_string()),
        "{}",
        a.stderr()
    );
    // And the next run starts clean.
    let a = call(&d, "Run", &js_run("console.log(typeof a)")).await;
    assert_eq!(a.stdout(), "undefined\n");
}

#[tokio::test]
async fn output_is_capped_per_stream_with_flags() {
    let d = wasm_daemon();
    let a = call(&d, "Run", &js_run("const l = 'x'.repeat(1023); for (let i = 0; i < 200; i++) { console.log(l); console.error(l) }")).await;
    assert_eq!(a.exit_code(), 0);
    assert_eq!(a.js_bytes("stdout").len(), 64 * 1024);
    assert_eq!(a.js_bytes("stderr").len(), 64 * 1024);
    assert_eq!(a.body["javascript"]["stdoutTruncated"], true);
    assert_eq!(a.body["javascript"]["stderrTruncated"], true);
    // Exactly at the cap is not truncated.
    let a = call(&d, "Run", &js_run("console.log('y'.repeat(65535))")).await;
    assert_eq!(a.js_bytes("stdout").len(), 65536);
    assert_eq!(
        a.body["javascript"]["stdoutTruncated"],
        serde_json::Value::Null
    );
}

#[tokio::test]
async fn runs_share_nothing() {
    // One run at a time: the second run lands in the slot the first used,
    // so what the first left there is what the second would see.
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("SANDBOX_MAX_CONCURRENT", "1"),
    ]);
    let a = call(
        &d,
        "Run",
        &js_run("globalThis.leak = 'secret'; Object.prototype.polluted = 1; console.log('set')"),
    )
    .await;
    assert_eq!(a.stdout(), "set\n");
    let b = call(
        &d,
        "Run",
        &js_run("console.log(typeof leak, typeof ({}).polluted)"),
    )
    .await;
    assert_eq!(b.stdout(), "undefined undefined\n");
}

/// A run that dirties megabytes of its instance's memory and changes
/// built-ins and global state leaves nothing any later run can see, in
/// whichever pool slot the later runs land (the slot is put back to the
/// snapshot's image between runs).
#[tokio::test]
async fn a_run_that_dirties_much_memory_leaves_nothing_behind() {
    let d = wasm_daemon();
    let dirty = r#"
        globalThis.keep = [];
        for (let i = 0; i < 64; i++) keep.push('canary-' + i + '-'.repeat(65536));
        // Past the 32 MiB an instance is released inline (the larger one is
        // released on a blocking thread), so both paths are reused below.
        const big = new Uint8Array((i_big ? 40 : 8) << 20); big.fill(0xAB); globalThis.big = big;
        Array.prototype.leaked = 1; JSON.stringify = () => 'hijacked';
        Math.leaked = 7;
        console.log('dirtied', keep.length, big[12345]);
    "#;
    let check = r#"
        const names = Object.getOwnPropertyNames(globalThis).sort().join(',');
        console.log(typeof keep, typeof big, [].leaked, JSON.stringify({a: 1}),
            Math.leaked, names.length);
    "#;
    let clean = call(&d, "Run", &js_run(check)).await;
    assert_eq!(clean.status, 200, "{:?}", clean.body);
    for round in 0..4 {
        let dirty = format!("const i_big = {};\n{dirty}", round % 2);
        let a = call(&d, "Run", &js_run(&dirty)).await;
        assert_eq!(a.stdout(), "dirtied 64 171\n", "{:?}", a.body);
        // Several runs, so the slot just used is among those reused.
        for _ in 0..4 {
            let b = call(&d, "Run", &js_run(check)).await;
            assert_eq!(b.stdout(), clean.stdout());
            assert!(
                b.stdout()
                    .starts_with("undefined undefined undefined {\"a\":1} undefined ")
            );
        }
    }
}

#[tokio::test]
async fn describe_reports_the_embedded_engine() {
    let d = wasm_daemon();
    let bytes = std::fs::read(guest_wasm_path()).expect("guest component built by make");
    let identity = format!(
        "quickjs-wasm:sha256:{}",
        hex::encode(Sha256::digest(&bytes))
    );
    let info = call(&d, "Describe", &json!({})).await;
    assert_eq!(info.body["sandbox"], "wasm");
    assert_eq!(info.body["isolation"], "process");
    assert_eq!(
        info.body["javascriptEnvironment"]["identity"],
        identity.as_str()
    );
    assert_eq!(info.body["javascriptEnvironment"]["maxTimeoutMs"], 30000);
    assert_eq!(info.body["resources"]["memoryMb"], 256);
    assert!(info.body.get("supportsProject").is_none());

    let a = call(&d, "Run", &js_run("1")).await;
    assert_eq!(a.body["environment"], identity.as_str());
    assert_eq!(a.body["record"]["environment"], identity.as_str());
    assert_eq!(a.body["record"]["version"], 4);

    // Projects are not something this provider can do.
    let p = call(
        &d,
        "Run",
        &json!({"protocol": 4, "project": {"steps": ["true"]}}),
    )
    .await;
    assert_eq!((p.code(), p.mark()), ("unimplemented", Some("unsupported")));
}

#[tokio::test]
async fn wasm_refuses_limits_it_cannot_enforce() {
    for var in ["SANDBOX_CPUS", "SANDBOX_PIDS", "SANDBOX_DISK_MB"] {
        let (code, text) =
            plimsoll_tests::run_to_exit(&[], &[("SANDBOX_PROVIDER", "wasm"), (var, "1")]);
        assert_eq!(code, Some(2), "{var}: {text}");
        assert!(text.contains(var), "{text}");
    }
}

#[tokio::test]
async fn math_random_is_fresh_in_every_run() {
    // Every run starts from one pre-initialised snapshot; without a per-run
    // seed they would all draw the same sequence.
    let d = wasm_daemon();
    let code = "console.log([1, 2, 3].map(() => Math.random()).join(','))";
    let mut seen = std::collections::HashSet::new();
    for _ in 0..5 {
        let out = call(&d, "Run", &js_run(code)).await.stdout();
        for v in out.trim().split(',') {
            let f: f64 = v.parse().expect("a number");
            assert!((0.0..1.0).contains(&f), "{f}");
        }
        assert!(
            seen.insert(out.clone()),
            "a run repeated another's sequence: {out}"
        );
    }
}

#[tokio::test]
async fn a_flooded_stream_still_ends_with_the_daemons_notice() {
    let d = wasm_daemon();
    let mut req =
        js_run("const s = 'y'.repeat(100000); for (;;) { console.error(s); console.log(s) }");
    req["timeoutMs"] = json!(300);
    let a = call(&d, "Run", &req).await;
    assert_eq!(a.body["javascript"]["timedOut"], true);
    let err = a.stderr();
    assert_eq!(err.len(), 64 * 1024);
    assert!(
        err.ends_with("plimsoll: the run was stopped at its deadline of 300 ms\n"),
        "{}",
        &err[err.len() - 80..]
    );
    assert_eq!(a.body["javascript"]["stderrTruncated"], true);
    assert_eq!(a.js_bytes("stdout").len(), 64 * 1024);
}

/// A run under way when the operator stops the daemon (SIGTERM) is
/// answered in full and gets its audit line before the daemon exits: a stop
/// never leaves a run that executed without its answer or its record.
#[tokio::test]
async fn a_run_under_way_at_a_stop_is_answered_and_audited_before_exit() {
    let mut d = wasm_daemon();
    let url = d.url("/plimsoll.v1.SandboxService/Run");
    let body =
        js_run("const t = Date.now(); while (Date.now() - t < 1200) {} console.log('finished')");
    let run = tokio::spawn(async move {
        plimsoll_tests::client()
            .post(url)
            .json(&body)
            .send()
            .await
            .expect("the run's answer")
    });
    plimsoll_tests::wait_inflight(&d, 1).await;
    assert!(d.terminate(), "SIGTERM was not delivered");

    let a = plimsoll_tests::answer(run.await.expect("join")).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.stdout(), "finished\n");
    assert_eq!(a.exit_code(), 0);

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while d.is_running() {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon did not exit after its last run"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The log is read on its own thread; give it the rest of the stream.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while d.audit_runs() < 1 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(d.audit_runs(), 1, "{:?}", d.log_lines());
}
