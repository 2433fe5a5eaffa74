use super::*;
use crate::wire::{
    Artifact, B64, CellResult, I64, JavaScriptResult, ProjectOutcome, ProjectResult, StepResult,
};

/// A named change to one part of an answer.
type Case<T> = (&'static str, fn(&mut T));

const STARTED: i64 = 1_700_000_000_000;
const ELAPSED: i64 = 42;

/// The provider evidence a run is sealed under.
const EV: record::Evidence<'static> = record::Evidence {
    provider: "docker",
    isolation: "container",
    environment: "oci:sha256:0a0a",
    policy: "plugin:sha256:0b0b",
    software_identity: "quickjs:2024-01-13",
    instance: "",
};

enum Output {
    JavaScript(JavaScriptResult),
    Project(ProjectResult),
    Cell(CellResult),
}

/// The answer the daemon gives `req` for `output` under `ev`, built as
/// `pipeline::answer::seal` builds it.
fn sealed(req: &RunRequest, ev: &record::Evidence<'_>, output: Output) -> RunResponse {
    let (javascript, project, cell, result_sha256) = match output {
        Output::JavaScript(r) => {
            let d = record::javascript_result_digest(&r);
            (Some(r), None, None, d)
        }
        Output::Project(r) => {
            let d = record::project_result_digest(&r);
            (None, Some(r), None, d)
        }
        Output::Cell(r) => {
            let d = record::cell_result_digest(&r);
            (None, None, Some(r), d)
        }
    };
    let rec = record::seal(
        record::request_digest(req),
        result_sha256,
        req.software_rule.as_ref(),
        ev,
        STARTED,
        STARTED + ELAPSED,
        None,
    );
    RunResponse {
        sandbox: ev.provider.to_string(),
        isolation: ev.isolation.to_string(),
        duration_ms: I64(ELAPSED),
        record: rec,
        software_identity: ev.software_identity.to_string(),
        environment: ev.environment.to_string(),
        instance: ev.instance.to_string(),
        javascript,
        project,
        cell,
        receipt: None,
    }
}

/// After a test changed the record on purpose, makes its own digest
/// right again, so only the rule under test can refuse it.
fn reseal(resp: &mut RunResponse) {
    resp.record.record_sha256 = record::record_digest(&resp.record);
}

fn javascript_request() -> RunRequest {
    parse_run_request(
        br#"{"protocol":4,"minimumIsolation":"container","timeoutMs":1500,"softwareRule":{"mode":"exact","identities":["quickjs:2024-01-13"]},"javascript":{"code":"console.log(6*7)","grantProfile":"inventory"}}"#,
    )
    .expect("parses")
}

fn javascript_result() -> JavaScriptResult {
    JavaScriptResult {
        stdout: B64(b"42\n".to_vec()),
        stderr: B64(b"note\n".to_vec()),
        exit_code: 0,
        ..Default::default()
    }
}

/// A request and the answer the daemon gives it: they check.
fn javascript_run() -> (RunRequest, RunResponse) {
    let req = javascript_request();
    let resp = sealed(&req, &EV, Output::JavaScript(javascript_result()));
    (req, resp)
}

fn project_run() -> (RunRequest, RunResponse) {
    let req = parse_run_request(
        br#"{"protocol":4,"project":{"files":[{"path":"main.py","content":"open('out.txt','w').write('1')"}],"steps":["python3 main.py","ls"],"artifacts":["out.txt"]}}"#,
    )
    .expect("parses");
    let step = |command: &str, stdout: &[u8], exit_code: i32| StepResult {
        command: command.into(),
        stdout: B64(stdout.to_vec()),
        stderr: B64(Vec::new()),
        exit_code,
        duration_ms: I64(9),
        ..Default::default()
    };
    let result = ProjectResult {
        steps: vec![
            step("python3 main.py", &b""[..], 0),
            step("ls", &b"main.py\nout.txt\n"[..], 0),
        ],
        outcome: ProjectOutcome::Completed,
        outcome_detail: String::new(),
        artifacts: vec![Artifact {
            path: "out.txt".into(),
            content: B64(b"1".to_vec()),
        }],
        artifacts_truncated: false,
        call_trace: None,
        advice: Vec::new(),
    };
    let resp = sealed(&req, &EV, Output::Project(result));
    (req, resp)
}

fn cell_run() -> (RunRequest, RunResponse) {
    let req =
        parse_run_request(br#"{"protocol":4,"cell":{"language":"python","code":"print(1+1)"}}"#)
            .expect("parses");
    let result = CellResult {
        stdout: B64(b"2\n".to_vec()),
        interpreter_started: true,
        ..Default::default()
    };
    let resp = sealed(&req, &EV, Output::Cell(result));
    (req, resp)
}

/// `check_run` refuses with a record error whose message names `field`.
fn refused(req: &RunRequest, resp: &RunResponse, field: &str) {
    match check_run(req, resp) {
        Err(AttestError::Record(why)) => {
            assert!(why.contains(field), "{field:?} is not named in: {why}")
        }
        Err(other) => panic!("not a record error: {other}"),
        Ok(()) => panic!("checked, though {field} is wrong"),
    }
}

#[test]
fn answers_as_the_daemon_seals_them_check() {
    for (req, resp) in [javascript_run(), project_run()] {
        check_run(&req, &resp).expect("checks");
    }
}

#[test]
fn answers_check_after_a_trip_through_their_json() {
    // The daemon writes the answer; the client reads it back into the
    // same types and recomputes the digests from what it read.
    for (req, resp) in [javascript_run(), project_run()] {
        let bytes = serde_json::to_vec(&resp).expect("serialises");
        let read: RunResponse = serde_json::from_slice(&bytes).expect("reads back");
        check_run(&req, &read).expect("checks from bytes");
        let value = serde_json::to_value(&resp).expect("serialises");
        let read: RunResponse = serde_json::from_value(value).expect("reads back");
        check_run(&req, &read).expect("checks from a JSON value");
    }
}

#[test]
fn a_changed_stdout_byte_is_refused() {
    let (req, mut resp) = javascript_run();
    resp.javascript.as_mut().expect("javascript").stdout.0[0] ^= 1;
    refused(&req, &resp, "record.resultSha256");
}

#[test]
fn a_changed_exit_code_is_refused() {
    let (req, mut resp) = javascript_run();
    resp.javascript.as_mut().expect("javascript").exit_code = 1;
    refused(&req, &resp, "record.resultSha256");
}

#[test]
fn a_changed_artifact_byte_is_refused() {
    let (req, mut resp) = project_run();
    resp.project.as_mut().expect("project").artifacts[0]
        .content
        .0[0] ^= 1;
    refused(&req, &resp, "record.resultSha256");
}

#[test]
fn a_cell_answered_through_run_is_refused() {
    // Every digest right, but the daemon refuses a cell outside a session
    // before running it: no Run ever answered one.
    let (req, resp) = cell_run();
    refused(&req, &resp, "a cell runs only inside a session");
}

#[test]
fn software_outside_the_rule_and_the_none_tier_are_refused() {
    let rule = |mode: &str, ids: &str| {
        parse_run_request(
            format!(
                r#"{{"protocol":4,"softwareRule":{{"mode":"{mode}","identities":[{ids}]}},"javascript":{{"code":"1"}}}}"#
            )
            .as_bytes(),
        )
        .expect("parses")
    };
    let mut ev = EV;
    ev.software_identity = "evil-runtime:1.0";
    // The record names its software; the rule names another.
    let req = rule("exact", r#""quickjs-wasm:sha256:03""#);
    let resp = sealed(&req, &ev, Output::JavaScript(JavaScriptResult::default()));
    refused(&req, &resp, "record.softwareIdentity");
    // A rule the daemon refuses as malformed.
    let req = rule("bogus", r#""evil-runtime:1.0""#);
    let resp = sealed(&req, &ev, Output::JavaScript(JavaScriptResult::default()));
    refused(&req, &resp, "request.softwareRule");
    // The rule holds here: the same record checks.
    let req = rule("exact", r#""evil-runtime:1.0""#);
    let resp = sealed(&req, &ev, Output::JavaScript(JavaScriptResult::default()));
    check_run(&req, &resp).expect("checks");
    // Nothing runs at tier none.
    let mut none = EV;
    none.isolation = "none";
    let (req, _) = javascript_run();
    let resp = sealed(&req, &none, Output::JavaScript(JavaScriptResult::default()));
    refused(&req, &resp, "record.isolation is none");
}

#[test]
fn a_result_digest_for_another_result_is_refused() {
    let (req, mut resp) = javascript_run();
    resp.record.result_sha256 = record::javascript_result_digest(&JavaScriptResult::default());
    reseal(&mut resp);
    refused(&req, &resp, "record.resultSha256");
}

#[test]
fn a_request_digest_for_another_request_is_refused() {
    let (req, mut resp) = javascript_run();
    resp.record.request_sha256 = "00".repeat(32);
    reseal(&mut resp);
    refused(&req, &resp, "record.requestSha256");
}

#[test]
fn a_request_other_than_the_one_answered_is_refused() {
    let (mut req, resp) = javascript_run();
    req.javascript.as_mut().expect("javascript").code = "console.log(7*6)".into();
    refused(&req, &resp, "record.requestSha256");
}

#[test]
fn a_wrong_record_digest_is_refused() {
    let (req, mut resp) = javascript_run();
    let mut digest = std::mem::take(&mut resp.record.record_sha256).into_bytes();
    digest[0] = if digest[0] == b'0' { b'1' } else { b'0' };
    resp.record.record_sha256 = String::from_utf8(digest).expect("hex");
    refused(&req, &resp, "record.recordSha256");
}

#[test]
fn a_record_field_changed_after_sealing_is_refused() {
    // Policy and the times are repeated nowhere else: only the record's
    // own digest holds them.
    let (req, mut resp) = javascript_run();
    resp.record.policy = "plugin:sha256:ffff".into();
    refused(&req, &resp, "record.recordSha256");
    let (req, mut resp) = javascript_run();
    resp.record.ended_unix_ms = I64(STARTED + ELAPSED + 1);
    refused(&req, &resp, "record.recordSha256");
}

#[test]
fn isolation_below_the_floor_is_refused() {
    let mut req = javascript_request();
    req.minimum_isolation = "kernel".into();
    // Sealed for this very request, so the digests all agree.
    let resp = sealed(&req, &EV, Output::JavaScript(javascript_result()));
    refused(&req, &resp, "below the request's minimumIsolation");
    // The same answer meets a floor at its own tier.
    req.minimum_isolation = "container".into();
    let resp = sealed(&req, &EV, Output::JavaScript(javascript_result()));
    check_run(&req, &resp).expect("meets its own tier");
}

#[test]
fn the_none_tier_meets_no_floor() {
    let req = javascript_request();
    let ev = record::Evidence {
        isolation: "none",
        ..EV
    };
    let resp = sealed(&req, &ev, Output::JavaScript(javascript_result()));
    refused(&req, &resp, "record.isolation is none");
}

#[test]
fn an_unknown_tier_is_refused() {
    let req = javascript_request();
    let ev = record::Evidence {
        isolation: "hypervisor",
        ..EV
    };
    let resp = sealed(&req, &ev, Output::JavaScript(javascript_result()));
    refused(
        &req,
        &resp,
        "record.isolation \"hypervisor\" is not a tier name",
    );
}

#[test]
fn an_unknown_floor_is_refused() {
    let mut req = javascript_request();
    req.minimum_isolation = "VM".into();
    let resp = sealed(&req, &EV, Output::JavaScript(javascript_result()));
    refused(&req, &resp, "request.minimumIsolation");
}

#[test]
fn evidence_the_answer_states_otherwise_is_refused() {
    let cases: [Case<RunResponse>; 5] = [
        ("answer's sandbox", |r| r.sandbox = "wasm".into()),
        ("answer's isolation", |r| r.isolation = "vm".into()),
        ("answer's environment", |r| r.environment.push('0')),
        ("answer's softwareIdentity", |r| {
            r.software_identity = "quickjs:2025-04-26".into()
        }),
        ("answer's instance", |r| r.instance = "replica-2".into()),
    ];
    for (field, change) in cases {
        let (req, mut resp) = javascript_run();
        change(&mut resp);
        refused(&req, &resp, field);
    }
}

#[test]
fn a_rule_id_the_request_does_not_state_is_refused() {
    let (req, mut resp) = javascript_run();
    resp.record.software_rule_id = "exact:quickjs:2025-04-26".into();
    reseal(&mut resp);
    refused(&req, &resp, "record.softwareRuleId");
}

#[test]
fn an_unanswered_record_is_refused() {
    let (req, mut resp) = javascript_run();
    resp.record.unanswered = "internal".into();
    reseal(&mut resp);
    refused(&req, &resp, "record.unanswered");
}

#[test]
fn another_record_version_is_refused() {
    let (req, mut resp) = javascript_run();
    resp.record.version = RECORD_VERSION - 1;
    reseal(&mut resp);
    refused(&req, &resp, "record.version");
}

#[test]
fn a_session_field_on_a_run_is_refused() {
    let cases: [Case<RunRecord>; 3] = [
        ("record.session", |r| r.session = "ab".repeat(32)),
        ("record.sequence", |r| r.sequence = I64(1)),
        ("record.previousSha256", |r| {
            r.previous_sha256 = "cd".repeat(32)
        }),
    ];
    for (field, change) in cases {
        let (req, mut resp) = javascript_run();
        change(&mut resp.record);
        reseal(&mut resp);
        refused(&req, &resp, field);
    }
}

#[test]
fn an_answer_without_exactly_one_result_is_refused() {
    let (req, mut resp) = javascript_run();
    resp.javascript = None;
    refused(&req, &resp, "carries no javascript, project or cell result");
    let (req, mut resp) = javascript_run();
    resp.cell = Some(CellResult::default());
    refused(&req, &resp, "more than one of javascript, project and cell");
}

#[test]
fn a_result_of_another_kind_is_refused() {
    // A cell result for a JavaScript request, every digest right.
    let req = javascript_request();
    let resp = sealed(&req, &EV, Output::Cell(CellResult::default()));
    refused(&req, &resp, "a cell result for a javascript request");
}

#[test]
fn a_request_without_exactly_one_payload_is_refused() {
    let mut req = javascript_request();
    req.javascript = None;
    let resp = sealed(&req, &EV, Output::JavaScript(javascript_result()));
    refused(&req, &resp, "request: it carries no payload");
    let mut req = javascript_request();
    req.project = Some(Default::default());
    let resp = sealed(&req, &EV, Output::JavaScript(javascript_result()));
    refused(&req, &resp, "request: it carries more than one payload");
}

#[test]
fn requests_parse_as_the_daemon_parses_them() {
    // The body and digest of `record`'s golden test, computed by the
    // published client: snake_case names and a string protocol parse.
    let req = parse_run_request(
        br#"{"protocol":"4","software_rule":{"mode":"approved","identities":["b:2","a:1"]},"javascript":{"code":"x","grant_profile":"inv"}}"#,
    )
    .expect("parses");
    assert_eq!(
        record::request_digest(&req),
        "ec5c2218d8aca2969fa94c54a64a0e93a9252c5377c26328fb5ad809b49cc818"
    );
    for bad in [
        &br#"{"javascript":{"code":"1"}}"#[..],
        br#"{"protocol":3,"javascript":{"code":"1"}}"#,
        br#"{"protocol":"+4","javascript":{"code":"1"}}"#,
        br#"{"protocol":4,"javascript":{"code":"1","junk":true}}"#,
        br#"{"protocol":4,"javascript":{"code":"1"}} trailing"#,
        br#"[4,"","",0,null,{"code":"1"}]"#,
        br#"{"protocol":4,"timeoutMs":1,"timeoutMs":2}"#,
    ] {
        match parse_run_request(bad) {
            Err(AttestError::Format(_)) => {}
            Err(other) => panic!("not a format error: {other}"),
            Ok(_) => panic!("parsed: {}", String::from_utf8_lossy(bad)),
        }
    }
}
