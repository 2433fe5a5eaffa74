//! The capability alone, on a fake backend: no Docker, no daemon, no
//! component. What is tested is the host's half of the contract: which
//! specs reach a backend, and when the call's not-dispatched mark is set,
//! kept, or put back.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use super::*;
use crate::outcome::{NotReady, ProcessOutput, RunFailure};
use crate::plugin_host::capabilities::container_engine::backend::{BackendFacts, Envelope};
use crate::refusal::Refusal;
use crate::tier::Tier;

const IMAGE: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// What the fake backend does when asked to run.
#[derive(Clone, Copy)]
enum Act {
    Exit(i32),
    FailBeforeStart,
    OutOfTime,
    FailAfterStart,
}

struct Fake {
    facts: BackendFacts,
    act: Act,
    /// (approved spec, timeout) of every run the backend was asked for.
    runs: Mutex<Vec<(Approved, Duration)>>,
    prewarmed: Mutex<Vec<Approved>>,
}

impl Fake {
    fn new(act: Act) -> Arc<Fake> {
        Arc::new(Fake {
            facts: BackendFacts {
                image: IMAGE.into(),
                configured_image: "test:1".into(),
                image_env: vec!["PATH=/bin".into()],
                guest_uid: 61000,
                runtime: String::new(),
                runtime_version: String::new(),
                languages: vec!["javascript".into()],
                tier: Tier::Container,
                checks: vec![],
                envelope: Envelope {
                    memory_mb: 64,
                    cpus: 1.0,
                    pids: 64,
                    disk_mb: 64,
                },
            },
            act,
            runs: Mutex::new(vec![]),
            prewarmed: Mutex::new(vec![]),
        })
    }

    fn runs(&self) -> usize {
        self.runs.lock().expect("lock").len()
    }
}

impl ContainerBackend for Fake {
    fn facts(&self) -> &BackendFacts {
        &self.facts
    }

    fn ready(&self) -> Result<(), NotReady> {
        Ok(())
    }

    fn check_ready(&self) -> BoxFuture<'_, Result<(), NotReady>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn run(
        &self,
        spec: Approved,
        _stdin: Vec<u8>,
        timeout: Duration,
        _output_limit: usize,
        _grant: Option<GrantMount>,
        _live: Option<crate::live::Live>,
    ) -> BoxFuture<'static, Result<ProcessOutput, EngineFailure>> {
        self.runs.lock().expect("lock").push((spec, timeout));
        let answer = match self.act {
            Act::Exit(code) => Ok(ProcessOutput {
                stdout: b"ran\n".to_vec(),
                exit_code: code,
                ..ProcessOutput::default()
            }),
            Act::FailBeforeStart => Err(EngineFailure::BeforeStart("create failed".into())),
            Act::OutOfTime => Err(EngineFailure::OutOfTime("start was too slow".into())),
            Act::FailAfterStart => Err(EngineFailure::AfterStart("stream cut".into())),
        };
        Box::pin(std::future::ready(answer))
    }

    fn prewarm(&self, spec: Approved) -> u32 {
        self.prewarmed.lock().expect("lock").push(spec);
        2
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}

fn call(seconds: u64) -> CallContext {
    CallContext::new(
        Arc::from("test"),
        Instant::now() + Duration::from_secs(seconds),
    )
}

fn state(fake: &Arc<Fake>) -> ContainerEngineState {
    let backend: Arc<dyn ContainerBackend> = fake.clone();
    ContainerEngineState::new(Arc::new(ContainerEngine::new(backend)))
}

fn good_spec() -> SpecValues {
    SpecValues {
        image: IMAGE.into(),
        command: vec!["node".into(), "-".into()],
        env: vec!["HOME=/work".into()],
        user: "61000:61000".into(),
        read_only_root: true,
        network: "none".into(),
        runtime: String::new(),
        ..SpecValues::default()
    }
}

async fn approve_and_run(
    call: &mut CallContext,
    state: &mut ContainerEngineState,
    spec: &SpecValues,
    timeout_ms: u32,
) -> Result<types::ProcessOutput, engine_if::EngineError> {
    let (_, approved) = approve(call, Some(state), spec)?;
    run(call, state, approved, vec![], timeout_ms, 1024, None).await
}

#[tokio::test]
async fn a_refused_spec_never_reaches_the_backend_and_leaves_the_mark() {
    let fake = Fake::new(Act::Exit(0));
    let mut st = state(&fake);
    let mut c = call(10);
    type Weaken = fn(&mut SpecValues);
    let weakenings: &[Weaken] = &[
        |s| s.privileged = true,
        |s| s.network = "host".into(),
        |s| s.read_only_root = false,
        |s| s.user = "0:0".into(),
        |s| s.user = "61001:61001".into(),
        |s| s.image = "node:22".into(),
        |s| s.runtime = "runsc".into(),
        |s| s.cap_add = vec!["SYS_ADMIN".into()],
        |s| s.mounts = vec!["/:/host".into()],
        |s| s.env = vec!["LD_PRELOAD=/tmp/x.so".into()],
    ];
    for weaken in weakenings {
        let mut spec = good_spec();
        weaken(&mut spec);
        let answer = approve_and_run(&mut c, &mut st, &spec, 1000).await;
        assert!(
            matches!(answer, Err(engine_if::EngineError::Forbidden(_))),
            "{spec:?} was not refused"
        );
    }
    assert_eq!(fake.runs(), 0, "a refused spec reached the backend");
    assert!(!c.mark.may_have_started());
    assert!(matches!(
        c.mark.refused("test", Refusal::capacity("full")),
        RunFailure::NotDispatched(_)
    ));
}

#[tokio::test]
async fn a_plugin_without_the_grant_is_refused_before_anything() {
    let c = call(10);
    let answer = approve(&c, None, &good_spec());
    assert!(matches!(answer, Err(engine_if::EngineError::Forbidden(_))));
    assert!(!c.mark.may_have_started());
}

#[tokio::test]
async fn only_the_approved_command_and_environment_reach_the_backend() {
    let fake = Fake::new(Act::Exit(3));
    let mut st = state(&fake);
    let mut c = call(10);
    let out = approve_and_run(&mut c, &mut st, &good_spec(), 1000)
        .await
        .expect("ran");
    assert_eq!((out.exit_code, out.stdout.as_slice()), (3, &b"ran\n"[..]));
    let runs = fake.runs.lock().expect("lock");
    assert_eq!(
        runs[0].0,
        Approved {
            command: vec!["node".into(), "-".into()],
            env: vec!["HOME=/work".into()],
        }
    );
    // A container that ran: the mark is set and a plugin's later "nothing
    // ran" is not repeated.
    assert!(c.mark.may_have_started());
    assert!(matches!(
        c.mark.refused("test", Refusal::capacity("full")),
        RunFailure::MayHaveRun(_)
    ));
}

#[tokio::test]
async fn a_container_that_never_started_puts_the_mark_back() {
    let fake = Fake::new(Act::FailBeforeStart);
    let mut st = state(&fake);
    let mut c = call(10);
    let answer = approve_and_run(&mut c, &mut st, &good_spec(), 1000).await;
    assert!(matches!(answer, Err(engine_if::EngineError::NotStarted(_))));
    assert_eq!(fake.runs(), 1);
    assert!(!c.mark.may_have_started());
    assert!(matches!(
        c.mark.failed("test", "trap"),
        RunFailure::NotDispatched(_)
    ));
}

#[tokio::test]
async fn a_container_with_no_time_to_start_puts_the_mark_back() {
    let fake = Fake::new(Act::OutOfTime);
    let mut st = state(&fake);
    let mut c = call(10);
    let answer = approve_and_run(&mut c, &mut st, &good_spec(), 1000).await;
    assert!(matches!(answer, Err(engine_if::EngineError::OutOfTime(_))));
    assert!(!c.mark.may_have_started());
}

#[tokio::test]
async fn a_container_that_failed_after_start_keeps_the_mark() {
    let fake = Fake::new(Act::FailAfterStart);
    let mut st = state(&fake);
    let mut c = call(10);
    let answer = approve_and_run(&mut c, &mut st, &good_spec(), 1000).await;
    assert!(matches!(answer, Err(engine_if::EngineError::Engine(_))));
    assert!(c.mark.may_have_started());
}

#[tokio::test]
async fn a_later_container_that_never_started_does_not_clear_an_earlier_one() {
    let ran = Fake::new(Act::Exit(0));
    let never = Fake::new(Act::FailBeforeStart);
    let mut c = call(10);
    approve_and_run(&mut c, &mut state(&ran), &good_spec(), 1000)
        .await
        .expect("ran");
    let answer = approve_and_run(&mut c, &mut state(&never), &good_spec(), 1000).await;
    assert!(matches!(answer, Err(engine_if::EngineError::NotStarted(_))));
    assert!(c.mark.may_have_started(), "the first container ran");
}

#[tokio::test]
async fn a_container_gets_what_is_left_of_the_call_and_never_more() {
    let fake = Fake::new(Act::Exit(0));
    let mut st = state(&fake);
    // Asked for a minute inside a 3 s call: at most 3 s less the report margin.
    let mut c = call(3);
    approve_and_run(&mut c, &mut st, &good_spec(), 60_000)
        .await
        .expect("ran");
    // Asked for ten minutes inside a long call: the capability's own cap.
    let mut long = call(3600);
    approve_and_run(&mut long, &mut st, &good_spec(), 600_000)
        .await
        .expect("ran");
    let runs = fake.runs.lock().expect("lock");
    assert!(runs[0].1 <= Duration::from_secs(2), "{:?}", runs[0].1);
    assert!(runs[0].1 > Duration::from_millis(1500), "{:?}", runs[0].1);
    assert_eq!(runs[1].1, MAX_CONTAINER_TIME);
}

#[tokio::test]
async fn prewarm_is_checked_like_a_run() {
    let fake = Fake::new(Act::Exit(0));
    let st = state(&fake);
    let c = call(10);
    let mut bad = good_spec();
    bad.privileged = true;
    assert!(approve(&c, Some(&st), &bad).is_err());
    let (engine, approved) = approve(&c, Some(&st), &good_spec()).expect("approved");
    assert_eq!(engine.backend.prewarm(approved), 2);
    assert_eq!(fake.prewarmed.lock().expect("lock").len(), 1);
}

#[test]
fn after_preflight_a_prewarm_is_refused_and_costs_the_mark() {
    let fake = Fake::new(Act::Exit(0));
    let st = state(&fake);
    let mut c = call(10);
    still_open(&mut c, Some(&st)).expect("open before the freeze");
    assert!(!c.mark.may_have_started());
    st.engine.freeze();
    match still_open(&mut c, Some(&st)) {
        Err(engine_if::EngineError::Forbidden(why)) => assert!(why.contains("preflight"), "{why}"),
        other => panic!("not refused: {other:?}"),
    }
    assert!(
        c.mark.may_have_started(),
        "the call could still say nothing ran"
    );
    assert!(fake.prewarmed.lock().expect("lock").is_empty());
}

#[test]
fn the_environment_is_what_the_backend_verified() {
    let fake = Fake::new(Act::Exit(0));
    let backend: Arc<dyn ContainerBackend> = fake.clone();
    let engine = ContainerEngine::new(backend);
    let env = environment(Some(&engine));
    assert_eq!(env.image, IMAGE);
    assert_eq!(env.user, "61000:61000");
    assert_eq!(env.languages, ["javascript"]);
    assert!(environment(None).image.is_empty());
}
