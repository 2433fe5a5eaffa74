use super::*;

#[test]
fn accepts_both_names_and_string_integers() {
    let r: RunRequest = serde_json::from_str(
        r#"{"protocol":"4","timeout_ms":"1500","minimumIsolation":"process","javascript":{"code":"1","grant_profile":null}}"#,
    )
    .expect("parses");
    assert_eq!(r.protocol, 4);
    assert_eq!(r.timeout_ms, 1500);
    assert_eq!(r.minimum_isolation, "process");
    assert_eq!(r.javascript.expect("js").code, "1");
}

#[test]
fn rejects_unknown_fields_duplicates_and_bad_numbers() {
    for bad in [
        r#"{"protocol":4,"javascript":{"code":"1","extra":1}}"#,
        r#"{"protocol":4,"bogus":true}"#,
        r#"{"protocol":4,"timeoutMs":1.5}"#,
        r#"{"protocol":4,"timeoutMs":"0x10"}"#,
        r#"{"protocol":4,"timeoutMs":4294967296}"#,
        r#"{"protocol":4,"timeoutMs":1,"timeoutMs":2}"#,
        r#"{"protocol":4,"javascript":{"code":5}}"#,
    ] {
        assert!(serde_json::from_str::<RunRequest>(bad).is_err(), "{bad}");
    }
}

#[test]
fn shape_pass_refuses_positional_arrays_and_reads_protocol() {
    assert_eq!(
        shape_of_run(br#"{"protocol":4,"javascript":{"code":"1"}}"#).expect("shape"),
        Ok(4)
    );
    assert_eq!(shape_of_run(br#"{"protocol":4.0}"#).expect("shape"), Ok(4));
    assert_eq!(shape_of_run(br#"{"protocol":"4"}"#).expect("shape"), Ok(4));
    assert!(
        shape_of_run(br#"{"protocol":"+4"}"#)
            .expect("shape")
            .is_err()
    );
    assert_eq!(
        shape_of_run(br#"{"javascript":null}"#).expect("shape"),
        Ok(0)
    );
    for bad in [
        &br#"[4,"","",0,null,{"code":"1"}]"#[..],
        br#"{"protocol":4,"javascript":["1",""]}"#,
        br#"{"protocol":4,"project":{"files":[["a","b"]],"steps":["x"]}}"#,
        br#"{"protocol":4,"module":{"rows":[[1,2]]}}"#,
        br#"{"protocol":4,"softwareRule":["exact",["a"]]}"#,
        br#"{"protocol":4} trailing"#,
        br#"{"protocol":4"#,
    ] {
        assert!(
            shape_of_run(bad).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    assert!(shape_of_describe(b"[]").is_err());
    assert!(shape_of_describe(b"{}").is_ok());
}

#[test]
fn answers_use_canonical_proto3_json() {
    let resp = RunResponse {
        sandbox: "wasm".into(),
        isolation: "process".into(),
        duration_ms: I64(7),
        javascript: Some(JavaScriptResult {
            stdout: B64(b"hi\n".to_vec()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let v = serde_json::to_value(&resp).expect("serialises");
    assert_eq!(v["durationMs"], "7");
    assert_eq!(v["javascript"]["stdout"], "aGkK");
    assert!(v["javascript"].get("exitCode").is_none());
}

// --- answers read back ------------------------------------------------------

/// Serialises `v`, checks that every one of its `fields` was written (so
/// the value really is non-zero everywhere), reads it back, lets
/// `restore` put back what reading skips, and checks the second
/// serialisation is byte for byte the first.
fn round_trip<T: Serialize + serde::de::DeserializeOwned>(
    v: &T,
    fields: usize,
    restore: impl FnOnce(&mut T),
) -> T {
    let first = serde_json::to_string(v).expect("serialises");
    let written: serde_json::Value = serde_json::from_str(&first).expect("is JSON");
    assert_eq!(
        written.as_object().map_or(0, |o| o.len()),
        fields,
        "a field was left at zero: {first}"
    );
    let mut back: T = serde_json::from_str(&first).expect("reads back");
    restore(&mut back);
    let second = serde_json::to_string(&back).expect("serialises again");
    assert_eq!(first, second);
    back
}

fn trace() -> Option<crate::grants::broker::CallTrace> {
    Some(crate::grants::broker::CallTrace {
        calls: Vec::new(),
        dropped: 1,
        denied: 2,
        shed: 3,
    })
}

fn javascript_result() -> JavaScriptResult {
    JavaScriptResult {
        stdout: B64(b"42\n".to_vec()),
        stderr: B64(vec![0, 0xff, b'\n']),
        exit_code: -3,
        timed_out: true,
        stdout_truncated: true,
        stderr_truncated: true,
        call_trace: trace(),
        advice: Vec::new(),
    }
}

fn cell_result() -> CellResult {
    CellResult {
        stdout: B64(b"out".to_vec()),
        stderr: B64(b"err".to_vec()),
        exit_code: 2,
        timed_out: true,
        stdout_truncated: true,
        stderr_truncated: true,
        interpreter_started: true,
        interpreter_ended: true,
    }
}

fn step_result(n: u8) -> StepResult {
    StepResult {
        command: format!("python3 step{n}.py"),
        stdout: B64(vec![n, b'o']),
        stderr: B64(vec![n, b'e']),
        exit_code: i32::from(n) + 1,
        timed_out: true,
        duration_ms: I64(i64::from(n) + 1_000),
        stdout_truncated: true,
        stderr_truncated: true,
    }
}

fn artifact(n: u8) -> Artifact {
    Artifact {
        path: format!("out/{n}.bin"),
        content: B64(vec![n; usize::from(n) + 1]),
    }
}

fn project_result() -> ProjectResult {
    ProjectResult {
        steps: vec![step_result(1), step_result(2)],
        outcome: ProjectOutcome::SetupFailed,
        outcome_detail: "step 2 exited 3".into(),
        artifacts: vec![artifact(1), artifact(2)],
        artifacts_truncated: true,
        call_trace: trace(),
        advice: Vec::new(),
    }
}

fn run_record() -> RunRecord {
    RunRecord {
        version: RECORD_VERSION,
        request_sha256: "aa".repeat(32),
        result_sha256: "bb".repeat(32),
        provider: "wasm".into(),
        isolation: "process".into(),
        environment: "quickjs-wasm:sha256:01".into(),
        policy: "plugin:sha256:02".into(),
        started_unix_ms: I64(1_700_000_000_000),
        ended_unix_ms: I64(1_700_000_000_042),
        session: "cc".repeat(32),
        sequence: I64(7),
        previous_sha256: "dd".repeat(32),
        record_sha256: "ee".repeat(32),
        software_identity: "quickjs-wasm:sha256:03".into(),
        software_rule_id: "exact:quickjs-wasm:sha256:03".into(),
        unanswered: "internal".into(),
        instance: "replica-1".into(),
    }
}

#[test]
fn javascript_result_reads_back_without_its_call_trace() {
    let v = javascript_result();
    round_trip(&v, 7, |back| {
        // The trace is outside the digest and never read back.
        assert!(back.call_trace.is_none());
        back.call_trace = trace();
    });
}

#[test]
fn cell_result_reads_back() {
    round_trip(&cell_result(), 8, |_| {});
}

#[test]
fn step_result_reads_back() {
    round_trip(&step_result(9), 8, |_| {});
}

#[test]
fn artifact_reads_back() {
    let back = round_trip(&artifact(4), 2, |_| {});
    assert_eq!(back.content.0, [4; 5]);
}

#[test]
fn project_result_reads_back_with_steps_and_artifacts() {
    let back = round_trip(&project_result(), 6, |back| {
        assert!(back.call_trace.is_none());
        back.call_trace = trace();
    });
    assert_eq!(back.steps.len(), 2);
    assert_eq!(back.artifacts.len(), 2);
    assert_eq!(back.outcome, ProjectOutcome::SetupFailed);
}

#[test]
fn run_record_reads_back() {
    let back = round_trip(&run_record(), 17, |_| {});
    assert_eq!(back.sequence, I64(7));
    assert_eq!(back.started_unix_ms, I64(1_700_000_000_000));
}

#[test]
fn run_response_reads_back() {
    // All three results at once: the wire type does not enforce the
    // oneof, and every field must survive the trip.
    let resp = RunResponse {
        sandbox: "wasm".into(),
        isolation: "process".into(),
        duration_ms: I64(42),
        record: run_record(),
        software_identity: "quickjs-wasm:sha256:03".into(),
        environment: "quickjs-wasm:sha256:01".into(),
        instance: "replica-1".into(),
        javascript: Some(javascript_result()),
        project: Some(project_result()),
        cell: Some(cell_result()),
        receipt: Some(serde_json::json!({"payload": "e30=", "signatures": []})),
    };
    round_trip(&resp, 11, |back| {
        for t in [
            &mut back.javascript.as_mut().expect("javascript").call_trace,
            &mut back.project.as_mut().expect("project").call_trace,
        ] {
            assert!(t.is_none());
            *t = trace();
        }
    });
}

#[test]
fn zero_values_left_out_read_as_zero() {
    let r: RunResponse =
        serde_json::from_str(r#"{"sandbox":"","isolation":"","record":{"version":4}}"#)
            .expect("reads");
    assert_eq!(r.duration_ms, I64(0));
    assert!(r.record.request_sha256.is_empty());
    assert!(r.javascript.is_none() && r.project.is_none() && r.cell.is_none());
    let p: ProjectResult =
        serde_json::from_str(r#"{"outcome":"PROJECT_OUTCOME_COMPLETED"}"#).expect("reads");
    assert!(p.steps.is_empty() && p.artifacts.is_empty() && !p.artifacts_truncated);
    let j: JavaScriptResult = serde_json::from_str("{}").expect("reads");
    assert!(j.stdout.0.is_empty() && j.exit_code == 0 && !j.timed_out);
}

#[test]
fn int64_reads_its_string_and_a_json_integer_only() {
    for (text, want) in [
        (r#""123""#, 123),
        (r#""-5""#, -5),
        (r#""0""#, 0),
        (r#""9223372036854775807""#, i64::MAX),
        (r#""-9223372036854775808""#, i64::MIN),
        ("123", 123),
        ("-5", -5),
    ] {
        assert_eq!(serde_json::from_str::<I64>(text).expect(text), I64(want));
    }
    for bad in [
        r#""+5""#,
        r#"" 5""#,
        r#""5 ""#,
        r#""""#,
        r#""-""#,
        r#""1.0""#,
        r#""1e3""#,
        r#""0x10""#,
        r#""9223372036854775808""#,
        "9223372036854775808",
        "1.5",
        "5.0",
        "1e3",
        "true",
        "null",
    ] {
        assert!(serde_json::from_str::<I64>(bad).is_err(), "{bad}");
    }
}

#[test]
fn bytes_read_only_padded_standard_base64() {
    for (text, want) in [
        (r#""aGkK""#, &b"hi\n"[..]),
        (r#""aGk=""#, &b"hi"[..]),
        (r#""aA==""#, &b"h"[..]),
        (r#""""#, &b""[..]),
        (r#""+/8=""#, &[0xfb_u8, 0xff][..]),
    ] {
        assert_eq!(serde_json::from_str::<B64>(text).expect(text).0, want);
    }
    for bad in [
        r#""aGk""#,   // padding left out
        r#""aA=""#,   // padding short
        r#""aGl=""#,  // trailing bits set
        r#""-_8=""#,  // URL-safe alphabet
        r#""aG k=""#, // a blank inside
        "5",
        "null",
    ] {
        assert!(serde_json::from_str::<B64>(bad).is_err(), "{bad}");
    }
}

#[test]
fn project_outcome_reads_its_name_or_number() {
    for o in ProjectOutcome::ALL {
        let name = serde_json::to_string(&o).expect("serialises");
        assert_eq!(
            serde_json::from_str::<ProjectOutcome>(&name).expect("name"),
            o
        );
        let number = (o as u32).to_string();
        assert_eq!(
            serde_json::from_str::<ProjectOutcome>(&number).expect("number"),
            o
        );
    }
    for bad in [
        r#""PROJECT_OUTCOME_UNSPECIFIED""#,
        r#""COMPLETED""#,
        r#""project_outcome_completed""#,
        "0",
        "5",
        "-1",
        "1.0",
        "null",
    ] {
        assert!(
            serde_json::from_str::<ProjectOutcome>(bad).is_err(),
            "{bad}"
        );
    }
}
