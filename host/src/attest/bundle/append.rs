//! Appending a run: its record checked, signed, and written after the
//! bundle's end with a new checkpoint after it. Nothing already in the file
//! is rewritten, so a write cut short by a crash leaves every earlier
//! checkpoint whole (`tail::repair` cuts the torn end off), and a write
//! that fails with an error is undone by cutting the file back.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use serde_json::Value;

use super::file::open_for_append;
use super::tail::{Tail, read_tail};
use super::{
    CheckpointPredicate, KIND_CHECKPOINT, KIND_RUN, LINE_SUBJECT, RECORD_SUBJECT, RunPredicate,
    SIGNED, Sharing, canonical, io_error, object, sha256_hex, to_value,
};
use crate::attest::AttestError;
use crate::attest::check::{answer_as_received, check_run, parse_run_request};
use crate::attest::dsse::Envelope;
use crate::attest::keys::SigningKey;
use crate::attest::session_check::Chain;
use crate::attest::statement::{self, BUNDLE_CHECKPOINT, RUN_RECORD};

/// Whether each append is on disk before it returns.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Synced before `append_run` returns: what a one-shot signer needs,
    /// since it says "recorded" and exits.
    Synced,
    /// Written, and synced by `sync` or when the appender is dropped: for a
    /// long-lived signer, which can say when its runs must be on disk. A
    /// crash can lose the unsynced tail (the bundle then shows it was cut
    /// short), never change what is there.
    Buffered,
}

/// Appends one run to the bundle at `path` (creating it, owner-only, if it
/// does not exist), signed with `key`: `Appender` for one run.
pub fn append_run(
    path: &Path,
    key: &SigningKey,
    sharing: Sharing,
    request: &Value,
    response: &Value,
) -> Result<(), AttestError> {
    // Checked before the file is opened: a record that does not check
    // leaves no trace, not even an empty bundle.
    let run = Checked::new(request, response)?;
    Appender::open(path, key, sharing, Durability::Synced)?.append(&run)
}

/// A run whose record checked against its request, as received: the only
/// thing an appender signs.
pub struct Checked<'a> {
    request: &'a Value,
    response: &'a Value,
    pub(super) record_sha256: String,
    /// The request's digest, as the record (now checked) states it.
    pub(super) request_sha256: String,
}

impl<'a> Checked<'a> {
    pub fn new(request: &'a Value, response: &'a Value) -> Result<Self, AttestError> {
        let parsed = parse_run_request(&canonical(request))?;
        let answer = answer_as_received(response)?;
        check_run(&parsed, &answer)?;
        Ok(Checked {
            request,
            response,
            record_sha256: answer.record.record_sha256,
            request_sha256: answer.record.request_sha256,
        })
    }
}

/// A bundle held open to append runs to: its checkpoint is read and checked
/// once, and the file stays locked while the appender lives, so each run
/// costs its own checks, signatures and write, never a read of the file.
pub struct Appender<'k> {
    file: File,
    key: &'k SigningKey,
    tail: Tail,
    durability: Durability,
    /// An append failed and the file could not be put back: nothing more
    /// is written through this appender.
    broken: bool,
    /// The sessions opened through this appender and not yet closed, by
    /// fingerprint: a session's chain is kept by the appender that wrote
    /// its open, so its calls are checked in order as they come.
    pub(super) sessions: HashMap<String, Chain>,
}

impl<'k> Appender<'k> {
    /// Opens (or creates, owner-only) the bundle at `path`, locks it, and
    /// checks that it ends with a checkpoint signed by `key`.
    pub fn open(
        path: &Path,
        key: &'k SigningKey,
        sharing: Sharing,
        durability: Durability,
    ) -> Result<Self, AttestError> {
        let mut file = open_for_append(path, sharing)?;
        file.lock().map_err(|e| io_error("locking the bundle", e))?;
        let tail = read_tail(&mut file, key)?;
        if tail.open_sessions > 0 {
            return Err(AttestError::Incomplete(format!(
                "the bundle holds {} session(s) a signer opened and never closed (it was stopped); it can no longer verify, so it is not extended: start a new bundle",
                tail.open_sessions
            )));
        }
        Ok(Appender {
            file,
            key,
            tail,
            durability,
            broken: false,
            sessions: HashMap::new(),
        })
    }

    /// Appends one run. Its record must check against the request first: a
    /// record that does not is never signed. If the write fails, the file
    /// is put back as it was.
    pub fn append_run(&mut self, request: &Value, response: &Value) -> Result<(), AttestError> {
        self.append(&Checked::new(request, response)?)
    }

    fn append(&mut self, run: &Checked<'_>) -> Result<(), AttestError> {
        let record = run.response.get("record").cloned().unwrap_or(Value::Null);
        self.append_line(
            KIND_RUN,
            "Run",
            Some(run.request),
            ("response", run.response),
            |key, line, previous_line_sha256| {
                statement::sign(
                    key,
                    RECORD_SUBJECT,
                    &run.record_sha256,
                    RUN_RECORD,
                    &RunPredicate {
                        record,
                        line,
                        previous_line_sha256,
                    },
                )
            },
        )
    }

    /// Appends one entry line (of `kind`, for `procedure`, holding the
    /// request, if the procedure's is worth keeping, and the answer, or the
    /// error, under its key) with
    /// the statement `sign` makes for its place, then a checkpoint after
    /// it. The caller has checked what the statement says.
    pub(super) fn append_line(
        &mut self,
        kind: &str,
        procedure: &str,
        request: Option<&Value>,
        (answer_key, answer): (&str, &Value),
        sign: impl FnOnce(&SigningKey, u64, String) -> Result<Envelope, AttestError>,
    ) -> Result<(), AttestError> {
        if self.broken {
            return Err(AttestError::Format(
                "an earlier append could not be undone; reopen the bundle".into(),
            ));
        }
        let key = self.key;
        let tail = &self.tail;
        let number = tail.lines + 1;
        let signed = sign(key, number, tail.previous.clone())?;
        let mut fields = vec![
            ("kind", Value::from(kind)),
            ("line", Value::from(number)),
            ("procedure", Value::from(procedure)),
            (answer_key, answer.clone()),
            (SIGNED, to_value(&signed)),
        ];
        if let Some(request) = request {
            fields.push(("request", request.clone()));
        }
        let entry = canonical(&Value::Object(object(&fields)));
        // The line must read back as written: an answer nested as deep as
        // the parser allows is one level too deep inside a line.
        if serde_json::from_slice::<Value>(&entry).is_err() {
            return Err(AttestError::Format(
                "the answer would not read back from a bundle line (nested too deep)".into(),
            ));
        }
        let entries = tail.entries + 1;
        let open_sessions = self.sessions.len() as u64;
        let checkpoint = checkpoint_line(
            key,
            CheckpointPredicate {
                line: number + 1,
                entries,
                open_sessions,
            },
            &sha256_hex(&entry),
        )?;
        let previous = sha256_hex(&checkpoint);
        let mut added = entry;
        added.push(b'\n');
        added.extend_from_slice(&checkpoint);
        added.push(b'\n');
        let sync = self.durability == Durability::Synced;
        match write_at_end(&mut self.file, self.tail.len, &added, sync) {
            Ok(()) => {
                self.tail = Tail {
                    lines: number + 1,
                    entries,
                    previous,
                    open_sessions,
                    len: self.tail.len + added.len() as u64,
                };
                Ok(())
            }
            Err(Unwritten { error, restored }) => {
                self.broken = !restored;
                Err(error)
            }
        }
    }

    /// Puts every entry appended so far on disk.
    pub fn sync(&self) -> Result<(), AttestError> {
        self.file
            .sync_data()
            .map_err(|e| io_error("syncing the bundle", e))
    }
}

impl Drop for Appender<'_> {
    fn drop(&mut self) {
        if self.durability == Durability::Buffered {
            let _ = self.file.sync_data();
        }
    }
}

/// The checkpoint stating `stated` (its line, the entries and open sessions
/// before it), closing the line whose digest is `last_line_sha256`.
fn checkpoint_line(
    key: &SigningKey,
    stated: CheckpointPredicate,
    last_line_sha256: &str,
) -> Result<Vec<u8>, AttestError> {
    let signed = statement::sign(
        key,
        LINE_SUBJECT,
        last_line_sha256,
        BUNDLE_CHECKPOINT,
        &stated,
    )?;
    Ok(canonical(&Value::Object(object(&[
        ("kind", Value::from(KIND_CHECKPOINT)),
        ("line", Value::from(stated.line)),
        ("entries", Value::from(stated.entries)),
        (SIGNED, to_value(&signed)),
    ]))))
}

/// An append that did not happen: why, and whether the file is as it was.
struct Unwritten {
    error: AttestError,
    restored: bool,
}

/// Writes `added` at `len`, the bundle's end (and syncs, if asked); on
/// failure cuts the file back to `len`, so the bundle is as it was.
fn write_at_end(file: &mut File, len: u64, added: &[u8], sync: bool) -> Result<(), Unwritten> {
    let written = file
        .seek(SeekFrom::Start(len))
        .and_then(|_| file.write_all(added))
        .and_then(|()| if sync { file.sync_data() } else { Ok(()) });
    let Err(e) = written else {
        return Ok(());
    };
    let restored = file.set_len(len).and_then(|()| file.sync_data());
    let what = match &restored {
        Ok(()) => "appending to the bundle (it is as it was)".to_string(),
        Err(r) => format!("appending to the bundle, and cutting it back ({r})"),
    };
    Err(Unwritten {
        error: io_error(&what, e),
        restored: restored.is_ok(),
    })
}
