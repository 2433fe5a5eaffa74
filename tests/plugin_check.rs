//! `plimsoll plugin describe` and `plimsoll plugin check` through the real
//! CLI: the hostile fixture fails the rule each of its misbehaviours
//! breaks, by name, and the shipped adapters that need no hosted service
//! (docker on the real engine; remote-plimsoll against a real upstream
//! daemon) pass. The cloud adapters are checked against their fakes in
//! tests/compat.

use std::path::PathBuf;
use std::process::Command;

use plimsoll_tests::{Scratch, plugin_dir, test_plugin_dir, wasm_daemon};

fn cli() -> PathBuf {
    plimsoll_tests::plimsolld_path().with_file_name("plimsoll")
}

/// Runs the CLI with exactly `env` (plus PATH); its exit code and stdout.
fn plimsoll(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new(cli());
    cmd.env_clear().args(args);
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("running plimsoll");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn verdict(report: &str, rule: &str) -> Option<String> {
    report.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        let verdict = words.next()?;
        (words.next()? == rule).then(|| verdict.to_string())
    })
}

fn hostile_check(config: &str) -> (Option<i32>, String) {
    let s = Scratch::new("pcheck");
    let file = s.path("config.json");
    std::fs::write(&file, config).expect("write");
    let image = plimsoll_tests::sandbox_image();
    let hostile = test_plugin_dir().join("hostile.wasm");
    plimsoll(
        &[
            "plugin",
            "check",
            hostile.to_str().expect("utf-8 path"),
            "--config",
            file.to_str().expect("utf-8 path"),
        ],
        &[
            ("SANDBOX_PLUGIN_CONTAINER_ENGINE", "1"),
            ("SANDBOX_DOCKER_IMAGE", image.as_str()),
            ("SANDBOX_DOCKER_POOL", "0"),
            ("SANDBOX_PLUGIN_HTTP_ORIGINS", "http://127.0.0.1:9"),
        ],
    )
}

#[test]
fn the_hostile_plugin_fails_each_rule_it_breaks_by_name() {
    for (config, broken) in [
        (r#"{}"#, "describe"),
        (
            r#"{"config-test": "run:refuse-after-send"}"#,
            "not-dispatched",
        ),
        (
            r#"{"config-test": "run:http-token"}"#,
            "plain-http-credential",
        ),
        (r#"{"config-test": "run:loop"}"#, "deadline"),
    ] {
        let (code, report) = hostile_check(config);
        assert_eq!(code, Some(1), "{config}:\n{report}");
        assert_eq!(
            verdict(&report, broken).as_deref(),
            Some("FAIL"),
            "{config}:\n{report}"
        );
    }
    // Where it behaves, the rules say so: the checks can pass.
    let (_, report) = hostile_check(r#"{}"#);
    for rule in [
        "imports",
        "preflight",
        "not-dispatched",
        "plain-http-credential",
    ] {
        assert_eq!(verdict(&report, rule).as_deref(), Some("PASS"), "{report}");
    }
}

#[test]
fn the_docker_adapter_passes_on_the_real_engine() {
    // Checked under the name the daemon gives it (a built-in name, which
    // only the check allows).
    let s = Scratch::new("pcheck-docker");
    let file = s.path("docker.wasm");
    std::fs::copy(
        plimsoll_tests::target_dir()
            .join("wasm32-wasip2")
            .join("guest")
            .join("plimsoll_plugin_docker.wasm"),
        &file,
    )
    .expect("the docker adapter, built by make guest");
    let image = plimsoll_tests::sandbox_image();
    let (code, report) = plimsoll(
        &["plugin", "check", file.to_str().expect("utf-8 path")],
        &[
            ("SANDBOX_PLUGIN_CONTAINER_ENGINE", "1"),
            ("SANDBOX_DOCKER_IMAGE", image.as_str()),
            ("SANDBOX_PLUGIN_MAX_TIER", "vm"),
        ],
    );
    assert_eq!(code, Some(0), "{report}");
    for rule in ["run", "deadline", "cleanup"] {
        assert_eq!(verdict(&report, rule).as_deref(), Some("PASS"), "{report}");
    }
    assert!(
        report.contains("a trap right after its first capability use"),
        "{report}"
    );
}

#[test]
fn remote_plimsoll_passes_against_a_real_upstream() {
    let upstream = wasm_daemon();
    let origin = format!("http://{}", upstream.addr);
    let file = plugin_dir().join("remote-plimsoll.wasm");
    let (code, report) = plimsoll(
        &["plugin", "check", file.to_str().expect("utf-8 path")],
        &[("SANDBOX_PLUGIN_HTTP_ORIGINS", origin.as_str())],
    );
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(verdict(&report, "run").as_deref(), Some("PASS"), "{report}");
    assert_eq!(
        verdict(&report, "cleanup").as_deref(),
        Some("SKIP"),
        "{report}"
    );
}

#[test]
fn describe_lists_a_plugins_keys_without_running_anything() {
    let file = plugin_dir().join("e2b.wasm");
    let (code, out) = plimsoll(
        &["plugin", "describe", file.to_str().expect("utf-8 path")],
        &[],
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("plugin e2b"), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("key template")
            && l.contains("default \"base\"")
            && l.contains("changes what runs")),
        "{out}"
    );
    let (code, json) = plimsoll(
        &[
            "plugin",
            "describe",
            file.to_str().expect("utf-8 path"),
            "--json",
        ],
        &[],
    );
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(v["configKeys"][0]["key"], "template");
    assert_eq!(v["claimedTier"], "vm");
    // A file that is not a component is a usage error, not a verdict.
    let s = Scratch::new("pcheck-bad");
    let bad = s.path("bad.wasm");
    std::fs::write(&bad, b"not wasm").expect("write");
    let (code, _) = plimsoll(&["plugin", "describe", bad.to_str().unwrap()], &[]);
    assert_eq!(code, Some(2));
}
