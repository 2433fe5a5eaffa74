//! Sessions in a bundle: appended through an `Appender`, read back by
//! `verify_bytes`.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::*;
use crate::attest::keys::{self, SigningKey};
use crate::record::{self, Evidence, Link};
use crate::sessions;
use crate::wire::{
    B64, CloseSessionResponse, I64, JavaScriptResult, OpenSessionResponse, RunRequest, RunResponse,
    SessionEnd, SessionRunRequest, SessionRunResponse,
};

const STARTED: i64 = 1_700_000_000_000;

const EV: Evidence<'static> = Evidence {
    provider: "docker",
    isolation: "container",
    environment: "oci:sha256:0a0a",
    policy: "plugin:sha256:0b0b",
    software_identity: "quickjs:2024-01-13",
    instance: "",
};

/// A fresh empty directory for one test (each passes its own tag).
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "plimsoll-bundle-session-{tag}-{}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).expect("scratch dir");
    d
}

fn appender<'k>(path: &Path, key: &'k SigningKey) -> Appender<'k> {
    Appender::open(path, key, Sharing::Private, Durability::Synced).expect("opens the bundle")
}

fn verified(path: &Path, key: &SigningKey) -> Result<Verified, AttestError> {
    verify_bytes(&fs::read(path).expect("reads"), &key.public(), None)
}

/// A JavaScript answer for `req`, sealed in place `link` (none for a Run).
fn sealed(req: &RunRequest, link: Option<&Link>) -> RunResponse {
    let result = JavaScriptResult {
        stdout: B64(b"42\n".to_vec()),
        ..Default::default()
    };
    let rec = record::seal(
        record::request_digest(req),
        record::javascript_result_digest(&result),
        req.software_rule.as_ref(),
        &EV,
        STARTED,
        STARTED + 5,
        link,
    );
    RunResponse {
        sandbox: EV.provider.into(),
        isolation: EV.isolation.into(),
        duration_ms: I64(5),
        record: rec,
        software_identity: EV.software_identity.into(),
        environment: EV.environment.into(),
        instance: EV.instance.into(),
        javascript: Some(result),
        project: None,
        cell: None,
        receipt: None,
    }
}

/// A Run's request and answer, as JSON.
fn run(code: &str) -> (Value, Value) {
    let request = json!({"protocol": 4, "javascript": {"code": code}});
    let parsed: RunRequest = serde_json::from_value(request.clone()).expect("parses");
    let answer = serde_json::to_value(sealed(&parsed, None)).expect("json");
    (request, answer)
}

/// One session as the daemon answers it: its ID, and where its chain is.
struct Session {
    id: String,
    fingerprint: String,
    calls: u64,
    last: String,
}

impl Session {
    fn new(id: &str) -> Self {
        Session {
            id: id.into(),
            fingerprint: sessions::fingerprint(id),
            calls: 0,
            last: String::new(),
        }
    }

    fn open_request() -> Value {
        json!({"protocol": 4, "minimumIsolation": "container"})
    }

    /// The open answer as received: with its session ID.
    fn open_answer(&self) -> Value {
        serde_json::to_value(OpenSessionResponse {
            session_id: self.id.clone(),
            session: self.fingerprint.clone(),
            sandbox: EV.provider.into(),
            isolation: EV.isolation.into(),
            expires_unix_ms: I64(STARTED + 600_000),
            idle_timeout_ms: 60_000,
            software_identity: EV.software_identity.into(),
        })
        .expect("json")
    }

    /// A call (its request kept without the ID) answered in place
    /// `sequence` after `previous`, and its record's digest.
    fn call_at(&self, code: &str, sequence: u64, previous: &str) -> (Value, Value, String) {
        let request = json!({"protocol": 4, "javascript": {"code": code}});
        let parsed: SessionRunRequest = serde_json::from_value(request.clone()).expect("parses");
        let link = Link {
            session: self.fingerprint.clone(),
            sequence,
            previous: previous.into(),
        };
        let run = sealed(&parsed.into_run().1, Some(&link));
        let digest = run.record.record_sha256.clone();
        let answer = SessionRunResponse {
            run,
            ended: SessionEnd::Open,
            end_detail: String::new(),
        };
        (request, serde_json::to_value(answer).expect("json"), digest)
    }

    /// The next call in the chain; the chain moves past it.
    fn call(&mut self, code: &str) -> (Value, Value) {
        let (request, answer, digest) = self.call_at(code, self.calls + 1, &self.last);
        self.calls += 1;
        self.last = digest;
        (request, answer)
    }

    fn close_answer(&self, calls: u64) -> Value {
        serde_json::to_value(CloseSessionResponse {
            session: self.fingerprint.clone(),
            calls: I64(calls as i64),
            last_record_sha256: self.last.clone(),
            ended: SessionEnd::Closed,
            receipt: None,
        })
        .expect("json")
    }
}

const ID_A: &str = "0a1b2c3d4e5f60718293a4b5c6d7e8f9";
const ID_B: &str = "f9e8d7c6b5a4938271605f4e3d2c1b0a";

fn incomplete(result: Result<Verified, AttestError>, said: &str) {
    match result {
        Err(AttestError::Incomplete(why)) => assert!(why.contains(said), "{said:?} not in: {why}"),
        other => panic!("not incomplete: {other:?}"),
    }
}

#[test]
fn interleaved_runs_and_two_sessions_verify() {
    let dir = scratch("interleaved");
    let path = dir.join("bundle.jsonl");
    let key = keys::ephemeral();
    let (mut a, mut b) = (Session::new(ID_A), Session::new(ID_B));
    {
        let mut app = appender(&path, &key);
        let (q, r) = run("1");
        app.append_run(&q, &r).expect("run 1");
        let fa = app
            .append_open(&Session::open_request(), &a.open_answer())
            .expect("open a");
        assert_eq!(fa, a.fingerprint);
        let fb = app
            .append_open(&Session::open_request(), &b.open_answer())
            .expect("open b");
        let (q, r) = a.call("a1");
        app.append_call(&fa, &q, &r).expect("a1");
        let (q, r) = b.call("b1");
        app.append_call(&fb, &q, &r).expect("b1");
        let (q, r) = run("2");
        app.append_run(&q, &r).expect("run 2");
        let (q, r) = a.call("a2");
        app.append_call(&fa, &q, &r).expect("a2");
        app.append_close(&fa, &a.close_answer(2)).expect("close a");
        let (q, r) = b.call("b2");
        app.append_call(&fb, &q, &r).expect("b2");
        let (q, r) = b.call("b3");
        app.append_call(&fb, &q, &r).expect("b3");
        app.append_close(&fb, &b.close_answer(3)).expect("close b");
    }
    let v = verified(&path, &key).expect("verifies");
    assert_eq!((v.runs, v.sessions, v.session_calls), (2, 2, 5));
    assert_eq!(v.requests.len(), 7);
    // The appender reopens the bundle where it ended.
    let mut app = appender(&path, &key);
    let (q, r) = run("3");
    app.append_run(&q, &r).expect("run 3 after reopening");
    drop(app);
    assert_eq!(verified(&path, &key).expect("verifies").runs, 3);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_session_without_its_close_is_incomplete() {
    let dir = scratch("no-close");
    let path = dir.join("bundle.jsonl");
    let key = keys::ephemeral();
    let mut s = Session::new(ID_A);
    {
        let mut app = appender(&path, &key);
        let fp = app
            .append_open(&Session::open_request(), &s.open_answer())
            .expect("open");
        let (q, r) = s.call("1");
        app.append_call(&fp, &q, &r).expect("call");
        let (q, r) = run("2");
        app.append_run(&q, &r).expect("run");
    }
    incomplete(verified(&path, &key), "no close");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn the_appender_refuses_a_call_that_does_not_continue_the_chain() {
    let dir = scratch("chain");
    let path = dir.join("bundle.jsonl");
    let key = keys::ephemeral();
    let mut s = Session::new(ID_A);
    let mut app = appender(&path, &key);
    let fp = app
        .append_open(&Session::open_request(), &s.open_answer())
        .expect("open");
    let before = fs::read(&path).expect("reads");

    let (q, r, _) = s.call_at("1", 2, "");
    match app.append_call(&fp, &q, &r) {
        Err(AttestError::Record(why)) => assert!(why.contains("record.sequence"), "{why}"),
        other => panic!("a call out of sequence was appended: {other:?}"),
    }
    let (q, r, _) = s.call_at("1", 1, "");
    let other = sessions::fingerprint("no such session");
    assert!(
        app.append_call(&other, &q, &r).is_err(),
        "a call of no open session"
    );
    assert_eq!(
        fs::read(&path).expect("reads"),
        before,
        "a refused call changed the file"
    );

    // The chain did not move: the right first call still appends.
    let (q, r) = s.call("1");
    app.append_call(&fp, &q, &r).expect("the first call");
    app.append_close(&fp, &s.close_answer(1)).expect("close");
    drop(app);
    let v = verified(&path, &key).expect("verifies");
    assert_eq!((v.sessions, v.session_calls), (1, 1));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn the_bundle_never_holds_the_session_id() {
    let dir = scratch("no-id");
    let path = dir.join("bundle.jsonl");
    let key = keys::ephemeral();
    let mut s = Session::new(ID_A);
    {
        let mut app = appender(&path, &key);
        // An ID its fingerprint does not name, or none, opens nothing.
        let mut wrong = s.open_answer();
        wrong["sessionId"] = json!(ID_B);
        assert!(app.append_open(&Session::open_request(), &wrong).is_err());
        let mut none = s.open_answer();
        if let Some(o) = none.as_object_mut() {
            o.remove("sessionId");
        }
        assert!(app.append_open(&Session::open_request(), &none).is_err());

        let fp = app
            .append_open(&Session::open_request(), &s.open_answer())
            .expect("open");
        let again = app.append_open(&Session::open_request(), &s.open_answer());
        assert!(again.is_err(), "the same session opened twice");
        // A call kept with its ID is refused.
        let (mut q, r, _) = s.call_at("1", 1, "");
        q["sessionId"] = json!(ID_A);
        assert!(app.append_call(&fp, &q, &r).is_err());

        let (q, r) = s.call("1");
        app.append_call(&fp, &q, &r).expect("call");
        app.append_close(&fp, &s.close_answer(1)).expect("close");
    }
    let bytes = fs::read(&path).expect("reads");
    assert!(
        !bytes.windows(ID_A.len()).any(|w| w == ID_A.as_bytes()),
        "the bundle holds the session ID"
    );
    let fp = sessions::fingerprint(ID_A);
    assert!(bytes.windows(fp.len()).any(|w| w == fp.as_bytes()));
    assert_eq!(verified(&path, &key).expect("verifies").sessions, 1);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_close_with_a_wrong_count_is_refused_and_the_bundle_stays_incomplete() {
    let dir = scratch("wrong-close");
    let path = dir.join("bundle.jsonl");
    let key = keys::ephemeral();
    let mut s = Session::new(ID_A);
    {
        let mut app = appender(&path, &key);
        let fp = app
            .append_open(&Session::open_request(), &s.open_answer())
            .expect("open");
        for code in ["1", "2"] {
            let (q, r) = s.call(code);
            app.append_call(&fp, &q, &r).expect("call");
        }
        let before = fs::read(&path).expect("reads");
        for calls in [1, 3] {
            match app.append_close(&fp, &s.close_answer(calls)) {
                Err(AttestError::Record(why)) => assert!(why.contains("the close counts"), "{why}"),
                other => panic!("a close counting {calls} calls was appended: {other:?}"),
            }
        }
        assert_eq!(fs::read(&path).expect("reads"), before);
    }
    incomplete(verified(&path, &key), "no close");
    let _ = fs::remove_dir_all(&dir);
}
