//! `plimsoll plugin describe` and `plimsoll plugin check`: a plugin loaded
//! the way the daemon loads it, before an operator trusts it with a daemon.
//!
//! `describe` runs the stages up to the plugin's own `describe`, with a
//! backend that runs nothing, and shows what the plugin states and the
//! configuration keys it reads. `check` loads it with the operator's
//! settings (the same `SANDBOX_PLUGIN_*` variables plimsolld reads, so a
//! cloud adapter can be pointed at its service or a fake of it), watches
//! every request and container through `instruments`, drives it through a
//! few scenarios (an ordinary snippet, one that never ends, one stopped
//! right after its first successful capability use, as its own trap would)
//! and reports each rule in `report`. Nothing here changes what the host
//! enforces; it shows whether a plugin keeps to what the host expects.

pub mod instruments;
pub mod report;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::env_vars::Env;
use crate::job::{Job, Output, Payload};
use crate::outcome::RunFailure;
use crate::plugin_host::capabilities::http::policy::{HttpAllowance, HttpTls};
use crate::plugin_host::dispatch_mark::OVERRULED;
use crate::plugin_host::load::{self, Grants, PluginError, PluginSource};
use crate::plugin_host::{Described as Facts, PluginProvider};
use crate::providers::plugin::{Engine, Instruments, Load};
use crate::providers::settings::ProviderSettings;
use crate::tier::Tier;
use instruments::{Counting, Counts, Recorder, RunsNothing, Trip};
use report::{Report, Rule};

/// Largest plugin file read.
const MAX_PLUGIN_BYTES: u64 = 256 << 20;
/// The scenarios' budgets: an ordinary run, and one that never ends.
const ORDINARY_TIMEOUT: Duration = Duration::from_secs(30);
const SPIN_TIMEOUT: Duration = Duration::from_secs(3);
const TRAP_TIMEOUT: Duration = Duration::from_secs(5);
/// How far past a run's timeout an answer may come and still be the
/// plugin's own (the host's backstop stops a call 2 s past it).
const DEADLINE_SLACK: Duration = Duration::from_millis(1500);
const OUTPUT_LIMIT: usize = 1 << 20;
/// The strongest tier a container engine's evidence can stand behind.
const CONTAINER_CEILING: Tier = Tier::Kernel;

/// A plugin file, and the name it is loaded under.
pub struct Target {
    pub name: String,
    pub bytes: &'static [u8],
    pub sha256: String,
}

impl Target {
    /// Reads `path`; the name is `name`, or the file's stem.
    pub fn read(path: &Path, name: Option<&str>) -> Result<Target, String> {
        let name = match name {
            Some(n) => n.to_string(),
            None => path
                .file_stem()
                .and_then(|s| s.to_str())
                .ok_or("the file has no name to load it under")?
                .to_string(),
        };
        // The daemon's rule for plugin names, built-in names allowed (the
        // docker adapter is checked under its own).
        if !crate::plugin_host::name_shape(&name) {
            return Err(format!(
                "{:?} is not a plugin name (1-32 of a-z, 0-9, '-'): give --name",
                crate::text::truncate(&name, 64)
            ));
        }
        let bytes = match crate::bounded_read::read_regular(path, MAX_PLUGIN_BYTES) {
            Ok((bytes, _)) => bytes,
            Err(e) => return Err(format!("cannot read {}: {e:?}", path.display())),
        };
        use sha2::{Digest, Sha256};
        let sha256 = hex::encode(Sha256::digest(&bytes));
        // One load per process: the bytes live as long as it does, as the
        // daemon's embedded adapter does.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        Ok(Target {
            name,
            bytes,
            sha256,
        })
    }

    fn source(&self) -> PluginSource {
        PluginSource::Embedded(self.bytes)
    }
}

/// The provider settings plimsolld would build from `vars` for this plugin.
fn settings(vars: &BTreeMap<String, String>, name: &str) -> Result<ProviderSettings, String> {
    ProviderSettings::for_plugin_file(&Env::new(vars), name).map_err(|e| e.to_string())
}

/// What the plugin states about itself, with every capability it could
/// import stood in for (no origins, a backend that runs nothing).
pub async fn describe(target: &Target, vars: &BTreeMap<String, String>) -> Result<Facts, String> {
    let settings = settings(vars, &target.name)?;
    let described = Load {
        name: &target.name,
        source: target.source(),
        pin: None,
        max_tier: Tier::Vm,
        http: Some(HttpAllowance {
            origins: vec![],
            api_key: None,
            key_origins: vec![],
            tls: HttpTls::default(),
            exchange: None,
        }),
        engine: Engine::Given(RunsNothing::new()),
        guard: None,
        instruments: None,
    }
    .describe(&settings)
    .await
    .map_err(|e| e.to_string())?;
    Ok(described.facts().clone())
}

/// Options beyond the operator's variables.
pub struct CheckOptions {
    /// A command that prints how many of the plugin's resources the service
    /// still holds (a number); without it a service's side is not checked.
    pub leftovers: Option<String>,
    /// How long resources may take to go (a service's own timeout reaps
    /// what a trapped plugin could not delete).
    pub grace: Duration,
}

/// Loads and drives the plugin; every rule gets a verdict. `Err` only when
/// the operator's settings are not usable.
pub async fn check(
    target: &Target,
    vars: &BTreeMap<String, String>,
    options: &CheckOptions,
) -> Result<Report, String> {
    let mut report = Report {
        plugin: target.name.clone(),
        sha256: target.sha256.clone(),
        findings: vec![],
    };
    let all = Grants {
        http: true,
        container_engine: true,
    };
    match load::read(&target.name, &target.source(), None).and_then(|p| p.compile(all, None)) {
        Ok(_) => report.pass(
            Rule::Imports,
            "every import is one a plimsoll plugin may have",
        ),
        Err(e @ (PluginError::UnknownImport(..) | PluginError::NotComponent(..))) => {
            report.fail(Rule::Imports, e.to_string());
            return Ok(report);
        }
        Err(e) => return Err(e.to_string()),
    }
    let settings = settings(vars, &target.name)?;
    let trip = Trip::default();
    let recorder = Recorder::new(trip.clone());
    let counts: Arc<Mutex<Option<Arc<Counts>>>> = Arc::default();
    let wrap = {
        let (trip, counts) = (trip.clone(), counts.clone());
        Box::new(move |b| {
            let c = Counting::wrap(b, trip);
            *counts.lock().expect("counts lock") = Some(c.counts.clone());
            c as Arc<
                dyn crate::plugin_host::capabilities::container_engine::backend::ContainerBackend,
            >
        })
    };
    let p = &settings.plugin;
    let load = Load {
        name: &target.name,
        source: target.source(),
        pin: p.sha256.as_deref(),
        max_tier: p.max_tier.unwrap_or(Tier::Process),
        http: p.http.clone(),
        engine: Engine::from(settings.docker.as_ref()),
        guard: None,
        instruments: Some(Instruments {
            watch: recorder.clone(),
            wrap_backend: wrap,
            trip_wire: trip.wire.clone(),
        }),
    };
    let described = match load.describe(&settings).await {
        Ok(d) => d,
        Err(e) => {
            report.fail(Rule::Describe, e.to_string());
            return Ok(report);
        }
    };
    judge_description(&mut report, &described);
    let provider = match described.preflight().await {
        Ok(p) => {
            report.pass(Rule::Preflight, "the smoke test passed");
            p
        }
        Err(e) => {
            report.fail(Rule::Preflight, e.to_string());
            return Ok(report);
        }
    };
    let scenarios = Scenarios {
        provider: &provider,
        trip: &trip,
    };
    let trapped = scenarios.run_all(&mut report).await;
    let seen = recorder.seen();
    if seen.plain_credentials.is_empty() {
        report.pass(
            Rule::PlainHttpCredential,
            format!(
                "{} request(s) seen, none with a credential in clear",
                seen.sent
            ),
        );
    } else {
        report.fail(
            Rule::PlainHttpCredential,
            format!(
                "credential-shaped headers on plain http: {}",
                seen.plain_credentials.join(", ")
            ),
        );
    }
    if !seen.refused.is_empty() {
        report.fail(
            Rule::Budgets,
            format!("the host refused requests: {}", seen.refused.join("; ")),
        );
    }
    report.pass_unless_failed(Rule::Budgets, "no output cut and no request refused");
    provider_shutdown(&provider).await;
    let counts = counts.lock().expect("counts lock").clone();
    judge_cleanup(&mut report, counts, trapped, options).await;
    Ok(report)
}

fn judge_description(report: &mut Report, described: &load::Described) {
    let facts = described.facts();
    if !facts.runs_javascript && !facts.runs_project {
        report.fail(Rule::Describe, "it states no payload it runs");
    } else if described.backend_tier().is_some() && facts.claimed_tier > CONTAINER_CEILING {
        // A container engine's evidence stands behind kernel at most (a
        // verified gVisor); the host caps any claim to what this one
        // verified, but a plugin claiming more than any engine can give
        // has misread what it drives.
        report.fail(
            Rule::Describe,
            format!(
                "it claims {} while driving a container engine, whose evidence stands behind {} at most",
                facts.claimed_tier.as_str(),
                CONTAINER_CEILING.as_str()
            ),
        );
    } else {
        report.pass(
            Rule::Describe,
            format!(
                "{} ({} configuration key(s)); reported tier {}",
                facts.environment,
                facts.config.len(),
                described.tier().as_str()
            ),
        );
    }
}

async fn provider_shutdown(provider: &PluginProvider) {
    if let Some(b) = provider.backend() {
        b.shutdown().await;
    }
}

/// The runs the checker asks for, and what each shows.
struct Scenarios<'a> {
    provider: &'a PluginProvider,
    trip: &'a Trip,
}

impl Scenarios<'_> {
    async fn snippet(
        &self,
        code: &str,
        timeout: Duration,
    ) -> (Result<Output, RunFailure>, Duration) {
        let began = Instant::now();
        let out = self
            .provider
            .run(Job {
                payload: Payload::JavaScript(code.to_string()),
                timeout,
                output_limit: OUTPUT_LIMIT,
                grant: None,
                live: None,
            })
            .await;
        (out, began.elapsed())
    }

    /// Whether the trap scenario went off (a capability use succeeded
    /// and the plugin was stopped right after it).
    async fn run_all(&self, report: &mut Report) -> bool {
        if !self.provider.described().runs_javascript {
            for rule in [Rule::Run, Rule::Deadline, Rule::NotDispatched] {
                report.skip(rule, "the plugin runs no snippets");
            }
            return false;
        }
        let mut failures = vec![];
        // An ordinary snippet.
        let (out, _) = self.snippet("console.log(6 * 7)", ORDINARY_TIMEOUT).await;
        match &out {
            Ok(Output::JavaScript(o)) if o.stdout == b"42\n" && o.exit_code == 0 => {
                report.pass(Rule::Run, "console.log(6 * 7) answered 42");
                if o.stdout_truncated || o.stderr_truncated {
                    report.fail(Rule::Budgets, "the ordinary run's output was cut");
                }
            }
            Ok(_) => report.fail(
                Rule::Run,
                "console.log(6 * 7) did not answer 42 with exit 0",
            ),
            Err(e) => report.fail(Rule::Run, format!("the run failed: {}", failure_text(e))),
        }
        if let Err(e) = out {
            failures.push(e);
        }
        // A snippet that never ends: the plugin's answer, in time.
        let (out, took) = self.snippet("for (;;) {}", SPIN_TIMEOUT).await;
        let backstop = match &out {
            Err(RunFailure::MayHaveRun(m)) => {
                m.contains("overran its deadline") || m.contains("ran past its deadline")
            }
            Err(RunFailure::NotDispatched(r)) => r.message.contains("ran past its deadline"),
            Ok(_) => false,
        };
        if backstop || took > SPIN_TIMEOUT + DEADLINE_SLACK {
            report.fail(
                Rule::Deadline,
                format!(
                    "a 3 s snippet that never ends was answered after {} ms{}",
                    took.as_millis(),
                    if backstop {
                        ", by the host's backstop"
                    } else {
                        ""
                    }
                ),
            );
        } else {
            report.pass(
                Rule::Deadline,
                format!(
                    "a 3 s snippet that never ends was answered after {} ms",
                    took.as_millis()
                ),
            );
        }
        if let Err(e) = out {
            failures.push(e);
        }
        // Stopped right after its first successful capability use. A short
        // budget, so a service's own timeout (set from it) reaps soon what
        // the stopped plugin could not delete.
        self.trip.arm();
        let (out, _) = self.snippet("console.log(6 * 7)", TRAP_TIMEOUT).await;
        // Stopped, not merely tripped: the wire is read at the next epoch
        // tick, and a plugin whose call ended before it was not stopped.
        let went_off = self.trip.went_off() && out.is_err();
        self.trip.reset();
        if let Err(e) = out {
            failures.push(e);
        }
        let overruled: Vec<&RunFailure> = failures
            .iter()
            .filter(|f| matches!(f, RunFailure::MayHaveRun(m) if m.contains(OVERRULED)))
            .collect();
        if overruled.is_empty() {
            report.pass(
                Rule::NotDispatched,
                "no claim that nothing ran came after a capability use",
            );
        } else {
            report.fail(
                Rule::NotDispatched,
                format!(
                    "{} answer(s) claimed nothing ran after the plugin used a capability that can start execution",
                    overruled.len()
                ),
            );
        }
        went_off
    }
}

fn failure_text(e: &RunFailure) -> String {
    match e {
        RunFailure::NotDispatched(r) => format!("not dispatched: {}", r.message),
        RunFailure::MayHaveRun(m) => m.clone(),
    }
}

/// Containers through the engine are the host's to count; a service's
/// resources only the operator's command can see.
async fn judge_cleanup(
    report: &mut Report,
    counts: Option<Arc<Counts>>,
    trapped: bool,
    options: &CheckOptions,
) {
    use std::sync::atomic::Ordering;
    let paths = if trapped {
        "on every path, a trap right after its first capability use included"
    } else {
        "on every path taken (no trap was injected: no capability use succeeded, or the call ended before the wire was read)"
    };
    if let Some(c) = counts {
        let (started, ended) = (
            c.started.load(Ordering::SeqCst),
            c.ended.load(Ordering::SeqCst),
        );
        if started == ended {
            if options.leftovers.is_none() {
                report.pass(
                    Rule::Cleanup,
                    format!("{started} container run(s) started, every one ended, {paths}"),
                );
                return;
            }
        } else {
            report.fail(
                Rule::Cleanup,
                format!("{started} container run(s) started, {ended} ended"),
            );
        }
    }
    let Some(cmd) = &options.leftovers else {
        if !report.findings.iter().any(|f| f.rule == Rule::Cleanup) {
            report.skip(
                Rule::Cleanup,
                "a service's resources are checked only with --leftovers CMD",
            );
        }
        return;
    };
    let until = Instant::now() + options.grace;
    loop {
        match leftovers(cmd).await {
            Ok(0) => {
                report.pass_unless_failed(
                    Rule::Cleanup,
                    format!("the service holds none of the plugin's resources, {paths}"),
                );
                return;
            }
            Ok(n) if Instant::now() >= until => {
                report.fail(
                    Rule::Cleanup,
                    format!(
                        "the service still holds {n} resource(s) after {} s",
                        options.grace.as_secs()
                    ),
                );
                return;
            }
            Ok(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            Err(why) => {
                report.fail(Rule::Cleanup, format!("--leftovers failed: {why}"));
                return;
            }
        }
    }
}

async fn leftovers(cmd: &str) -> Result<u64, String> {
    let out = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .await
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("it exited with {}", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|_| "it did not print a number".to_string())
}
