//! Sessions in signed bundles, through the real CLI and a real daemon: a
//! session's open, calls and close signed as one chain, which no dropped,
//! moved or re-signed line gets past; the session ID kept out of every byte
//! written; a signer that refuses a call the chain does not account for;
//! and sessions replayed into fresh ones, on the wasm tier and on docker.
//! The docker test needs the engine and the guest image (`make image`).

use std::path::Path;

use plimsoll_tests::{Daemon, Scratch, call};
use serde_json::{Value, json};

#[path = "attest/support.rs"]
mod support;
use support::*;

fn sessions_daemon() -> Daemon {
    Daemon::start(&[("SANDBOX_PROVIDER", "wasm"), ("SANDBOX_MAX_SESSIONS", "2")])
}

fn cell(code: &str) -> Value {
    json!({"protocol": 4, "timeoutMs": 30000, "cell": {"language": "javascript", "code": code}})
}

/// A session of three calls that depend on each other: a cell binding,
/// a cell reading it, and a snippet.
fn script() -> Value {
    json!({
        "open": {"protocol": 4, "languages": ["javascript"]},
        "calls": [cell("let x = 6*7"), cell("x"), plimsoll_tests::js_run("console.log(1)")],
    })
}

fn ok(out: &std::process::Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout {}\nstderr {}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// The indexes (0-based) of the lines of `kind`.
fn of_kind(lines: &[String], kind: &str) -> Vec<usize> {
    lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains(&format!("\"kind\":\"{kind}\"")))
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn a_signed_session_verifies_with_ours_and_theirs_and_never_holds_its_id() {
    let d = sessions_daemon();
    let scratch = Scratch::new("attest-session");
    let (key, public) = keygen(&scratch.0, "signer");
    let bundle = scratch.path("s.jsonl");
    let out = sign_session(&d.url(""), &key, &bundle, &script());
    ok(&out);
    let printed = text(&out.stdout);
    let answers: Vec<Value> = printed
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON lines"))
        .collect();
    assert_eq!(answers.len(), 5, "open, three calls, close: {printed}");
    // The cell saw the binding the first cell made: one session, in order.
    assert_eq!(
        answers[2]["run"]["cell"]["stdout"], "NDIK",
        "42\\n: {printed}"
    );
    assert_eq!(answers[4]["calls"], "3");

    // The ID is a capability: neither printed nor kept.
    let kept = std::fs::read_to_string(&bundle).expect("bundle");
    for leak in ["sessionId", "session_id"] {
        assert!(!printed.contains(leak) && !kept.contains(leak), "{leak}");
    }

    let v = verify(&bundle, &public, &[]);
    ok(&v);
    assert!(
        text(&v.stdout).contains("0 runs and 1 sessions (3 calls) verified"),
        "{}",
        text(&v.stdout)
    );
    // Five entries (open, three calls, close), each with its checkpoint.
    let theirs = others_verify(&bundle, &public);
    assert_eq!(theirs.status.code(), Some(0), "{}", text(&theirs.stderr));
    assert!(text(&theirs.stdout).contains("10 envelopes verified"));

    // Session calls count as runs for what a batch expects.
    let run = sign_js(&d.url(""), &key, &bundle, "console.log(2)");
    ok(&run);
    ok(&verify(&bundle, &public, &["--expect-count", "4"]));
    assert_refused(
        &verify(&bundle, &public, &["--expect-count", "3"]),
        "expected 3",
    );
}

#[test]
fn a_dropped_moved_or_unclosed_session_line_is_refused_even_re_signed() {
    let d = sessions_daemon();
    let scratch = Scratch::new("attest-session-cut");
    let (key, public) = keygen(&scratch.0, "signer");
    let bundle = scratch.path("s.jsonl");
    ok(&sign_session(&d.url(""), &key, &bundle, &script()));
    let whole = lines(&bundle);
    let calls = of_kind(&whole, "session-call");
    let close = of_kind(&whole, "session-close");
    assert_eq!((calls.len(), close.len()), (3, 1));
    let try_lines = |name: &str, edited: Vec<String>| {
        let path = scratch.path(name);
        write_lines(&path, &edited);
        verify(&path, &public, &[])
    };

    // The control: re-signing an unchanged bundle changes nothing, so the
    // refusals below are the chain's, not the re-signing's.
    ok(&try_lines("same.jsonl", rechain(&whole, &key)));

    // A call dropped (with its checkpoint): the signatures break where it
    // was; re-signed by the key holder, the session's own chain shows it.
    let mut dropped = whole.clone();
    dropped.drain(calls[1]..calls[1] + 2);
    assert_refused(&try_lines("drop.jsonl", dropped.clone()), "line");
    assert_refused(
        &try_lines("drop-resigned.jsonl", rechain(&dropped, &key)),
        "record.sequence",
    );

    // Two calls swapped: the same.
    let mut moved = whole.clone();
    moved.swap(calls[0], calls[1]);
    assert_refused(
        &try_lines("moved-resigned.jsonl", rechain(&moved, &key)),
        "record.sequence",
    );

    // The close dropped: calls may be missing from the session's end, and
    // the bundle says so even re-signed.
    let mut unclosed = whole.clone();
    unclosed.drain(close[0]..close[0] + 2);
    assert_refused(
        &try_lines("unclosed-resigned.jsonl", rechain(&unclosed, &key)),
        "no close",
    );

    // The last call and the close dropped: the chain that is left is
    // whole, and only the missing close shows what went.
    let mut cut = whole.clone();
    cut.truncate(calls[2]);
    assert_refused(
        &try_lines("cut-resigned.jsonl", rechain(&cut, &key)),
        "no close",
    );

    // A session's open copied in a second time is a copied chain.
    let open = of_kind(&whole, "session-open")[0];
    let mut twice = whole.clone();
    let copy: Vec<String> = whole[open..open + 2].to_vec();
    twice.splice(0..0, copy);
    assert_refused(
        &try_lines("twice-resigned.jsonl", rechain(&twice, &key)),
        "opened before",
    );
}

#[test]
fn the_signer_refuses_a_call_its_chain_does_not_account_for() {
    use plimsoll::attest::bundle::{Appender, Durability, Sharing};
    use plimsoll::attest::keys::SigningKey;
    let d = sessions_daemon();
    let scratch = Scratch::new("attest-session-intruder");
    let (key_file, public) = keygen(&scratch.0, "signer");
    let key = SigningKey::load(&key_file).expect("key");
    let bundle = scratch.path("s.jsonl");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let open = json!({"protocol": 4, "languages": ["javascript"]});
    let opened = rt.block_on(call(&d, "OpenSession", &open));
    assert_eq!(opened.status, 200, "{:?}", opened.body);
    let id = opened.body["sessionId"]
        .as_str()
        .expect("an ID")
        .to_string();
    let send = |kept: &Value| {
        let mut sent = kept.clone();
        sent["sessionId"] = id.clone().into();
        rt.block_on(call(&d, "SessionRun", &sent))
    };

    let mut appender =
        Appender::open(&bundle, &key, Sharing::Private, Durability::Synced).expect("bundle");
    let fp = appender
        .append_open(&open, &opened.body)
        .expect("the open checks");
    let first = cell("let x = 1");
    let a = send(&first);
    assert_eq!(a.status, 200, "{:?}", a.body);
    appender
        .append_call(&fp, &first, &a.body)
        .expect("call 1 checks");

    // Someone else holding the ID runs a call the signer never sees.
    let intruder = send(&cell("x = 2"));
    assert_eq!(intruder.status, 200, "{:?}", intruder.body);

    let next = cell("x");
    let b = send(&next);
    assert_eq!(b.status, 200, "{:?}", b.body);
    let before = std::fs::read(&bundle).expect("bundle");
    let refused = appender
        .append_call(&fp, &next, &b.body)
        .expect_err("a call after a gap is not signed");
    assert!(refused.to_string().contains("record.sequence"), "{refused}");
    assert_eq!(std::fs::read(&bundle).expect("bundle"), before);

    // Nor is a close that counts the intruder's call.
    let closed = rt.block_on(call(
        &d,
        "CloseSession",
        &json!({"protocol": 4, "sessionId": id}),
    ));
    assert_eq!(closed.body["calls"], "3", "{:?}", closed.body);
    assert!(appender.append_close(&fp, &closed.body).is_err());
    drop(appender);

    // What the bundle holds is true and says it is not the whole session.
    assert_refused(&verify(&bundle, &public, &[]), "no close");
    let kept = std::fs::read_to_string(&bundle).expect("bundle");
    assert!(!kept.contains(&id), "the session ID reached the bundle");
}

#[test]
fn a_replayed_session_matches_and_one_that_reads_the_clock_does_not() {
    let d = sessions_daemon();
    let scratch = Scratch::new("attest-session-replay");
    let (key, public) = keygen(&scratch.0, "signer");
    let replay = |bundle: &Path| {
        attest(
            Some(&d.url("")),
            &["replay", "--pub", s(&public), s(bundle)],
        )
    };

    let bundle = scratch.path("s.jsonl");
    ok(&sign_session(&d.url(""), &key, &bundle, &script()));
    let out = replay(&bundle);
    ok(&out);
    assert!(
        text(&out.stdout).contains("0 runs and 1 sessions replayed: 3 results the same, 0 not"),
        "{}",
        text(&out.stdout)
    );

    let timed = scratch.path("timed.jsonl");
    let clock = json!({
        "open": {"protocol": 4, "languages": ["javascript"]},
        "calls": [cell("let t = Date.now()"), cell("t")],
    });
    ok(&sign_session(&d.url(""), &key, &timed, &clock));
    std::thread::sleep(std::time::Duration::from_millis(5));
    let out = replay(&timed);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stdout));
    let said = text(&out.stdout);
    assert!(said.contains("session 1 call 1: same result"), "{said}");
    assert!(
        said.contains("session 1 call 2: a different result"),
        "{said}"
    );
}

#[test]
fn a_daemon_with_a_key_vouches_for_each_session_call() {
    let scratch = Scratch::new("attest-session-receipts");
    let (daemon_key, daemon_pub, _) = keygen_id(&scratch.0, "daemon");
    let (key, public) = keygen(&scratch.0, "signer");
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("SANDBOX_MAX_SESSIONS", "1"),
        ("PLIMSOLL_RECORD_SIGNING_KEY", s(&daemon_key)),
    ]);
    let bundle = scratch.path("s.jsonl");
    ok(&sign_session(&d.url(""), &key, &bundle, &script()));
    let v = verify(&bundle, &public, &["--daemon-pub", s(&daemon_pub)]);
    ok(&v);
    // One receipt per call, and one for the close.
    assert!(
        text(&v.stdout).contains("4 daemon receipts verified"),
        "{}",
        text(&v.stdout)
    );
    // Another daemon key is refused at the first call.
    assert_refused(
        &verify(&bundle, &public, &["--daemon-pub", s(&public)]),
        "signature",
    );
    // The independent verifiers check the receipts too: ten statements and
    // checkpoints, three call receipts and the close's.
    let theirs = others_verify_with(&bundle, &public, &["--daemon-pub", s(&daemon_pub)]);
    assert_eq!(theirs.status.code(), Some(0), "{}", text(&theirs.stderr));
    assert!(
        text(&theirs.stdout).contains("14 envelopes verified"),
        "{}",
        text(&theirs.stdout)
    );

    // A receipt is held to its form even where no daemon key checks it:
    // nothing but the daemon's statement about this record rides in it.
    let mut smuggled = lines(&bundle);
    let first = of_kind(&smuggled, "session-call")[0];
    let mut call: Value = serde_json::from_str(&smuggled[first]).expect("call");
    call["response"]["run"]["receipt"]["sessionId"] = "0123456789abcdef".into();
    smuggled[first] = call.to_string();
    let edited = scratch.path("smuggled.jsonl");
    write_lines(&edited, &rechain(&smuggled, &key));
    assert_refused(&verify(&edited, &public, &[]), "fields a receipt has not");
    call["response"]["run"]["receipt"] =
        json!({"payload": "", "payloadType": "x", "signatures": []});
    smuggled[first] = call.to_string();
    write_lines(&edited, &rechain(&smuggled, &key));
    assert_refused(&verify(&edited, &public, &[]), "not the daemon's statement");

    // The signing key's holder drops the last call and writes a close that
    // counts only the rest. Every line then checks against the signer's
    // key: only the daemon's word on the close shows calls went missing.
    let whole = lines(&bundle);
    let calls = of_kind(&whole, "session-call");
    let last_kept: Value = serde_json::from_str(&whole[calls[1]]).expect("call 2");
    let mut short: Vec<String> = whole.clone();
    short.drain(calls[2]..calls[2] + 2);
    let close_at = of_kind(&short, "session-close")[0];
    let mut close: Value = serde_json::from_str(&short[close_at]).expect("close");
    close["response"]["calls"] = "2".into();
    close["response"]["lastRecordSha256"] =
        last_kept["response"]["run"]["record"]["recordSha256"].clone();
    short[close_at] = close.to_string();
    let forged = scratch.path("short.jsonl");
    write_lines(&forged, &rechain(&short, &key));
    // The daemon's receipt, kept, is about another close: its form shows
    // that even without the daemon's key.
    assert_refused(
        &verify(&forged, &public, &[]),
        "not the daemon's statement about this answer",
    );
    // Without it, only the signer's word is left: accepted without the
    // daemon's key (docs/attest.md says so), refused with it.
    close["response"]
        .as_object_mut()
        .expect("object")
        .remove("receipt");
    short[close_at] = close.to_string();
    write_lines(&forged, &rechain(&short, &key));
    ok(&verify(&forged, &public, &[]));
    assert_refused(
        &verify(&forged, &public, &["--daemon-pub", s(&daemon_pub)]),
        "no receipt",
    );
}

/// A docker session whose calls depend on the state the earlier ones left
/// (a Python binding, a file a project wrote), replayed into a fresh
/// session: the same results, which replaying the calls as separate runs
/// could not give. Its last call forges an answer line into the session
/// agent's output and exits, so the daemon cannot tell what it did: it may
/// have run, and its record comes in the error. That record is signed into
/// the chain too, so the session is still whole, and replay sends the call
/// again without a result to compare.
#[test]
fn a_replayed_docker_session_matches() {
    let image = plimsoll_tests::sandbox_image();
    let d = Daemon::start(&[
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_DOCKER_IMAGE", image.as_str()),
        ("SANDBOX_DOCKER_POOL", "0"),
        ("SANDBOX_MAX_SESSIONS", "1"),
    ]);
    let scratch = Scratch::new("attest-session-docker");
    let (key, public) = keygen(&scratch.0, "signer");
    let python = |code: &str| json!({"protocol": 4, "timeoutMs": 60000, "cell": {"language": "python", "code": code}});
    let forged = json!({"process": {"stdout": "", "stderr": "", "exit_code": 0, "timed_out": false,
        "stdout_truncated": false, "stderr_truncated": false}})
    .to_string()
        + "\n";
    let forger = format!(
        "require('fs').appendFileSync('/proc/' + process.ppid + '/fd/1', {}); process.exit(3)",
        Value::from(forged)
    );
    let session = json!({
        "open": {"protocol": 4, "languages": ["python"]},
        "calls": [
            python("x = 6*7"),
            {"protocol": 4, "timeoutMs": 60000, "project": {"steps": ["echo kept > a.txt"]}},
            python("print(x, open('a.txt').read().strip())"),
            plimsoll_tests::js_run(&forger),
        ],
    });
    let bundle = scratch.path("docker.jsonl");
    let out = sign_session(&d.url(""), &key, &bundle, &session);
    // The last call may have run: the signer says so, and still records it.
    assert_eq!(out.status.code(), Some(126), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("its record is in the bundle"),
        "{}",
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("\"isolation\":\"container\""));
    assert!(
        text(&out.stdout).contains("NDIga2VwdAo"),
        "42 kept\\n: {}",
        text(&out.stdout)
    );
    let v = verify(&bundle, &public, &["--expect-count", "4"]);
    ok(&v);
    assert!(
        text(&v.stdout).contains("(4 calls, 1 unanswered)"),
        "{}",
        text(&v.stdout)
    );
    let theirs = others_verify(&bundle, &public);
    assert_eq!(theirs.status.code(), Some(0), "{}", text(&theirs.stderr));
    // The unanswered call holds its place: dropped and re-signed, the
    // close counts one call more than the chain holds; its error's code
    // changed, the record no longer matches it.
    let whole = lines(&bundle);
    let at = of_kind(&whole, "session-unanswered");
    assert_eq!(at.len(), 1);
    let mut dropped = whole.clone();
    dropped.drain(at[0]..at[0] + 2);
    let edited = scratch.path("edited.jsonl");
    write_lines(&edited, &rechain(&dropped, &key));
    assert_refused(&verify(&edited, &public, &[]), "the close counts 4 calls");
    let mut recoded = whole.clone();
    let mut line: Value = serde_json::from_str(&recoded[at[0]]).expect("line");
    line["error"]["code"] = "unknown".into();
    recoded[at[0]] = line.to_string();
    write_lines(&edited, &rechain(&recoded, &key));
    assert_refused(&verify(&edited, &public, &[]), "record.unanswered");

    let out = attest(
        Some(&d.url("")),
        &["replay", "--pub", s(&public), s(&bundle)],
    );
    ok(&out);
    let said = text(&out.stdout);
    assert!(
        said.contains("1 sessions replayed: 3 results the same, 0 not"),
        "{said}"
    );
    assert!(said.contains("session 1 call 4: not compared"), "{said}");
}

/// A script the daemon would refuse is refused before anything is sent:
/// the daemon named is a closed port, so an attempt would exit 126.
#[test]
fn a_script_the_daemon_would_refuse_opens_no_session() {
    let scratch = Scratch::new("attest-session-script");
    let (key, _) = keygen(&scratch.0, "signer");
    let bundle = scratch.path("s.jsonl");
    let call = |extra: Value| {
        let mut c = json!({"protocol": 4, "javascript": {"code": "1"}});
        c.as_object_mut()
            .expect("object")
            .extend(extra.as_object().cloned().unwrap_or_default());
        c
    };
    for script in [
        json!({"open": {"protocol": 4}, "calls": [call(json!({"timeoutMs": "abc"}))]}),
        json!({"open": {"protocol": 4}, "calls": [call(json!({"sessionId": "x"}))]}),
        json!({"open": {"protocol": 4}, "calls": [call(json!({"module": {}}))]}),
        json!({"open": {"protocol": 3}, "calls": []}),
        json!({"open": {"protocol": 4, "owner": 7}, "calls": []}),
        json!({"open": {"protocol": 4}, "calls": [], "extra": 1}),
    ] {
        let out = sign_session("http://127.0.0.1:9", &key, &bundle, &script);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{script}: {}",
            text(&out.stderr)
        );
    }
    assert!(!bundle.exists(), "a bundle was written");
}

/// A signer stopped by SIGINT closes its session first, so the bundle
/// stays whole; one killed outright leaves the session open, and then the
/// bundle says it can no longer verify and no signer extends it.
#[test]
fn a_stopped_signer_closes_its_session_and_a_killed_one_leaves_a_bundle_no_one_extends() {
    let d = Daemon::start(&[("SANDBOX_PROVIDER", "wasm"), ("SANDBOX_MAX_SESSIONS", "3")]);
    let scratch = Scratch::new("attest-session-stopped");
    let (key, public) = keygen(&scratch.0, "signer");
    // The first call keeps the signer busy while the signal comes.
    let script = json!({
        "open": {"protocol": 4, "languages": ["javascript"]},
        "calls": [
            cell("const t0 = Date.now(); while (Date.now() - t0 < 1500) {}"),
            cell("1"),
            cell("2"),
        ],
    });
    let start = |bundle: &Path| {
        let file = scratch.path(&format!("script-{}.json", rand_tag()));
        std::fs::write(&file, script.to_string()).expect("script");
        std::process::Command::new(cli())
            .env_clear()
            .env("PLIMSOLL_URL", d.url(""))
            .args([
                "attest",
                "session",
                "--key",
                s(&key),
                "--bundle",
                s(bundle),
                s(&file),
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("attest session")
    };
    let signal = |child: &std::process::Child, sig: &str| {
        std::thread::sleep(std::time::Duration::from_millis(600));
        let sent = std::process::Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(sent.success());
    };

    let stopped = scratch.path("stopped.jsonl");
    let child = start(&stopped);
    signal(&child, "-INT");
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    let v = verify(&stopped, &public, &[]);
    ok(&v);
    assert!(
        text(&v.stdout).contains("1 sessions (1 calls)"),
        "{}",
        text(&v.stdout)
    );

    let killed = scratch.path("killed.jsonl");
    let child = start(&killed);
    signal(&child, "-KILL");
    let _ = child.wait_with_output();
    assert_refused(&verify(&killed, &public, &[]), "no close");
    let more = sign_js(&d.url(""), &key, &killed, "console.log(3)");
    assert_eq!(more.status.code(), Some(2), "{}", text(&more.stderr));
    assert!(
        text(&more.stderr).contains("never closed"),
        "{}",
        text(&more.stderr)
    );
}
