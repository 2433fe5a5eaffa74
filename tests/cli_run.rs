//! `plimsoll run` and `plimsoll describe`, run as a subprocess against a
//! real daemon: output in order, the run's exit code, the summary line,
//! `--json`, and the exit codes the CLI adds (125 refused and nothing ran,
//! 126 anything else).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use plimsoll_tests::{Daemon, Scratch};
use serde_json::Value;

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
fn without_an_answer_or_a_token_it_exits_126() {
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
    // A daemon with callers, asked without a token: unauthenticated, which
    // the daemon does not mark, so 126 too.
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
    assert_eq!(out.status.code(), Some(126));
    assert!(
        text(&out.stderr).contains("unauthenticated"),
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
    use std::time::{Duration, Instant};
    let d = plimsoll_tests::wasm_daemon();
    let s = Scratch::new("cli-stream");
    // Prints, then keeps running for over a second before printing again.
    let file = write(
        &s.0,
        "slow.js",
        "console.log('first'); let t = Date.now(); while (Date.now() - t < 1200) {} console.log('second')",
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
    let began = Instant::now();
    let mut first = [0u8; 6];
    stdout.read_exact(&mut first).expect("the first line");
    let first_at = began.elapsed();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("the rest");
    let ended_at = began.elapsed();
    let status = child.wait().expect("exit");
    assert_eq!(&first, b"first\n");
    assert_eq!(rest, "second\n", "printed once, not again from the answer");
    assert_eq!(status.code(), Some(0));
    assert!(
        ended_at - first_at > Duration::from_millis(800),
        "the first line arrived only with the answer ({first_at:?} then {ended_at:?})"
    );
}
