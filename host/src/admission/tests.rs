//! Admission's rules at their edges: each bound is tried at its limit and one
//! past it, so a changed comparison or constant fails a test.

use super::*;
use crate::wire::JavaScriptRun;

fn js(code: &str) -> RunRequest {
    RunRequest {
        protocol: 4,
        javascript: Some(JavaScriptRun {
            code: code.into(),
            grant_profile: String::new(),
        }),
        ..Default::default()
    }
}

#[test]
fn code_bounds() {
    let l = Limits::new(8);
    assert!(validate(&js("1"), &l).is_ok());
    assert!(validate(&js(""), &l).is_err());
    assert!(validate(&js("a\0b"), &l).is_err());
    assert!(validate(&js(&"x".repeat(MAX_CODE_BYTES)), &l).is_ok());
    assert!(validate(&js(&"x".repeat(MAX_CODE_BYTES + 1)), &l).is_err());
}

#[test]
fn timeouts_default_and_clamp() {
    let l = Limits::new(8);
    let snippet = |ms| clamp_timeout(ms, l.default_timeout, l.max_timeout);
    assert_eq!(snippet(0), Duration::from_secs(5));
    assert_eq!(snippet(-5), Duration::from_secs(5));
    assert_eq!(snippet(250), Duration::from_millis(250));
    assert_eq!(snippet(i32::MAX), Duration::from_secs(30));
    let project = |ms| clamp_timeout(ms, l.project_default_timeout, l.project_max_timeout);
    assert_eq!(project(0), Duration::from_secs(30));
    assert_eq!(project(60_000), Duration::from_secs(60));
    assert_eq!(project(i32::MAX), Duration::from_secs(120));
}

#[test]
fn trace_ids_are_dropped_whole() {
    let l = Limits::new(8);
    let mut r = js("1");
    r.trace_id = "ok:id-1".into();
    let c = validate(&r, &l).expect("valid");
    assert_eq!(c.trace_id.as_deref(), Some("ok:id-1"));
    r.trace_id = "bad id with spaces".into();
    let c = validate(&r, &l).expect("valid");
    assert_eq!(c.trace_id, None);
    assert!(c.trace_id_rejected);
}

#[test]
fn paths() {
    for good in ["a", "a/b.txt", "dir/.hidden"] {
        assert!(valid_relative_path(good), "{good}");
    }
    for bad in ["", "/abs", "a//b", "./a", "a/..", "a\\b", "a\nb", "a/"] {
        assert!(!valid_relative_path(bad), "{bad:?}");
    }
}

#[test]
fn software_rules() {
    let l = Limits::new(8);
    let mut r = js("1");
    r.software_rule = Some(SoftwareRule {
        mode: "exact".into(),
        identities: vec!["a".into(), "b".into()],
    });
    assert!(validate(&r, &l).is_err());
    r.software_rule = Some(SoftwareRule {
        mode: "approved".into(),
        identities: vec!["a b".into()],
    });
    assert!(validate(&r, &l).is_err());
    r.software_rule = Some(SoftwareRule {
        mode: "approved".into(),
        identities: vec!["a".into(), "a".into()],
    });
    assert!(validate(&r, &l).is_err());
    r.software_rule = Some(SoftwareRule {
        mode: "exact".into(),
        identities: vec!["quickjs-wasm:sha256:ab".into()],
    });
    assert!(validate(&r, &l).is_ok());
}

#[test]
fn cell_through_run_and_two_payloads_are_refused() {
    let l = Limits::new(8);
    let mut r = js("1");
    r.cell = Some(Default::default());
    assert!(validate(&r, &l).is_err());
    let mut r = RunRequest {
        protocol: 4,
        ..Default::default()
    };
    assert!(validate(&r, &l).is_err());
    r.cell = Some(Default::default());
    assert!(validate(&r, &l).is_err());
}

#[test]
fn cells_are_checked_in_a_session() {
    let l = Limits::new(8);
    let cell = |language: &str, code: &str, path: &str| RunRequest {
        protocol: 4,
        cell: Some(CellRun {
            language: language.into(),
            code: code.into(),
            files: vec![ProjectFile {
                path: path.into(),
                content: "x".into(),
            }],
        }),
        ..Default::default()
    };
    let ok = validate_in_session(&cell("python", "1", "a.txt"), &l).expect("valid");
    assert!(matches!(ok.payload, Payload::Cell(_)));
    assert_eq!(ok.timeout, l.project_default_timeout);
    assert!(validate(&cell("python", "1", "a.txt"), &l).is_err());
    assert!(validate_in_session(&cell("ruby", "1", "a.txt"), &l).is_err());
    assert!(validate_in_session(&cell("python", "", "a.txt"), &l).is_err());
    assert!(validate_in_session(&cell("python", "1", "../a"), &l).is_err());
}

// --- every bound at its limit and one past it ---------------------------------

fn refused(r: &RunRequest) -> bool {
    validate(r, &Limits::new(8)).is_err()
}

fn project(p: ProjectRun) -> RunRequest {
    RunRequest {
        protocol: 4,
        project: Some(p),
        ..Default::default()
    }
}

fn one_step() -> ProjectRun {
    ProjectRun {
        steps: vec!["node main.js".into()],
        ..Default::default()
    }
}

fn module(model: &str, end_time: f64, step: f64) -> RunRequest {
    RunRequest {
        protocol: 4,
        module: Some(ModuleRun {
            model: model.into(),
            end_time,
            step,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn file(path: &str, len: usize) -> ProjectFile {
    ProjectFile {
        path: path.into(),
        content: "x".repeat(len),
    }
}

#[test]
fn each_payload_alone_is_admitted_and_named() {
    let l = Limits::new(8);
    let kinds = [
        (js("1"), "javascript"),
        (project(one_step()), "project"),
        (module("m", 1.0, 0.5), "module"),
    ];
    for (r, kind) in kinds {
        let c = validate(&r, &l).unwrap_or_else(|e| panic!("{kind}: {}", e.message));
        assert_eq!(c.payload.kind(), kind);
    }
    let cell = RunRequest {
        protocol: 4,
        cell: Some(CellRun {
            language: "javascript".into(),
            code: "1".into(),
            files: vec![],
        }),
        ..Default::default()
    };
    assert_eq!(
        validate_in_session(&cell, &l).expect("cell").payload.kind(),
        "cell"
    );
    // A session call may carry any other payload too.
    assert!(validate_in_session(&js("1"), &l).is_ok());
    let mut two = js("1");
    two.project = Some(one_step());
    assert!(refused(&two));
    assert!(validate_in_session(&two, &l).is_err());
}

#[test]
fn the_floor_is_parsed_and_a_bad_one_refused() {
    let l = Limits::new(8);
    let mut r = js("1");
    assert_eq!(validate(&r, &l).expect("no floor").floor, None);
    r.minimum_isolation = "vm".into();
    assert_eq!(validate(&r, &l).expect("vm").floor, Some(Tier::Vm));
    r.minimum_isolation = "hypervisor".into();
    assert!(refused(&r));
}

#[test]
fn each_payload_gets_its_own_time_budget() {
    let l = Limits::new(8);
    assert_eq!(validate(&js("1"), &l).unwrap().timeout, l.default_timeout);
    assert_eq!(
        validate(&module("m", 1.0, 0.5), &l).unwrap().timeout,
        l.default_timeout
    );
    assert_eq!(
        validate(&project(one_step()), &l).unwrap().timeout,
        l.project_default_timeout
    );
    let mut r = project(one_step());
    r.timeout_ms = 90_000;
    assert_eq!(
        validate(&r, &l).unwrap().timeout,
        Duration::from_secs(90),
        "a project may ask for more than a snippet's maximum"
    );
    let mut r = js("1");
    r.timeout_ms = 90_000;
    assert_eq!(validate(&r, &l).unwrap().timeout, l.max_timeout);
    assert_eq!(
        clamp_timeout(1, l.default_timeout, l.max_timeout),
        Duration::from_millis(1)
    );
    assert_eq!(
        clamp_timeout(30_000, l.default_timeout, l.max_timeout),
        Duration::from_secs(30)
    );
    assert_eq!(Limits::new(3).max_concurrent, 3);
    assert_eq!(Limits::new(3).output_limit, OUTPUT_LIMIT);
    // What the clients and docs promise, as a number.
    assert_eq!(OUTPUT_LIMIT, 65_536);
}

#[test]
fn trace_id_bounds() {
    let l = Limits::new(8);
    let mut r = js("1");
    let c = validate(&r, &l).unwrap();
    assert_eq!((c.trace_id, c.trace_id_rejected), (None, false));
    r.trace_id = "a".repeat(MAX_TRACE_ID);
    assert!(validate(&r, &l).unwrap().trace_id.is_some());
    r.trace_id = "a".repeat(MAX_TRACE_ID + 1);
    assert!(validate(&r, &l).unwrap().trace_id_rejected);
    assert!(valid_trace_id("aZ9._:-"));
    for bad in ["", "a/b", "a b", "é"] {
        assert!(!valid_trace_id(bad), "{bad:?}");
    }
}

#[test]
fn grant_profile_bounds() {
    let mut r = js("1");
    r.javascript.as_mut().unwrap().grant_profile = "p".repeat(MAX_PROFILE_BYTES);
    assert!(!refused(&r));
    r.javascript.as_mut().unwrap().grant_profile = "p".repeat(MAX_PROFILE_BYTES + 1);
    assert!(refused(&r));
    let mut p = one_step();
    p.grant_profile = "p".repeat(MAX_PROFILE_BYTES + 1);
    assert!(refused(&project(p)));
}

#[test]
fn software_rule_bounds() {
    let rule = |mode: &str, ids: Vec<String>| SoftwareRule {
        mode: mode.into(),
        identities: ids,
    };
    let ids = |n: usize| (0..n).map(|i| format!("id-{i}")).collect::<Vec<_>>();
    assert!(validate_rule(&rule("exact", ids(1))).is_ok());
    assert!(validate_rule(&rule("exact", ids(0))).is_err());
    assert!(validate_rule(&rule("approved", ids(0))).is_err());
    assert!(validate_rule(&rule("approved", ids(MAX_IDENTITIES))).is_ok());
    assert!(validate_rule(&rule("approved", ids(MAX_IDENTITIES + 1))).is_err());
    assert!(validate_rule(&rule("loose", ids(1))).is_err());
    let one = |id: String| rule("exact", vec![id]);
    assert!(validate_rule(&one("aZ9._:/@+-".into())).is_ok());
    assert!(validate_rule(&one(String::new())).is_err());
    assert!(validate_rule(&one("a".repeat(MAX_IDENTITY_BYTES))).is_ok());
    assert!(validate_rule(&one("a".repeat(MAX_IDENTITY_BYTES + 1))).is_err());
    assert!(validate_rule(&one("a*".into())).is_err());
}

#[test]
fn path_bounds() {
    assert!(valid_relative_path(&"a".repeat(MAX_PATH_BYTES)));
    assert!(!valid_relative_path(&"a".repeat(MAX_PATH_BYTES + 1)));
    for bad in ["a/.", ".", "..", "a\tb", "a\u{7f}b", "\\a"] {
        assert!(!valid_relative_path(bad), "{bad:?}");
    }
}

#[test]
fn project_step_and_artifact_bounds() {
    let steps = |n: usize| ProjectRun {
        steps: vec!["true".into(); n],
        ..Default::default()
    };
    assert!(refused(&project(steps(0))));
    assert!(!refused(&project(steps(MAX_PROJECT_STEPS))));
    assert!(refused(&project(steps(MAX_PROJECT_STEPS + 1))));
    let step = |s: String| ProjectRun {
        steps: vec!["true".into(), s],
        ..Default::default()
    };
    assert!(!refused(&project(step("s".repeat(MAX_STEP_BYTES)))));
    assert!(refused(&project(step("s".repeat(MAX_STEP_BYTES + 1)))));
    assert!(refused(&project(step("a\0b".into()))));
    let artifacts = |a: Vec<String>| ProjectRun {
        artifacts: a,
        ..one_step()
    };
    let many = |n: usize| (0..n).map(|i| format!("out/{i}")).collect::<Vec<_>>();
    assert!(!refused(&project(artifacts(many(MAX_ARTIFACTS)))));
    assert!(refused(&project(artifacts(many(MAX_ARTIFACTS + 1)))));
    assert!(refused(&project(artifacts(vec!["../x".into()]))));
    assert!(refused(&project(artifacts(vec!["a".into(), "a".into()]))));
}

#[test]
fn file_bounds() {
    let with = |files: Vec<ProjectFile>| ProjectRun {
        files,
        ..one_step()
    };
    let count = |n: usize| (0..n).map(|i| file(&format!("f{i}"), 1)).collect();
    assert!(!refused(&project(with(count(MAX_PROJECT_FILES)))));
    assert!(refused(&project(with(count(MAX_PROJECT_FILES + 1)))));
    // The byte bound is on the total, not on each file.
    let half = MAX_PROJECT_BYTES / 2;
    assert!(!refused(&project(with(vec![
        file("a", half),
        file("b", half)
    ]))));
    assert!(refused(&project(with(vec![
        file("a", half),
        file("b", half + 1)
    ]))));
    assert!(refused(&project(with(vec![
        file("a", MAX_PROJECT_BYTES - 1),
        file("b", 2),
        file("c", 0),
    ]))));
    assert!(refused(&project(with(vec![file("a", 1), file("a", 1)]))));
    assert!(refused(&project(with(vec![file("/etc/passwd", 1)]))));
}

#[test]
fn module_bounds() {
    assert!(!refused(&module("a", 1.0, 1.0)));
    assert!(!refused(&module(&"a".repeat(64), 1.0, 1.0)));
    assert!(!refused(&module("a.b_c-9", 1.0, 1.0)));
    for bad in ["", "_a", ".a", "a/b", "a b"] {
        assert!(refused(&module(bad, 1.0, 1.0)), "{bad:?}");
    }
    assert!(refused(&module(&"a".repeat(65), 1.0, 1.0)));
    for (end, step) in [
        (0.0, 1.0),
        (1.0, 0.0),
        (-1.0, 1.0),
        (1.0, -1.0),
        (f64::INFINITY, 1.0),
        (1.0, f64::INFINITY),
        (f64::NAN, 1.0),
        (1.0, f64::NAN),
    ] {
        assert!(refused(&module("m", end, step)), "{end} {step}");
    }
}
