//! `plimsoll attest replay`: a verified bundle's runs sent again, and its
//! sessions replayed into fresh sessions, with each new result digest
//! compared to the one the bundle holds.
//!
//! Nothing is sent unless the whole bundle verifies, and what is sent is
//! read from the very bytes that verified. Each new answer is held to the
//! signer's checks before its result counts: a record that does not check
//! is a failure, not a comparison. Replay shows whether the code gives the
//! same result again; output that varies by nature (time, randomness)
//! differs, and is reported as such.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use plimsoll::attest::bundle::{self, Checked, Held, HeldCall};
use plimsoll::attest::keys::VerifyingKey;
use plimsoll::attest::session_check::{
    call_as_received, check_open, close_as_received, id_matches, open_as_received,
    parse_open_request, parse_session_call, unanswered_of, without_id,
};
use serde_json::Value;

use crate::attest_session::{Called, budget_of, close_request, session_call, with_id};
use crate::client::Api;
use crate::run::{EXIT_USAGE, call, fail};

/// A bundle that does not verify: nothing sent.
const EXIT_NOT_VERIFIED: u8 = 1;
/// A replayed result that differs, or a call that could not be compared.
const EXIT_DIFFERS: u8 = 4;

#[derive(Args)]
pub struct ReplayArgs {
    bundle: PathBuf,
    /// The signer's public key (PREFIX.pub): the bundle must verify first.
    #[arg(long = "pub")]
    public: PathBuf,
    /// The daemon (default PLIMSOLL_URL, else http://127.0.0.1:8746).
    #[arg(long)]
    url: Option<String>,
}

/// Tallies what replay found, printing one line per run or call.
#[derive(Default)]
struct Tally {
    same: usize,
    other: usize,
    /// Sent again, but with nothing to compare with.
    uncompared: usize,
}

impl Tally {
    fn same(&mut self, what: &str) {
        self.same += 1;
        println!("{what}: same result");
    }

    fn uncompared(&mut self, what: &str, verdict: &str) {
        self.uncompared += 1;
        println!("{what}: {verdict}");
    }

    fn other(&mut self, what: &str, verdict: &str) {
        self.other += 1;
        println!("{what}: {verdict}");
    }
}

pub fn replay(args: ReplayArgs) -> ExitCode {
    let key = match VerifyingKey::load(&args.public) {
        Ok(k) => k,
        Err(e) => return fail(EXIT_USAGE, &e.to_string()),
    };
    let api = match Api::new(args.url) {
        Ok(a) => a,
        Err(e) => return fail(EXIT_USAGE, &e),
    };
    let held = match bundle::verified_entries(&args.bundle, &key) {
        Ok(h) => h,
        Err(e) => {
            return fail(
                EXIT_NOT_VERIFIED,
                &format!("not verified, nothing sent: {e}"),
            );
        }
    };
    let mut tally = Tally::default();
    let (mut runs, mut sessions) = (0, 0);
    for entry in &held {
        match entry {
            Held::Run(run) => {
                runs += 1;
                replay_run(&api, &format!("run {runs}"), run, &mut tally);
            }
            Held::Session { open, calls } => {
                sessions += 1;
                replay_session(&api, sessions, open, calls, &mut tally);
            }
        }
    }
    println!(
        "{runs} runs and {sessions} sessions replayed: {} results the same, {} not",
        tally.same, tally.other
    );
    if tally.uncompared > 0 {
        println!(
            "{} calls sent again had no answer when signed: not compared",
            tally.uncompared
        );
    }
    if tally.other == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_DIFFERS)
    }
}

fn replay_run(api: &Api, what: &str, run: &HeldCall, tally: &mut Tally) {
    let Ok(answer) = call(api, "Run", &run.request, budget_of(&run.request)) else {
        return tally.other(what, "not answered");
    };
    match Checked::new(&run.request, &answer) {
        Err(e) => tally.other(what, &format!("its record does not check ({e})")),
        Ok(_) if answer["record"]["resultSha256"] == run.result_sha256.as_str() => tally.same(what),
        Ok(_) => tally.other(what, "a different result"),
    }
}

/// A session replayed into a fresh one: opened with the request the bundle
/// holds (less its owner, whose live session the replay must not replace,
/// and its trace ID), each call sent in order and checked against the new
/// chain, then closed. Calls after one that fails are not sent.
fn replay_session(api: &Api, n: usize, open: &Value, calls: &[HeldCall], tally: &mut Tally) {
    let mut request = open.clone();
    if let Some(o) = request.as_object_mut() {
        o.remove("owner");
        o.remove("traceId");
        o.remove("trace_id");
    }
    let not_replayed = |tally: &mut Tally, from: usize, why: &str| {
        for c in from..calls.len() {
            tally.other(&format!("session {n} call {}", c + 1), why);
        }
    };
    let Ok(opened) = call(api, "OpenSession", &request, budget_of(&Value::Null)) else {
        tally.other(&format!("session {n}"), "not opened");
        return not_replayed(tally, 0, "not replayed (the session did not open)");
    };
    let id = opened["sessionId"].as_str().unwrap_or_default().to_string();
    let checked = parse_open_request(&request)
        .and_then(|req| Ok((req, open_as_received(&without_id(&opened))?)))
        .and_then(|(req, resp)| check_open(&req, &resp));
    let refused = match &checked {
        Ok(chain) if id_matches(&id, &chain.fingerprint) => None,
        Ok(_) => Some("not replayed (the open's ID is not its fingerprint's)".to_string()),
        Err(e) => Some(format!("not replayed (the open does not check: {e})")),
    };
    let (Ok(mut chain), None) = (checked, refused.as_ref()) else {
        if !id.is_empty() {
            let _ = call(
                api,
                "CloseSession",
                &close_request(&id),
                budget_of(&Value::Null),
            );
        }
        let why = refused.unwrap_or_default();
        tally.other(&format!("session {n}"), &why);
        return not_replayed(tally, 0, &why);
    };
    for (c, held) in calls.iter().enumerate() {
        let what = format!("session {n} call {}", c + 1);
        let request = parse_session_call(&held.request);
        let called = session_call(api, &with_id(&held.request, &id), budget_of(&held.request));
        // Each new answer, or unanswered record, checked against the fresh
        // chain before anything is compared; then the chain moves on.
        let checked = match (request, called) {
            (_, Err(_)) => Err("not answered".to_string()),
            (Err(e), _) => Err(format!("its request does not parse ({e})")),
            (Ok(req), Ok(Called::Answer(answer))) => call_as_received(&answer)
                .and_then(|resp| chain.check_call(&req, &resp).map(|()| resp))
                .map(|resp| {
                    chain.advance(&resp);
                    Some(resp.run.record.result_sha256)
                })
                .map_err(|e| format!("its record does not check ({e})")),
            (Ok(req), Ok(Called::Unanswered(error))) => unanswered_of(&error)
                .and_then(|(rec, ended)| {
                    chain.check_unanswered(&req, &rec)?;
                    chain.advance_past(&rec, ended);
                    Ok(None)
                })
                .map_err(|e| format!("no answer, and its record does not check ({e})")),
        };
        let no_answer = matches!(checked, Ok(None));
        let stop = match (checked, held.result_sha256.as_str()) {
            (Err(why), _) => {
                tally.other(&what, &why);
                true
            }
            // Nothing to compare with: the signed call had no answer.
            (Ok(_), "") => {
                tally.uncompared(&what, "not compared (it had no answer when signed)");
                false
            }
            (Ok(None), _) => {
                tally.other(&what, "no answer (it may have run)");
                true
            }
            (Ok(Some(now)), was) if now == was => {
                tally.same(&what);
                false
            }
            (Ok(Some(_)), _) => {
                tally.other(&what, "a different result");
                false
            }
        };
        // As the client does, nothing more is sent after a call that may
        // have run without an answer, or one that failed.
        if stop || no_answer || chain.has_ended() {
            not_replayed(
                tally,
                c + 1,
                "not replayed (an earlier call failed or ended the session)",
            );
            break;
        }
    }
    // The fresh session's close must account for every call it answered,
    // as a signed one's must.
    let closed = call(
        api,
        "CloseSession",
        &close_request(&id),
        budget_of(&Value::Null),
    );
    let checked = closed
        .map_err(|_| "not answered".to_string())
        .and_then(|answer| close_as_received(&answer).map_err(|e| e.to_string()))
        .and_then(|answer| chain.check_close(&answer).map_err(|e| e.to_string()));
    if let Err(why) = checked {
        tally.other(&format!("session {n} close"), &why);
    }
}
