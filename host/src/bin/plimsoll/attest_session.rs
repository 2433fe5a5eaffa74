//! `plimsoll attest session`: one session, opened, called and closed, with
//! each answer signed into a bundle as it comes.
//!
//! The script is `{"open": OpenSessionRequest, "calls": [SessionRunRequest
//! without sessionId, …]}`. The session ID stays in this process's memory:
//! it is put into each call just before sending and never printed, written
//! or passed on (it is a capability; a bundle names the session by its
//! fingerprint). The bundle stays locked from open to close, so the chain
//! is kept in memory and each call is checked against it as it comes.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use plimsoll::attest::bundle::{Appender, Durability, Sharing};
use plimsoll::attest::session_check::{parse_open_request, parse_session_call, without_id};
use serde_json::{Value, json};

use crate::client::{Api, Failure};
use crate::local_files::read_request;
use crate::run::{EXIT_UNKNOWN, EXIT_USAGE, call, drive, fail};
use crate::signer::{SignerArgs, signing_key};

/// The answer came but is not in the bundle.
const EXIT_NOT_RECORDED: u8 = 3;
/// Stopped by SIGINT or SIGTERM: the session was closed early.
const EXIT_INTERRUPTED: u8 = 130;

/// Set by SIGINT or SIGTERM: no more calls are sent, and the session is
/// closed, so the bundle still ends with its close. (A signer killed
/// outright leaves the session open; the bundle then says so and is not
/// extended.)
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn interrupted(_: libc::c_int) {
    // Only an atomic store: all a signal handler may safely do here.
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn close_on_interrupt() {
    let handler = interrupted as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is
    // async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}
/// How long an open or a close may take.
const SESSION_CALL_BUDGET: Duration = Duration::from_secs(120);

#[derive(Args)]
pub struct SessionArgs {
    /// The session script: {"open": {...}, "calls": [{...}, ...]}.
    script: PathBuf,
    #[command(flatten)]
    signer: SignerArgs,
}

/// The script's open request and calls, or why it is not one. A call that
/// carries a session ID is refused: the ID is the daemon's to give.
pub fn read_script(path: &std::path::Path) -> Result<(Value, Vec<Value>), String> {
    let script = read_request(path)?;
    let shown = path.display();
    let Some(fields) = script.as_object() else {
        return Err(format!("{shown}: not a JSON object"));
    };
    if let Some(other) = fields.keys().find(|k| *k != "open" && *k != "calls") {
        return Err(format!(
            "{shown}: {other:?} is not a script field (open, calls)"
        ));
    }
    let open = match fields.get("open") {
        Some(o @ Value::Object(_)) => o.clone(),
        _ => return Err(format!("{shown}: no \"open\" request object")),
    };
    let calls = match fields.get("calls") {
        Some(Value::Array(calls)) => calls.clone(),
        None => Vec::new(),
        Some(_) => return Err(format!("{shown}: \"calls\" is not a list")),
    };
    // Each request is read as the daemon will read it, so a malformed one
    // is refused here, before a session is opened for it.
    parse_open_request(&open).map_err(|e| format!("{shown}: open: {e}"))?;
    for (n, c) in calls.iter().enumerate() {
        let Some(fields) = c.as_object() else {
            return Err(format!("{shown}: call {} is not an object", n + 1));
        };
        if fields.contains_key("sessionId") || fields.contains_key("session_id") {
            return Err(format!(
                "{shown}: call {} names a session ID; the daemon gives one at open",
                n + 1
            ));
        }
        parse_session_call(c).map_err(|e| format!("{shown}: call {}: {e}", n + 1))?;
    }
    Ok((open, calls))
}

/// The call as sent: the kept call with the session's ID put in.
pub fn with_id(call: &Value, id: &str) -> Value {
    let mut sent = call.clone();
    if let Some(o) = sent.as_object_mut() {
        o.insert("sessionId".into(), Value::from(id));
    }
    sent
}

pub fn close_request(id: &str) -> Value {
    json!({"protocol": plimsoll::wire::PROTOCOL, "sessionId": id})
}

/// What a session call came back with: an answer, or the error of a call
/// that may have run, carrying its record.
pub enum Called {
    Answer(Value),
    Unanswered(Value),
}

/// Sends one session call; a refusal or any other failure is printed and
/// becomes the exit code, as for `plimsoll run`.
pub fn session_call(api: &Api, body: &Value, budget: Duration) -> Result<Called, ExitCode> {
    let (_output, quiet) = tokio::sync::mpsc::unbounded_channel();
    let called = async {
        match api.call("SessionRun", body, budget).await {
            Ok(answer) => Ok(Called::Answer(answer)),
            Err(Failure::Unanswered { error }) => Ok(Called::Unanswered(error)),
            Err(other) => Err(other),
        }
    };
    drive(called, quiet).map(|(called, _)| called)
}

pub fn budget_of(call: &Value) -> Duration {
    Duration::from_millis(call["timeoutMs"].as_u64().unwrap_or(120_000))
}

pub fn sign_session(SessionArgs { script, signer }: SessionArgs) -> ExitCode {
    // Everything that can be refused here is, before anything is sent.
    let key = match signing_key(signer.key.as_deref()) {
        Ok(k) => k,
        Err(e) => return fail(EXIT_USAGE, &e),
    };
    let sharing = if signer.shared_bundle {
        Sharing::Shared
    } else {
        Sharing::Private
    };
    let (open, calls) = match read_script(&script) {
        Ok(s) => s,
        Err(e) => return fail(EXIT_USAGE, &e),
    };
    let api = match Api::new(signer.url) {
        Ok(a) => a,
        Err(e) => return fail(EXIT_USAGE, &e),
    };
    let mut bundle = match Appender::open(&signer.bundle, &key, sharing, Durability::Synced) {
        Ok(b) => b,
        Err(e) => return fail(EXIT_USAGE, &format!("{}: {e}", signer.bundle.display())),
    };

    close_on_interrupt();
    let opened = match call(&api, "OpenSession", &open, SESSION_CALL_BUDGET) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let id = opened["sessionId"].as_str().unwrap_or_default().to_string();
    println!("{}", without_id(&opened));
    let fingerprint = match bundle.append_open(&open, &opened) {
        Ok(fp) => fp,
        Err(e) => {
            // Not ours to keep open: closed, as the client closes a session
            // whose open does not check.
            if !id.is_empty() {
                let _ = call(
                    &api,
                    "CloseSession",
                    &close_request(&id),
                    SESSION_CALL_BUDGET,
                );
            }
            return fail(EXIT_NOT_RECORDED, &format!("the open is not recorded: {e}"));
        }
    };

    // The first failure decides the exit; the close is tried on every path.
    let mut outcome = ExitCode::SUCCESS;
    for (n, kept) in calls.iter().enumerate() {
        if INTERRUPTED.load(Ordering::SeqCst) {
            outcome = fail(
                EXIT_INTERRUPTED,
                &format!(
                    "interrupted: {} calls not sent; closing the session",
                    calls.len() - n
                ),
            );
            break;
        }
        let answer = match session_call(&api, &with_id(kept, &id), budget_of(kept)) {
            Ok(Called::Answer(a)) => a,
            // The call may have run: its record goes in the chain, and, as
            // the published client does, nothing more is sent.
            Ok(Called::Unanswered(error)) => {
                println!("{error}");
                outcome = match bundle.append_unanswered(&fingerprint, kept, &error) {
                    Ok(()) => fail(
                        EXIT_UNKNOWN,
                        &format!(
                            "call {} failed, it may have run; its record is in the bundle",
                            n + 1
                        ),
                    ),
                    Err(e) => fail(
                        EXIT_NOT_RECORDED,
                        &format!("call {} failed and its record is not recorded: {e}", n + 1),
                    ),
                };
                break;
            }
            Err(code) => {
                outcome = code;
                break;
            }
        };
        println!("{answer}");
        if let Err(e) = bundle.append_call(&fingerprint, kept, &answer) {
            outcome = fail(
                EXIT_NOT_RECORDED,
                &format!("call {} is not recorded: {e}", n + 1),
            );
            break;
        }
        if answer.get("ended").is_some() {
            let unsent = calls.len() - n - 1;
            if unsent > 0 {
                outcome = fail(
                    EXIT_NOT_RECORDED,
                    &format!(
                        "the session ended after call {}; {unsent} calls not sent, so not recorded",
                        n + 1
                    ),
                );
            }
            break;
        }
    }

    let closed = match call(
        &api,
        "CloseSession",
        &close_request(&id),
        SESSION_CALL_BUDGET,
    ) {
        Ok(a) => a,
        Err(code) => {
            return if outcome == ExitCode::SUCCESS {
                code
            } else {
                outcome
            };
        }
    };
    println!("{closed}");
    match bundle.append_close(&fingerprint, &closed) {
        Ok(()) => outcome,
        Err(e) => {
            let left = fail(
                EXIT_NOT_RECORDED,
                &format!(
                    "the close is not recorded, so the bundle shows the session incomplete: {e}"
                ),
            );
            if outcome == ExitCode::SUCCESS {
                left
            } else {
                outcome
            }
        }
    }
}
