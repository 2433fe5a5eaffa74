//! `plimsoll plugin describe|check FILE.wasm`: a provider plugin examined
//! on this machine, before a daemon loads it (`plimsoll::plugin_check`).
//! Both read the operator's `SANDBOX_PLUGIN_*` variables as plimsolld
//! does; `--config` names the plugin's configuration file instead of
//! `SANDBOX_PLUGIN_CONFIG_FILE`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use plimsoll::plugin_check::{self, CheckOptions, Target};

use crate::run::{EXIT_USAGE, fail};

#[derive(Subcommand)]
pub enum Action {
    /// Shows what a plugin states about itself and the configuration keys
    /// it reads (nothing is run, nothing is reached).
    Describe(DescribeArgs),
    /// Loads a plugin as the daemon would, drives it through a few runs and
    /// reports each rule it is held to. Exit 0: every rule checked passed;
    /// 1: one failed; 2: the plugin or the settings could not be used.
    Check(CheckArgs),
}

#[derive(Args)]
pub struct Common {
    /// The plugin component.
    file: PathBuf,
    /// The name to load it under (default: the file's stem).
    #[arg(long)]
    name: Option<String>,
    /// The plugin's configuration file (default: SANDBOX_PLUGIN_CONFIG_FILE).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct DescribeArgs {
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
pub struct CheckArgs {
    #[command(flatten)]
    common: Common,
    /// A shell command printing how many of the plugin's resources its
    /// service still holds; checked until it prints 0 or --grace passes.
    #[arg(long)]
    leftovers: Option<String>,
    /// Seconds a service may take to let go of what a stopped plugin made.
    #[arg(long, default_value_t = 60)]
    grace: u64,
}

pub fn run(action: Action) -> ExitCode {
    init_log();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(EXIT_USAGE, &format!("runtime: {e}")),
    };
    match action {
        Action::Describe(args) => rt.block_on(describe(args.common)),
        Action::Check(args) => rt.block_on(check(args)),
    }
}

/// The plugin's own log lines and the host's warnings, on stderr.
fn init_log() {
    use tracing_subscriber::filter::LevelFilter;
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(LevelFilter::WARN)
        .try_init();
}

fn vars(common: &Common) -> BTreeMap<String, String> {
    let mut vars: BTreeMap<String, String> = std::env::vars().collect();
    if let Some(c) = &common.config {
        vars.insert("SANDBOX_PLUGIN_CONFIG_FILE".into(), c.display().to_string());
    }
    vars
}

async fn describe(common: Common) -> ExitCode {
    let target = match Target::read(&common.file, common.name.as_deref()) {
        Ok(t) => t,
        Err(e) => return fail(EXIT_USAGE, &e),
    };
    let facts = match plugin_check::describe(&target, &vars(&common)).await {
        Ok(f) => f,
        Err(e) => return fail(EXIT_USAGE, &e),
    };
    if common.json {
        let keys: Vec<serde_json::Value> = facts
            .config
            .iter()
            .map(|k| {
                serde_json::json!({
                    "key": k.key, "meaning": k.meaning, "default": k.default,
                    "changesWhatRuns": k.changes_what_runs,
                })
            })
            .collect();
        let out = serde_json::json!({
            "name": target.name, "sha256": target.sha256,
            "claimedTier": facts.claimed_tier.as_str(), "environment": facts.environment,
            "javascript": facts.runs_javascript, "project": facts.runs_project,
            "sessions": facts.sessions.is_some(), "configKeys": keys,
        });
        println!("{out}");
        return ExitCode::SUCCESS;
    }
    println!("plugin {} (sha256 {})", target.name, target.sha256);
    println!(
        "claims {} · runs{}{} · sessions {}",
        facts.claimed_tier.as_str(),
        if facts.runs_javascript {
            " javascript"
        } else {
            ""
        },
        if facts.runs_project { " projects" } else { "" },
        if facts.sessions.is_some() {
            "yes"
        } else {
            "no"
        },
    );
    println!("environment {}", facts.environment);
    if facts.config.is_empty() {
        println!("configuration keys: none");
    }
    for k in &facts.config {
        println!(
            "key {:<20} {} · {}{}",
            k.key,
            match &k.default {
                Some(d) => format!("default {d:?}"),
                None => "required".into(),
            },
            if k.changes_what_runs {
                "changes what runs · "
            } else {
                ""
            },
            k.meaning
        );
    }
    ExitCode::SUCCESS
}

async fn check(args: CheckArgs) -> ExitCode {
    let target = match Target::read(&args.common.file, args.common.name.as_deref()) {
        Ok(t) => t,
        Err(e) => return fail(EXIT_USAGE, &e),
    };
    let options = CheckOptions {
        leftovers: args.leftovers,
        grace: Duration::from_secs(args.grace),
    };
    let report = match plugin_check::check(&target, &vars(&args.common), &options).await {
        Ok(r) => r,
        Err(e) => return fail(EXIT_USAGE, &e),
    };
    if args.common.json {
        println!(
            "{}",
            serde_json::to_string(&report).expect("the report serializes")
        );
    } else {
        print!("{}", report.text());
    }
    if report.any_failed() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
