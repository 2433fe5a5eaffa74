//! `plimsoll attest`: signed run records a third party can check later.
//!
//!   plimsoll attest keygen --out PREFIX
//!   plimsoll attest run --bundle FILE [--key FILE] [--shared-bundle] [--url URL] REQUEST.json
//!   plimsoll attest repair [--key FILE] BUNDLE
//!   plimsoll attest session --bundle FILE [--key FILE] [--shared-bundle] [--url URL] SCRIPT.json
//!   plimsoll attest replay --pub FILE [--url URL] BUNDLE
//!   plimsoll attest verify --pub FILE [--daemon-pub FILE] [--expect FILE | --expect-count N] BUNDLE
//!
//! `run` sends the request as one Run, prints the answer as JSON, and
//! appends the signed run to the bundle, but only if its record checks
//! against the request: a record that does not is printed and never
//! signed. The bundle's format and what a signature proves are in
//! docs/attest.md.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use plimsoll::attest::bundle::{self, Expect, Sharing};
use plimsoll::attest::keys::{self, VerifyingKey};

use crate::attest_replay::{self, ReplayArgs};
use crate::attest_session::{self, SessionArgs};
use crate::client::Api;
use crate::local_files::read_request;
use crate::run::{EXIT_USAGE, call, fail};
use crate::signer::{Signer, SignerArgs, signing_key};

/// The answer came but is not in the bundle: its record did not check, or
/// the bundle could not be written.
const EXIT_NOT_RECORDED: u8 = 3;
/// A bundle that does not verify.
const EXIT_NOT_VERIFIED: u8 = 1;

#[derive(Subcommand)]
pub enum Action {
    /// Creates an Ed25519 key pair: PREFIX.key (owner-only) and PREFIX.pub.
    /// Never overwrites a file.
    Keygen {
        #[arg(long)]
        out: PathBuf,
    },
    /// Sends REQUEST.json as one Run, prints the answer, and appends the
    /// signed run to the bundle.
    Run(RunArgs),
    /// Checks every line of a bundle, and that no expected run is missing.
    Verify(VerifyArgs),
    /// Cuts off the end an interrupted append left (a crash, a kill):
    /// whatever follows this key's last checkpoint, if no more than one
    /// append writes. Prints what it removed.
    Repair(RepairArgs),
    /// Verifies a bundle, then sends each of its runs again, and each of
    /// its sessions into a fresh session, and compares result digests;
    /// nothing is sent if the bundle does not verify.
    Replay(ReplayArgs),
    /// Opens a session, sends the script's calls in it, closes it, and
    /// appends each signed answer to the bundle as it comes.
    Session(SessionArgs),
}

#[derive(Args)]
pub struct RunArgs {
    /// A Run request in the API's JSON form.
    request: PathBuf,
    #[command(flatten)]
    signer: SignerArgs,
}

#[derive(Args)]
pub struct VerifyArgs {
    bundle: PathBuf,
    /// The signer's public key (PREFIX.pub).
    #[arg(long = "pub")]
    public: PathBuf,
    /// The daemon's public key: every run must then carry the daemon's
    /// receipt, signed with it, for its record.
    #[arg(long = "daemon-pub")]
    daemon_public: Option<PathBuf>,
    /// A file of request digests, one per line: each must be in the bundle.
    #[arg(long, conflicts_with = "expect_count")]
    expect: Option<PathBuf>,
    /// The number of runs and session calls the bundle must hold.
    #[arg(long)]
    expect_count: Option<usize>,
}

pub fn run(action: Action) -> ExitCode {
    match action {
        Action::Keygen { out } => keygen(&out),
        Action::Run(args) => sign_run(args),
        Action::Verify(args) => verify(args),
        Action::Repair(args) => repair(args),
        Action::Replay(args) => attest_replay::replay(args),
        Action::Session(args) => attest_session::sign_session(args),
    }
}

#[derive(Args)]
pub struct RepairArgs {
    bundle: PathBuf,
    /// The signing key (default: the PEM text in PLIMSOLL_ATTEST_KEY).
    #[arg(long)]
    key: Option<PathBuf>,
    /// Accept a bundle others may read.
    #[arg(long)]
    shared_bundle: bool,
}

fn repair(args: RepairArgs) -> ExitCode {
    let key = match signing_key(args.key.as_deref()) {
        Ok(k) => k,
        Err(e) => return fail(EXIT_USAGE, &e),
    };
    let sharing = if args.shared_bundle {
        Sharing::Shared
    } else {
        Sharing::Private
    };
    match bundle::repair(&args.bundle, &key, sharing) {
        Ok(r) if r.removed == 0 => {
            println!(
                "the bundle is whole: {} entries, nothing removed",
                r.entries
            );
            ExitCode::SUCCESS
        }
        Ok(r) => {
            println!(
                "removed the last {} bytes (an append cut short); {} entries remain",
                r.removed, r.entries
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(EXIT_NOT_VERIFIED, &format!("not repaired: {e}")),
    }
}

fn keygen(prefix: &Path) -> ExitCode {
    match keys::generate(prefix) {
        Ok(public) => {
            println!("key ID {}", public.key_id());
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, &e.to_string()),
    }
}

fn sign_run(args: RunArgs) -> ExitCode {
    // Everything that can be refused here is, before anything is sent.
    let RunArgs { request, signer } = args;
    let url = signer.url;
    let signer = match Signer::new(signer.bundle, signer.key.as_deref(), signer.shared_bundle) {
        Ok(s) => s,
        Err(e) => return fail(EXIT_USAGE, &e),
    };
    let request = match read_request(&request) {
        Ok(r) => r,
        Err(e) => return fail(EXIT_USAGE, &e),
    };
    let api = match Api::new(url) {
        Ok(a) => a,
        Err(e) => return fail(EXIT_USAGE, &e),
    };
    let budget = Duration::from_millis(request["timeoutMs"].as_u64().unwrap_or(120_000));
    let answer = match call(&api, "Run", &request, budget) {
        Ok(a) => a,
        Err(code) => return code,
    };
    println!("{answer}");
    match signer.record(&request, &answer) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(EXIT_NOT_RECORDED, &e),
    }
}

fn verify(args: VerifyArgs) -> ExitCode {
    let key = match VerifyingKey::load(&args.public) {
        Ok(k) => k,
        Err(e) => return fail(EXIT_USAGE, &e.to_string()),
    };
    let daemon = match args.daemon_public.as_deref().map(VerifyingKey::load) {
        Some(Ok(k)) => Some(k),
        Some(Err(e)) => return fail(EXIT_USAGE, &e.to_string()),
        None => None,
    };
    let expect = match (&args.expect, args.expect_count) {
        (Some(file), _) => match expected_requests(file) {
            Ok(digests) => Expect::Requests(digests),
            Err(e) => return fail(EXIT_USAGE, &e),
        },
        (None, Some(n)) => Expect::Count(n),
        (None, None) => Expect::Nothing,
    };
    match bundle::verify(&args.bundle, &key, daemon.as_ref(), &expect) {
        Ok(v) => {
            let unanswered = if v.unanswered > 0 {
                format!(", {} unanswered", v.unanswered)
            } else {
                String::new()
            };
            println!(
                "{} runs and {} sessions ({} calls{unanswered}) verified, signed by key ID {}",
                v.runs,
                v.sessions,
                v.session_calls,
                key.key_id()
            );
            match &daemon {
                Some(d) => println!(
                    "{} daemon receipts verified, signed by key ID {}",
                    v.receipts,
                    d.key_id()
                ),
                None if v.receipts > 0 => println!(
                    "{} daemon receipts present, not checked (give --daemon-pub)",
                    v.receipts
                ),
                None => {}
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(EXIT_NOT_VERIFIED, &format!("not verified: {e}")),
    }
}

/// The request digests an `--expect` file lists: one lowercase hex SHA-256
/// per line, blank lines ignored.
fn expected_requests(path: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            if l.len() == 64 && l.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                Ok(l.to_string())
            } else {
                Err(format!(
                    "{}: {l:?} is not a request digest (64 lowercase hex)",
                    path.display()
                ))
            }
        })
        .collect()
}
