//! Appending a run: its record checked, signed, and written in place of
//! the checkpoint with a new checkpoint after it, the file put back as it
//! was if the write fails.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use serde_json::Value;

use super::{
    CheckpointPredicate, KIND_CHECKPOINT, KIND_RUN, LINE_SUBJECT, RECORD_SUBJECT, RunPredicate,
    SIGNED, Sharing, canonical, io_error, object, sha256_hex, to_value,
};
use crate::attest::AttestError;
use crate::attest::check::{answer_as_received, check_run, parse_run_request};
use crate::attest::dsse::Envelope;
use crate::attest::keys::SigningKey;
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
    record_sha256: String,
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
        Ok(Appender {
            file,
            key,
            tail,
            durability,
            broken: false,
        })
    }

    /// Appends one run. Its record must check against the request first: a
    /// record that does not is never signed. If the write fails, the file
    /// is put back as it was.
    pub fn append_run(&mut self, request: &Value, response: &Value) -> Result<(), AttestError> {
        self.append(&Checked::new(request, response)?)
    }

    fn append(&mut self, run: &Checked<'_>) -> Result<(), AttestError> {
        if self.broken {
            return Err(AttestError::Format(
                "an earlier append could not be undone; reopen the bundle".into(),
            ));
        }
        let key = self.key;
        let tail = &self.tail;
        let number = tail.entries + 1;
        let signed = statement::sign(
            key,
            RECORD_SUBJECT,
            &run.record_sha256,
            RUN_RECORD,
            &RunPredicate {
                record: run.response.get("record").cloned().unwrap_or(Value::Null),
                line: number,
                previous_line_sha256: tail.previous.clone(),
            },
        )?;
        let entry = canonical(&Value::Object(object(&[
            ("kind", Value::from(KIND_RUN)),
            ("line", Value::from(number)),
            ("procedure", Value::from("Run")),
            ("request", run.request.clone()),
            ("response", run.response.clone()),
            (SIGNED, to_value(&signed)),
        ])));
        // The line must read back as written: an answer nested as deep as
        // the parser allows is one level too deep inside a line.
        if serde_json::from_slice::<Value>(&entry).is_err() {
            return Err(AttestError::Format(
                "the answer would not read back from a bundle line (nested too deep)".into(),
            ));
        }
        let checkpoint = checkpoint_line(key, number, &sha256_hex(&entry))?;
        let mut added = entry;
        added.push(b'\n');
        let entry_len = added.len() as u64;
        let entry_sha256 = sha256_hex(&added[..added.len() - 1]);
        added.extend_from_slice(&checkpoint);
        added.push(b'\n');
        let sync = self.durability == Durability::Synced;
        match replace_tail(&mut self.file, &self.tail, &added, sync) {
            Ok(()) => {
                self.tail = Tail {
                    entries: self.tail.entries + 1,
                    previous: entry_sha256,
                    offset: self.tail.offset + entry_len,
                    checkpoint: added[entry_len as usize..].to_vec(),
                };
                Ok(())
            }
            Err(Unwritten { error, restored }) => {
                self.broken = !restored;
                Err(error)
            }
        }
    }

    /// Puts every run appended so far on disk.
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

/// The checkpoint after `entries` runs, the last of them the line whose
/// digest is `last_line_sha256`.
fn checkpoint_line(
    key: &SigningKey,
    entries: u64,
    last_line_sha256: &str,
) -> Result<Vec<u8>, AttestError> {
    let signed = statement::sign(
        key,
        LINE_SUBJECT,
        last_line_sha256,
        BUNDLE_CHECKPOINT,
        &CheckpointPredicate {
            line: entries + 1,
            entries,
        },
    )?;
    Ok(canonical(&Value::Object(object(&[
        ("kind", Value::from(KIND_CHECKPOINT)),
        ("line", Value::from(entries + 1)),
        ("entries", Value::from(entries)),
        (SIGNED, to_value(&signed)),
    ]))))
}

/// Where the next run goes: after `entries` runs, replacing the checkpoint
/// that starts at `offset` (the file's end for a new bundle).
struct Tail {
    entries: u64,
    /// Digest of the last run line (empty for a new bundle).
    previous: String,
    offset: u64,
    /// The checkpoint's bytes, to put back if an append fails.
    checkpoint: Vec<u8>,
}

/// Reads the bundle's checkpoint, checked with the signer's own key: a
/// bundle someone else closed, or one cut short, is not extended. Only
/// the last line is read, so an append costs the same in a bundle of any
/// length.
fn read_tail(file: &mut File, key: &SigningKey) -> Result<Tail, AttestError> {
    let len = file
        .metadata()
        .map_err(|e| io_error("reading the bundle", e))?
        .len();
    if len == 0 {
        return Ok(Tail {
            entries: 0,
            previous: String::new(),
            offset: 0,
            checkpoint: Vec::new(),
        });
    }
    let offset = last_line_start(file, len)?;
    let mut checkpoint = Vec::new();
    file.seek(SeekFrom::Start(offset))
        .and_then(|_| file.read_to_end(&mut checkpoint))
        .map_err(|e| io_error("reading the bundle", e))?;
    let line = checkpoint.strip_suffix(b"\n").ok_or_else(|| {
        AttestError::Incomplete(
            "the bundle does not end with a whole line: it was cut short".into(),
        )
    })?;
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(line) else {
        return Err(AttestError::Format(
            "the bundle's last line is not a JSON object".into(),
        ));
    };
    let signed: Option<Envelope> = fields
        .remove(SIGNED)
        .and_then(|v| serde_json::from_value(v).ok());
    let not_ours = || {
        AttestError::Incomplete(
            "the bundle does not end with this key's checkpoint: it was cut short, changed, or signed by another key".into(),
        )
    };
    let signed = signed.ok_or_else(not_ours)?;
    let (last_line, stated): (String, CheckpointPredicate) =
        statement::open(&signed, &key.public(), LINE_SUBJECT, BUNDLE_CHECKPOINT)
            .map_err(|_| not_ours())?;
    let is_checkpoint = fields.get("kind").and_then(Value::as_str) == Some(KIND_CHECKPOINT);
    let entries = fields.get("entries").and_then(Value::as_u64);
    let line_number = fields.get("line").and_then(Value::as_u64);
    if !is_checkpoint
        || entries != Some(stated.entries)
        || line_number != Some(stated.line)
        || stated.line != stated.entries + 1
    {
        return Err(not_ours());
    }
    // The line before the checkpoint must be the one it closes: a file
    // that ends with one of this key's checkpoints after anything else (a
    // copied checkpoint, lines of another bundle) is not extended.
    if offset == 0 || last_line_sha256(file, offset)? != last_line {
        return Err(not_ours());
    }
    Ok(Tail {
        entries: stated.entries,
        previous: last_line,
        offset,
        checkpoint,
    })
}

/// The digest of the line that ends (with its newline) at `end`.
fn last_line_sha256(file: &mut File, end: u64) -> Result<String, AttestError> {
    let start = last_line_start(file, end)?;
    let mut line = vec![0u8; (end - 1 - start) as usize];
    file.seek(SeekFrom::Start(start))
        .and_then(|_| file.read_exact(&mut line))
        .map_err(|e| io_error("reading the bundle", e))?;
    Ok(sha256_hex(&line))
}

/// Where the file's last line starts (it ends with a newline).
fn last_line_start(file: &mut File, len: u64) -> Result<u64, AttestError> {
    const CHUNK: u64 = 64 * 1024;
    // The last byte is the line's own newline; search before it.
    let mut end = len - 1;
    let mut buf = vec![0u8; CHUNK as usize];
    while end > 0 {
        let start = end.saturating_sub(CHUNK);
        let n = (end - start) as usize;
        file.seek(SeekFrom::Start(start))
            .and_then(|_| file.read_exact(&mut buf[..n]))
            .map_err(|e| io_error("reading the bundle", e))?;
        if let Some(at) = buf[..n].iter().rposition(|b| *b == b'\n') {
            return Ok(start + at as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// An append that did not happen: why, and whether the file is as it was.
struct Unwritten {
    error: AttestError,
    restored: bool,
}

/// Writes `added` in place of the checkpoint (and syncs, if asked); on
/// failure puts the old checkpoint back, so the bundle is as it was.
fn replace_tail(file: &mut File, tail: &Tail, added: &[u8], sync: bool) -> Result<(), Unwritten> {
    let written = file
        .seek(SeekFrom::Start(tail.offset))
        .and_then(|_| file.write_all(added))
        .and_then(|()| file.set_len(tail.offset + added.len() as u64))
        .and_then(|()| if sync { file.sync_data() } else { Ok(()) });
    let Err(e) = written else {
        return Ok(());
    };
    let restored = file
        .set_len(tail.offset)
        .and_then(|()| file.seek(SeekFrom::Start(tail.offset)))
        .and_then(|_| file.write_all(&tail.checkpoint))
        .and_then(|()| file.sync_data());
    let what = match &restored {
        Ok(()) => "appending to the bundle (it is as it was)".to_string(),
        Err(r) => format!("appending to the bundle, and putting it back ({r})"),
    };
    Err(Unwritten {
        error: io_error(&what, e),
        restored: restored.is_ok(),
    })
}

/// Opens (or creates, owner-only) the bundle for an append. A bundle others
/// may read or write is refused unless the caller asked for a shared one;
/// a symlink is never followed.
fn open_for_append(path: &Path, sharing: Sharing) -> Result<File, AttestError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io_error(&format!("opening {}", path.display()), e))?;
    let meta = file
        .metadata()
        .map_err(|e| io_error(&format!("reading {}", path.display()), e))?;
    if !meta.file_type().is_file() {
        return Err(AttestError::Format(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    if meta.uid() != crate::dirs::euid() && sharing == Sharing::Private {
        return Err(AttestError::Key(format!(
            "{} belongs to another user; use a file of your own, or ask for a shared bundle",
            path.display()
        )));
    }
    if meta.mode() & 0o077 != 0 && sharing == Sharing::Private {
        return Err(AttestError::Key(format!(
            "{} may be read or written by others (mode {:o}); use a private file, or ask for a shared bundle",
            path.display(),
            meta.mode() & 0o777
        )));
    }
    Ok(file)
}
