//! docker: the provider adapter for the local Docker engine, shipped inside
//! plimsolld and selected with `SANDBOX_PROVIDER=docker`.
//!
//! It decides *what* runs: `node -` reading a snippet from stdin, or the
//! project runner (`runner.js`, under node) reading a plan from stdin. The
//! host decides *how*: the image ID it verified, the runtime, the user and
//! every limit come from the host's `container-engine`, which checks each
//! spec this adapter sends and fills in the rest itself. The tier is the
//! host's evidence too; the claim below is capped by it.
//!
//! The adapter holds no state between calls (each call gets a fresh
//! instance) and no configuration of its own: `environment()` tells it the
//! image, user and interpreters the host verified. A session's container is
//! the host's to keep (`session`): the adapter only says what it runs.

mod project;
mod session;

mod bindings {
    wit_bindgen::generate!({
        world: "container-adapter",
        path: "../../wit/provider",
        generate_all,
    });
}

use bindings::exports::plimsoll::provider::adapter::Guest;
use bindings::plimsoll::provider::container_engine::{
    self as engine, ContainerSpec, EngineEnvironment, EngineError, PrebootKind,
};
use bindings::plimsoll::provider::log::{self, Level};
use bindings::plimsoll::provider::project_report;
use bindings::plimsoll::provider::types::{
    Artifact, Description, Language, PayloadKind, PreflightReport, ProjectOutcome, ProjectPayload,
    ProjectSummary, Refusal, RunError, RunRequest, RunResult, SessionAnswer, SessionFailure,
    SessionOptions, SessionSupport, StepResult, Tier,
};
use project::run_project;

/// A project's result inside the adapter, before it is reported.
struct ProjectResult {
    steps: Vec<StepResult>,
    outcome: ProjectOutcome,
    outcome_detail: String,
    artifacts: Vec<Artifact>,
    artifacts_truncated: bool,
}

const NAME: &str = "docker";
const RUNNER: &str = include_str!("runner.js");
/// Most report a project's runner may print: every step's two capped
/// streams and the artifacts, base64-encoded, with room to spare.
const REPORT_LIMIT: u32 = 24 << 20;
/// Time the runner keeps, before the host's deadline, to report.
const REPORT_MARGIN_MS: u32 = 500;

struct Docker;

fn base_spec(env: &EngineEnvironment, command: Vec<String>) -> ContainerSpec {
    let mut vars = env.image_env.clone();
    // Tools that want a home write there; /work is the run's scratch space.
    vars.retain(|v| !v.starts_with("HOME="));
    vars.push("HOME=/work".to_string());
    ContainerSpec {
        image: env.image.clone(),
        command,
        env: vars,
        user: env.user.clone(),
        read_only_root: true,
        network: "none".to_string(),
        privileged: false,
        cap_add: vec![],
        runtime: env.runtime.clone(),
        host_namespaces: vec![],
        mounts: vec![],
    }
}

/// What a pre-booted node loads before the snippet: the host's end frames.
const END_FRAME: &str = include_str!("end_frame.mjs");

/// A snippet: node reads the program from stdin, which the host writes only
/// once a run takes the container. The same spec is declared as this
/// plugin's pre-boot command for snippets, so warm containers have node
/// booted and waiting on stdin; the hook is inert without the host's
/// nonce, as in a cold container.
fn snippet_spec(env: &EngineEnvironment) -> ContainerSpec {
    base_spec(
        env,
        vec![
            "node".into(),
            "--import".into(),
            end_frame_hook(),
            "-".into(),
        ],
    )
}

/// A project's runner: it reads the project from stdin, so it is declared
/// as this plugin's pre-boot command for projects too, with the same end
/// frames.
fn runner_spec(env: &EngineEnvironment) -> ContainerSpec {
    base_spec(
        env,
        vec![
            "node".into(),
            "--import".into(),
            end_frame_hook(),
            "-e".into(),
            RUNNER.into(),
        ],
    )
}

/// The end-frame module as a `data:` URL for `--import`.
fn end_frame_hook() -> String {
    use base64::Engine as _;
    format!(
        "data:text/javascript;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(END_FRAME)
    )
}

impl Guest for Docker {
    fn describe() -> Description {
        let env = engine::environment();
        Description {
            name: NAME.to_string(),
            // The strongest this adapter can be; the host holds it to the
            // runtime it verified (container under runc, kernel under runsc).
            tier: Tier::Kernel,
            payloads: vec![PayloadKind::Javascript, PayloadKind::Project],
            environment: format!("docker-image:{}", env.image),
            // The host keeps to the interpreters its smoke test proved.
            sessions: Some(SessionSupport {
                payloads: vec![PayloadKind::Javascript, PayloadKind::Project],
                cell_languages: vec![Language::Javascript, Language::Python],
            }),
        }
    }

    fn preflight() -> Result<PreflightReport, String> {
        let env = engine::environment();
        let mut checks = Vec::new();
        let mut languages = Vec::new();
        if !env.languages.iter().any(|l| l == "javascript") {
            return Err("the image has no node; the docker adapter needs it".into());
        }
        // A snippet exactly as runs send it.
        let out = engine::run(&snippet_spec(&env), b"console.log(6 * 7)", 30_000, 4096)
            .map_err(|e| format!("running a snippet: {}", engine_text(&e)))?;
        if out.exit_code != 0 || out.stdout != b"42\n" {
            return Err(format!(
                "a snippet printed {:?} and exited {}",
                String::from_utf8_lossy(&out.stdout),
                out.exit_code
            ));
        }
        checks.push("a snippet ran as runs do".to_string());
        languages.push(Language::Javascript);

        // A project through the runner, with a python step when the image
        // has python3.
        let python = env.languages.iter().any(|l| l == "python");
        let mut steps = vec!["cat in.txt".to_string()];
        if python {
            steps.push("python3 -c 'print(6 * 7)'".to_string());
        }
        let project = ProjectPayload {
            files: vec![bindings::plimsoll::provider::types::ProjectFile {
                path: "in.txt".into(),
                content: "project-ok\n".into(),
            }],
            steps,
            artifacts: vec!["in.txt".into()],
        };
        let result = run_project(&env, &project, 60_000, 4096)
            .map_err(|e| format!("running a project: {}", run_error_text(&e)))?;
        let stdout = |i: usize| result.steps.get(i).map(|s| s.output.stdout.clone());
        let ok = matches!(result.outcome, ProjectOutcome::Completed)
            && stdout(0).as_deref() == Some(b"project-ok\n")
            && (!python || stdout(1).as_deref() == Some(b"42\n"))
            && result.artifacts.len() == 1;
        if !ok {
            return Err(format!(
                "a project did not complete as expected (outcome {:?}, {} steps): {}",
                result.outcome,
                result.steps.len(),
                result.outcome_detail
            ));
        }
        checks.push("a project ran through the runner: files, steps, artifacts".to_string());
        if python {
            languages.push(Language::Python);
        }

        match engine::preboot(PrebootKind::Snippet, &snippet_spec(&env)) {
            Ok(n) => checks.push(format!(
                "{n} warm containers kept for snippets, node booted"
            )),
            Err(e) => return Err(format!("preboot: {}", engine_text(&e))),
        }
        match engine::preboot(PrebootKind::Project, &runner_spec(&env)) {
            Ok(n) => checks.push(format!(
                "{n} warm containers kept for projects, the runner booted"
            )),
            Err(e) => return Err(format!("preboot for projects: {}", engine_text(&e))),
        }
        match engine::preboot(PrebootKind::Session, &session::spec(&env)) {
            Ok(n) => checks.push(format!(
                "{n} warm containers kept for sessions, the agent and its kernels booted"
            )),
            Err(e) => return Err(format!("preboot for sessions: {}", engine_text(&e))),
        }
        Ok(PreflightReport {
            passed: true,
            checks: checks.join("\n"),
            languages,
        })
    }

    fn run(request: RunRequest) -> Result<RunResult, RunError> {
        let env = engine::environment();
        match request.payload {
            bindings::plimsoll::provider::types::Payload::Javascript(code) => {
                // The container's output is the snippet's output as it
                // stands, so a caller watching the run may see it early.
                let out = engine::run_live(
                    &snippet_spec(&env),
                    code.as_bytes(),
                    request.timeout_ms,
                    request.output_limit,
                )
                .map_err(run_error)?;
                Ok(RunResult::Javascript(out))
            }
            bindings::plimsoll::provider::types::Payload::Project(p) => {
                let r = run_project(&env, &p, request.timeout_ms, request.output_limit)?;
                Ok(RunResult::Project(report(r)))
            }
            bindings::plimsoll::provider::types::Payload::Cell(_) => Err(RunError::NotDispatched(
                Refusal::Request("a cell runs only in a session".into()),
            )),
        }
    }

    fn open_session(options: SessionOptions) -> Result<String, RunError> {
        session::open(options)
    }

    fn session_run(_state: String, request: RunRequest) -> Result<SessionAnswer, SessionFailure> {
        session::run(request)
    }

    fn close_session(_state: String) {
        // The host removes the session's container itself.
    }
}

/// Hands a project's steps and artifacts to the host one by one; the
/// answer carries how the project ended.
fn report(r: ProjectResult) -> ProjectSummary {
    let mut artifacts_truncated = r.artifacts_truncated;
    for step in &r.steps {
        if !project_report::add_step(step) {
            log::write(Level::Warn, "the host kept no more steps");
            break;
        }
    }
    for a in &r.artifacts {
        if !project_report::add_artifact(a) {
            artifacts_truncated = true;
            break;
        }
    }
    ProjectSummary {
        outcome: r.outcome,
        outcome_detail: r.outcome_detail,
        artifacts_truncated,
    }
}

fn engine_text(e: &EngineError) -> String {
    match e {
        EngineError::Forbidden(m) => format!("the host refused the spec: {m}"),
        EngineError::NotStarted(m) | EngineError::OutOfTime(m) | EngineError::Engine(m) => {
            m.clone()
        }
    }
}

fn run_error_text(e: &RunError) -> String {
    match e {
        RunError::NotDispatched(r) => match r {
            Refusal::Request(m)
            | Refusal::Permission(m)
            | Refusal::Unsupported(m)
            | Refusal::Isolation(m)
            | Refusal::Environment(m)
            | Refusal::Capacity(m) => m.clone(),
        },
        RunError::MayHaveRun(m) => m.clone(),
    }
}

/// Engine errors, honestly: a refused spec or a container that never started
/// ran nothing; anything else may have.
fn run_error(e: EngineError) -> RunError {
    match e {
        EngineError::Forbidden(m) => {
            log::write(Level::Error, &format!("the host refused a spec: {m}"));
            RunError::NotDispatched(Refusal::Environment(format!(
                "the docker adapter built a spec the host refuses: {m}"
            )))
        }
        EngineError::NotStarted(m) => RunError::NotDispatched(Refusal::Environment(m)),
        EngineError::OutOfTime(m) => RunError::NotDispatched(Refusal::Capacity(m)),
        EngineError::Engine(m) => RunError::MayHaveRun(m),
    }
}

bindings::export!(Docker with_types_in bindings);
