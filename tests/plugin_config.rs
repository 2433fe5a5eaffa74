//! A plugin's configuration (SANDBOX_PLUGIN_CONFIG_FILE, read through
//! wasi:config/store) through the real daemon: every problem listed at
//! start and nothing served, the plugin's misuses refused (undeclared
//! reads, late or over-budget declarations), and the values that change
//! what runs named in the provider's evidence, so a client pinned to the
//! old environment sees the change.

use plimsoll_tests::{Daemon, Scratch, call, plugin_dir, run_to_exit, test_plugin_dir};
use serde_json::json;
use sha2::{Digest, Sha256};

/// No request leaves during describe or the hostile plugin's preflight;
/// the origin only satisfies the grant its imports need.
const ORIGIN: &str = "http://127.0.0.1:9";

fn hostile_env<'a>(dir: &'a str, image: &'a str, config: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("SANDBOX_PROVIDER", "hostile"),
        ("PLIMSOLL_PLUGIN_DIR", dir),
        ("SANDBOX_PLUGIN_HTTP_ORIGINS", ORIGIN),
        ("SANDBOX_PLUGIN_CONTAINER_ENGINE", "1"),
        ("SANDBOX_DOCKER_IMAGE", image),
        ("SANDBOX_DOCKER_POOL", "0"),
        ("SANDBOX_MEMORY_MB", "64"),
        ("SANDBOX_PLUGIN_CONFIG_FILE", config),
        // For `run_to_exit`, which keeps the default address.
        ("PLIMSOLL_ADDR", "127.0.0.1:0"),
    ]
}

/// Runs the hostile plugin with `json` as its configuration: the exit code
/// and output of a start that fails, or the running daemon.
fn with_config(scratch: &Scratch, json: &str) -> Result<Daemon, (Option<i32>, String)> {
    let file = scratch.path("config.json");
    std::fs::write(&file, json).expect("write config");
    let dir = test_plugin_dir().display().to_string();
    let image = plimsoll_tests::sandbox_image();
    let file = file.display().to_string();
    let env = hostile_env(&dir, &image, &file);
    Daemon::try_start(&env).map_err(|_| {
        let (code, text) = run_to_exit(&[], &env);
        (code, unescaped(&text))
    })
}

/// The log's JSON lines as plain text (each field's value), so an error's
/// quotes and line breaks read as the operator sees them.
fn unescaped(log: &str) -> String {
    log.lines()
        .map(|l| match serde_json::from_str::<serde_json::Value>(l) {
            Ok(serde_json::Value::Object(fields)) => fields
                .values()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect::<Vec<_>>()
                .join(" "),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn probe(d: &Daemon, fact: &str) -> Option<String> {
    let needle = format!("config probe: {fact}=");
    d.log_lines().iter().rev().find_map(|l| {
        let at = l.find(&needle)? + needle.len();
        Some(
            l[at..]
                .split(|c: char| c == '"' || c.is_whitespace())
                .next()
                .unwrap_or("")
                .to_string(),
        )
    })
}

async fn identity(d: &Daemon) -> String {
    let info = call(d, "Describe", &json!({})).await;
    info.body["javascriptEnvironment"]["identity"]
        .as_str()
        .expect("identity")
        .to_string()
}

#[test]
fn every_problem_is_listed_at_start_and_nothing_serves() {
    let s = Scratch::new("pcfg-all");
    let (code, text) = with_config(
        &s,
        r#"{"config-test": "all", "nonsense": "1", "flavour": "spicy"}"#,
    )
    .err()
    .expect("the daemon must not start");
    assert_ne!(code, Some(0), "{text}");
    for needle in [
        "has 3 problem(s)",
        r#"unknown key "nonsense" (this plugin reads: config-test, flavour, needed)"#,
        r#"missing required key "needed""#,
        r#"refused the value of "flavour": hostile refuses every flavour"#,
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
}

#[test]
fn a_malformed_file_is_a_configuration_error() {
    let s = Scratch::new("pcfg-file");
    for (json, why) in [
        (r#"{"flavour": "a", "flavour": "b"}"#, "appears twice"),
        (r#"{"flavour": 1}"#, "must be a string"),
        (r#"{"flavour": "a"} trailing"#, "trailing data"),
    ] {
        let (code, text) = with_config(&s, json).err().expect("refused");
        assert_eq!(code, Some(2), "{json}: {text}");
        assert!(
            text.contains("SANDBOX_PLUGIN_CONFIG_FILE") && text.contains(why),
            "{json}: {text}"
        );
    }
    // A configuration file needs a plugin provider to read it.
    let file = s.path("config.json");
    std::fs::write(&file, "{}").expect("write");
    let file = file.display().to_string();
    let (code, text) = run_to_exit(
        &[],
        &[
            ("SANDBOX_PROVIDER", "wasm"),
            ("SANDBOX_PLUGIN_CONFIG_FILE", file.as_str()),
        ],
    );
    assert_eq!(code, Some(2), "{text}");
}

#[test]
fn declarations_over_budget_are_refused() {
    let s = Scratch::new("pcfg-budget");
    for (test, needle) in [
        ("many", "declared more than 64 keys"),
        ("huge-key", "malformed key"),
        ("bad-meaning", "must be one line"),
    ] {
        let (code, text) = with_config(&s, &format!(r#"{{"config-test": "{test}"}}"#))
            .err()
            .expect("refused");
        assert_ne!(code, Some(0), "{test}: {text}");
        assert!(text.contains(needle), "{test}: {needle:?} not in:\n{text}");
    }
    // The probes the plugin logged before it was refused: 62 of its 70
    // extra keys fit beside its own two, and the rest were answered false.
    let (_, text) = with_config(&s, r#"{"config-test": "many"}"#)
        .err()
        .expect("refused");
    assert!(text.contains("config probe: accepted=62"), "{text}");
    let (_, text) = with_config(&s, r#"{"config-test": "huge-key"}"#)
        .err()
        .expect("refused");
    assert!(text.contains("config probe: huge-key=false"), "{text}");
}

#[tokio::test]
async fn a_plugin_reads_only_what_it_declared_and_only_while_describing() {
    let s = Scratch::new("pcfg-reads");
    let d = with_config(&s, r#"{"flavour": "mild"}"#).expect("starts");
    // Nothing before its own declaration, nothing it never declared.
    assert_eq!(probe(&d, "before-declare").as_deref(), Some("false"));
    assert_eq!(probe(&d, "undeclared").as_deref(), Some("false"));
    assert_eq!(probe(&d, "all-keys").as_deref(), Some("2"));
    // After describe, declarations are closed; values stay as settled.
    assert_eq!(probe(&d, "late-declare").as_deref(), Some("false"));
    assert_eq!(probe(&d, "flavour").as_deref(), Some("mild"));
    assert!(
        identity(&d).await.contains("+config:sha256:"),
        "a value that changes what runs is named"
    );
}

#[tokio::test]
async fn a_value_that_changes_what_runs_changes_the_evidence() {
    let s = Scratch::new("pcfg-evidence");
    let digest = |pairs: &str| hex::encode(Sha256::digest(pairs.as_bytes()));
    let default = identity(&with_config(&s, "{}").expect("starts")).await;
    assert_eq!(
        default,
        format!(
            "hostile:none+config:sha256:{}",
            digest(r#"[["flavour","plain"]]"#)
        )
    );
    // A value that does not change what runs leaves the evidence alone;
    // the default given explicitly is the same evidence.
    let quiet = r#"{"config-test": "", "flavour": "plain"}"#;
    assert_eq!(
        identity(&with_config(&s, quiet).expect("starts")).await,
        default
    );
    // One that does is seen by a client pinned to the old environment.
    let spicy = identity(&with_config(&s, r#"{"flavour": "spicy"}"#).expect("starts")).await;
    assert_ne!(spicy, default);
    assert_eq!(
        spicy,
        format!(
            "hostile:none+config:sha256:{}",
            digest(r#"[["flavour","spicy"]]"#)
        )
    );
}

/// Every problem is listed, but the list is the host's memory: a plugin
/// that rejects in a loop gets a bounded list and the count of the rest.
#[test]
fn a_flood_of_problems_is_bounded() {
    let s = Scratch::new("pcfg-flood");
    let (code, text) = with_config(&s, r#"{"config-test": "reject-flood"}"#)
        .err()
        .expect("refused");
    assert_ne!(code, Some(0), "{}", &text[..text.len().min(2000)]);
    assert!(
        text.contains("more problem(s) not listed"),
        "{}",
        &text[..text.len().min(2000)]
    );
    assert!(text.len() < 256 << 10, "{} bytes of error", text.len());
}

/// The segments after the plugin's own environment are the host's: a
/// plugin that writes one itself does not load.
#[test]
fn a_plugin_cannot_forge_the_hosts_evidence_segments() {
    let s = Scratch::new("pcfg-forge");
    let (code, text) = with_config(&s, r#"{"config-test": "forge-env"}"#)
        .err()
        .expect("refused");
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("a segment the host reserves"), "{text}");
}

/// A plugin that declares nothing (remote-plimsoll) refuses any key, and
/// keeps the identity it always had.
#[test]
fn a_plugin_without_keys_refuses_every_key() {
    let s = Scratch::new("pcfg-none");
    let file = s.path("config.json");
    std::fs::write(&file, r#"{"template": "base"}"#).expect("write");
    let file = file.display().to_string();
    let dir = plugin_dir().display().to_string();
    let (code, text) = run_to_exit(
        &[],
        &[
            ("SANDBOX_PROVIDER", "remote-plimsoll"),
            ("PLIMSOLL_PLUGIN_DIR", dir.as_str()),
            ("SANDBOX_PLUGIN_HTTP_ORIGINS", ORIGIN),
            ("SANDBOX_PLUGIN_CONFIG_FILE", file.as_str()),
            ("PLIMSOLL_ADDR", "127.0.0.1:0"),
        ],
    );
    let text = unescaped(&text);
    assert_ne!(code, Some(0), "{text}");
    assert!(
        text.contains(r#"unknown key "template" (this plugin reads: none)"#),
        "{text}"
    );
}
