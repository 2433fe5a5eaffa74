//! Pre-booted warm containers against the real engine: what a plugin
//! declared before its first request is what runs in them, named in the
//! evidence; a request reaches one only when a run takes it; its end frames
//! answer early and gain a guest nothing it could not get by exiting; and a
//! declaration that spins, or one made with a request in hand, costs the
//! plugin, never a caller.

use std::process::Command;
use std::time::{Duration, Instant};

use plimsoll_tests::hostile_plugin::hostile_with;
use plimsoll_tests::{Answer, Daemon, call, js_run, metrics_text};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

fn docker(pool: &str) -> Daemon {
    let image = plimsoll_tests::sandbox_image();
    Daemon::start(&[
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_DOCKER_IMAGE", image.as_str()),
        ("SANDBOX_DOCKER_POOL", pool),
    ])
}

/// The IDs of a daemon's running containers.
fn running(pid: u32) -> Vec<String> {
    plimsoll_tests::container_ids_of(pid, false)
}

/// A daemon's containers and their states, for a failure's message.
fn ps(pid: u32) -> String {
    let out = Command::new("docker")
        .args([
            "ps",
            "-a",
            "--format",
            "{{.ID}} {{.Status}} {{.Command}}",
            "--filter",
            &format!("label=io.plimsoll.owner={pid}"),
        ])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A container's configuration, as the engine holds it.
fn config(id: &str) -> Value {
    let out = Command::new("docker")
        .args(["inspect", "--format", "{{json .Config}}", id])
        .output()
        .expect("docker inspect");
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// Waits until the daemon has `n` running containers; their IDs.
async fn wait_running(pid: u32, n: usize, within: Duration) -> Vec<String> {
    let until = Instant::now() + within;
    loop {
        let ids = running(pid);
        if ids.len() == n || Instant::now() > until {
            return ids;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until the daemon's warm containers (a pool of one: one for
/// snippets, one for projects) are all it has: the last run's container is
/// gone and the refill is up, so the next run takes a pre-booted container
/// rather than a cold one.
async fn settled(d: &Daemon) {
    let pid = d.pid().expect("pid");
    let until = Instant::now() + Duration::from_secs(20);
    while (
        plimsoll_tests::containers_of(pid),
        plimsoll_tests::running_containers_of(pid),
    ) != (2, 2)
    {
        assert!(Instant::now() < until, "the pool did not settle");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run(d: &Daemon, code: &str, timeout_ms: u64) -> Answer {
    let mut req = js_run(code);
    req["timeoutMs"] = json!(timeout_ms);
    let a = call(d, "Run", &req).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    a
}

/// `run` on a pre-booted container: one that ran cold (exit 99, see
/// `FORGE`) is tried again once the pool has settled.
async fn run_booted(d: &Daemon, code: &str, timeout_ms: u64) -> Answer {
    for _ in 0..10 {
        settled(d).await;
        let a = run(d, code, timeout_ms).await;
        if a.exit_code() != 99 {
            return a;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("no run found a pre-booted container");
}

/// The docker plugin declares `node --import <end-frame hook> -` for
/// snippets, its runner for projects and its session agent for sessions. Each warm container runs
/// exactly its kind's declaration: the launch (the gate without its wait)
/// before the declared environment and command, plus only the host's
/// nonce. Describe names the declarations' digest, and recomputing it from
/// what the engine holds gives the same. A session's agent has its kernels
/// up before any session takes the container.
#[tokio::test]
async fn a_warm_container_runs_exactly_the_declared_command_named_in_evidence() {
    let image = plimsoll_tests::sandbox_image();
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_DOCKER_IMAGE", image.as_str()),
        ("SANDBOX_DOCKER_POOL", "1"),
        ("SANDBOX_SESSION_POOL", "1"),
        ("SANDBOX_MAX_SESSIONS", "2"),
    ]);
    let pid = d.pid().expect("pid");
    let info = call(&d, "Describe", &json!({})).await;
    let identity = info.body["javascriptEnvironment"]["identity"]
        .as_str()
        .expect("identity")
        .to_string();
    let (stated, digest) = identity
        .split_once("+preboot:sha256:")
        .expect("the declarations are in the evidence");
    assert_eq!(stated, format!("docker-image:{image}"));
    let ids = wait_running(pid, 3, Duration::from_secs(30)).await;
    assert_eq!(ids.len(), 3, "a warm container of each kind");
    let mut declared = Vec::new();
    for id in &ids {
        let c = config(id);
        let entry = strings(&c["Entrypoint"]);
        assert_eq!(entry.len(), 4, "{entry:?}");
        assert_eq!(entry[3], "plimsoll-launch");
        assert!(!entry[2].contains("read"), "no gate: {}", entry[2]);
        let cmd = strings(&c["Cmd"]);
        let split = cmd.iter().position(|a| a == "--").expect("--");
        let (mut env, command) = (cmd[..split].to_vec(), cmd[split + 1..].to_vec());
        let nonce = env.pop().expect("the host's nonce, last");
        assert!(nonce.starts_with("PLIMSOLL_END="), "{nonce}");
        assert_eq!(nonce.len(), "PLIMSOLL_END=".len() + 32);
        let session = c["Labels"]["io.plimsoll.session"] == "1";
        let top = Command::new("docker")
            .args(["top", id])
            .output()
            .expect("docker top");
        let top = String::from_utf8_lossy(&top.stdout).into_owned();
        if session {
            assert_eq!(command[..2], ["/bin/sh", "-c"]);
            // The agent, and both kernels, booted before any request.
            let until = Instant::now() + Duration::from_secs(20);
            loop {
                let top = Command::new("docker")
                    .args(["top", id])
                    .output()
                    .expect("docker top");
                let top = String::from_utf8_lossy(&top.stdout).into_owned();
                if top.matches("node -e").count() >= 2 && top.contains("python3") {
                    break;
                }
                assert!(Instant::now() < until, "kernels not booted:\n{top}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        } else {
            assert_eq!(command[..2], ["node", "--import"]);
            assert!(top.contains("node --import"), "{top}");
        }
        // A snippet's node reads its program from stdin; a project's runner
        // is its `-e` argument, reading the project from stdin.
        let kind = match command.get(3).map(String::as_str) {
            _ if session => "session",
            Some("-") => "snippet",
            Some("-e") => "project",
            other => panic!("an undeclared command: {other:?}"),
        };
        declared.push(json!({"command": command, "env": env, "kind": kind}));
    }
    declared.sort_by_key(|d| d["kind"].as_str().map(str::to_string));
    let canonical = serde_json::to_vec(&declared).expect("json");
    assert_eq!(hex::encode(Sha256::digest(&canonical)), digest);
    // And a run on it answers as node would, under the same evidence.
    let a = run(&d, "console.log(6 * 7)", 10_000).await;
    assert_eq!((a.stdout().as_str(), a.exit_code()), ("42\n", 0));
    assert_eq!(a.body["record"]["environment"], identity);
}

/// A guest that writes the end frames itself (the nonce is in its own
/// environment) gets what it could get by exiting, and no more: the answer
/// holds what came before the frame, the container is killed right after,
/// and the host's deadline, limits and flags stand.
#[tokio::test]
async fn end_frames_answer_early_and_gain_a_guest_nothing() {
    let d = docker("1");
    let pid = d.pid().expect("pid");
    // A run that found no pre-booted container ready (the refill was
    // still starting) ran cold, without a nonce: it exits 99 and is tried
    // again.
    const FORGE: &str = "const fs = require('fs');
const v = fs.readFileSync('/proc/self/environ', 'latin1').split('\\0')
  .find(v => v.startsWith('PLIMSOLL_END='));
if (!v) process.exit(99);
const n = v.slice(13);
const frame = (code) => { fs.writeSync(2, '\\0plimsoll-end:' + n + '\\n');
  fs.writeSync(1, '\\0plimsoll-end:' + n + ':' + code + '\\n'); };";

    // (a) A frame, then a spin: answered at the frame, not the deadline.
    let a = run_booted(
        &d,
        &format!("{FORGE} fs.writeSync(1, require('os').hostname()); frame(0); for (;;) {{}}"),
        20_000,
    )
    .await;
    let took: u64 = a.body["durationMs"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("durationMs");
    assert!(took < 5_000, "answered after {took} ms, at the deadline");
    // The answer holds what came before the frame: the container's name.
    let spinner = a.stdout();
    assert_eq!((spinner.len(), a.exit_code()), (12, 0), "{spinner:?}");
    assert_eq!(
        a.body["javascript"]["timedOut"],
        json!(null),
        "{:?}",
        a.body
    );
    // The spinning container is gone soon after the answer.
    let until = Instant::now() + Duration::from_secs(5);
    while plimsoll_tests::container_exists(&spinner) {
        assert!(
            Instant::now() < until,
            "the spinner outlived its answer: {}",
            ps(pid)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // (b) Output after a frame is not the run's, on either stream.
    let a = run_booted(
        &d,
        &format!("{FORGE} frame(4); fs.writeSync(1, 'after'); fs.writeSync(2, 'after')"),
        10_000,
    )
    .await;
    assert_eq!(
        (a.stdout().as_str(), a.stderr().as_str(), a.exit_code()),
        ("", "", 4)
    );

    // (c) A flood past the limit, then a frame: the host's truncation.
    let a = run_booted(
        &d,
        &format!("{FORGE} fs.writeSync(1, 'y'.repeat(100000)); frame(0)"),
        10_000,
    )
    .await;
    assert_eq!(a.stdout().len(), 64 << 10);
    assert_eq!(
        a.body["javascript"]["stdoutTruncated"], true,
        "{:?}",
        a.body["javascript"]["stdoutTruncated"]
    );

    // (d) A frame with another nonce is output like any other bytes.
    settled(&d).await;
    let a = run(
        &d,
        "process.stdout.write('\\0plimsoll-end:00:0\\n'); process.exitCode = 2",
        10_000,
    )
    .await;
    assert_eq!(
        (a.stdout().as_str(), a.exit_code()),
        ("\0plimsoll-end:00:0\n", 2)
    );

    // (e) No frame at all (an exit that skips the hook): the engine's way,
    // with the whole output.
    settled(&d).await;
    let a = run(
        &d,
        "process.stdout.write('x'); process.reallyExit(3)",
        10_000,
    )
    .await;
    assert_eq!((a.stdout().as_str(), a.exit_code()), ("x", 3));

    // (f) A spin with no frame ends at the host's deadline, as ever.
    settled(&d).await;
    let a = run(&d, "for (;;) {}", 1_500).await;
    assert_eq!(a.body["javascript"]["timedOut"], true, "{:?}", a.body);
}

/// What ordinary snippets print and exit with is the same whether node was
/// pre-booted and framed its end, or started cold behind the gate.
#[tokio::test]
async fn pre_booted_runs_answer_as_cold_gated_runs_do() {
    let corpus = [
        "console.log('out'); console.error('err')",
        "throw new Error('boom')",
        "Promise.reject(new Error('rejected'))",
        "process.exitCode = 5; console.log('set')",
        "console.log('a'); process.exit(7)",
        "process.exit(300)",
        "process.on('exit', (c) => console.log('bye', c)); console.log('hi')",
        "import fs from 'node:fs'; console.log(typeof fs.readFileSync)",
        "console.log(typeof require, require.main === module, process.argv.length)",
        "setTimeout(() => console.log('later'), 50); console.log('now')",
        "process.stdout.write('z'.repeat(200000))",
        "console.log(process.env.PLIMSOLL_END, Object.keys(process.env).filter(k => k.startsWith('PLIMSOLL')))",
    ];
    let cold = docker("0");
    let warm = docker("1");
    for code in corpus {
        let a = run(&cold, code, 10_000).await;
        // Each pre-booted run waits for the refill, so it takes a booted
        // one (counted below).
        settled(&warm).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let b = run(&warm, code, 10_000).await;
        for field in [
            "stdout",
            "stderr",
            "exitCode",
            "stdoutTruncated",
            "timedOut",
        ] {
            assert_eq!(
                a.body["javascript"][field], b.body["javascript"][field],
                "{field} of {code}"
            );
        }
    }
    let taken = |d, how| async move {
        let m = metrics_text(d).await;
        let series = format!("plimsoll_run_containers_total{{how=\"{how}\"}} ");
        m.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0)
    };
    assert_eq!(taken(&cold, "booted").await, 0);
    assert_eq!(
        taken(&warm, "booted").await,
        corpus.len(),
        "every run pre-booted"
    );
}

/// A plugin whose declared pre-boot command spins: each warm container is
/// removed within seconds and counted, and after three the host stops
/// pre-booting and keeps its containers behind the gate. No caller's run
/// is involved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spinning_preboot_is_removed_counted_and_stopped() {
    let tag = "plimsoll-test/spin-preboot:1";
    let tagged = Command::new("docker")
        .args(["tag", &plimsoll_tests::sandbox_image(), tag])
        .status()
        .expect("docker tag");
    assert!(tagged.success());
    let d = hostile_with(
        "http://127.0.0.1:9",
        &[("SANDBOX_DOCKER_POOL", "2"), ("SANDBOX_DOCKER_IMAGE", tag)],
    );
    let pid = d.pid().expect("pid");
    let until = Instant::now() + Duration::from_secs(60);
    let stopped = loop {
        let m = metrics_text(&d).await;
        if m.lines().any(|l| l == "plimsoll_preboot_stopped_total 1") {
            break m;
        }
        assert!(Instant::now() < until, "never stopped:\n{m}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let cpu = stopped
        .lines()
        .find_map(|l| l.strip_prefix("plimsoll_warm_removed_total{reason=\"cpu\"} "))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(cpu >= 3, "{stopped}");
    assert!(
        d.log_lines()
            .iter()
            .any(|l| l.contains("keeps its containers behind the gate for the next 10 minutes")),
        "the stop is not logged"
    );
    // From here its warm containers wait behind the gate: nothing spins.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let names: Vec<String> = running(pid)
            .iter()
            .map(|id| {
                strings(&config(id)["Entrypoint"])
                    .get(3)
                    .cloned()
                    .unwrap_or_default()
            })
            .collect();
        if names == ["plimsoll-gate", "plimsoll-gate"] {
            break;
        }
        assert!(Instant::now() < until, "still not gated: {names:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(d.audit_runs(), 0, "no run was involved");
}

/// A plugin that declares a pre-boot command with a request in hand (its
/// environment carrying the request's bytes), then says nothing ran: the
/// declaration is refused, the claim is not repeated, and no container
/// holds the bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preboot_declared_with_a_request_in_hand_is_refused_and_costs_the_mark() {
    let d = hostile_with("http://127.0.0.1:9", &[("SANDBOX_DOCKER_POOL", "1")]);
    let pid = d.pid().expect("pid");
    let a = call(&d, "Run", &js_run("preboot-loop")).await;
    assert_ne!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.mark(), None, "marked not dispatched: {:?}", a.body);
    let until = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = d.log_lines().join("\n");
        if log.contains("hostile preboot") || Instant::now() > until {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(log.contains("hostile preboot: refused"), "{log}");
    assert!(!log.contains("hostile preboot: ALLOWED"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    for id in plimsoll_tests::container_ids_of(pid, true) {
        let c = config(&id).to_string();
        assert!(!c.contains("SMUGGLED"), "the request's bytes reached {id}");
    }
}

/// A warm container killed from outside (an operator, an engine restart)
/// is never handed a run: the run finds it dead, it is removed and counted,
/// and the run is served by another container, with its right answer.
#[tokio::test]
async fn a_warm_container_killed_outside_is_not_used() {
    let d = docker("1");
    settled(&d).await;
    let pid = d.pid().expect("pid");
    for id in running(pid) {
        let killed = Command::new("docker")
            .args(["kill", &id])
            .status()
            .expect("docker kill");
        assert!(killed.success());
    }
    // The engine's word that the stream ended takes a moment to arrive (a
    // run in that moment would take the container and fail, unmarked).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let a = run(&d, "console.log(6 * 7)", 10_000).await;
    assert_eq!((a.stdout().as_str(), a.exit_code()), ("42\n", 0));
    let m = metrics_text(&d).await;
    assert!(
        m.lines()
            .any(|l| l == "plimsoll_warm_removed_total{reason=\"died\"} 1"
                || l == "plimsoll_warm_removed_total{reason=\"died\"} 2"),
        "{m}"
    );
}
