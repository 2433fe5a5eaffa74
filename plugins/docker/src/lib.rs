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
//! image, user and interpreters the host verified.

use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;

mod bindings {
    wit_bindgen::generate!({
        world: "container-adapter",
        path: "../../wit/provider",
        generate_all,
    });
}

use bindings::exports::plimsoll::provider::adapter::Guest;
use bindings::plimsoll::provider::container_engine::{
    self as engine, ContainerSpec, EngineEnvironment, EngineError,
};
use bindings::plimsoll::provider::log::{self, Level};
use bindings::plimsoll::provider::project_report;
use bindings::plimsoll::provider::types::{
    Artifact, Description, Language, PayloadKind, PreflightReport, ProcessOutput, ProjectOutcome,
    ProjectPayload, ProjectSummary, Refusal, RunError, RunRequest, RunResult, StepResult, Tier,
};

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
/// Total artifact bytes brought back; more sets `artifacts_truncated`.
const ARTIFACT_BYTES: u64 = 8 << 20;
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

/// A snippet: node reads the program from stdin, which the host writes only
/// once the container is contained; the same spec is kept warm.
fn snippet_spec(env: &EngineEnvironment) -> ContainerSpec {
    base_spec(env, vec!["node".into(), "-".into()])
}

fn runner_spec(env: &EngineEnvironment) -> ContainerSpec {
    base_spec(env, vec!["node".into(), "-e".into(), RUNNER.into()])
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

        match engine::prewarm(&snippet_spec(&env)) {
            Ok(n) => checks.push(format!("{n} warm containers kept for snippets")),
            Err(e) => return Err(format!("prewarm: {}", engine_text(&e))),
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
                let out = engine::run(
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
                // Steps and artifacts go to the host one by one; the answer
                // carries how the project ended.
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
                Ok(RunResult::Project(ProjectSummary {
                    outcome: r.outcome,
                    outcome_detail: r.outcome_detail,
                    artifacts_truncated,
                }))
            }
        }
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

#[derive(Deserialize)]
struct ReportStep {
    command: String,
    stdout: String,
    stderr: String,
    exit_code: i32,
    timed_out: bool,
    duration_ms: u64,
    stdout_truncated: bool,
    stderr_truncated: bool,
}

#[derive(Deserialize)]
struct ReportArtifact {
    path: String,
    content: String,
}

#[derive(Deserialize)]
struct ReportEnd {
    outcome: String,
    detail: String,
    artifacts_truncated: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Line {
    Start(usize),
    Step(ReportStep),
    Artifact(ReportArtifact),
    End(ReportEnd),
}

fn run_project(
    env: &EngineEnvironment,
    p: &ProjectPayload,
    timeout_ms: u32,
    output_limit: u32,
) -> Result<ProjectResult, RunError> {
    let plan = json!({
        "files": p.files.iter().map(|f| json!({"path": f.path, "content": f.content})).collect::<Vec<_>>(),
        "steps": p.steps,
        "artifacts": p.artifacts,
        "budget_ms": timeout_ms.saturating_sub(REPORT_MARGIN_MS),
        "output_limit": output_limit,
        "artifact_bytes": ARTIFACT_BYTES,
    });
    let plan = serde_json::to_vec(&plan).map_err(|e| {
        RunError::NotDispatched(Refusal::Request(format!("the plan does not encode: {e}")))
    })?;
    let out = engine::run(&runner_spec(env), &plan, timeout_ms, REPORT_LIMIT).map_err(run_error)?;
    Ok(read_report(p, &out, output_limit as usize))
}

/// Reads the runner's report against the plan. Whatever the container
/// printed is untrusted: a report that does not fit the plan is a protocol
/// error, never a result.
fn read_report(p: &ProjectPayload, out: &ProcessOutput, output_limit: usize) -> ProjectResult {
    let mut result = ProjectResult {
        steps: vec![],
        outcome: ProjectOutcome::ProtocolError,
        outcome_detail: String::new(),
        artifacts: vec![],
        artifacts_truncated: false,
    };
    let protocol = |mut r: ProjectResult, why: &str| {
        r.outcome = ProjectOutcome::ProtocolError;
        r.outcome_detail = why.to_string();
        r
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut running: Option<usize> = None;
    let mut ended = false;
    if out.stdout_truncated {
        return protocol(result, "the runner's report exceeded its size limit");
    }
    for raw in out.stdout.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        if ended {
            return protocol(result, "the runner's report continues past its end");
        }
        let Ok(line) = serde_json::from_slice::<Line>(raw) else {
            return protocol(result, "the runner's report is not readable");
        };
        match line {
            Line::Start(i) => {
                if i != result.steps.len() || i >= p.steps.len() || running.is_some() {
                    return protocol(result, "the runner started steps out of order");
                }
                running = Some(i);
            }
            Line::Step(s) => {
                let i = result.steps.len();
                if running != Some(i) || p.steps.get(i) != Some(&s.command) {
                    return protocol(result, "the runner reported a step the plan does not have");
                }
                running = None;
                let (Ok(stdout), Ok(stderr)) = (b64.decode(&s.stdout), b64.decode(&s.stderr))
                else {
                    return protocol(result, "the runner's step output is not base64");
                };
                if stdout.len() > output_limit || stderr.len() > output_limit {
                    return protocol(result, "the runner's step output exceeds the limit");
                }
                result.steps.push(StepResult {
                    command: s.command,
                    output: ProcessOutput {
                        stdout,
                        stderr,
                        exit_code: s.exit_code,
                        timed_out: s.timed_out,
                        stdout_truncated: s.stdout_truncated,
                        stderr_truncated: s.stderr_truncated,
                    },
                    duration_ms: s.duration_ms,
                });
            }
            Line::Artifact(a) => {
                let wanted = p.artifacts.contains(&a.path);
                let repeated = result.artifacts.iter().any(|x| x.path == a.path);
                let Ok(content) = b64.decode(&a.content) else {
                    return protocol(result, "the runner's artifact is not base64");
                };
                let total: u64 = result
                    .artifacts
                    .iter()
                    .map(|x| x.content.len() as u64)
                    .sum::<u64>()
                    + content.len() as u64;
                if !wanted || repeated || total > ARTIFACT_BYTES {
                    return protocol(
                        result,
                        "the runner reported an artifact the plan did not ask for",
                    );
                }
                result.artifacts.push(Artifact {
                    path: a.path,
                    content,
                });
            }
            Line::End(e) => {
                ended = true;
                result.artifacts_truncated = e.artifacts_truncated;
                result.outcome_detail = e.detail.chars().take(512).collect();
                result.outcome = match e.outcome.as_str() {
                    "completed" => ProjectOutcome::Completed,
                    "timed_out" => ProjectOutcome::TimedOut,
                    "setup_failed" => ProjectOutcome::SetupFailed,
                    _ => return protocol(result, "the runner reported an unknown outcome"),
                };
            }
        }
    }
    if out.timed_out {
        // The host killed the container at the run's deadline: the steps
        // that finished stand, and the one that was running timed out.
        if let Some(i) = running {
            result.steps.push(StepResult {
                command: p.steps[i].clone(),
                output: ProcessOutput {
                    stdout: vec![],
                    stderr: vec![],
                    exit_code: 124,
                    timed_out: true,
                    stdout_truncated: false,
                    stderr_truncated: false,
                },
                duration_ms: 0,
            });
        }
        result.outcome = ProjectOutcome::TimedOut;
        result.outcome_detail = "the run's time budget ran out".to_string();
        return result;
    }
    if !ended {
        let why = if out.exit_code == 137 {
            "the runner was killed (out of memory or processes) before it reported"
        } else {
            "the runner ended without a complete report"
        };
        return protocol(result, why);
    }
    if matches!(
        result.outcome,
        ProjectOutcome::Completed | ProjectOutcome::TimedOut
    ) {
        // The steps must be a prefix of the plan that stops at the first
        // failure, or run to the end.
        let failed = |s: &StepResult| s.output.exit_code != 0 || s.output.timed_out;
        let n = result.steps.len();
        let prefix_ok = n > 0 && !result.steps[..n - 1].iter().any(failed);
        let end_ok = n == p.steps.len() || result.steps.last().is_some_and(failed);
        if !prefix_ok || !end_ok {
            return protocol(result, "the runner's steps do not match the plan");
        }
    }
    result
}

bindings::export!(Docker with_types_in bindings);
