//! The docker provider against the real engine, under runc and under runsc
//! (gVisor). Nothing here is faked: each test starts plimsolld with
//! `SANDBOX_PROVIDER=docker`, which verifies the runtime and the image and
//! runs its smoke test before it listens. A machine without a docker engine,
//! the guest image (`make image`) or runsc fails these tests.

use std::time::{Duration, Instant};

use base64::Engine as _;
use plimsoll_tests::canaries::{self, canary};
use plimsoll_tests::{Answer, Daemon, EngineRelay, RelayFaults, call, js_run};
use serde_json::{Value, json};

fn docker(runtime: &str, extra: &[(&str, &str)]) -> Daemon {
    let image = plimsoll_tests::sandbox_image();
    let mut env: Vec<(&str, &str)> = vec![
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_DOCKER_IMAGE", image.as_str()),
        ("SANDBOX_DOCKER_POOL", "1"),
    ];
    if !runtime.is_empty() {
        env.push(("SANDBOX_DOCKER_RUNTIME", runtime));
    }
    env.extend_from_slice(extra);
    Daemon::start(&env)
}

fn project(files: &[(&str, &str)], steps: &[&str], artifacts: &[&str]) -> Value {
    json!({
        "protocol": 4,
        "project": {
            "files": files.iter().map(|(p, c)| json!({"path": p, "content": c})).collect::<Vec<_>>(),
            "steps": steps,
            "artifacts": artifacts,
        }
    })
}

fn b64(v: &Value) -> String {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap_or(""))
        .expect("base64");
    String::from_utf8_lossy(&bytes).into_owned()
}

fn step_out(a: &Answer, i: usize) -> String {
    b64(&a.body["project"]["steps"][i]["stdout"])
}

/// Runs a snippet and returns its stdout, asserting it was answered.
async fn js(d: &Daemon, code: &str) -> Answer {
    let a = call(d, "Run", &js_run(code)).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    a
}

/// A snippet tagged with `trace`.
fn traced(code: &str, trace: &str) -> Value {
    let mut req = js_run(code);
    req["traceId"] = json!(trace);
    req
}

/// "Nothing ran" for the requests tagged `traces` (`canaries`): the
/// sentinel gets a budget a slow engine start cannot use up.
async fn assert_never_ran(d: &Daemon, traces: &[&str]) {
    canaries::assert_never_ran(d, traces, |tag| async move {
        let mut req = traced("0", &tag);
        req["timeoutMs"] = json!(20000);
        call(d, "Run", &req).await
    })
    .await;
}

/// After the daemon stops, nothing it created is left.
fn assert_no_leftovers(d: Daemon) {
    // Counted before the stopped daemon is reaped: until then no other
    // test's daemon can judge its containers orphaned and sweep one, so a
    // leak is seen (`Daemon::stop_then`).
    assert_eq!(
        d.stop_counting_leftovers(),
        0,
        "containers were left behind"
    );
}

#[tokio::test]
async fn runc_is_the_container_tier_and_runs_snippets_and_projects() {
    let d = docker("", &[]);
    let info = call(&d, "Describe", &json!({})).await;
    assert_eq!(info.body["sandbox"], "docker");
    assert_eq!(info.body["isolation"], "container");
    assert_eq!(info.body["supportsProject"], true);
    assert_eq!(
        info.body["projectEnvironment"]["languages"],
        json!(["javascript", "python"])
    );
    let env = info.body["javascriptEnvironment"]["identity"]
        .as_str()
        .expect("identity");
    // The image, then the plugin's pre-boot declaration (tests/preboot.rs
    // recomputes its digest).
    let (image, preboot) = env.split_once("+preboot:sha256:").expect("a declaration");
    assert_eq!(
        image,
        format!("docker-image:{}", plimsoll_tests::sandbox_image())
    );
    assert_eq!(preboot.len(), 64, "{preboot}");
    assert_eq!(info.body["resources"]["pids"], 256);
    // runc's version, as the engine reports it, is stated.
    let runtime = info.body["runtime"].as_str().expect("runtime stated");
    assert!(runtime.starts_with("runc "), "{runtime}");

    let a = js(
        &d,
        "console.log(process.getuid(), process.cwd()); console.error('e'); process.exitCode = 3",
    )
    .await;
    assert_eq!(a.stdout(), "61000 /work\n");
    assert_eq!(a.stderr(), "e\n");
    assert_eq!(a.exit_code(), 3);
    assert_eq!(a.body["isolation"], "container");
    assert_eq!(a.body["record"]["isolation"], "container");

    // The answer may come before the used container's removal, never
    // instead of it: the run's container is dead once answered, and soon
    // gone; what stays is the pools' warm containers, running: one for
    // snippets, one for projects.
    let pid = d.pid().expect("pid");
    let deadline = Instant::now() + Duration::from_secs(15);
    while (
        plimsoll_tests::containers_of(pid),
        plimsoll_tests::running_containers_of(pid),
    ) != (2, 2)
    {
        assert!(
            Instant::now() < deadline,
            "the run's container was not removed after its answer"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A floor above the evidence: refused, nothing ran.
    let floored = canary("floor");
    let mut req = traced("console.log('ran')", &floored);
    req["minimumIsolation"] = json!("kernel");
    let a = call(&d, "Run", &req).await;
    assert_eq!(a.mark(), Some("isolation"), "{:?}", a.body);
    assert_never_ran(&d, &[floored.as_str()]).await;

    // The deadline kills the whole container.
    let mut req = js_run("for(;;){}");
    req["timeoutMs"] = json!(1000);
    let t = Instant::now();
    let a = call(&d, "Run", &req).await;
    assert_eq!(a.body["javascript"]["timedOut"], true, "{:?}", a.body);
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());

    // Output is capped per stream, with the flag set.
    let a = js(&d, "process.stdout.write('x'.repeat(200000))").await;
    assert_eq!(a.stdout().len(), 64 << 10);
    assert_eq!(a.body["javascript"]["stdoutTruncated"], true);

    projects(&d).await;
    // The audit line of a project: sizes and outcome, never names or
    // contents.
    let deadline = Instant::now() + Duration::from_secs(10);
    let line =
        loop {
            if let Some(l) = d.log_lines().into_iter().find(|l| {
                l.contains("\"op\":\"project\"") && l.contains("PROJECT_OUTCOME_COMPLETED")
            }) {
                break l;
            }
            assert!(Instant::now() < deadline, "no project audit line");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
    assert!(
        line.contains("\"steps\":4") && line.contains("\"files\":1"),
        "{line}"
    );
    assert!(
        !line.contains("main.py") && !line.contains("range"),
        "{line}"
    );
    assert_no_leftovers(d);
}

/// Files, steps in order stopping at the first failure, artifacts, python,
/// and the outcomes a runner can report.
async fn projects(d: &Daemon) {
    let a = call(
        d,
        "Run",
        &project(
            &[(
                "src/main.py",
                "import sys\nprint(sum(range(10)))\nopen('out.txt','w').write('art')\n",
            )],
            &[
                "python3 src/main.py",
                "cat out.txt",
                "echo bad >&2; exit 7",
                "echo never",
            ],
            &["out.txt", "missing.txt"],
        ),
    )
    .await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    let p = &a.body["project"];
    assert_eq!(p["outcome"], "PROJECT_OUTCOME_COMPLETED", "{p:?}");
    assert_eq!(p["steps"].as_array().map(Vec::len), Some(3), "{p:?}");
    assert_eq!(step_out(&a, 0), "45\n");
    assert_eq!(step_out(&a, 1), "art");
    assert_eq!(p["steps"][2]["exitCode"], 7);
    assert_eq!(b64(&p["steps"][2]["stderr"]), "bad\n");
    assert_eq!(p["artifacts"].as_array().map(Vec::len), Some(1));
    assert_eq!(p["artifacts"][0]["path"], "out.txt");
    assert_eq!(b64(&p["artifacts"][0]["content"]), "art");

    // A file path that collides with a directory: refused by the runner
    // before any step.
    let a = call(
        d,
        "Run",
        &project(&[("a", "x"), ("a/b", "y")], &["echo never"], &[]),
    )
    .await;
    assert_eq!(
        a.body["project"]["outcome"], "PROJECT_OUTCOME_SETUP_FAILED",
        "{:?}",
        a.body
    );
    assert!(a.body["project"]["steps"].as_array().is_none());

    // The budget runs out inside a step: the earlier step stands.
    let mut req = project(&[], &["echo first", "sleep 30"], &[]);
    req["timeoutMs"] = json!(2000);
    let a = call(d, "Run", &req).await;
    let p = &a.body["project"];
    assert_eq!(p["outcome"], "PROJECT_OUTCOME_TIMED_OUT", "{:?}", a.body);
    assert_eq!(step_out(&a, 0), "first\n");
    assert_eq!(p["steps"][1]["timedOut"], true);
}

#[tokio::test]
async fn runsc_is_verified_as_the_kernel_tier() {
    let d = docker("runsc", &[]);
    let info = call(&d, "Describe", &json!({})).await;
    assert_eq!(info.body["isolation"], "kernel", "{:?}", info.body);
    // The gVisor release the kernel tier rests on is stated, and it is the
    // one the workload corpus was proven with or newer.
    let runtime = info.body["runtime"].as_str().expect("runtime stated");
    let release: u32 = runtime
        .strip_prefix("runsc 0.0~")
        .and_then(|v| v.get(..8))
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("{runtime}"));
    assert!(release >= 20_240_729, "{runtime}");
    let mut req = js_run("console.log(require('os').release())");
    req["minimumIsolation"] = json!("kernel");
    let a = call(&d, "Run", &req).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.body["record"]["isolation"], "kernel");
    // gVisor's own kernel answers, not the host's.
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    assert_ne!(a.stdout().trim(), host.trim(), "the host kernel answered");
    projects(&d).await;
    // The startup evidence names the runtime and every argument the engine
    // passes it.
    assert!(
        d.log_lines()
            .iter()
            .any(|l| l.contains(&format!("runtime {runtime} at"))
                && l.contains("--network=none")
                && l.contains("--host-uds=open")),
        "the runtime's arguments are not in the startup evidence"
    );
    assert_no_leftovers(d);
}

/// An engine that runs runsc with an argument outside the allowlist (here
/// a host network, as the engine reports it) does not get the kernel tier:
/// the daemon refuses to start and names the argument.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runsc_with_arguments_outside_the_allowlist_is_refused() {
    let path = std::env::temp_dir().join(format!("plimsoll-args-{}.sock", std::process::id()));
    let _relay = EngineRelay::start(
        &path,
        RelayFaults {
            rewrite: Some(("--network=none", "--network=host")),
            ..RelayFaults::default()
        },
    );
    let socket = path.display().to_string();
    let image = plimsoll_tests::sandbox_image();
    let (code, text) = tokio::task::spawn_blocking(move || {
        plimsoll_tests::run_to_exit(
            &[],
            &[
                ("SANDBOX_PROVIDER", "docker"),
                ("SANDBOX_DOCKER_RUNTIME", "runsc"),
                ("SANDBOX_DOCKER_IMAGE", image.as_str()),
                ("SANDBOX_DOCKER_SOCKET", socket.as_str()),
            ],
        )
    })
    .await
    .expect("join");
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("--network=host"), "{text}");
    assert!(!text.contains("plimsolld listening"), "{text}");
}

/// One deadline from before create: an engine slow to start a container
/// cannot stretch the container's life past its run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_is_gone_at_its_deadline_even_when_start_is_slow() {
    let path = std::env::temp_dir().join(format!("plimsoll-slow-{}.sock", std::process::id()));
    let socket = path.display().to_string();
    let _relay = EngineRelay::start(
        &path,
        RelayFaults {
            delay: Some(("/start HTTP/1.1", Duration::from_secs(4))),
            ..RelayFaults::default()
        },
    );
    let d = docker(
        "",
        &[
            ("SANDBOX_DOCKER_SOCKET", socket.as_str()),
            ("SANDBOX_DOCKER_POOL", "0"),
        ],
    );
    let pid = d.pid().expect("pid");
    let late = canary("slow-start");
    let mut req = traced("console.log('ran')", &late);
    req["timeoutMs"] = json!(2000);
    let t = Instant::now();
    let a = call(&d, "Run", &req).await;
    let answered = t.elapsed();
    assert!(
        answered < Duration::from_secs(3),
        "answered after {answered:?}"
    );
    // The start never finished inside the budget, so the gate never
    // opened: nothing ran, and the answer says so (a busy engine: capacity,
    // the same run may fit later).
    assert_ne!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.mark(), Some("capacity"), "{:?}", a.body);
    // And nothing of it is left by the time the engine gets round to the
    // delayed start.
    let gone = Instant::now() + Duration::from_secs(2);
    while plimsoll_tests::containers_of(pid) > 0 {
        assert!(Instant::now() < gone, "the container outlived its run");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "removal came too late"
    );
    // The daemon recorded no run under the refused request's trace (the
    // sentinel's own start waits out the relay's delay within its budget).
    assert_never_ran(&d, &[late.as_str()]).await;
    assert_no_leftovers(d);
}

#[tokio::test]
async fn hostile_code_is_contained_under_runc() {
    let d = docker("", &[]);
    hostile_corpus(&d, false).await;
    assert_no_leftovers(d);
}

#[tokio::test]
async fn hostile_code_is_contained_under_runsc() {
    let d = docker("runsc", &[]);
    hostile_corpus(&d, true).await;
    assert_no_leftovers(d);
}

/// Each attack runs for real and its containment is asserted from the
/// result; the daemon must serve normally afterwards.
async fn hostile_corpus(d: &Daemon, gvisor: bool) {
    // Write to the root filesystem: refused because it is read-only, not
    // merely because the guest uid may not. runc's kernel checks the mount
    // first and says EROFS; gVisor checks the uid first (EACCES), so there
    // the mount table must say the root is read-only too.
    let a = js(
        d,
        "for (const p of ['/x', '/etc/passwd', '/usr/local/bin/node']) { try { require('fs').writeFileSync(p, 'y'); console.log('WROTE', p) } catch (e) { console.log(e.code) } } const root = require('fs').readFileSync('/proc/self/mountinfo', 'utf8').split('\\n').map(l => l.split(' ')).find(f => f[4] === '/'); console.log('root', root[5].split(',').includes('ro') ? 'ro' : 'rw');",
    )
    .await;
    if gvisor {
        assert_eq!(
            a.stdout(),
            "EACCES\nEACCES\nEACCES\nroot ro\n",
            "{}",
            a.stderr()
        );
    } else {
        assert_eq!(
            a.stdout(),
            "EROFS\nEROFS\nEROFS\nroot ro\n",
            "{}",
            a.stderr()
        );
    }

    // The network: loopback is the only interface, and it works (so the
    // probe can see a connection), while an address off it has no route at
    // all (not merely no answer, which an offline host would give anyway).
    let a = js(
        d,
        "const net = require('net'); console.log('ifaces', Object.keys(require('os').networkInterfaces()).join(',')); const srv = net.createServer(c => c.end()).listen(0, '127.0.0.1', () => { const port = srv.address().port; net.connect(port, '127.0.0.1').on('connect', () => { console.log('loopback connected'); const s = net.connect({host: '10.0.0.1', port: 80, timeout: 2000}); s.on('connect', () => { console.log('OFF-HOST CONNECTED'); process.exit(0) }); s.on('error', e => { console.log('off-host', e.code); process.exit(0) }); s.on('timeout', () => { console.log('off-host timeout'); process.exit(0) }); }); });",
    )
    .await;
    let out = a.stdout();
    assert!(out.contains("ifaces lo\n"), "{out}");
    assert!(out.contains("loopback connected"), "{out}");
    // No route at all: runc's kernel says the network, gVisor the host.
    assert!(
        out.contains("off-host ENETUNREACH") || out.contains("off-host EHOSTUNREACH"),
        "{out}"
    );

    // Fork bomb: the process limit holds. Under runc the forks fail (the
    // shell reports it, or dies of it); under gVisor the sandbox is killed at
    // its host cgroup's limit. Either way the step ends and nothing more
    // than the limit ever ran.
    let mut req = project(
        &[],
        &[
            "i=0; while [ $i -lt 2000 ]; do sleep 20 & i=$((i+1)); done; echo spawned; ls /proc | grep -c '^[0-9]'",
        ],
        &[],
    );
    req["timeoutMs"] = json!(15000);
    let a = call(d, "Run", &req).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    let step = &a.body["project"]["steps"][0];
    let out = step_out(&a, 0);
    let stderr = b64(&step["stderr"]);
    // The limit was hit, not merely never approached: forks failed (runc),
    // or the sandbox was killed at its host cgroup's limit (gVisor).
    let forks_failed = stderr.contains("fork");
    let killed = gvisor && step["exitCode"] != 0 && !out.contains("spawned");
    assert!(
        forks_failed || killed,
        "the limit was never hit: {:?}",
        a.body
    );
    if let Some(n) = out
        .lines()
        .last()
        .and_then(|l| l.trim().parse::<u32>().ok())
    {
        assert!(n <= 260, "{n} processes ran under a limit of 256");
    }

    // Fill /tmp past its size: ENOSPC at 16 MiB.
    let a = call(
        d,
        "Run",
        &project(
            &[],
            &["dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>/dev/null; wc -c < /tmp/fill"],
            &[],
        ),
    )
    .await;
    let size: u64 = step_out(&a, 0).trim().parse().expect("a size");
    assert!(size <= 16 << 20, "/tmp took {size} bytes");

    // Other processes' /proc: the host's are not there, nor the daemon's.
    let a = js(
        d,
        "const ps = require('fs').readdirSync('/proc').filter(n => /^[0-9]+$/.test(n)); console.log(ps.length)",
    )
    .await;
    let n: u32 = a.stdout().trim().parse().expect("a count");
    assert!(n < 10, "{n} processes visible in /proc");

    // Setuid binaries and privileges: none to gain.
    let a = call(
        d,
        "Run",
        &project(
            &[],
            &["find / -xdev -perm /6000 -type f 2>/dev/null | wc -l; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status"],
            &[],
        ),
    )
    .await;
    let out = step_out(&a, 0);
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("0"), "setuid binaries: {out}");
    assert!(out.contains("0000000000000000"), "capabilities: {out}");
    if !gvisor {
        assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    }

    // The docker socket: not there to open. The probe's own last line shows
    // it ran to the end.
    let a = js(
        d,
        "const tries = ['/var/run/docker.sock', '/run/docker.sock'].map(p => new Promise(done => { const s = require('net').connect(p); s.on('connect', () => { console.log('OPENED', p); done() }); s.on('error', e => { console.log('no', e.code); done() }); })); Promise.all(tries).then(() => console.log('done'));",
    )
    .await;
    assert_eq!(a.stdout(), "no ENOENT\nno ENOENT\ndone\n", "{}", a.stderr());

    // And after all of it, the daemon serves.
    let a = js(d, "console.log('still here')").await;
    assert_eq!(a.stdout(), "still here\n");
    let r = plimsoll_tests::client()
        .get(d.url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(r.status().as_u16(), 200);
}

async fn readyz(d: &Daemon) -> u16 {
    plimsoll_tests::client()
        .get(d.url("/readyz"))
        .send()
        .await
        .map_or(0, |r| r.status().as_u16())
}

async fn wait_ready(d: &Daemon, want: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while readyz(d).await != want {
        assert!(Instant::now() < deadline, "readyz never became {want}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_repointed_tag_refuses_runs_until_it_points_back() {
    let tag = format!("plimsoll-test/repoint:{}", std::process::id());
    let retag = |image: &str| {
        let ok = std::process::Command::new("docker")
            .args(["tag", image, &tag])
            .status()
            .expect("docker tag")
            .success();
        assert!(ok, "docker tag");
    };
    retag(&plimsoll_tests::sandbox_image());
    let d = docker("", &[("SANDBOX_DOCKER_IMAGE", tag.as_str())]);
    assert_eq!(js(&d, "console.log(1)").await.stdout(), "1\n");

    retag(&plimsoll_tests::busybox_image());
    wait_ready(&d, 503).await;
    let repointed = canary("repointed");
    let a = call(&d, "Run", &traced("console.log('ran')", &repointed)).await;
    assert_eq!(a.mark(), Some("environment"), "{:?}", a.body);

    retag(&plimsoll_tests::sandbox_image());
    wait_ready(&d, 200).await;
    assert_eq!(js(&d, "console.log(2)").await.stdout(), "2\n");
    assert_never_ran(&d, &[repointed.as_str()]).await;
    assert_no_leftovers(d);
    let _ = std::process::Command::new("docker")
        .args(["rmi", &tag])
        .output();
}

/// Points `tag` at `image` in the engine.
fn tag_as(tag: &str, image: &str) {
    let ok = std::process::Command::new("docker")
        .args(["tag", image, tag])
        .status()
        .expect("docker tag")
        .success();
    assert!(ok, "docker tag {image} {tag}");
}

/// The end reason (`plimsoll.v1.SessionEnd` number) in a refusal's
/// `plimsoll.v1.SessionEnded` detail, if it has one.
fn session_end(a: &Answer) -> Option<u8> {
    let details = a.body.get("details")?.as_array()?;
    let d = details
        .iter()
        .find(|d| d["type"] == "plimsoll.v1.SessionEnded")?;
    let raw = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(d["value"].as_str()?)
        .ok()?;
    match raw.as_slice() {
        [0x08, n, ..] => Some(*n),
        _ => None,
    }
}

/// `SESSION_END_SANDBOX_CHANGED`.
const SANDBOX_CHANGED: u8 = 6;

/// A session's evidence is checked again before every call, not only at
/// open: once the tag the daemon was started with is re-pointed (the
/// provider is no longer ready), the next call is refused before it
/// reaches the session's container, marked `environment`, and the session
/// ends `sandbox_changed`. The container itself is untouched (it runs the
/// pinned image), so without the check the call would run there and
/// answer 200. Nothing ran: the session-call counter did not move, no
/// audit line carries the refused calls' traces once a later run's line
/// is in, and the session's container is removed.
#[tokio::test]
async fn a_session_call_is_refused_and_the_session_ended_when_its_evidence_no_longer_holds() {
    let tag = format!("plimsoll-test/repoint-session:{}", std::process::id());
    tag_as(&tag, &plimsoll_tests::sandbox_image());
    let d = docker(
        "",
        &[
            ("SANDBOX_DOCKER_IMAGE", tag.as_str()),
            ("SANDBOX_DOCKER_POOL", "0"),
            ("SANDBOX_MAX_SESSIONS", "1"),
        ],
    );
    let pid = d.pid().expect("pid");
    let opened = call(&d, "OpenSession", &json!({"protocol": 4})).await;
    assert_eq!(opened.status, 200, "{:?}", opened.body);
    let sid = opened.body["sessionId"]
        .as_str()
        .expect("a session ID")
        .to_string();
    let session_run = |code: &str, trace: &str| {
        json!({
            "protocol": 4,
            "sessionId": sid,
            "timeoutMs": 30000,
            "traceId": trace,
            "javascript": {"code": code},
        })
    };
    let a = call(
        &d,
        "SessionRun",
        &session_run("console.log('before')", &canary("session-before")),
    )
    .await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(b64(&a.body["run"]["javascript"]["stdout"]), "before\n");
    assert_eq!(
        canaries::metric(&d, "plimsoll_session_calls_total").await,
        1
    );

    tag_as(&tag, &plimsoll_tests::busybox_image());
    wait_ready(&d, 503).await;
    let refused = canary("session-refused");
    let a = call(
        &d,
        "SessionRun",
        &session_run("console.log('ran')", &refused),
    )
    .await;
    assert_eq!(
        (a.code(), a.mark()),
        ("failed_precondition", Some("environment")),
        "{:?}",
        a.body
    );
    assert_eq!(session_end(&a), Some(SANDBOX_CHANGED), "{:?}", a.body);
    // The counter is the daemon's own, read after the answer: no log lags
    // behind it.
    assert_eq!(
        canaries::metric(&d, "plimsoll_session_calls_total").await,
        1,
        "the refused call was dispatched to the session's container"
    );
    // The session is over: the next call is told how it ended.
    let after = canary("session-after");
    let a = call(&d, "SessionRun", &session_run("console.log('ran')", &after)).await;
    assert_eq!(a.code(), "failed_precondition", "{:?}", a.body);
    assert!(a.mark().is_some(), "{:?}", a.body);
    assert_eq!(session_end(&a), Some(SANDBOX_CHANGED), "{:?}", a.body);

    tag_as(&tag, &plimsoll_tests::sandbox_image());
    wait_ready(&d, 200).await;
    assert_never_ran(&d, &[refused.as_str(), after.as_str()]).await;
    assert_eq!(
        canaries::metric(&d, "plimsoll_session_calls_total").await,
        1
    );
    // The ended session's container goes (the sentinel's own run
    // container too, soon after its answer).
    let deadline = Instant::now() + Duration::from_secs(20);
    while plimsoll_tests::containers_of(pid) > 0 {
        assert!(
            Instant::now() < deadline,
            "the ended session's container was not removed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_no_leftovers(d);
    let _ = std::process::Command::new("docker")
        .args(["rmi", &tag])
        .output();
}

// Multi-threaded: the relay must serve the engine while this thread waits
// for the daemon to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_engine_refuses_runs_and_recovers_on_its_own() {
    let path = std::env::temp_dir().join(format!("plimsoll-relay-{}.sock", std::process::id()));
    let mut relay = EngineRelay::start(&path, RelayFaults::default());
    let socket = path.display().to_string();
    let mut d = docker("", &[("SANDBOX_DOCKER_SOCKET", socket.as_str())]);
    assert_eq!(js(&d, "console.log(1)").await.stdout(), "1\n");

    relay.cut();
    wait_ready(&d, 503).await;
    let cut = canary("engine-cut");
    let a = call(&d, "Run", &traced("console.log('ran')", &cut)).await;
    assert_eq!(a.mark(), Some("environment"), "{:?}", a.body);
    assert!(d.is_running());

    let _relay = EngineRelay::start(&path, RelayFaults::default());
    wait_ready(&d, 200).await;
    // The first run after recovery may find the pool still refilling; it
    // runs either way.
    assert_eq!(js(&d, "console.log(2)").await.stdout(), "2\n");
    assert_never_ran(&d, &[cut.as_str()]).await;
    assert_no_leftovers(d);
}

#[test]
fn startup_refuses_what_it_cannot_verify() {
    // An image that is not there.
    let (code, text) = plimsoll_tests::run_to_exit(
        &[],
        &[
            ("SANDBOX_PROVIDER", "docker"),
            ("SANDBOX_DOCKER_IMAGE", "plimsoll-test/no-such-image:1"),
        ],
    );
    assert_ne!(code, Some(0));
    assert!(text.contains("not in the engine"), "{text}");

    // An image without node or python: the smoke test fails, naming why.
    let busybox = plimsoll_tests::busybox_image();
    let (code, text) = plimsoll_tests::run_to_exit(
        &[],
        &[
            ("SANDBOX_PROVIDER", "docker"),
            ("SANDBOX_DOCKER_IMAGE", busybox.as_str()),
        ],
    );
    assert_ne!(code, Some(0));
    assert!(text.contains("smoke test"), "{text}");

    // A guest uid that is an account on this host (root's group 0 aside,
    // uid 1000+ is refused when present; 65534 is nobody on Debian).
    let (code, text) = plimsoll_tests::run_to_exit(
        &[],
        &[
            ("SANDBOX_PROVIDER", "docker"),
            ("SANDBOX_GUEST_UID", "65533"),
        ],
    );
    assert_ne!(code, Some(0));
    assert!(
        text.contains("/etc/passwd") || text.contains("/etc/group"),
        "{text}"
    );

    // A runtime plimsoll does not verify.
    let (code, text) = plimsoll_tests::run_to_exit(
        &[],
        &[
            ("SANDBOX_PROVIDER", "docker"),
            ("SANDBOX_DOCKER_RUNTIME", "kata"),
        ],
    );
    assert_ne!(code, Some(0));
    assert!(text.contains("SANDBOX_DOCKER_RUNTIME"), "{text}");
}

/// A runtime that answers statx with EINVAL, as Debian 12's runsc does,
/// breaks `ls -la` and `stat` in every sandbox: the daemon must refuse to
/// start, naming the command, rather than serve a tier where an agent's
/// first command fails. The runtime's behaviour is reproduced for real
/// under runc, with a seccomp profile (the shipped one, statx made to fail
/// with EINVAL) given through the operator's own setting.
#[test]
fn a_runtime_that_breaks_ls_is_refused_at_start() {
    let mut profile: Value =
        serde_json::from_str(include_str!("../plugins/docker/seccomp.json")).expect("profile");
    let rules = profile["syscalls"].as_array_mut().expect("syscalls");
    for rule in rules.iter_mut() {
        if let Some(names) = rule["names"].as_array_mut() {
            names.retain(|n| n != "statx");
        }
    }
    rules.push(json!({"names": ["statx"], "action": "SCMP_ACT_ERRNO", "errnoRet": 22}));
    let dir = plimsoll_tests::Scratch::new("statx-einval");
    let path = dir.path("statx-einval.json");
    std::fs::write(&path, profile.to_string()).expect("profile written");
    let image = plimsoll_tests::sandbox_image();
    let (code, text) = plimsoll_tests::run_to_exit(
        &[],
        &[
            ("SANDBOX_PROVIDER", "docker"),
            ("SANDBOX_DOCKER_IMAGE", image.as_str()),
            ("SANDBOX_DOCKER_SECCOMP", path.to_str().expect("utf-8 path")),
        ],
    );
    assert!(code.is_some_and(|c| c != 0), "{code:?}: {text}");
    assert!(text.contains("`ls -la` fails inside the sandbox"), "{text}");
}
