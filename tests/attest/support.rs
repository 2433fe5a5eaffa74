//! What the attest tests share: the CLI run as a subprocess, key pairs,
//! bundles read and written as lines, and the independent verifiers.

// Each test crate that includes this uses only some of it.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub fn cli() -> PathBuf {
    plimsoll_tests::plimsolld_path().with_file_name("plimsoll")
}

pub fn attest(url: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(cli());
    cmd.env_clear().arg("attest").args(args);
    if let Some(u) = url {
        cmd.env("PLIMSOLL_URL", u);
    }
    cmd.output().expect("running plimsoll attest")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

pub fn keygen(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let prefix = dir.join(name);
    let out = attest(None, &["keygen", "--out", s(&prefix)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    (prefix.with_extension("key"), prefix.with_extension("pub"))
}

/// Writes `request` beside `bundle` and signs its run into `bundle`.
pub fn sign(d_url: &str, key: &Path, bundle: &Path, request: &Value) -> Output {
    let dir = bundle.parent().expect("the bundle's directory");
    let file = dir.join(format!("req-{}.json", rand_tag()));
    std::fs::write(&file, request.to_string()).expect("write request");
    attest(
        Some(d_url),
        &["run", "--key", s(key), "--bundle", s(bundle), s(&file)],
    )
}

/// Signs the run of JavaScript `code` into `bundle`.
pub fn sign_js(d_url: &str, key: &Path, bundle: &Path, code: &str) -> Output {
    sign(d_url, key, bundle, &plimsoll_tests::js_run(code))
}

pub fn rand_tag() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

pub fn verify(bundle: &Path, public: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["verify", "--pub", s(public)];
    args.extend_from_slice(extra);
    args.push(s(bundle));
    attest(None, &args)
}

pub fn assert_refused(out: &Output, says: &str) {
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(err.contains(says), "wanted {says:?} in {err}");
}

/// The independent verifiers' verdict on a bundle.
pub fn others_verify(bundle: &Path, public: &Path) -> Output {
    others_verify_with(bundle, public, &[])
}

/// The same, with more arguments (`--daemon-pub FILE`).
pub fn others_verify_with(bundle: &Path, public: &Path, extra: &[&str]) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    Command::new(root.join(".venv-attest/bin/python"))
        .arg(root.join("tests/attest/verify_with_others.py"))
        .args([bundle, public])
        .args(extra)
        .output()
        .expect("the independent verifiers run (make setup creates .venv-attest)")
}

pub fn lines(bundle: &Path) -> Vec<String> {
    text(&std::fs::read(bundle).expect("read bundle"))
        .lines()
        .map(str::to_string)
        .collect()
}

pub fn write_lines(path: &Path, lines: &[String]) {
    let mut body = lines.join("\n");
    body.push('\n');
    std::fs::write(path, body).expect("write bundle");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

/// The key ID `keygen` printed for the pair at `prefix`.
pub fn keygen_id(dir: &Path, name: &str) -> (PathBuf, PathBuf, String) {
    let prefix = dir.join(name);
    let out = attest(None, &["keygen", "--out", s(&prefix)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let id = text(&out.stdout)
        .trim()
        .strip_prefix("key ID ")
        .expect("key ID line")
        .to_string();
    (
        prefix.with_extension("key"),
        prefix.with_extension("pub"),
        id,
    )
}

/// Writes the session script beside `bundle` and signs the session into it.
pub fn sign_session(d_url: &str, key: &Path, bundle: &Path, script: &Value) -> Output {
    let dir = bundle.parent().expect("the bundle's directory");
    let file = dir.join(format!("session-{}.json", rand_tag()));
    std::fs::write(&file, script.to_string()).expect("write script");
    attest(
        Some(d_url),
        &["session", "--key", s(key), "--bundle", s(bundle), s(&file)],
    )
}

/// The bundle's lines renumbered and every statement and checkpoint
/// re-signed with `key` (a session's open and close statements restating
/// the line's answer): what a key holder who drops, moves or edits lines
/// can write. A verifier must still refuse what the lines' own content shows.
pub fn rechain(lines: &[String], key: &Path) -> Vec<String> {
    use base64::Engine as _;
    use plimsoll::attest::dsse::Envelope;
    use plimsoll::attest::keys::SigningKey;
    use plimsoll::attest::statement::PAYLOAD_TYPE;
    use sha2::{Digest, Sha256};
    let key = SigningKey::load(key).expect("signing key");
    let b64 = base64::engine::general_purpose::STANDARD;
    let (mut previous, mut entries, mut open) = (String::new(), 0u64, 0u64);
    let mut out = Vec::new();
    for (i, text) in lines.iter().enumerate() {
        let number = i as u64 + 1;
        let mut line: Value = serde_json::from_str(text).expect("a JSON line");
        let payload = b64
            .decode(line["signed"]["payload"].as_str().expect("payload"))
            .expect("base64");
        let mut statement: Value = serde_json::from_slice(&payload).expect("statement");
        line["line"] = number.into();
        statement["predicate"]["line"] = number.into();
        if line["kind"] == "checkpoint" {
            line["entries"] = entries.into();
            statement["predicate"]["entries"] = entries.into();
            let predicate = statement["predicate"].as_object_mut().expect("predicate");
            predicate.remove("openSessions");
            if open > 0 {
                predicate.insert("openSessions".into(), open.into());
            }
            statement["subject"][0]["digest"]["sha256"] = previous.clone().into();
        } else {
            entries += 1;
            statement["predicate"]["previousLineSha256"] = previous.clone().into();
            // What the statement says is what the line now holds.
            let kind = line["kind"].as_str().unwrap_or_default().to_string();
            match kind.as_str() {
                "session-open" => {
                    statement["predicate"]["opened"] = line["response"].clone();
                    open += 1;
                }
                "session-close" => {
                    statement["predicate"]["closed"] = line["response"].clone();
                    open = open.saturating_sub(1);
                }
                _ => {}
            }
        }
        let payload = serde_json::to_vec(&statement).expect("statement bytes");
        line["signed"] =
            serde_json::to_value(Envelope::sign(&key, PAYLOAD_TYPE, &payload)).expect("envelope");
        let text = serde_json::to_string(&line).expect("line");
        previous = hex::encode(Sha256::digest(text.as_bytes()));
        out.push(text);
    }
    out
}
