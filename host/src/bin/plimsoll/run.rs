//! `plimsoll run` and `plimsoll describe`.
//!
//! `run` sends a JavaScript file, or a directory's files with shell steps,
//! as one `RunStream` (`Run` with `--json`); prints the program's output as
//! it arrives (stdout to stdout, stderr to stderr; for a project, each
//! step's in order when the run ends), then a summary line on
//! stderr: provider, isolation tier, exit code, duration and the run
//! record's digest. It exits with the run's exit code; the codes it adds
//! are documented in docs/cli.md: 125 when the daemon refused the run and
//! marked it not-dispatched (nothing ran), 126 for any other failure (it
//! may have run), 2 for a bad command line or an unreadable input.
//!
//! What it reads and writes on this machine (the snippet, a project's
//! files, artifacts) goes through `local_files`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{Value, json};

use crate::client::{self, Api, Failure, shown};
use crate::local_files::{check_artifact_names, project_files, read_snippet, write_artifacts};
use crate::signer::Signer;

pub const EXIT_NOT_DISPATCHED: u8 = 125;
pub const EXIT_UNKNOWN: u8 = 126;
pub const EXIT_USAGE: u8 = 2;

#[derive(clap::Args)]
pub struct Connection {
    /// The daemon (default PLIMSOLL_URL, else http://127.0.0.1:8746). The
    /// caller's token is read from PLIMSOLL_TOKEN.
    #[arg(long)]
    url: Option<String>,
    /// Print the daemon's answer as JSON on stdout instead.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// A JavaScript file to run.
    #[arg(required_unless_present = "project", conflicts_with = "project")]
    file: Option<PathBuf>,
    /// A directory whose files are sent with the run (relative paths).
    #[arg(long, requires = "steps")]
    project: Option<PathBuf>,
    /// A shell step run in the project directory, in order (repeat it).
    #[arg(long = "step", requires = "project")]
    steps: Vec<String>,
    /// A file to bring back from the project directory (repeat it).
    #[arg(long = "artifact", requires = "project")]
    artifacts: Vec<String>,
    /// Where artifacts are written (default: the current directory).
    #[arg(long, requires = "project")]
    out: Option<PathBuf>,
    /// The weakest isolation the run may have: process, container, kernel
    /// or vm. Below it nothing runs.
    #[arg(long)]
    floor: Option<String>,
    /// The run's budget: 500ms, 5s, 2m, or a number of seconds.
    #[arg(long)]
    timeout: Option<String>,
    /// A grant profile the run may use.
    #[arg(long)]
    grant: Option<String>,
    /// Also sign the run into this bundle (see `plimsoll attest`); a run
    /// whose record does not check is not signed, and the exit code is 126.
    #[arg(long)]
    bundle: Option<PathBuf>,
    /// The key that signs for --bundle (default: the PEM text in
    /// PLIMSOLL_ATTEST_KEY).
    #[arg(long, requires = "bundle")]
    key: Option<PathBuf>,
    /// Accept a --bundle others may read.
    #[arg(long, requires = "bundle")]
    shared_bundle: bool,
    #[command(flatten)]
    conn: Connection,
}

#[derive(clap::Args)]
pub struct DescribeArgs {
    #[command(flatten)]
    conn: Connection,
}

pub fn run(args: RunArgs) -> ExitCode {
    let request = match request(&args) {
        Ok(r) => r,
        Err(e) => return fail(EXIT_USAGE, &e),
    };
    let signer = match &args.bundle {
        Some(b) => match Signer::new(b.clone(), args.key.as_deref(), args.shared_bundle) {
            Ok(s) => Some(s),
            Err(e) => return fail(EXIT_USAGE, &e),
        },
        None => None,
    };
    let budget = Duration::from_millis(request["timeoutMs"].as_u64().unwrap_or(120_000));
    let api = match Api::new(args.conn.url.clone()) {
        Ok(a) => a,
        Err(e) => return fail(EXIT_USAGE, &e),
    };
    if args.conn.json {
        let answer = match call(&api, "Run", &request, budget) {
            Ok(a) => a,
            Err(code) => return code,
        };
        println!("{answer}");
        return recorded(signer.as_ref(), &request, &answer, exit_of(&answer));
    }
    // Output is printed as the run writes it, where the provider passes it
    // on early; what was not streamed is printed from the answer.
    // A run to be signed is asked with `Run` and printed from its answer:
    // what the terminal shows is then exactly what the record checks and
    // the bundle keeps, never output streamed before it.
    let asked = if signer.is_some() {
        call(&api, "Run", &request, budget).map(|a| (a, false))
    } else {
        stream(&api, &request, budget)
    };
    let (answer, streamed) = match asked {
        Ok(a) => a,
        Err(code) => return code,
    };
    if args.project.is_some() {
        if let Err(e) = print_project(&answer, &args.artifacts, args.out.as_deref()) {
            return fail(EXIT_UNKNOWN, &e);
        }
    } else if !streamed {
        let js = &answer["javascript"];
        let _ = std::io::stdout().write_all(&client::bytes(&js["stdout"]));
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().write_all(&client::bytes(&js["stderr"]));
    }
    let code = exit_of(&answer);
    eprintln!("{}", summary(&answer, code));
    recorded(signer.as_ref(), &request, &answer, code)
}

/// The run's exit code once it is in the bundle, if one was asked for; 126
/// if it could not be put there (the run happened; its record is not kept).
fn recorded(signer: Option<&Signer>, request: &Value, answer: &Value, code: u8) -> ExitCode {
    match signer.map(|s| s.record(request, answer)) {
        Some(Err(e)) => fail(EXIT_UNKNOWN, &e),
        _ => ExitCode::from(code),
    }
}

pub fn describe(args: DescribeArgs) -> ExitCode {
    let api = match Api::new(args.conn.url.clone()) {
        Ok(a) => a,
        Err(e) => return fail(EXIT_USAGE, &e),
    };
    let answer = match call(&api, "Describe", &json!({}), Duration::from_secs(10)) {
        Ok(a) => a,
        Err(code) => return code,
    };
    if args.conn.json {
        println!("{answer}");
    } else {
        println!(
            "provider {} · isolation {}{}{}",
            shown(answer["sandbox"].as_str().unwrap_or("?")),
            shown(answer["isolation"].as_str().unwrap_or("?")),
            if answer["supportsProject"].as_bool() == Some(true) {
                " · projects"
            } else {
                ""
            },
            if answer["supportsSessions"].as_bool() == Some(true) {
                " · sessions"
            } else {
                ""
            },
        );
    }
    ExitCode::SUCCESS
}

pub(crate) fn call(
    api: &Api,
    procedure: &str,
    body: &Value,
    budget: Duration,
) -> Result<Value, ExitCode> {
    let (_output, quiet) = tokio::sync::mpsc::unbounded_channel();
    drive(api.call(procedure, body, budget), quiet).map(|(answer, _)| answer)
}

/// `RunStream`: output printed as it arrives. Also says whether any did.
/// A daemon without `RunStream` (it answers that it has no such
/// procedure, and ran nothing) is asked with `Run` instead.
fn stream(api: &Api, body: &Value, budget: Duration) -> Result<(Value, bool), ExitCode> {
    let (output, printed) = tokio::sync::mpsc::unbounded_channel();
    let streamed = async {
        match api.stream(body, budget, output).await {
            Err(Failure::NoSuchProcedure(_)) => api.call("Run", body, budget).await,
            other => other,
        }
    };
    drive(streamed, printed)
}

/// Waits for `answer`, printing `output` as it comes (stderr pieces to
/// stderr). On a terminal, anything slower than a second shows that it is
/// waiting (a docker project, a cold sandbox) until output or the answer
/// arrives; the line is cleared before anything is printed.
pub(crate) fn drive<T>(
    answer: impl std::future::Future<Output = Result<T, Failure>>,
    mut output: tokio::sync::mpsc::UnboundedReceiver<(bool, Vec<u8>)>,
) -> Result<(T, bool), ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(EXIT_UNKNOWN, &format!("runtime: {e}")))?;
    rt.block_on(async {
        let terminal = std::io::stderr().is_terminal();
        tokio::pin!(answer);
        let began = std::time::Instant::now();
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::now() + Duration::from_secs(1),
            Duration::from_secs(1),
        );
        let (mut shown, mut printed) = (false, false);
        let clear = |shown: &mut bool| {
            if std::mem::take(shown) {
                eprint!("\r\x1b[K");
            }
        };
        let answer = loop {
            tokio::select! {
                biased;
                Some((stderr, bytes)) = output.recv() => {
                    clear(&mut shown);
                    printed = true;
                    if stderr {
                        let _ = std::io::stderr().write_all(&bytes);
                    } else {
                        let mut out = std::io::stdout();
                        let _ = out.write_all(&bytes);
                        let _ = out.flush();
                    }
                }
                answer = &mut answer => break answer,
                _ = tick.tick(), if terminal && !printed => {
                    eprint!("\rplimsoll: running… {} s", began.elapsed().as_secs());
                    shown = true;
                }
            }
        };
        // Output that arrived with the answer, after the waiting line is
        // cleared (so it neither follows the line nor is wiped with it).
        clear(&mut shown);
        while let Ok((stderr, bytes)) = output.try_recv() {
            printed = true;
            if stderr {
                let _ = std::io::stderr().write_all(&bytes);
            } else {
                let _ = std::io::stdout().write_all(&bytes);
            }
        }
        let _ = std::io::stdout().flush();
        answer.map(|a| (a, printed))
    })
    .map_err(|f| match f {
        Failure::NotDispatched { reason, message } => fail(
            EXIT_NOT_DISPATCHED,
            &format!("refused, nothing ran ({reason}): {message}"),
        ),
        Failure::NoSuchProcedure(message) => fail(
            EXIT_NOT_DISPATCHED,
            &format!("refused, nothing ran (unsupported): {message}"),
        ),
        Failure::Unanswered { error } => fail(
            EXIT_UNKNOWN,
            &format!(
                "failed, it may have run: {}",
                error["message"].as_str().unwrap_or_default()
            ),
        ),
        Failure::Unknown(why) => fail(EXIT_UNKNOWN, &format!("failed, it may have run: {why}")),
    })
}

pub(crate) fn fail(code: u8, why: &str) -> ExitCode {
    eprintln!("plimsoll: {}", shown(why));
    ExitCode::from(code)
}

/// The Run request the arguments describe.
fn request(args: &RunArgs) -> Result<Value, String> {
    let mut req = json!({"protocol": 4});
    if let Some(floor) = &args.floor {
        if !["process", "container", "kernel", "vm"].contains(&floor.as_str()) {
            return Err(format!(
                "--floor {floor:?}: want process, container, kernel or vm"
            ));
        }
        req["minimumIsolation"] = json!(floor);
    }
    if let Some(t) = &args.timeout {
        req["timeoutMs"] = json!(parse_duration_ms(t)?);
    }
    let grant = args.grant.clone().unwrap_or_default();
    match (&args.file, &args.project) {
        (Some(file), None) => {
            let code = read_snippet(file)?;
            req["javascript"] = json!({"code": code, "grantProfile": grant});
        }
        (None, Some(dir)) => {
            check_artifact_names(&args.artifacts)?;
            req["project"] = json!({
                "files": project_files(dir)?,
                "steps": args.steps,
                "artifacts": args.artifacts,
                "grantProfile": grant,
            });
        }
        _ => return Err("give a JavaScript file or --project DIR".into()),
    }
    Ok(req)
}

/// `500ms`, `5s`, `2m`, or a bare number of seconds.
fn parse_duration_ms(s: &str) -> Result<u64, String> {
    let bad = || format!("--timeout {s:?}: want e.g. 500ms, 5s, 2m");
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000)
    } else {
        (s, 1000)
    };
    let n: u64 = num.trim().parse().map_err(|_| bad())?;
    n.checked_mul(scale)
        .filter(|ms| *ms > 0 && *ms <= i32::MAX as u64)
        .ok_or_else(bad)
}

fn print_project(answer: &Value, asked: &[String], out: Option<&Path>) -> Result<(), String> {
    let project = &answer["project"];
    for step in project["steps"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        eprintln!("$ {}", shown(step["command"].as_str().unwrap_or("")));
        let _ = std::io::stdout().write_all(&client::bytes(&step["stdout"]));
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().write_all(&client::bytes(&step["stderr"]));
    }
    write_artifacts(project, asked, out.unwrap_or(Path::new(".")))?;
    if project["artifactsTruncated"].as_bool() == Some(true) {
        eprintln!("plimsoll: some artifacts were left out (over 8 MiB in all)");
    }
    Ok(())
}

/// The run's exit code: a snippet's own; for a project the last step's
/// that ran (124 when it timed out), 0 with no step.
fn exit_of(answer: &Value) -> u8 {
    let result = if answer["project"].is_object() {
        answer["project"]["steps"]
            .as_array()
            .and_then(|s| s.last())
            .cloned()
            .unwrap_or(Value::Null)
    } else {
        answer["javascript"].clone()
    };
    if result["timedOut"].as_bool() == Some(true) {
        return 124;
    }
    let code = result["exitCode"].as_i64().unwrap_or(0);
    // A shell shows a code past 255 modulo 256; one that would land on 0
    // is still a failure.
    match code.rem_euclid(256) as u8 {
        0 if code != 0 => 1,
        c => c,
    }
}

fn summary(answer: &Value, code: u8) -> String {
    let result = if answer["project"].is_object() {
        &answer["project"]
    } else {
        &answer["javascript"]
    };
    let mut notes = Vec::new();
    if result["timedOut"].as_bool() == Some(true)
        || answer["project"]["outcome"].as_str() == Some("PROJECT_OUTCOME_TIMED_OUT")
    {
        notes.push("timed out");
    }
    if result["stdoutTruncated"].as_bool() == Some(true) {
        notes.push("stdout truncated");
    }
    if result["stderrTruncated"].as_bool() == Some(true) {
        notes.push("stderr truncated");
    }
    format!(
        "plimsoll: {} · {} · exit {code} · {} ms{} · record {}",
        shown(answer["sandbox"].as_str().unwrap_or("?")),
        shown(answer["isolation"].as_str().unwrap_or("?")),
        shown(answer["durationMs"].as_str().unwrap_or("0")),
        notes.iter().map(|n| format!(" · {n}")).collect::<String>(),
        shown(answer["record"]["recordSha256"].as_str().unwrap_or("?")),
    )
}
