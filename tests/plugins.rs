//! Provider plugins through the real daemon: the example adapter end to end
//! against a real upstream plimsolld, pinning, capability scoping, and a
//! deliberately hostile plugin whose every attempt must be refused (its
//! network attacks are in `plugin_network.rs`).

use std::sync::atomic::Ordering;

use plimsoll_tests::hostile_plugin::{hostile_with, recording_server};
use plimsoll_tests::{Daemon, call, js_run, plugin_dir, run_to_exit, test_plugin_dir, wasm_daemon};
use serde_json::json;
use sha2::{Digest, Sha256};

fn sha256_of(path: &std::path::Path) -> String {
    hex::encode(Sha256::digest(
        std::fs::read(path).expect("plugin built by make"),
    ))
}

fn remote_daemon(upstream: &Daemon, extra: &[(&str, &str)]) -> Daemon {
    let origin = format!("http://{}", upstream.addr);
    let dir = plugin_dir().display().to_string();
    let mut env = vec![
        ("SANDBOX_PROVIDER", "remote-plimsoll"),
        ("PLIMSOLL_PLUGIN_DIR", dir.as_str()),
        ("SANDBOX_PLUGIN_HTTP_ORIGINS", origin.as_str()),
    ];
    env.extend_from_slice(extra);
    Daemon::start(&env)
}

#[tokio::test]
async fn the_example_plugin_runs_a_snippet_end_to_end() {
    let upstream = wasm_daemon();
    // Every proxy variable points at a listener that must never be reached:
    // the plugin's requests go to the upstream itself.
    let (proxy, proxied) = plimsoll_tests::recording_listener().await;
    let proxies = plimsoll_tests::proxy_env(&proxy);
    let mut extra: Vec<(&str, &str)> = vec![("SANDBOX_PLUGIN_MAX_TIER", "vm")];
    extra.extend(proxies.iter().map(|(k, v)| (*k, v.as_str())));
    let front = remote_daemon(&upstream, &extra);

    let info = call(&front, "Describe", &json!({})).await;
    assert_eq!(info.body["sandbox"], "remote-plimsoll");
    // The plugin claims the upstream's tier; the operator allowed up to vm.
    assert_eq!(info.body["isolation"], "process");
    let sha = sha256_of(&plugin_dir().join("remote-plimsoll.wasm"));
    assert_eq!(info.body["policy"], format!("plugin:sha256:{sha}").as_str());

    let a = call(&front, "Run", &js_run("console.log('via plugin', 6 * 7)")).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.stdout(), "via plugin 42\n");
    assert_eq!(a.body["sandbox"], "remote-plimsoll");
    assert_eq!(
        a.body["record"]["policy"],
        format!("plugin:sha256:{sha}").as_str()
    );
    // It really ran upstream: the upstream audited it (its log arrives on
    // its own thread, so wait for the line rather than race it).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !upstream
        .log_lines()
        .iter()
        .any(|l| l.contains("plimsoll::audit"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "upstream never ran it"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // The host's floor check uses the host's evidence.
    let mut req = js_run("console.log('no')");
    req["minimumIsolation"] = json!("container");
    let a = call(&front, "Run", &req).await;
    assert_eq!(a.mark(), Some("isolation"));
    assert_eq!(
        proxied.load(Ordering::SeqCst),
        0,
        "a request went to the proxy"
    );
}

#[tokio::test]
async fn the_operator_caps_what_a_plugin_may_claim() {
    let (origin, _hits) = recording_server().await;
    let dir = test_plugin_dir().display().to_string();
    // The hostile plugin claims vm and the operator allows vm, but a plugin
    // holding the container engine is at most container.
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "hostile"),
        ("PLIMSOLL_PLUGIN_DIR", dir.as_str()),
        ("SANDBOX_PLUGIN_HTTP_ORIGINS", origin.as_str()),
        ("SANDBOX_PLUGIN_CONTAINER_ENGINE", "1"),
        (
            "SANDBOX_DOCKER_IMAGE",
            plimsoll_tests::sandbox_image().as_str(),
        ),
        ("SANDBOX_PLUGIN_MAX_TIER", "vm"),
    ]);
    let info = call(&d, "Describe", &json!({})).await;
    assert_eq!(
        info.body["isolation"], "container",
        "a container-engine plugin is at most container"
    );
    assert_eq!(
        info.body["javascriptEnvironment"]["languages"],
        json!(["javascript"])
    );
}

#[tokio::test]
async fn a_pinned_plugin_must_match_its_digest() {
    let upstream = wasm_daemon();
    let sha = sha256_of(&plugin_dir().join("remote-plimsoll.wasm"));
    let ok = remote_daemon(&upstream, &[("SANDBOX_PLUGIN_SHA256", sha.as_str())]);
    assert_eq!(
        call(&ok, "Run", &js_run("console.log(1)")).await.stdout(),
        "1\n"
    );

    let wrong = "0".repeat(64);
    let origin = format!("http://{}", upstream.addr);
    let dir = plugin_dir().display().to_string();
    let (code, text) = run_to_exit(
        &[],
        &[
            ("SANDBOX_PROVIDER", "remote-plimsoll"),
            ("PLIMSOLL_PLUGIN_DIR", dir.as_str()),
            ("SANDBOX_PLUGIN_HTTP_ORIGINS", origin.as_str()),
            ("SANDBOX_PLUGIN_SHA256", wrong.as_str()),
        ],
    );
    assert_ne!(code, Some(0));
    assert!(
        text.contains("SANDBOX_PLUGIN_SHA256") && text.contains(&sha),
        "{text}"
    );
}

#[test]
fn a_missing_plugin_is_a_configuration_error_listing_what_exists() {
    let dir = plugin_dir().display().to_string();
    let (code, text) = run_to_exit(
        &[],
        &[
            ("SANDBOX_PROVIDER", "no-such-plugin"),
            ("PLIMSOLL_PLUGIN_DIR", dir.as_str()),
        ],
    );
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("remote-plimsoll") && text.contains("wasm") && text.contains("disabled"),
        "{text}"
    );
}

/// The plugin is read through a handle on the plugin directory: a name
/// that leads out of it is refused, not followed.
#[test]
fn a_plugin_file_that_leads_out_of_the_plugin_directory_is_refused() {
    let dir = plimsoll_tests::Scratch::new("plugin-link");
    std::os::unix::fs::symlink(
        test_plugin_dir().join("hostile.wasm"),
        dir.path("hostile.wasm"),
    )
    .expect("symlink");
    let path = dir.0.display().to_string();
    let (code, text) = run_to_exit(
        &[],
        &[
            ("SANDBOX_PROVIDER", "hostile"),
            ("PLIMSOLL_PLUGIN_DIR", path.as_str()),
        ],
    );
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("reading plugin"), "{text}");
}

#[test]
fn a_plugin_importing_an_ungranted_capability_is_refused_at_start() {
    let dir = test_plugin_dir().display().to_string();
    // The hostile plugin imports container-engine and http; grant neither.
    let (code, text) = run_to_exit(
        &[],
        &[
            ("SANDBOX_PROVIDER", "hostile"),
            ("PLIMSOLL_PLUGIN_DIR", dir.as_str()),
        ],
    );
    assert_ne!(code, Some(0));
    assert!(text.contains("did not grant"), "{text}");
}

fn hostile(origin: &str) -> Daemon {
    hostile_with_pool(origin, "0")
}

fn hostile_with_pool(origin: &str, pool: &str) -> Daemon {
    hostile_with(origin, &[("SANDBOX_DOCKER_POOL", pool)])
}

/// IDs of the containers a daemon has now.
fn container_ids(pid: u32) -> Vec<String> {
    plimsoll_tests::container_ids_of(pid, true)
}

/// A plugin that asks for warm containers of a spin loop once it has a
/// request in hand, then says nothing ran. What warm containers hold is
/// chosen at preflight and fixed for the plugin's life, so the ask is
/// refused; and since the plugin acted outside that rule with a request in
/// hand, the host no longer repeats its claim that nothing ran. No
/// container of the loop's is ever made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prewarm_after_preflight_is_refused_and_costs_the_mark() {
    let (origin, _) = recording_server().await;
    let d = hostile_with_pool(&origin, "2");
    let pid = d.pid().expect("pid");
    let a = call(&d, "Run", &js_run("prewarm-loop")).await;
    assert_eq!(a.mark(), None, "marked not dispatched: {:?}", a.body);
    assert_ne!(a.status, 200, "{:?}", a.body);
    for _ in 0..15 {
        assert!(
            container_ids(pid).is_empty(),
            "a container was made for the loop"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(
        d.log_lines()
            .iter()
            .any(|l| l.contains("fixed for the plugin's life")),
        "the refusal is not logged"
    );
}

/// A plugin that tries a new warm-container spec again and again, once it
/// has a request: every one refused, and no container made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_specs_cannot_change_after_preflight() {
    let (origin, _) = recording_server().await;
    let d = hostile_with_pool(&origin, "2");
    let pid = d.pid().expect("pid");
    let a = call(&d, "Run", &js_run("prewarm-churn")).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    let out = a.stdout();
    let refused = out.lines().filter(|l| l.ends_with(" refused")).count();
    assert_eq!(refused, 10, "{out}");
    assert!(container_ids(pid).is_empty());
}

#[tokio::test]
async fn every_forbidden_container_spec_is_refused() {
    let (origin, _) = recording_server().await;
    let d = hostile(&origin);
    let a = call(&d, "Run", &js_run("engine-attacks")).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    let report = a.stdout();
    let lines: Vec<&str> = report.lines().collect();
    assert!(lines.len() >= 20, "{report}");
    for line in &lines {
        if line.starts_with("control:") {
            assert!(
                line.ends_with("passed-monitor"),
                "a compliant spec was refused: {line}"
            );
        } else {
            assert!(
                line.ends_with(" forbidden"),
                "the monitor let one through: {line}"
            );
        }
    }
    // Each refusal is in the operator's log, naming the rule, not the spec.
    // (Log lines arrive on their own thread; the sentinel's line comes after
    // every line logged before it.)
    d.audit_after_sentinel().await;
    let refused = d
        .log_lines()
        .iter()
        .filter(|l| l.contains("container spec refused"))
        .count();
    assert_eq!(refused, lines.len() - 1);
}

#[tokio::test]
async fn a_misbehaving_plugin_fails_one_call_and_nothing_else() {
    let (origin, hits) = recording_server().await;
    let mut d = hostile(&origin);

    // Trapped before using any capability: a marked environment refusal.
    let a = call(&d, "Run", &js_run("trap")).await;
    assert_eq!(
        (a.code(), a.mark()),
        ("failed_precondition", Some("environment")),
        "{:?}",
        a.body
    );
    assert!(
        a.body["message"].as_str().unwrap_or("").contains("trapped"),
        "{:?}",
        a.body
    );

    // Memory exhaustion: the same, and named.
    let a = call(&d, "Run", &js_run("oom")).await;
    assert_eq!(a.mark(), Some("environment"));
    assert!(
        a.body["message"].as_str().unwrap_or("").contains("memory"),
        "{:?}",
        a.body
    );

    // An endless loop ends at the call's deadline.
    let mut req = js_run("loop");
    req["timeoutMs"] = json!(300);
    let t = std::time::Instant::now();
    let a = call(&d, "Run", &req).await;
    assert_eq!(a.mark(), Some("environment"), "{:?}", a.body);
    assert!(
        t.elapsed() < std::time::Duration::from_secs(10),
        "the loop held the call for {:?}",
        t.elapsed()
    );

    // A plugin's own clean refusal keeps its mark.
    let a = call(&d, "Run", &js_run("refuse-clean")).await;
    assert_eq!(
        (a.code(), a.mark()),
        ("resource_exhausted", Some("capacity"))
    );

    // A refusal claimed after sending a request is not repeated: unmarked.
    let a = call(&d, "Run", &js_run("refuse-after-send")).await;
    assert_eq!((a.status, a.mark()), (500, None), "{:?}", a.body);
    assert_eq!(hits.load(Ordering::SeqCst), 1);

    // A result of the wrong kind is a failure that may follow execution.
    let a = call(&d, "Run", &js_run("wrong-kind")).await;
    assert_eq!((a.status, a.mark()), (500, None));

    // Output is capped by the host whatever the plugin returns.
    let a = call(&d, "Run", &js_run("flood")).await;
    assert_eq!(a.js_bytes("stdout").len(), 64 * 1024);
    assert_eq!(a.body["javascript"]["stdoutTruncated"], true);
    assert_eq!(a.body["javascript"]["stderrTruncated"], true);

    // Its log lines are bounded per call and cannot forge lines of their own.
    let before = d.log_lines().len();
    let a = call(&d, "Run", &js_run("log-flood")).await;
    assert_eq!(a.stdout(), "logged\n");
    d.audit_after_sentinel().await;
    let plugin_lines: Vec<String> = d.log_lines()[before..]
        .iter()
        .filter(|l| l.contains("plimsoll::plugin"))
        .cloned()
        .collect();
    let flood = plugin_lines
        .iter()
        .filter(|l| l.contains("forged log line"))
        .count();
    assert_eq!(flood, 200, "per-call log budget");
    assert!(
        plugin_lines.iter().any(|l| l.contains("\"dropped\":9800")),
        "the dropped lines were not reported"
    );
    assert!(
        plugin_lines
            .iter()
            .all(|l| !l.contains('\u{1b}') && !l.contains("\\u001b")),
        "control characters reached the log"
    );

    // After all of it, the daemon is healthy and serves.
    assert!(d.is_running());
    let a = call(&d, "Run", &js_run("engine-attacks")).await;
    assert_eq!(a.status, 200);
}

#[tokio::test]
async fn a_compliant_container_runs_for_real_inside_the_envelope_and_is_removed() {
    let (origin, _) = recording_server().await;
    let d = hostile(&origin);
    let a = call(&d, "Run", &js_run("engine-run")).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    // stdin reached it; it ran as 61000 on a read-only root; streams and the
    // exit code came back separately.
    assert_eq!(a.stdout(), "out\nfrom stdin\n61000\nroot-ro\n");
    assert_eq!(a.stderr(), "err\n");
    assert_eq!(a.exit_code(), 3);

    // A container that asks for a minute is held to the run's own deadline
    // (1 s plus the 2 s call margin): killed, reported, and removed.
    let t = std::time::Instant::now();
    let mut req = js_run("engine-sleep");
    req["timeoutMs"] = json!(1000);
    let a = call(&d, "Run", &req).await;
    assert_eq!(a.body["javascript"]["timedOut"], true, "{:?}", a.body);
    assert_eq!(a.exit_code(), 137);
    assert!(
        t.elapsed() < std::time::Duration::from_secs(8),
        "{:?}",
        t.elapsed()
    );
    // This daemon's containers only: other tests run containers meanwhile.
    // A run is answered once its container is dead, and the dead container
    // is removed just after (the answer does not wait on the engine's
    // filesystem work): it must be gone soon, not at the answer.
    let pid = d.pid().expect("pid");
    let gone = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while plimsoll_tests::containers_of(pid) > 0 {
        assert!(
            std::time::Instant::now() < gone,
            "a run container was left behind"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn spinning_plugins_do_not_starve_the_daemon() {
    let (origin, _) = recording_server().await;
    // Two worker threads, whatever this machine has, and more spinners than
    // that: a daemon whose workers were held would not answer at all.
    let d = hostile_with(&origin, &[("TOKIO_WORKER_THREADS", "2")]);
    let mut req = js_run("loop");
    req["timeoutMs"] = json!(3000);
    let spinners: Vec<_> = (0..4)
        .map(|_| {
            let url = d.url("/plimsoll.v1.SandboxService/Run");
            let req = req.clone();
            tokio::spawn(async move {
                plimsoll_tests::client()
                    .post(url)
                    .header("content-type", "application/json")
                    .json(&req)
                    .send()
                    .await
            })
        })
        .collect();
    // Every spinner is in flight (the daemon's own gauge says so).
    plimsoll_tests::wait_inflight(&d, 4).await;
    // The daemon still answers while they spin: each answer is followed by
    // the gauge still counting all four, so it came while every spinner
    // still ran. (Not a time bound: both cores are busy, and how long an
    // answer takes then is this machine's business. A daemon whose workers
    // were held would answer only once a spinner's deadline freed one,
    // and the gauge read after it would be short of four.)
    for _ in 0..3 {
        let r = plimsoll_tests::client()
            .get(d.url("/healthz"))
            .send()
            .await
            .expect("healthz");
        assert_eq!(r.status().as_u16(), 200);
        assert_eq!(
            plimsoll_tests::inflight(&d).await,
            4,
            "a spinner ended before healthz was answered"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    for s in spinners {
        let a = plimsoll_tests::answer(s.await.expect("join").expect("sent")).await;
        assert_eq!(a.mark(), Some("environment"), "{:?}", a.body);
    }
}

/// A project report over every budget: the host keeps 20 steps, each
/// stream cut to the output limit, 8 MiB of artifacts at most, only those
/// asked for, and says it cut.
#[tokio::test]
async fn a_plugins_project_report_is_held_to_its_budgets() {
    let (origin, _) = recording_server().await;
    let d = hostile(&origin);
    // The plugin reports `big.bin` (over the byte budget) and `small-0` to
    // `small-149`; the request asks for `big.bin` and the first 99 smalls
    // (100 names, as many as a request may have).
    let mut asked = vec!["big.bin".to_string()];
    asked.extend((0..99).map(|i| format!("small-{i}.txt")));
    let req =
        json!({"protocol": 4, "project": {"files": [], "steps": ["flood"], "artifacts": asked}});
    let a = call(&d, "Run", &req).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    let p = &a.body["project"];
    let steps = p["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 20);
    use base64::Engine as _;
    for s in steps {
        let out = base64::engine::general_purpose::STANDARD
            .decode(s["stdout"].as_str().unwrap_or(""))
            .expect("base64");
        assert_eq!(out.len(), 64 << 10);
        assert_eq!(s["stdoutTruncated"], true);
        assert_eq!(s["stderrTruncated"], true);
    }
    let artifacts = p["artifacts"].as_array().expect("artifacts");
    assert_eq!(artifacts.len(), 99);
    assert!(artifacts.iter().all(|a| a["path"] != "big.bin"));
    assert!(
        artifacts
            .iter()
            .all(|a| asked.iter().any(|n| a["path"] == n.as_str())),
        "an artifact nobody asked for was kept"
    );
    // big.bin was asked for and left out.
    assert_eq!(p["artifactsTruncated"], true);
}

/// A plugin that reports artifacts the request did not ask for (a git hook,
/// a path out of the directory, an absolute one, a second body for the one
/// name asked for): the host keeps only the first body of the name asked
/// for, says nothing was truncated, logs how many it dropped and not their
/// names, and the run's result stands, with no not-dispatched mark.
#[tokio::test]
async fn a_plugin_cannot_add_artifacts_nobody_asked_for() {
    let (origin, _) = recording_server().await;
    let d = hostile(&origin);
    let req = json!({"protocol": 4, "project": {
        "files": [], "steps": ["unrequested"], "artifacts": ["out.txt"]}});
    let before = d.log_lines().len();
    let a = call(&d, "Run", &req).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.mark(), None);
    let p = &a.body["project"];
    use base64::Engine as _;
    let kept: Vec<(String, Vec<u8>)> = p["artifacts"]
        .as_array()
        .expect("artifacts")
        .iter()
        .map(|a| {
            (
                a["path"].as_str().unwrap_or("").to_string(),
                base64::engine::general_purpose::STANDARD
                    .decode(a["content"].as_str().unwrap_or(""))
                    .expect("base64"),
            )
        })
        .collect();
    assert_eq!(kept, vec![("out.txt".to_string(), b"asked for".to_vec())]);
    // Absent (false): nothing asked for was left out.
    assert_eq!(p.get("artifactsTruncated"), None, "{p}");
    d.audit_after_sentinel().await;
    let lines = d.log_lines()[before..].join("\n");
    assert!(
        lines.contains(
            "unrequested: hook false dotdot false absolute false requested true again false"
        ),
        "{lines}"
    );
    assert!(
        lines.contains("did not ask for") && lines.contains("\"dropped\":4"),
        "{lines}"
    );
    assert!(
        !lines.contains("pre-commit"),
        "a dropped name reached the log"
    );
}

#[tokio::test]
async fn a_plugin_finds_no_ambient_authority_in_wasi() {
    let (origin, _) = recording_server().await;
    let d = hostile(&origin);
    // Something listens here, so only the absence of sockets can refuse.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let a = call(&d, "Run", &js_run(&format!("wasi-probe {port}"))).await;
    assert_eq!(
        a.stdout(),
        "env 0\nfs-root false\npasswd false\ntcp false\n"
    );
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the plugin reached the listener"
    );
}

#[tokio::test]
async fn oversized_plugin_values_are_refused_before_they_are_copied() {
    let (origin, hits) = recording_server().await;
    let d = hostile(&origin);
    let a = call(&d, "Run", &js_run("many-values")).await;
    assert_eq!(
        a.stdout(),
        "headers forbidden\nenv forbidden\n",
        "{:?}",
        a.body
    );
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    assert_eq!(call(&d, "Run", &js_run("wasi-probe")).await.status, 200);
}

// Multi-threaded: the relay must serve the engine while this thread waits
// for the daemon to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_expired_or_orphaned_are_swept_and_live_ones_kept() {
    let image = plimsoll_tests::busybox_image();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let (expired, live) = (
        format!("sweep-expired-{}", std::process::id()),
        format!("sweep-live-{}", std::process::id()),
    );
    let pid = std::process::id();
    let (orphan, living_maker, foreign) = (
        format!("sweep-orphan-{pid}"),
        format!("sweep-living-maker-{pid}"),
        format!("sweep-foreign-{pid}"),
    );
    // Removed however the test ends: a failed assertion must not leave a
    // planted container for the suite's leftover check (or the next run).
    let _planted = Planted(vec![
        expired.clone(),
        live.clone(),
        orphan.clone(),
        living_maker.clone(),
        foreign.clone(),
    ]);
    // A daemon that ran and exited, as a killed daemon's session container
    // would name it: unexpired for an hour, but its maker provably gone.
    let mut child = std::process::Command::new("true").spawn().expect("true");
    let dead = child.id();
    child.wait().expect("wait");
    let dead_maker = plimsoll_tests::process_identity(dead, "1");
    let live_maker = plimsoll_tests::process_identity(pid, &plimsoll_tests::own_start_time());
    // Planted under a run label only this test's daemon sweeps for (its
    // engine relay rewrites its sweep's query): every daemon of the other
    // tests sweeps what is expired or orphaned too, and one of them taking
    // these would pass the test for this one.
    use plimsoll_tests::plant_private_container as plant;
    plant(&expired, &image, now - 10, None);
    plant(&live, &image, now + 3600, None);
    plant(&orphan, &image, now + 3600, Some(&dead_maker));
    plant(&living_maker, &image, now + 3600, Some(&live_maker));
    // Another boot: this host cannot judge that PID, so expiry decides.
    let other_boot = format!("not-this-boot/{}", dead_maker.split_once('/').unwrap().1);
    plant(&foreign, &image, now + 3600, Some(&other_boot));
    let path =
        std::env::temp_dir().join(format!("plimsoll-sweep-relay-{}.sock", std::process::id()));
    let _relay = plimsoll_tests::EngineRelay::start(
        &path,
        plimsoll_tests::RelayFaults::sweep_only_planted(),
    );
    let socket = path.display().to_string();
    let (origin, _) = recording_server().await;
    let _d = hostile_with(&origin, &[("SANDBOX_DOCKER_SOCKET", socket.as_str())]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while plimsoll_tests::container_exists(&expired) || plimsoll_tests::container_exists(&orphan) {
        assert!(
            std::time::Instant::now() < deadline,
            "an expired or orphaned container was not swept"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // Ones another daemon may still be running are left alone.
    for kept in [&live, &living_maker, &foreign] {
        assert!(plimsoll_tests::container_exists(kept), "{kept} was swept");
    }
}

/// Containers a test planted, removed when it ends, passed or failed.
struct Planted(Vec<String>);

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .arg("rm")
            .arg("-f")
            .args(&self.0)
            .output();
    }
}
