use super::*;
use crate::record::{self, Evidence, Link};
use crate::wire::{B64, CellResult, I64, JavaScriptResult, RunResponse};
use serde_json::json;

/// The session ID: only its fingerprint appears in records.
const ID: &str = "5f0c2a1e9b7d4c3a8e6f1b2d3c4a5e6f";
const IDENTITY: &str = "quickjs:2024-01-13";
const STARTED: i64 = 1_700_000_000_000;

/// The evidence the session's sandbox has, call after call.
const EV: Evidence<'static> = Evidence {
    provider: "docker",
    isolation: "container",
    environment: "oci:sha256:0a0a",
    policy: "plugin:sha256:0b0b",
    software_identity: IDENTITY,
    instance: "",
};

fn fp() -> String {
    sessions::fingerprint(ID)
}

fn rule() -> Value {
    json!({"mode": "exact", "identities": [IDENTITY]})
}

fn open_request(body: Value) -> OpenSessionRequest {
    parse_open_request(&body).expect("parses")
}

/// An open with a floor and a rule, as most tests use.
fn ruled_open() -> OpenSessionRequest {
    open_request(json!({
        "protocol": 4, "minimumIsolation": "container", "languages": ["python"],
        "softwareRule": rule()
    }))
}

/// The open answer the daemon gives, as kept (without its ID).
fn open_answer() -> OpenSessionResponse {
    OpenSessionResponse {
        session_id: String::new(),
        session: fp(),
        sandbox: EV.provider.into(),
        isolation: EV.isolation.into(),
        expires_unix_ms: I64(STARTED + 600_000),
        idle_timeout_ms: 60_000,
        software_identity: IDENTITY.into(),
    }
}

fn opened() -> Chain {
    check_open(&ruled_open(), &open_answer()).expect("opens")
}

fn call(body: Value) -> RunRequest {
    parse_session_call(&body).expect("parses")
}

/// A JavaScript call under the session's rule.
fn js(code: &str) -> RunRequest {
    call(json!({"protocol": 4, "softwareRule": rule(), "javascript": {"code": code}}))
}

fn link(sequence: u64, previous: &str) -> Link {
    Link {
        session: fp(),
        sequence,
        previous: previous.into(),
    }
}

/// The answer the daemon gives a call at `link` under `ev`, sealed as
/// `pipeline::answer` seals it.
fn answer(
    req: &RunRequest,
    ev: &Evidence<'_>,
    link: &Link,
    ended: SessionEnd,
) -> SessionRunResponse {
    let (javascript, cell, result_sha256) = if req.cell.is_some() {
        let r = CellResult {
            stdout: B64(b"2\n".to_vec()),
            interpreter_started: true,
            ..Default::default()
        };
        let d = record::cell_result_digest(&r);
        (None, Some(r), d)
    } else {
        let r = JavaScriptResult {
            stdout: B64(b"42\n".to_vec()),
            ..Default::default()
        };
        let d = record::javascript_result_digest(&r);
        (Some(r), None, d)
    };
    let rec = record::seal(
        record::request_digest(req),
        result_sha256,
        req.software_rule.as_ref(),
        ev,
        STARTED,
        STARTED + 5,
        Some(link),
    );
    SessionRunResponse {
        run: RunResponse {
            sandbox: ev.provider.into(),
            isolation: ev.isolation.into(),
            duration_ms: I64(5),
            record: rec,
            software_identity: ev.software_identity.into(),
            environment: ev.environment.into(),
            instance: ev.instance.into(),
            javascript,
            project: None,
            cell,
            receipt: None,
        },
        ended,
        end_detail: String::new(),
    }
}

/// A chain past one call of `js("1")`, and that call's answer.
fn after_one_call() -> (Chain, SessionRunResponse) {
    let mut chain = opened();
    let first = answer(&js("1"), &EV, &link(1, ""), SessionEnd::Open);
    chain
        .check_call(&js("1"), &first)
        .expect("first call checks");
    chain.advance(&first);
    (chain, first)
}

/// Refused as a record error whose message names `field`.
fn refused<T: std::fmt::Debug>(result: Result<T, AttestError>, field: &str) {
    match result {
        Err(AttestError::Record(why)) => {
            assert!(why.contains(field), "{field:?} is not named in: {why}")
        }
        Err(other) => panic!("not a record error: {other}"),
        Ok(v) => panic!("checked, though {field} is wrong: {v:?}"),
    }
}

#[test]
fn a_session_as_the_daemon_seals_it_checks() {
    // Each answer read back from its JSON, as a signer receives it.
    let kept = serde_json::to_value(open_answer()).expect("json");
    let opened_answer = open_as_received(&kept).expect("reads");
    let mut chain = check_open(&ruled_open(), &opened_answer).expect("opens");
    assert_eq!((chain.calls, chain.last.as_str()), (0, ""));
    assert_eq!(chain.fingerprint, fp());

    let first = answer(&js("1"), &EV, &link(1, ""), SessionEnd::Open);
    let first = call_as_received(&serde_json::to_value(&first).expect("json")).expect("reads");
    chain
        .check_call(&js("1"), &first)
        .expect("first call checks");
    chain.advance(&first);
    let first_sha256 = first.run.record.record_sha256.clone();
    assert_eq!((chain.calls, &chain.last), (1, &first_sha256));

    let second = answer(&js("2"), &EV, &link(2, &first_sha256), SessionEnd::Open);
    chain
        .check_call(&js("2"), &second)
        .expect("second call checks");
    chain.advance(&second);
    assert_eq!(
        (chain.calls, &chain.last),
        (2, &second.run.record.record_sha256)
    );

    let close = CloseSessionResponse {
        session: fp(),
        calls: I64(2),
        last_record_sha256: second.run.record.record_sha256.clone(),
        ended: SessionEnd::Closed,
        receipt: None,
    };
    let close_json = serde_json::to_value(&close).expect("json");
    assert_eq!(close_json["calls"], "2");
    let close = close_as_received(&close_json).expect("reads");
    chain.check_close(&close).expect("close checks");
}

#[test]
fn a_call_out_of_sequence_or_after_another_record_is_refused() {
    let chain = opened();
    let skipped = answer(&js("1"), &EV, &link(2, ""), SessionEnd::Open);
    refused(chain.check_call(&js("1"), &skipped), "record.sequence");

    let digest = "ab".repeat(32);
    let after_nothing = answer(&js("1"), &EV, &link(1, &digest), SessionEnd::Open);
    refused(
        chain.check_call(&js("1"), &after_nothing),
        "record.previousSha256",
    );

    let other = Link {
        session: sessions::fingerprint("another session's id"),
        sequence: 1,
        previous: String::new(),
    };
    let elsewhere = answer(&js("1"), &EV, &other, SessionEnd::Open);
    refused(chain.check_call(&js("1"), &elsewhere), "record.session");

    let (chain, first) = after_one_call();
    // The first call again, and a second after another record.
    refused(chain.check_call(&js("1"), &first), "record.sequence");
    let wrong = answer(
        &js("2"),
        &EV,
        &link(2, &first.run.record.request_sha256),
        SessionEnd::Open,
    );
    refused(chain.check_call(&js("2"), &wrong), "record.previousSha256");
    let right = answer(
        &js("2"),
        &EV,
        &link(2, &first.run.record.record_sha256),
        SessionEnd::Open,
    );
    chain
        .check_call(&js("2"), &right)
        .expect("the right second call checks");
}

#[test]
fn a_call_after_an_answer_that_ended_the_session_is_refused() {
    for end in [
        SessionEnd::Closed,
        SessionEnd::Expired,
        SessionEnd::SandboxChanged,
    ] {
        let mut chain = opened();
        let first = answer(&js("1"), &EV, &link(1, ""), end);
        chain
            .check_call(&js("1"), &first)
            .expect("the ending call checks");
        chain.advance(&first);
        let next = answer(
            &js("2"),
            &EV,
            &link(2, &first.run.record.record_sha256),
            SessionEnd::Open,
        );
        refused(chain.check_call(&js("2"), &next), "ended the session");
    }
}

#[test]
fn a_close_counting_other_calls_or_another_last_record_is_refused() {
    let (mut chain, first) = after_one_call();
    let second = answer(
        &js("2"),
        &EV,
        &link(2, &first.run.record.record_sha256),
        SessionEnd::Open,
    );
    chain.check_call(&js("2"), &second).expect("checks");
    chain.advance(&second);
    let close = |calls: i64, last: &str| CloseSessionResponse {
        session: fp(),
        calls: I64(calls),
        last_record_sha256: last.into(),
        ended: SessionEnd::Closed,
        receipt: None,
    };
    let (first_sha256, second_sha256) = (
        &first.run.record.record_sha256,
        &second.run.record.record_sha256,
    );
    chain
        .check_close(&close(2, second_sha256))
        .expect("the true close checks");
    refused(
        chain.check_close(&close(1, first_sha256)),
        "the close counts 1 calls",
    );
    refused(
        chain.check_close(&close(1, second_sha256)),
        "the close counts 1 calls",
    );
    refused(
        chain.check_close(&close(3, second_sha256)),
        "the close counts 3 calls",
    );
    refused(
        chain.check_close(&close(2, first_sha256)),
        "the close counts 2 calls",
    );
    refused(chain.check_close(&close(2, "")), "the close counts 2 calls");
    let mut elsewhere = close(2, second_sha256);
    elsewhere.session = sessions::fingerprint("another session's id");
    refused(chain.check_close(&elsewhere), "another session's");

    // A session with no calls closes with none.
    let fresh = opened();
    fresh
        .check_close(&close(0, ""))
        .expect("an empty session closes");
    refused(
        fresh.check_close(&close(1, first_sha256)),
        "the close counts 1 calls",
    );
}

#[test]
fn a_call_whose_evidence_is_not_the_opens_is_refused() {
    let chain = opened();
    let moved = Evidence {
        provider: "podman",
        ..EV
    };
    let a = answer(&js("1"), &moved, &link(1, ""), SessionEnd::Open);
    refused(chain.check_call(&js("1"), &a), "record.provider");
    let raised = Evidence {
        isolation: "kernel",
        ..EV
    };
    let a = answer(&js("1"), &raised, &link(1, ""), SessionEnd::Open);
    refused(chain.check_call(&js("1"), &a), "record.isolation");

    // Without rules, only the open's software identity holds the call's.
    let bare = open_request(json!({"protocol": 4, "minimumIsolation": "container"}));
    let chain = check_open(&bare, &open_answer()).expect("opens");
    let unruled = call(json!({"protocol": 4, "javascript": {"code": "1"}}));
    let other = Evidence {
        software_identity: "quickjs:2025-01-01",
        ..EV
    };
    let a = answer(&unruled, &other, &link(1, ""), SessionEnd::Open);
    refused(chain.check_call(&unruled, &a), "record.softwareIdentity");
    let a = answer(&unruled, &EV, &link(1, ""), SessionEnd::Open);
    chain
        .check_call(&unruled, &a)
        .expect("the open's identity checks");
}

#[test]
fn a_second_call_whose_environment_or_policy_changed_is_refused() {
    let (chain, first) = after_one_call();
    let previous = first.run.record.record_sha256.clone();
    for ev in [
        Evidence {
            environment: "oci:sha256:0c0c",
            ..EV
        },
        Evidence {
            policy: "plugin:sha256:0d0d",
            ..EV
        },
    ] {
        let a = answer(&js("2"), &ev, &link(2, &previous), SessionEnd::Open);
        refused(
            chain.check_call(&js("2"), &a),
            "record.environment or policy",
        );
    }
    // The first call sets what the session's evidence is.
    let fresh = opened();
    let other = Evidence {
        environment: "oci:sha256:0c0c",
        ..EV
    };
    let a = answer(&js("1"), &other, &link(1, ""), SessionEnd::Open);
    fresh
        .check_call(&js("1"), &a)
        .expect("any environment may start it");
}

#[test]
fn a_call_rule_wider_than_the_sessions_is_refused() {
    let chain = opened();
    let wider = call(json!({
        "protocol": 4, "javascript": {"code": "1"},
        "softwareRule": {"mode": "approved", "identities": [IDENTITY, "node:22"]}
    }));
    let a = answer(&wider, &EV, &link(1, ""), SessionEnd::Open);
    refused(chain.check_call(&wider, &a), "request.softwareRule");
    // No rule at all allows any software: wider than the session's too.
    let unruled = call(json!({"protocol": 4, "javascript": {"code": "1"}}));
    let a = answer(&unruled, &EV, &link(1, ""), SessionEnd::Open);
    refused(chain.check_call(&unruled, &a), "request.softwareRule");
}

#[test]
fn a_call_record_below_the_sessions_floor_is_refused() {
    // The open's isolation met its floor and each call must repeat it, so
    // this rule shows alone only on a chain whose floor is raised here.
    let mut chain = opened();
    chain.floor = Some(Tier::Vm);
    let a = answer(&js("1"), &EV, &link(1, ""), SessionEnd::Open);
    refused(
        chain.check_call(&js("1"), &a),
        "session's minimumIsolation vm",
    );
    chain.floor = Some(Tier::Container);
    chain.check_call(&js("1"), &a).expect("meets the floor");
}

#[test]
fn an_open_below_its_floor_or_outside_its_rule_is_refused() {
    check_open(&ruled_open(), &open_answer()).expect("the control opens");
    let kernel = open_request(json!({"protocol": 4, "minimumIsolation": "kernel"}));
    refused(
        check_open(&kernel, &open_answer()),
        "minimumIsolation kernel",
    );
    let unknown = open_request(json!({"protocol": 4, "minimumIsolation": "cloud"}));
    refused(
        check_open(&unknown, &open_answer()),
        "request.minimumIsolation",
    );
    for tier in ["none", "cloud", ""] {
        let mut a = open_answer();
        a.isolation = tier.into();
        refused(check_open(&ruled_open(), &a), "isolation");
    }
    let mut a = open_answer();
    a.software_identity = "quickjs:2025-01-01".into();
    refused(check_open(&ruled_open(), &a), "softwareIdentity");
    let mut a = open_answer();
    a.sandbox = String::new();
    refused(check_open(&ruled_open(), &a), "sandbox");

    let ruby = open_request(json!({"protocol": 4, "languages": ["ruby"]}));
    refused(check_open(&ruby, &open_answer()), "request.languages");
    let owner = open_request(json!({"protocol": 4, "owner": "not an owner"}));
    refused(check_open(&owner, &open_answer()), "request.owner");
    let bad_rule = open_request(json!({
        "protocol": 4, "softwareRule": {"mode": "exact", "identities": []}
    }));
    refused(
        check_open(&bad_rule, &open_answer()),
        "request.softwareRule",
    );
}

#[test]
fn an_open_whose_session_is_not_a_fingerprint_is_refused() {
    for session in [
        fp().to_uppercase(),
        "xyz".into(),
        fp()[..63].to_string(),
        String::new(),
    ] {
        let mut a = open_answer();
        a.session = session;
        refused(check_open(&ruled_open(), &a), "is not a fingerprint");
    }
}

#[test]
fn a_session_id_in_a_kept_call_or_open_answer_is_refused() {
    for body in [
        json!({"protocol": 4, "sessionId": ID, "javascript": {"code": "1"}}),
        json!({"protocol": 4, "session_id": ID, "javascript": {"code": "1"}}),
        // The key alone, even empty, is refused.
        json!({"protocol": 4, "sessionId": "", "javascript": {"code": "1"}}),
    ] {
        assert!(
            matches!(parse_session_call(&body), Err(AttestError::Format(_))),
            "{body}"
        );
    }
    let with_id = OpenSessionResponse {
        session_id: ID.into(),
        ..open_answer()
    };
    let received = serde_json::to_value(&with_id).expect("json");
    assert_eq!(received["sessionId"], ID);
    assert!(matches!(
        open_as_received(&received),
        Err(AttestError::Format(_))
    ));
    let mut snake = serde_json::to_value(open_answer()).expect("json");
    snake["session_id"] = json!(ID);
    assert!(matches!(
        open_as_received(&snake),
        Err(AttestError::Format(_))
    ));

    for given in [&received, &snake] {
        let kept = without_id(given);
        assert!(kept.get("sessionId").is_none() && kept.get("session_id").is_none());
        assert!(!kept.to_string().contains(ID), "{kept}");
        let read = open_as_received(&kept).expect("the kept answer reads");
        assert_eq!(read.session, fp());
    }
}

#[test]
fn a_python_cell_checks_in_a_session_and_a_ruby_one_does_not() {
    let chain = opened();
    let cell = |language: &str| {
        call(json!({
            "protocol": 4, "softwareRule": rule(),
            "cell": {"language": language, "code": "print(1+1)"}
        }))
    };
    let python = cell("python");
    let a = answer(&python, &EV, &link(1, ""), SessionEnd::Open);
    chain.check_call(&python, &a).expect("a python cell checks");
    let ruby = cell("ruby");
    let a = answer(&ruby, &EV, &link(1, ""), SessionEnd::Open);
    refused(chain.check_call(&ruby, &a), "\"ruby\" cells");
}

#[test]
fn id_matches_only_the_id_its_fingerprint_names() {
    assert!(id_matches(ID, &fp()));
    assert!(!id_matches("another session's id", &fp()));
    assert!(!id_matches("", &fp()));
    assert!(!id_matches("", &sessions::fingerprint("")));
    assert!(!id_matches(ID, ""));
}
