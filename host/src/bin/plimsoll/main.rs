//! `plimsoll`: the command line.
//!
//!   plimsoll run FILE.js [--floor TIER] [--timeout T] [--grant P] [--json]
//!   plimsoll run --project DIR --step CMD... [--artifact PATH]... [--out DIR]
//!   plimsoll describe [--json]
//!   plimsoll mcp [--url URL]
//!   plimsoll callers create|import|list|rotate|revoke --file F ...
//!   plimsoll attest keygen|run|verify ...
//!   plimsoll plugin describe|check FILE.wasm [--config F] [--json]
//!   plimsoll grants from-openapi SPEC --base-url URL --profile NAME --caller ID... [--out DIR]
//!
//! `run` and `describe` talk to a daemon (`--url`, or PLIMSOLL_URL, default
//! http://127.0.0.1:8746) with the caller's token from PLIMSOLL_TOKEN; see
//! docs/cli.md for what they print and their exit codes. `callers` manages
//! the callers file on this machine. `grants from-openapi` writes a grant
//! profile, its SDK and its tool description from an OpenAPI 3.0 document,
//! offline.

mod attest_cli;
mod attest_replay;
mod attest_session;
mod callers;
mod client;
mod grants_cli;
mod local_files;
mod mcp;
mod plugin;
mod run;
mod signer;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "plimsoll",
    about = "Run code through plimsolld, and manage its callers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs a JavaScript file, or a project directory's steps, and exits
    /// with the run's exit code.
    Run(run::RunArgs),
    /// Shows what the daemon runs and at which isolation tier.
    Describe(run::DescribeArgs),
    /// Serves the daemon's MCP tools over stdio, for an agent that launches
    /// its tools as processes (the daemon's /mcp, bridged).
    Mcp(mcp::McpArgs),
    /// Manage the callers file (PLIMSOLL_CLIENTS_FILE).
    Callers {
        #[command(subcommand)]
        action: callers::Action,
    },
    /// Signed run records: keys, signing runs into a bundle, verifying one.
    Attest {
        #[command(subcommand)]
        action: attest_cli::Action,
    },
    /// Provider plugins, before a daemon loads them: what one states and
    /// reads, and whether it keeps to the host's rules.
    Plugin {
        #[command(subcommand)]
        action: plugin::Action,
    },
    /// Grant profiles, made on this machine: from an OpenAPI 3.0 document,
    /// a profile, the SDK its preamble loads and its tool description.
    Grants {
        #[command(subcommand)]
        action: grants_cli::Action,
    },
}

fn main() -> ExitCode {
    // A write past the file-size limit then fails with EFBIG, which the
    // bundle's append answers by cutting the file back; by default the
    // signal would kill the process first and leave the append torn.
    // SAFETY: setting a signal's disposition to ignore, before any thread
    // of ours starts; no handler runs.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    match Cli::parse().command {
        Command::Run(args) => run::run(args),
        Command::Describe(args) => run::describe(args),
        Command::Mcp(args) => mcp::run(args),
        Command::Attest { action } => attest_cli::run(action),
        Command::Plugin { action } => plugin::run(action),
        Command::Grants { action } => grants_cli::run(action),
        Command::Callers { action } => match callers::run(action) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("plimsoll: {e}");
                ExitCode::from(1)
            }
        },
    }
}
