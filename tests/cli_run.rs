//! `plimsoll run` and `plimsoll describe`, run as a subprocess against a
//! real daemon: output in order, the run's exit code, the summary line,
//! `--json`, and the exit codes the CLI adds (125 refused and nothing ran,
//! 126 anything else). Also what the CLI does on this machine: no proxy
//! between it and the daemon, inputs read only when they are bounded
//! regular files, and artifacts written only as asked, never through a
//! symlink (against a stand-in daemon whose answer is crafted).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use plimsoll_tests::{Daemon, Scratch};
use serde_json::{Value, json};

fn cli() -> PathBuf {
    plimsoll_tests::plimsolld_path().with_file_name("plimsoll")
}

fn plimsoll(d: Option<&Daemon>, args: &[&str], token: Option<&str>) -> Output {
    let mut cmd = Command::new(cli());
    cmd.env_clear().args(args);
    if let Some(d) = d {
        cmd.env("PLIMSOLL_URL", d.url(""));
    }
    if let Some(t) = token {
        cmd.env("PLIMSOLL_TOKEN", t);
    }
    cmd.output().expect("running plimsoll")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn write(dir: &Path, name: &str, content: &str) -> String {
    let p = dir.join(name);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(&p, content).expect("write");
    p.display().to_string()
}

#[test]
fn a_file_runs_and_the_cli_exits_with_its_exit_code() {
    let d = plimsoll_tests::wasm_daemon();
    let s = Scratch::new("cli-run");
    let file = write(
        &s.0,
        "a.js",
        "console.log('hello', 6 * 7); console.error('to stderr'); throw new Error('boom')",
    );
    let out = plimsoll(Some(&d), &["run", &file], None);
    // An uncaught exception is exit 1 on wasm.
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hello 42\n");
    let err = text(&out.stderr);
    assert!(err.starts_with("to stderr\nUncaught Error: boom"), "{err}");
    // The summary: provider, tier, exit code, duration, the record digest.
    let summary = err.lines().last().expect("summary");
    assert!(
        summary.starts_with("plimsoll: wasm · process · exit 1 · "),
        "{summary}"
    );
    let digest = summary.rsplit("record ").next().expect("digest");
    assert!(
        digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "{summary}"
    );
}

#[test]
fn json_prints_the_answer_and_keeps_the_exit_code() {
    let d = plimsoll_tests::wasm_daemon();
    let s = Scratch::new("cli-json");
    let file = write(&s.0, "a.js", "console.log(1); throw 1");
    let out = plimsoll(Some(&d), &["run", "--json", &file], None);
    assert_eq!(out.status.code(), Some(1));
    let answer: Value = serde_json::from_slice(&out.stdout).expect("json on stdout");
    assert_eq!(answer["sandbox"], "wasm");
    assert_eq!(answer["javascript"]["exitCode"], 1);
    assert_eq!(
        answer["record"]["recordSha256"].as_str().map(str::len),
        Some(64)
    );
    let described = plimsoll(Some(&d), &["describe", "--json"], None);
    let info: Value = serde_json::from_slice(&described.stdout).expect("describe json");
    assert_eq!(info["isolation"], "process");
    let plain = plimsoll(Some(&d), &["describe"], None);
    assert_eq!(text(&plain.stdout), "provider wasm · isolation process\n");
}

#[test]
fn a_refusal_exits_125_and_names_its_reason() {
    let d = plimsoll_tests::wasm_daemon();
    let s = Scratch::new("cli-refused");
    let file = write(&s.0, "a.js", "console.log('never')");
    let out = plimsoll(Some(&d), &["run", "--floor", "vm", &file], None);
    assert_eq!(out.status.code(), Some(125));
    assert!(out.stdout.is_empty());
    assert!(
        text(&out.stderr).contains("refused, nothing ran (isolation)"),
        "{}",
        text(&out.stderr)
    );
    // A project on wasm: unsupported, also marked.
    write(&s.0, "p/x.txt", "x");
    let dir = s.path("p").display().to_string();
    let out = plimsoll(
        Some(&d),
        &["run", "--project", &dir, "--step", "cat x.txt"],
        None,
    );
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("(unsupported)"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_timeout_exits_124_and_says_so() {
    let d = plimsoll_tests::wasm_daemon();
    let s = Scratch::new("cli-timeout");
    let file = write(&s.0, "a.js", "console.log('started'); while (true) {}");
    let out = plimsoll(Some(&d), &["run", "--timeout", "1s", &file], None);
    assert_eq!(out.status.code(), Some(124));
    assert_eq!(text(&out.stdout), "started\n");
    assert!(
        text(&out.stderr).contains(" · timed out · "),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn without_an_answer_it_exits_126_and_without_a_token_125() {
    let s = Scratch::new("cli-unknown");
    let file = write(&s.0, "a.js", "console.log(1)");
    // Nothing listens there.
    let mut cmd = Command::new(cli());
    let out = cmd
        .env_clear()
        .env("PLIMSOLL_URL", "http://127.0.0.1:9")
        .args(["run", &file])
        .output()
        .expect("plimsoll");
    assert_eq!(out.status.code(), Some(126));
    assert!(
        text(&out.stderr).contains("it may have run"),
        "{}",
        text(&out.stderr)
    );
    // A daemon with callers, asked without a token: refused before the
    // body was read, which the daemon marks (`permission`), so 125.
    let callers = s.path("callers.json");
    let created = Command::new(cli())
        .args(["callers", "create", "--file"])
        .arg(&callers)
        .args(["--id", "cli"])
        .output()
        .expect("callers create");
    let token = text(&created.stdout).trim().to_string();
    let f = callers.display().to_string();
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_CLIENTS_FILE", f.as_str()),
    ]);
    let out = plimsoll(Some(&d), &["run", &file], None);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("permission"),
        "{}",
        text(&out.stderr)
    );
    let out = plimsoll(Some(&d), &["run", &file], Some(&token));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains(&token));
}

#[test]
fn bad_arguments_exit_2_before_anything_is_sent() {
    let s = Scratch::new("cli-usage");
    let file = write(&s.0, "a.js", "console.log(1)");
    for args in [
        vec!["run", "--floor", "strong", file.as_str()],
        vec!["run", "--timeout", "soon", file.as_str()],
        vec!["run", "/no/such/file.js"],
        vec!["run"],
        vec!["describe", "--url", "ftp://x"],
    ] {
        let out = plimsoll(None, &args, None);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    // A token is never sent in clear off this machine.
    let out = Command::new(cli())
        .env_clear()
        .env("PLIMSOLL_URL", "http://192.0.2.1:8746")
        .env("PLIMSOLL_TOKEN", "secret-token-canary")
        .args(["run", &file])
        .output()
        .expect("plimsoll");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("plain http off this machine"));
    assert!(!text(&out.stderr).contains("secret-token-canary"));
}

#[test]
fn a_project_runs_its_steps_in_order_and_writes_its_artifacts() {
    let image = plimsoll_tests::sandbox_image();
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_DOCKER_IMAGE", image.as_str()),
        ("SANDBOX_DOCKER_POOL", "0"),
    ]);
    let s = Scratch::new("cli-project");
    write(&s.0, "p/src/in.txt", "payload\n");
    let dir = s.path("p").display().to_string();
    let out_dir = s.path("out").display().to_string();
    let out = plimsoll(
        Some(&d),
        &[
            "run",
            "--project",
            &dir,
            "--step",
            "cp src/in.txt out.txt && echo one",
            "--step",
            "echo two >&2; exit 4",
            "--artifact",
            "out.txt",
            "--out",
            &out_dir,
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "one\n");
    let err = text(&out.stderr);
    assert!(
        err.contains("$ cp src/in.txt out.txt && echo one\n$ echo two >&2; exit 4\ntwo\n"),
        "{err}"
    );
    assert!(
        err.lines()
            .last()
            .expect("summary")
            .contains(" · container · exit 4 · "),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(s.path("out/out.txt")).expect("artifact"),
        "payload\n"
    );
}

#[test]
fn on_a_terminal_a_slow_run_shows_it_is_waiting_and_clears_the_line() {
    let d = plimsoll_tests::wasm_daemon();
    let s = Scratch::new("cli-tty");
    let file = write(
        &s.0,
        "a.js",
        "const t = Date.now(); while (Date.now() - t < 2500) {} console.log('done')",
    );
    // `script` gives the command a terminal; its output is the terminal's.
    let command = format!("{} run --timeout 10s {file}", cli().display());
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env_clear()
        .env("PLIMSOLL_URL", d.url(""))
        .output()
        .expect("script");
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(shown.contains("\rplimsoll: running… 1 s"), "{shown:?}");
    assert!(shown.contains("\r\x1b[Kdone"), "{shown:?}");
    // Not a terminal: no progress at all (every other test here).
    let plain = plimsoll(Some(&d), &["run", "--timeout", "10s", &file], None);
    assert_eq!(text(&plain.stdout), "done\n");
    assert!(!text(&plain.stderr).contains("running…"));
}

#[test]
fn output_is_printed_as_the_run_writes_it() {
    use std::io::Read;
    let d = plimsoll_tests::wasm_daemon();
    let s = Scratch::new("cli-stream");
    // Prints, then keeps running for two seconds before printing again,
    // with the time (this machine's clock, in ms) it printed that.
    let file = write(
        &s.0,
        "slow.js",
        "console.log('first'); let t = Date.now(); while (Date.now() - t < 2000) {} console.log('second ' + Date.now())",
    );
    let mut child = Command::new(cli())
        .env_clear()
        .env("PLIMSOLL_URL", d.url(""))
        .args(["run", &file])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running plimsoll");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut first = [0u8; 6];
    stdout.read_exact(&mut first).expect("the first line");
    let first_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("the rest");
    let status = child.wait().expect("exit");
    assert_eq!(&first, b"first\n");
    let second_at: u128 = rest
        .strip_prefix("second ")
        .and_then(|r| r.strip_suffix('\n'))
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("printed once, not again from the answer: {rest:?}"));
    assert_eq!(status.code(), Some(0));
    // In the order things happened, not a time bound: the first line was
    // read here before the run printed its last, so it was printed while
    // the run ran (the answer comes only after that last line).
    assert!(
        first_at < second_at,
        "the first line arrived only with the answer (read at {first_at} ms, the run's last line printed at {second_at} ms)"
    );
}

/// Where nothing listens: a CLI that sent anything would exit 126.
const NOWHERE: &str = "http://127.0.0.1:9";

/// A loopback listener that counts every connection and drops it at once:
/// a proxy that must never be used.
fn recording_proxy() -> (String, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            counter.fetch_add(1, Ordering::SeqCst);
            drop(conn);
        }
    });
    (format!("http://{addr}"), hits)
}

/// Runs `cmd` to its exit with stdin closed; panics (after killing it) if
/// it is still running after `limit`.
fn exits_within(cmd: &mut Command, limit: Duration) -> Output {
    exits_within_fed(cmd, b"", limit)
}

/// The same, with `input` on its stdin before it is closed.
fn exits_within_fed(cmd: &mut Command, input: &[u8], limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    {
        let mut stdin = child.stdin.take().expect("stdin");
        // A program that exits without reading leaves a broken pipe.
        let _ = stdin.write_all(input);
    }
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!("still running after {limit:?}: {}", text(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `plimsoll run ARGS` against nowhere, with at most 1 GiB of address
/// space (so a CLI that tried to hold a huge input fails instead of eating
/// the machine) and 20 s.
fn run_bounded(args: &[&str]) -> Output {
    let mut cmd = Command::new("sh");
    cmd.env_clear()
        .env("PLIMSOLL_URL", NOWHERE)
        .arg("-c")
        .arg("ulimit -v 1048576 && exec \"$0\" run \"$@\"")
        .arg(cli())
        .args(args);
    exits_within(&mut cmd, Duration::from_secs(20))
}

#[test]
fn the_cli_never_sends_through_a_proxy() {
    let d = plimsoll_tests::wasm_daemon();
    let (proxy, hits) = recording_proxy();
    let s = Scratch::new("cli-proxy");
    let file = write(&s.0, "a.js", "console.log('direct')");
    let with_proxy = |args: &[&str]| {
        let mut cmd = Command::new(cli());
        cmd.env_clear().env("PLIMSOLL_URL", d.url("")).args(args);
        for (k, v) in plimsoll_tests::proxy_env(&proxy) {
            cmd.env(k, v);
        }
        cmd
    };
    let out = exits_within(&mut with_proxy(&["run", &file]), Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "direct\n");
    let out = exits_within(
        &mut with_proxy(&["run", "--json", &file]),
        Duration::from_secs(60),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = exits_within(&mut with_proxy(&["describe"]), Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "provider wasm · isolation process\n");
    // The MCP bridge: one initialize, then stdin closes.
    let hello = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "cli-proxy-test", "version": "0"}}});
    let out = exits_within_fed(
        &mut with_proxy(&["mcp"]),
        format!("{hello}\n").as_bytes(),
        Duration::from_secs(60),
    );
    let answered = text(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .any(|m| m["id"] == 1 && m["result"].is_object());
    assert!(
        answered,
        "stdout {} stderr {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "a request went to the proxy"
    );
}

#[test]
fn an_input_that_is_not_a_bounded_regular_file_is_refused_at_once() {
    let s = Scratch::new("cli-input");
    // A device that never ends.
    let out = run_bounded(&["/dev/zero"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not a regular file"),
        "{}",
        text(&out.stderr)
    );
    // A FIFO nobody writes to: opening it for reading would wait forever.
    let fifo = s.path("pipe.js");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let out = run_bounded(&[&fifo.display().to_string()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not a regular file"),
        "{}",
        text(&out.stderr)
    );
    // A directory.
    let out = run_bounded(&[&s.0.display().to_string()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    // A regular file one byte over the API's bound for a snippet, and a
    // sparse one of 4 GiB: refused by size, having read at most the bound.
    let over = s.path("over.js");
    std::fs::write(&over, vec![b'x'; (256 << 10) + 1]).expect("write");
    let sparse = s.path("sparse.js");
    std::fs::File::create(&sparse)
        .and_then(|f| f.set_len(4 << 30))
        .expect("sparse file");
    for big in [&over, &sparse] {
        let out = run_bounded(&[&big.display().to_string()]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("larger than the 256 KiB the daemon accepts"),
            "{}",
            text(&out.stderr)
        );
    }
    // At the bound exactly, the file is read and sent (nothing listens).
    std::fs::write(&over, vec![b'x'; 256 << 10]).expect("write");
    let out = run_against(NOWHERE, &["run", &over.display().to_string()]);
    assert_eq!(out.status.code(), Some(126), "{}", text(&out.stderr));
}

/// A stand-in daemon: answers every `RunStream` with `answer` (one result
/// message, then the end of the stream) and keeps each request's message.
fn fake_daemon(rt: &tokio::runtime::Runtime, answer: Value) -> (String, Arc<Mutex<Vec<Value>>>) {
    let frame = |flags: u8, message: &Value| {
        let bytes = serde_json::to_vec(message).expect("json");
        let mut framed = vec![flags];
        framed.extend_from_slice(&u32::try_from(bytes.len()).expect("len").to_be_bytes());
        framed.extend_from_slice(&bytes);
        framed
    };
    let mut reply = frame(0, &json!({"result": answer}));
    reply.extend(frame(2, &json!({})));
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let kept = seen.clone();
    let app = axum::Router::new().route(
        "/plimsoll.v1.SandboxService/RunStream",
        axum::routing::post(move |body: axum::body::Bytes| {
            let reply = reply.clone();
            let kept = kept.clone();
            async move {
                if let Some(message) = body.get(5..) {
                    let request = serde_json::from_slice(message).unwrap_or(Value::Null);
                    kept.lock().expect("lock").push(request);
                }
                (
                    [(axum::http::header::CONTENT_TYPE, "application/connect+json")],
                    reply,
                )
            }
        }),
    );
    (rt.block_on(plimsoll_tests::serve_loopback(app)), seen)
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A project answer carrying, besides what the test asks for (`out.txt`,
/// `nested/deep.txt`), a git hook, a path out of the directory and a
/// second body for `out.txt`.
fn answer_with_extra_artifacts() -> Value {
    json!({
        "sandbox": "fake",
        "isolation": "container",
        "durationMs": "1",
        "record": {"recordSha256": "0".repeat(64)},
        "project": {
            "steps": [{"command": "make", "stdout": "", "stderr": "", "exitCode": 0}],
            "outcome": "PROJECT_OUTCOME_COMPLETED",
            "artifacts": [
                {"path": ".git/hooks/pre-commit", "content": b64("#!/bin/sh\necho planted\n")},
                {"path": "out.txt", "content": b64("fresh\n")},
                {"path": "nested/deep.txt", "content": b64("deep\n")},
                {"path": "../escape.txt", "content": b64("escaped\n")},
                {"path": "out.txt", "content": b64("second body\n")},
            ],
            "artifactsTruncated": false,
        },
    })
}

fn run_against(url: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(cli());
    cmd.env_clear().env("PLIMSOLL_URL", url).args(args);
    exits_within(&mut cmd, Duration::from_secs(60))
}

#[test]
fn only_the_artifacts_asked_for_are_written_and_never_through_a_symlink() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (url, _) = fake_daemon(&rt, answer_with_extra_artifacts());
    let s = Scratch::new("cli-artifacts");
    write(&s.0, "p/Makefile", "all:\n");
    let project = s.path("p").display().to_string();
    let victim = s.path("outside/victim.txt");
    write(&s.0, "outside/victim.txt", "original\n");
    // The output directory already holds a link where out.txt goes.
    let out_dir = s.path("out");
    std::fs::create_dir(&out_dir).expect("out");
    std::os::unix::fs::symlink(&victim, out_dir.join("out.txt")).expect("symlink");
    let out_arg = out_dir.display().to_string();
    let out = run_against(
        &url,
        &[
            "run",
            "--project",
            &project,
            "--step",
            "make",
            "--artifact",
            "out.txt",
            "--artifact",
            "nested/deep.txt",
            "--out",
            &out_arg,
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "original\n",
        "written through the symlink"
    );
    let written = out_dir.join("out.txt");
    assert!(
        std::fs::symlink_metadata(&written)
            .expect("out.txt")
            .is_file(),
        "the link was not replaced by a file"
    );
    assert_eq!(
        std::fs::read_to_string(&written).expect("out.txt"),
        "fresh\n"
    );
    assert_eq!(
        std::fs::read_to_string(out_dir.join("nested/deep.txt")).expect("deep"),
        "deep\n"
    );
    assert!(
        !out_dir.join(".git").exists(),
        "an artifact nobody asked for"
    );
    assert!(!s.path("escape.txt").exists());
    assert!(err.contains("ignored 3 artifact(s)"), "{err}");
    assert!(!err.contains("pre-commit"), "{err}");
    // No temporary file is left beside the artifacts.
    let names: Vec<String> = std::fs::read_dir(&out_dir)
        .expect("out")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| n == "out.txt" || n == "nested"),
        "{names:?}"
    );

    // A directory on the way that is a link out is refused, not followed.
    let out_dir = s.path("out2");
    std::fs::create_dir(&out_dir).expect("out2");
    std::os::unix::fs::symlink(s.path("outside"), out_dir.join("nested")).expect("symlink");
    let out_arg = out_dir.display().to_string();
    let out = run_against(
        &url,
        &[
            "run",
            "--project",
            &project,
            "--step",
            "make",
            "--artifact",
            "nested/deep.txt",
            "--out",
            &out_arg,
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(126), "{err}");
    assert!(err.contains("nested/deep.txt"), "{err}");
    assert!(
        !s.path("outside/deep.txt").exists(),
        "written through the link"
    );
    assert!(
        !out_dir.join("out.txt").exists(),
        "an artifact nobody asked for"
    );
}

#[test]
fn artifact_names_that_could_leave_the_output_directory_are_refused_before_sending() {
    let s = Scratch::new("cli-artifact-names");
    write(&s.0, "p/a.txt", "a");
    let project = s.path("p").display().to_string();
    for bad in [
        vec!["../x"],
        vec!["/etc/passwd"],
        vec!["a/../../x"],
        vec!["./x"],
        vec!["a//b"],
        vec!["x", "x"],
    ] {
        let mut args = vec!["run", "--project", project.as_str(), "--step", "true"];
        for a in &bad {
            args.extend(["--artifact", *a]);
        }
        let out = run_against(NOWHERE, &args);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out.stderr));
    }
}

#[test]
fn a_project_is_read_without_following_links_or_opening_pipes() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut answer = answer_with_extra_artifacts();
    answer["project"]["artifacts"] = json!([]);
    let (url, seen) = fake_daemon(&rt, answer);
    let s = Scratch::new("cli-project-read");
    write(&s.0, "secret.txt", "outside the project\n");
    write(&s.0, "p/a.txt", "a\n");
    write(&s.0, "p/sub/b.txt", "b\n");
    let project = s.path("p");
    std::os::unix::fs::symlink(s.path("secret.txt"), project.join("link.txt")).expect("link");
    std::os::unix::fs::symlink(&s.0, project.join("up")).expect("dir link");
    let made = Command::new("mkfifo")
        .arg(project.join("pipe"))
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let project_arg = project.display().to_string();
    let out = run_against(&url, &["run", "--project", &project_arg, "--step", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let sent = seen.lock().expect("lock").pop().expect("a request");
    let mut paths: Vec<&str> = sent["project"]["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| f["path"].as_str().unwrap_or(""))
        .collect();
    paths.sort_unstable();
    assert_eq!(paths, ["a.txt", "sub/b.txt"]);
    assert!(!sent.to_string().contains("outside the project"));

    // A path longer than the API takes is refused here, before sending.
    let mut deep = project.clone();
    for c in ["d", "e", "f", "g", "h"] {
        deep.push(c.repeat(250));
    }
    std::fs::create_dir_all(&deep).expect("deep");
    std::fs::write(deep.join("x.txt"), "x").expect("deep file");
    let out = run_against(
        NOWHERE,
        &["run", "--project", &project_arg, "--step", "true"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("longer than the 1024 bytes"),
        "{}",
        text(&out.stderr)
    );
}

/// An answer whose words carry terminal escapes or a bidirectional
/// override cannot rewrite the summary line: the tier shown is the one the
/// answer states, every control character replaced.
#[test]
fn an_answers_words_cannot_rewrite_the_summary_line() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut answer = answer_with_extra_artifacts();
    answer["sandbox"] = json!("fake\u{1b}[2K\r\u{1b}[32mplimsoll: vm \u{202e}");
    let (url, _) = fake_daemon(&rt, answer);
    let s = Scratch::new("cli-escapes");
    write(&s.0, "p/Makefile", "all:\n");
    let project = s.path("p").display().to_string();
    // An --out of its own: nothing is asked for, and a CLI that wrote the
    // answer's artifacts anyway must not litter the working directory.
    let out_dir = s.path("out").display().to_string();
    let out = run_against(
        &url,
        &[
            "run",
            "--project",
            &project,
            "--step",
            "make",
            "--out",
            &out_dir,
        ],
    );
    let err = text(&out.stderr);
    let summary = err
        .lines()
        .find(|l| l.contains(" · exit "))
        .unwrap_or_else(|| panic!("no summary line in {err:?}"));
    assert!(
        !summary.chars().any(|c| c.is_control() || c == '\u{202e}'),
        "{summary:?}"
    );
    assert!(summary.contains(" · container · "), "{summary:?}");
}

/// A daemon older than `RunStream` answers it as it answers any path it
/// does not serve (404, marked unsupported: nothing ran), and the command
/// asks `Run` instead. A 404 that carries no mark is not that answer: the
/// command does not run the code a second time on a guess.
#[test]
fn a_daemon_without_run_stream_is_asked_with_run() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let s = Scratch::new("cli-no-stream");
    let file = write(&s.0, "a.js", "console.log('hi')");
    for marked in [true, false] {
        let (url, runs) = daemon_without_stream(&rt, marked);
        let out = run_against(&url, &["run", &file]);
        if marked {
            assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
            assert_eq!(text(&out.stdout), "hi\n");
            assert_eq!(runs.load(Ordering::SeqCst), 1);
        } else {
            assert_ne!(out.status.code(), Some(0), "{}", text(&out.stderr));
            assert_eq!(runs.load(Ordering::SeqCst), 0, "asked again on a guess");
        }
    }
}

/// A stand-in for a daemon without `RunStream`: `Run` answers a snippet
/// that printed "hi" (and is counted); every other path gets a 404, with
/// the not-dispatched mark plimsolld puts on it when `marked`.
fn daemon_without_stream(rt: &tokio::runtime::Runtime, marked: bool) -> (String, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let answer = json!({
        "sandbox": "fake",
        "isolation": "process",
        "durationMs": "1",
        "record": {"recordSha256": "0".repeat(64)},
        "javascript": {"stdout": b64("hi\n"), "stderr": "", "exitCode": 0},
    });
    let app = axum::Router::new()
        .route(
            "/plimsoll.v1.SandboxService/Run",
            axum::routing::post(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                let answer = answer.clone();
                async move { axum::Json(answer) }
            }),
        )
        .fallback(move || async move {
            let mut error =
                json!({"code": "unimplemented", "message": "no such procedure or path"});
            if marked {
                error["details"] = json!([{"type": "plimsoll.v1.NotDispatched", "value": "CAQ"}]);
            }
            (axum::http::StatusCode::NOT_FOUND, axum::Json(error))
        });
    (rt.block_on(plimsoll_tests::serve_loopback(app)), runs)
}
