//! `plimsoll attest`, run as a subprocess against a real daemon: keys that
//! are never overwritten, runs signed into a bundle only when their records
//! check, and a verifier that refuses every change an attacker holding the
//! bundle (but not the key) can make to it. Every envelope is also checked
//! by verifiers nobody here wrote (securesystemslib's DSSE and
//! in-toto-attestation's Statement v1), so the format is the standard's,
//! not only our reading of it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use plimsoll_tests::{Daemon, Scratch};
use serde_json::{Value, json};

#[path = "attest/support.rs"]
mod support;
use support::*;

/// A bundle of three runs signed through a real daemon, and its keys.
struct Signed {
    _d: Daemon,
    scratch: Scratch,
    key: PathBuf,
    public: PathBuf,
    bundle: PathBuf,
}

fn three_runs() -> Signed {
    let d = plimsoll_tests::wasm_daemon();
    let scratch = Scratch::new("attest");
    let (key, public) = keygen(&scratch.0, "signer");
    let bundle = scratch.path("runs.jsonl");
    for code in [
        "console.log(1)",
        "console.log(2)",
        "throw new Error('three')",
    ] {
        let out = sign_js(&d.url(""), &key, &bundle, code);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let answer: Value = serde_json::from_slice(&out.stdout).expect("the answer, as JSON");
        assert_eq!(answer["isolation"], "process");
    }
    Signed {
        _d: d,
        scratch,
        key,
        public,
        bundle,
    }
}

#[test]
fn keys_are_owner_only_and_never_overwritten() {
    let scratch = Scratch::new("attest-keys");
    let (key, public) = keygen(&scratch.0, "k");
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&key), 0o600);
    assert_eq!(mode(&public), 0o644);
    let before = std::fs::read(&key).expect("read key");
    let again = attest(None, &["keygen", "--out", s(&scratch.path("k"))]);
    assert_ne!(again.status.code(), Some(0));
    assert_eq!(
        std::fs::read(&key).expect("read key"),
        before,
        "a key was overwritten"
    );
    // A private key others may read is not used.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = attest(
        Some("http://127.0.0.1:9"),
        &[
            "run",
            "--key",
            s(&key),
            "--bundle",
            s(&scratch.path("b")),
            s(&public),
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        !scratch.path("b").exists(),
        "nothing is written with a refused key"
    );
}

#[test]
fn a_signed_bundle_verifies_with_ours_and_with_theirs() {
    let r = three_runs();
    let out = verify(&r.bundle, &r.public, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("3 runs and 0 sessions (0 calls) verified"),
        "{}",
        text(&out.stdout)
    );
    let mode = std::fs::metadata(&r.bundle)
        .expect("stat")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "a new bundle is owner-only");
    // Three runs, each followed by its checkpoint, each line one signed
    // statement: six envelopes, each standard DSSE around in-toto v1.
    assert_eq!(lines(&r.bundle).len(), 6);
    let theirs = others_verify(&r.bundle, &r.public);
    assert_eq!(theirs.status.code(), Some(0), "{}", text(&theirs.stderr));
    assert!(
        text(&theirs.stdout).contains("6 envelopes verified"),
        "{}",
        text(&theirs.stdout)
    );

    // And they are not a rubber stamp: a payload changed by one byte fails
    // theirs as it fails ours.
    let mut changed = lines(&r.bundle);
    let mut line: Value = serde_json::from_str(&changed[1]).expect("line");
    let payload = line["signed"]["payload"]
        .as_str()
        .expect("payload")
        .to_string();
    let flipped = if payload.starts_with('e') { "f" } else { "e" };
    line["signed"]["payload"] = json!(format!("{flipped}{}", &payload[1..]));
    changed[1] = line.to_string();
    let tampered = r.scratch.path("payload.jsonl");
    write_lines(&tampered, &changed);
    assert_eq!(others_verify(&tampered, &r.public).status.code(), Some(1));
    assert_eq!(verify(&tampered, &r.public, &[]).status.code(), Some(1));
}

#[test]
fn every_change_to_a_bundle_is_refused() {
    let r = three_runs();
    let good = lines(&r.bundle);
    let at = |name: &str| r.scratch.path(name);

    // Stdout changed, the line kept in canonical form, as an attacker would.
    let mut changed = good.clone();
    let mut line: Value = serde_json::from_str(&changed[0]).expect("line");
    line["response"]["javascript"]["stdout"] = json!("Mgo="); // "2\n"
    changed[0] = line.to_string();
    write_lines(&at("stdout"), &changed);
    assert_refused(&verify(&at("stdout"), &r.public, &[]), "line 1");

    // A field no digest covers (the answer's duration), changed in a middle
    // run: the next line's statement names the old bytes; in the last run,
    // the checkpoint does.
    for (index, refused_at) in [(2, "line 4"), (4, "line 6")] {
        let mut timed = good.clone();
        let mut line: Value = serde_json::from_str(&timed[index]).expect("line");
        line["response"]["durationMs"] = json!("999");
        timed[index] = line.to_string();
        write_lines(&at("timed"), &timed);
        assert_refused(&verify(&at("timed"), &r.public, &[]), refused_at);
    }

    let mut swapped = good.clone();
    swapped.swap(0, 1);
    write_lines(&at("swapped"), &swapped);
    assert_refused(&verify(&at("swapped"), &r.public, &[]), "line 1");

    let mut dropped = good.clone();
    dropped.remove(1);
    write_lines(&at("dropped"), &dropped);
    assert_refused(&verify(&at("dropped"), &r.public, &[]), "line 2");

    let mut added = good.clone();
    added.insert(1, good[0].clone());
    write_lines(&at("added"), &added);
    assert_refused(&verify(&at("added"), &r.public, &[]), "line 2");

    // Cut short: no checkpoint, or half a line.
    write_lines(&at("no-checkpoint"), &good[..5]);
    assert_refused(&verify(&at("no-checkpoint"), &r.public, &[]), "checkpoint");
    let whole = std::fs::read(&r.bundle).expect("read");
    std::fs::write(at("cut"), &whole[..whole.len() - 40]).expect("write");
    assert_refused(&verify(&at("cut"), &r.public, &[]), "cut short");

    // Something unsigned riding on the checkpoint.
    let mut padded = good.clone();
    let mut line: Value = serde_json::from_str(&padded[5]).expect("line");
    line["approvedBy"] = json!("security-team");
    padded[5] = line.to_string();
    write_lines(&at("padded"), &padded);
    assert_refused(&verify(&at("padded"), &r.public, &[]), "line 6");

    // The same runs in another encoding of the same JSON.
    let mut spaced = good.clone();
    spaced[0] = spaced[0].replacen(":", ": ", 1);
    write_lines(&at("spaced"), &spaced);
    assert_refused(&verify(&at("spaced"), &r.public, &[]), "canonical");

    // Another key's signatures are no signatures at all.
    let (_, other) = keygen(&r.scratch.0, "other");
    assert_refused(&verify(&r.bundle, &other, &[]), "signature");

    // The untouched bundle still verifies: each refusal above was the change.
    assert_eq!(verify(&r.bundle, &r.public, &[]).status.code(), Some(0));
}

#[test]
fn a_forger_without_the_key_cannot_sign_a_changed_run() {
    // The forger has a key of their own and the bundle; the verifier has the
    // signer's public key. Runs the forger signs into the bundle do not
    // verify, and the bundle they then hold no longer ends with the signer's
    // checkpoint, so the signer will not extend it either.
    let r = three_runs();
    let d = plimsoll_tests::wasm_daemon();
    let (forger, _) = keygen(&r.scratch.0, "forger");
    let out = sign_js(&d.url(""), &forger, &r.bundle, "1");
    // Refused before the run is sent (2: nothing was sent).
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("checkpoint"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(lines(&r.bundle).len(), 6, "the bundle was changed");
    assert_eq!(verify(&r.bundle, &r.public, &[]).status.code(), Some(0));
    // A fresh bundle signed by the forger is refused under the signer's key.
    let forged = r.scratch.path("forged.jsonl");
    let out = sign_js(&d.url(""), &forger, &forged, "1");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_refused(&verify(&forged, &r.public, &[]), "signature");
    drop(r.key);
}

#[test]
fn a_batch_with_runs_missing_is_refused() {
    let r = three_runs();
    assert_eq!(
        verify(&r.bundle, &r.public, &["--expect-count", "3"])
            .status
            .code(),
        Some(0)
    );
    assert_refused(
        &verify(&r.bundle, &r.public, &["--expect-count", "4"]),
        "expected 4",
    );
    // The request digests the daemon recorded, one per line.
    let digests: Vec<String> = lines(&r.bundle)
        .iter()
        .step_by(2)
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("line");
            v["response"]["record"]["requestSha256"]
                .as_str()
                .expect("digest")
                .to_string()
        })
        .collect();
    let expect = r.scratch.path("expect.txt");
    std::fs::write(&expect, digests.join("\n")).expect("write");
    let out = verify(&r.bundle, &r.public, &["--expect", s(&expect)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // One more run expected than was signed: the batch is incomplete.
    std::fs::write(
        &expect,
        format!("{}\n{}", digests.join("\n"), "a".repeat(64)),
    )
    .expect("w");
    assert_refused(
        &verify(&r.bundle, &r.public, &["--expect", s(&expect)]),
        "1 of the 4",
    );
    // One run fewer expected than signed: the batch is not this one either.
    std::fs::write(&expect, digests[..2].join("\n")).expect("w");
    assert_refused(
        &verify(&r.bundle, &r.public, &["--expect", s(&expect)]),
        "not among",
    );
    // And an empty list expects nothing, so it vouches for nothing.
    std::fs::write(&expect, "").expect("w");
    assert_refused(
        &verify(&r.bundle, &r.public, &["--expect", s(&expect)]),
        "empty",
    );
}

#[test]
fn a_record_that_does_not_check_is_never_signed() {
    // The answers come from a stand-in daemon that takes a real answer and
    // changes one thing in it; the bundle must not change.
    let d = plimsoll_tests::wasm_daemon();
    let scratch = Scratch::new("attest-check");
    let (key, _) = keygen(&scratch.0, "signer");
    let bundle = scratch.path("b.jsonl");
    let ok = sign_js(&d.url(""), &key, &bundle, "console.log(7)");
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    let real: Value = serde_json::from_slice(&ok.stdout).expect("answer");
    let before = std::fs::read(&bundle).expect("read");

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut floor_req = plimsoll_tests::js_run("console.log(7)");
    floor_req["minimumIsolation"] = json!("container");
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "stdout changed",
            plimsoll_tests::js_run("console.log(7)"),
            {
                let mut a = real.clone();
                a["javascript"]["stdout"] = json!("OAo=");
                a
            },
        ),
        (
            "answered for another request",
            plimsoll_tests::js_run("console.log(8)"),
            real.clone(),
        ),
        // The floor asked for is above the tier the record states.
        ("below the floor", floor_req, real.clone()),
        // Every digest right, and something no digest covers beside them.
        (
            "a claim inside the record",
            plimsoll_tests::js_run("console.log(7)"),
            {
                let mut a = real.clone();
                a["record"]["attestedIsolation"] = json!("vm");
                a
            },
        ),
        (
            "a snake_case twin another reader would prefer",
            plimsoll_tests::js_run("console.log(7)"),
            {
                let mut a = real.clone();
                a["javascript"]["exit_code"] = json!(7);
                a
            },
        ),
    ];
    for (what, request, answer) in cases {
        let app = axum::Router::new().route(
            "/plimsoll.v1.SandboxService/Run",
            axum::routing::post(move || {
                let answer = answer.clone();
                async move { axum::Json(answer) }
            }),
        );
        let url = rt.block_on(plimsoll_tests::serve_loopback(app));
        let out = sign(&url, &key, &bundle, &request);
        assert_eq!(out.status.code(), Some(3), "{what}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("not recorded"),
            "{what}: {}",
            text(&out.stderr)
        );
        assert_eq!(
            std::fs::read(&bundle).expect("read"),
            before,
            "{what}: the bundle changed"
        );
    }
    // A refused record leaves no trace: not even an empty bundle.
    let app = axum::Router::new().route(
        "/plimsoll.v1.SandboxService/Run",
        axum::routing::post(move || {
            let mut a = real.clone();
            a["javascript"]["stdout"] = json!("OAo=");
            async move { axum::Json(a) }
        }),
    );
    let url = rt.block_on(plimsoll_tests::serve_loopback(app));
    let fresh = scratch.path("fresh.jsonl");
    let out = sign_js(&url, &key, &fresh, "console.log(7)");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(!fresh.exists(), "a refused record created the bundle");
}

#[test]
fn a_bundle_others_can_read_is_refused_unless_shared() {
    let d = plimsoll_tests::wasm_daemon();
    let scratch = Scratch::new("attest-shared");
    let (key, public) = keygen(&scratch.0, "signer");
    let bundle = scratch.path("b.jsonl");
    std::fs::write(&bundle, "").expect("create");
    std::fs::set_permissions(&bundle, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let request = plimsoll_tests::js_run("1");
    let out = sign(&d.url(""), &key, &bundle, &request);
    // Refused before the run is sent (2: nothing was sent).
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("others"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read(&bundle).expect("read").len(), 0);
    let file = scratch.path("req.json");
    std::fs::write(&file, request.to_string()).expect("write");
    let out = attest(
        Some(&d.url("")),
        &[
            "run",
            "--key",
            s(&key),
            "--bundle",
            s(&bundle),
            "--shared-bundle",
            s(&file),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        verify(&bundle, &public, &["--expect-count", "1"])
            .status
            .code(),
        Some(0)
    );
}

#[test]
fn a_symlinked_bundle_is_not_followed() {
    let d = plimsoll_tests::wasm_daemon();
    let scratch = Scratch::new("attest-link");
    let (key, _) = keygen(&scratch.0, "signer");
    let target = scratch.path("elsewhere");
    std::fs::write(&target, "").expect("create");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let link = scratch.path("b.jsonl");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let out = sign_js(&d.url(""), &key, &link, "1");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read(&target).expect("read").len(),
        0,
        "written through a link"
    );
}

#[test]
fn a_failed_append_leaves_the_bundle_as_it_was() {
    // The file-size limit makes the append's write fail part way. The
    // shell leaves SIGXFSZ at its default, which kills the writer; the CLI
    // ignores it itself, so it sees EFBIG and lives to put the bundle back.
    let d = plimsoll_tests::wasm_daemon();
    let scratch = Scratch::new("attest-efbig");
    let (key, public) = keygen(&scratch.0, "signer");
    let bundle = scratch.path("b.jsonl");
    let ok = sign_js(&d.url(""), &key, &bundle, "1");
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    let before = std::fs::read(&bundle).expect("read");
    let request = scratch.path("req.json");
    std::fs::write(
        &request,
        plimsoll_tests::js_run("console.log('x'.repeat(4096))").to_string(),
    )
    .expect("write");
    let limit_kib = before.len() / 1024 + 1;
    let script = format!(
        "trap - XFSZ; ulimit -f {limit_kib}; exec \"$0\" attest run --key \"$1\" --bundle \"$2\" \"$3\""
    );
    let out = Command::new("bash")
        .env_clear()
        .env("PLIMSOLL_URL", d.url(""))
        .args(["-c", &script])
        .arg(cli())
        .args([&key, &bundle, &request])
        .output()
        .expect("bash");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("as it was"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read(&bundle).expect("read"),
        before,
        "the bundle was left changed"
    );
    // And it is still a bundle the signer extends.
    let again = sign_js(&d.url(""), &key, &bundle, "2");
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    assert_eq!(
        verify(&bundle, &public, &["--expect-count", "2"])
            .status
            .code(),
        Some(0)
    );
}

#[test]
fn plimsoll_run_signs_into_a_bundle_too() {
    let d = plimsoll_tests::wasm_daemon();
    let scratch = Scratch::new("attest-cli-run");
    let (key, public) = keygen(&scratch.0, "signer");
    let bundle = scratch.path("b.jsonl");
    let file = scratch.path("a.js");
    std::fs::write(&file, "console.log('signed'); throw new Error('after')").expect("write");
    let mut cmd = Command::new(cli());
    cmd.env_clear()
        .env("PLIMSOLL_URL", d.url(""))
        .env(
            "PLIMSOLL_ATTEST_KEY",
            std::fs::read_to_string(&key).expect("key"),
        )
        .args(["run", "--bundle", s(&bundle), s(&file)]);
    let out = cmd.output().expect("plimsoll run");
    // The run's own exit code, and the run in the bundle.
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "signed\n");
    let v = verify(&bundle, &public, &["--expect-count", "1"]);
    assert_eq!(v.status.code(), Some(0), "{}", text(&v.stderr));
}

#[test]
fn a_daemon_with_a_key_vouches_for_each_record_it_seals() {
    let scratch = Scratch::new("attest-receipts");
    let (daemon_key, daemon_pub, daemon_id) = keygen_id(&scratch.0, "daemon");
    let (key, public) = keygen(&scratch.0, "signer");
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_RECORD_SIGNING_KEY", s(&daemon_key)),
    ]);
    // Describe states which key the daemon signs with.
    let describe = Command::new(cli())
        .env_clear()
        .env("PLIMSOLL_URL", d.url(""))
        .args(["describe", "--json"])
        .output()
        .expect("describe");
    let described: Value = serde_json::from_slice(&describe.stdout).expect("describe JSON");
    assert_eq!(described["recordSigningKeyId"], json!(daemon_id));

    let bundle = scratch.path("b.jsonl");
    for code in ["console.log(1)", "console.log(2)"] {
        let out = sign_js(&d.url(""), &key, &bundle, code);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let answer: Value = serde_json::from_slice(&out.stdout).expect("answer");
        assert!(answer["receipt"].is_object(), "{answer}");
        // The audit line names the record, so a signed run can be found in
        // the daemon's log.
        let digest = answer["record"]["recordSha256"]
            .as_str()
            .expect("digest")
            .to_string();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !d
            .log_lines()
            .iter()
            .any(|l| l.contains("plimsoll::audit") && l.contains(&digest))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "no audit line names {digest}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    let out = verify(&bundle, &public, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("2 daemon receipts present, not checked"));
    let out = verify(&bundle, &public, &["--daemon-pub", s(&daemon_pub)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!(
        "2 daemon receipts verified, signed by key ID {daemon_id}"
    )));
    // A receipt by a key other than the one Describe states is refused.
    assert_refused(
        &verify(&bundle, &public, &["--daemon-pub", s(&public)]),
        "signature",
    );
    // The independent verifiers check the receipts too.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let theirs = Command::new(root.join(".venv-attest/bin/python"))
        .arg(root.join("tests/attest/verify_with_others.py"))
        .args([&bundle, &public])
        .arg("--daemon-pub")
        .arg(&daemon_pub)
        .output()
        .expect("independent verifiers");
    assert_eq!(theirs.status.code(), Some(0), "{}", text(&theirs.stderr));
    assert!(
        text(&theirs.stdout).contains("6 envelopes verified"),
        "{}",
        text(&theirs.stdout)
    );

    // A bundle from a daemon that signs nothing does not pass as vouched.
    let plain = plimsoll_tests::wasm_daemon();
    let unvouched = scratch.path("plain.jsonl");
    let out = sign_js(&plain.url(""), &key, &unvouched, "1");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_refused(
        &verify(&unvouched, &public, &["--daemon-pub", s(&daemon_pub)]),
        "no receipt",
    );
}

#[test]
fn a_record_signing_key_others_can_read_stops_the_daemon() {
    let scratch = Scratch::new("attest-daemon-key");
    let (daemon_key, _, _) = keygen_id(&scratch.0, "daemon");
    std::fs::set_permissions(&daemon_key, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let started = Daemon::try_start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_RECORD_SIGNING_KEY", s(&daemon_key)),
    ]);
    let log = started
        .err()
        .expect("the daemon started with a key others may read");
    assert!(log.contains("PLIMSOLL_RECORD_SIGNING_KEY"), "{log}");
    assert!(
        !log.contains("PRIVATE KEY"),
        "the key's text reached the log: {log}"
    );
}

#[test]
fn only_a_bundle_this_key_closed_is_extended() {
    let r = three_runs();
    let d = plimsoll_tests::wasm_daemon();
    let good = lines(&r.bundle);
    // The signer's own checkpoint, copied after nothing or after junk: the
    // line before it is not the one it closes, so nothing is spliced on.
    for (name, body) in [
        ("copied", vec![good[5].clone()]),
        ("junk", vec!["junk".to_string(), good[5].clone()]),
        ("other", vec![good[0].clone(), good[5].clone()]),
    ] {
        let path = r.scratch.path(name);
        write_lines(&path, &body);
        let before = std::fs::read(&path).expect("read");
        let out = sign_js(&d.url(""), &r.key, &path, "1");
        assert_eq!(out.status.code(), Some(2), "{name}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("checkpoint"),
            "{name}: {}",
            text(&out.stderr)
        );
        assert_eq!(
            std::fs::read(&path).expect("read"),
            before,
            "{name}: changed"
        );
    }
    // A bundle of another user's is not written to, whatever its mode.
    let theirs = r.scratch.path("theirs.jsonl");
    std::fs::copy(&r.bundle, &theirs).expect("copy");
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
    let out = sign_js(&d.url(""), &r.key, &theirs, "1");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("another user"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn verify_reads_only_a_bounded_regular_file() {
    let scratch = Scratch::new("attest-verify-files");
    let (_, public) = keygen(&scratch.0, "k");
    let out = verify(Path::new("/dev/zero"), &public, &[]);
    assert_refused(&out, "not a regular file");
    let fifo = scratch.path("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let t = std::time::Instant::now();
    assert_refused(&verify(&fifo, &public, &[]), "not a regular file");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "waited on a FIFO"
    );
}

#[test]
fn an_append_cut_by_a_crash_is_refused_until_repaired() {
    // What a kill part way through an append leaves: the last checkpoint
    // before it whole, then a run line and part of its checkpoint (or part
    // of the run line). Nothing earlier was rewritten.
    let r = three_runs();
    let d = plimsoll_tests::wasm_daemon();
    let whole = std::fs::read(&r.bundle).expect("read");
    let good = lines(&r.bundle);
    let after_two = good[..4].join("\n").len() + 1;
    for (name, cut) in [
        ("into the checkpoint", whole.len() - 30),
        ("into the run line", after_two + 50),
    ] {
        let torn = r.scratch.path("torn.jsonl");
        std::fs::write(&torn, &whole[..cut]).expect("write");
        std::fs::set_permissions(&torn, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert_refused(&verify(&torn, &r.public, &[]), "cut short");
        let out = sign_js(&d.url(""), &r.key, &torn, "1");
        assert_eq!(out.status.code(), Some(2), "{name}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("repair"),
            "{name}: {}",
            text(&out.stderr)
        );
        let fixed = attest(None, &["repair", "--key", s(&r.key), s(&torn)]);
        assert_eq!(
            fixed.status.code(),
            Some(0),
            "{name}: {}",
            text(&fixed.stderr)
        );
        assert!(
            text(&fixed.stdout).contains("2 entries remain"),
            "{name}: {}",
            text(&fixed.stdout)
        );
        // The two runs before the torn append verify, and the bundle grows
        // again from there.
        let out = verify(&torn, &r.public, &["--expect-count", "2"]);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
        let out = sign_js(&d.url(""), &r.key, &torn, "1");
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
        let out = verify(&torn, &r.public, &["--expect-count", "3"]);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
    }
    // A whole bundle is left alone; more than one append's worth of damage
    // is not a torn append, and is not cut.
    let out = attest(None, &["repair", "--key", s(&r.key), s(&r.bundle)]);
    assert!(
        text(&out.stdout).contains("nothing removed"),
        "{}",
        text(&out.stdout)
    );
    let wrecked = r.scratch.path("wrecked.jsonl");
    write_lines(
        &wrecked,
        &[good[..2].join("\n"), "x".into(), "y".into(), "z".into()],
    );
    let before = std::fs::read(&wrecked).expect("read");
    let out = attest(None, &["repair", "--key", s(&r.key), s(&wrecked)]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert_eq!(std::fs::read(&wrecked).expect("read"), before);
}

#[test]
fn replay_sends_a_verified_bundle_again_and_compares_results() {
    let r = three_runs();
    let d = plimsoll_tests::wasm_daemon();
    let replay =
        |url: &str, bundle: &Path| attest(Some(url), &["replay", "--pub", s(&r.public), s(bundle)]);
    // The same snippets answer the same results.
    let out = replay(&d.url(""), &r.bundle);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("3 runs and 0 sessions replayed: 3 results the same, 0 not"),
        "{}",
        text(&out.stdout)
    );
    // A run whose output is the time it ran does not.
    let timed = r.scratch.path("timed.jsonl");
    let out = sign_js(&d.url(""), &r.key, &timed, "console.log(Date.now())");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    std::thread::sleep(std::time::Duration::from_millis(5));
    let out = replay(&d.url(""), &timed);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("run 1: a different result"),
        "{}",
        text(&out.stdout)
    );
    // A bundle that does not verify sends nothing: a stand-in counts calls.
    let mut broken = lines(&r.bundle);
    broken.swap(0, 2);
    let bad = r.scratch.path("bad.jsonl");
    write_lines(&bad, &broken);
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    let app = axum::Router::new().fallback(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { axum::http::StatusCode::NOT_FOUND }
    });
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let url = rt.block_on(plimsoll_tests::serve_loopback(app));
    let out = replay(&url, &bad);
    assert_refused(&out, "nothing sent");
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a call was sent"
    );
}
