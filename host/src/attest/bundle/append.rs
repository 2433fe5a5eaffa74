//! Appending a run: its record checked, signed, and written in place of
//! the checkpoint with a new checkpoint after it, the file put back as it
//! was if the write fails.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use serde_json::Value;

use super::{
    KIND_CHECKPOINT, KIND_RUN, LINE_SUBJECT, LinkPredicate, RECORD_SUBJECT, RecordPredicate,
    Sharing, canonical, io_error, object, sha256_hex, signed_line, to_value,
};
use crate::attest::AttestError;
use crate::attest::check::{check_run, parse_run_request};
use crate::attest::dsse::Envelope;
use crate::attest::keys::SigningKey;
use crate::attest::statement::{self, BUNDLE_LINK, RUN_RECORD};
use crate::wire::RunResponse;

/// Appends one run to the bundle at `path` (creating it, owner-only, if it
/// does not exist), signed with `key`. The record must check against the
/// request first: a record that does not is never signed. If anything
/// fails after the file was touched, the file is put back as it was.
pub fn append_run(
    path: &Path,
    key: &SigningKey,
    sharing: Sharing,
    request: &Value,
    response: &Value,
) -> Result<(), AttestError> {
    let sent = canonical(request);
    let parsed = parse_run_request(&sent)?;
    let answer: RunResponse = serde_json::from_value(response.clone())
        .map_err(|e| AttestError::Format(format!("the answer is not a Run answer: {e}")))?;
    check_run(&parsed, &answer)?;
    let record = statement::sign(
        key,
        RECORD_SUBJECT,
        &answer.record.record_sha256,
        RUN_RECORD,
        &RecordPredicate {
            record: response.get("record").cloned().unwrap_or(Value::Null),
        },
    )?;

    let mut file = open_for_append(path, sharing)?;
    file.lock().map_err(|e| io_error("locking the bundle", e))?;
    let tail = read_tail(&mut file, key)?;
    let entry = signed_line(
        key,
        object(&[
            ("kind", Value::from(KIND_RUN)),
            ("line", Value::from(tail.entries + 1)),
            ("procedure", Value::from("Run")),
            ("request", request.clone()),
            ("response", response.clone()),
            ("record", to_value(&record)),
        ]),
        tail.entries + 1,
        &tail.previous,
    )?;
    let checkpoint = signed_line(
        key,
        object(&[
            ("kind", Value::from(KIND_CHECKPOINT)),
            ("line", Value::from(tail.entries + 2)),
            ("entries", Value::from(tail.entries + 1)),
        ]),
        tail.entries + 2,
        &sha256_hex(&entry),
    )?;
    let mut added = entry;
    added.push(b'\n');
    added.extend_from_slice(&checkpoint);
    added.push(b'\n');
    replace_tail(&mut file, &tail, &added)
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
    let link: Envelope = fields
        .remove("link")
        .and_then(|v| serde_json::from_value(v).ok())
        .ok_or_else(|| AttestError::Format("the bundle's last line has no link".into()))?;
    let (digest, stated): (String, LinkPredicate) =
        statement::open(&link, &key.public(), LINE_SUBJECT, BUNDLE_LINK)?;
    let entries = fields.get("entries").and_then(Value::as_u64);
    let is_checkpoint = fields.get("kind").and_then(Value::as_str) == Some(KIND_CHECKPOINT);
    match entries {
        Some(entries)
            if is_checkpoint
                && digest == sha256_hex(&canonical(&Value::Object(fields.clone())))
                && stated.line == entries + 1 =>
        {
            Ok(Tail {
                entries,
                previous: stated.previous_line_sha256,
                offset,
                checkpoint,
            })
        }
        _ => Err(AttestError::Incomplete(
            "the bundle does not end with this key's checkpoint: it was cut short, changed, or signed by another key".into(),
        )),
    }
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

/// Writes `added` in place of the checkpoint and syncs; on failure puts the
/// old checkpoint back, so the bundle is as it was.
fn replace_tail(file: &mut File, tail: &Tail, added: &[u8]) -> Result<(), AttestError> {
    let written = file
        .seek(SeekFrom::Start(tail.offset))
        .and_then(|_| file.write_all(added))
        .and_then(|()| file.set_len(tail.offset + added.len() as u64))
        .and_then(|()| file.sync_data());
    match written {
        Ok(()) => Ok(()),
        Err(e) => {
            let restored = file
                .set_len(tail.offset)
                .and_then(|()| file.seek(SeekFrom::Start(tail.offset)))
                .and_then(|_| file.write_all(&tail.checkpoint))
                .and_then(|()| file.sync_data());
            let what = match restored {
                Ok(()) => "appending to the bundle (it is as it was)".to_string(),
                Err(r) => format!("appending to the bundle, and putting it back ({r})"),
            };
            Err(io_error(&what, e))
        }
    }
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
    if meta.mode() & 0o077 != 0 && sharing == Sharing::Private {
        return Err(AttestError::Key(format!(
            "{} may be read or written by others (mode {:o}); use a private file, or ask for a shared bundle",
            path.display(),
            meta.mode() & 0o777
        )));
    }
    Ok(file)
}
