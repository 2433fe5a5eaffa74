//! A bundle's end, as a signer reads it: the checkpoint it will append
//! after, checked with its own key, and the repair of an end a crash tore.
//!
//! Only the last lines are read, so opening a bundle costs the same at any
//! length.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde_json::Value;

use super::{
    CheckpointPredicate, KIND_CHECKPOINT, LINE_SUBJECT, SIGNED, Sharing, io_error, sha256_hex,
};
use crate::attest::AttestError;
use crate::attest::dsse::Envelope;
use crate::attest::keys::{SigningKey, VerifyingKey};
use crate::attest::statement::{self, BUNDLE_CHECKPOINT};

/// Where the next run goes.
pub(super) struct Tail {
    /// Lines in the bundle (runs and checkpoints).
    pub(super) lines: u64,
    /// Runs in the bundle.
    pub(super) entries: u64,
    /// Digest of the last line, the checkpoint (empty for a new bundle).
    pub(super) previous: String,
    /// Sessions the last checkpoint says were left open.
    pub(super) open_sessions: u64,
    /// The file's length: where the next line starts.
    pub(super) len: u64,
}

/// The bundle's end, checked: it must close with a checkpoint signed by
/// `key` that closes the line before it. A bundle someone else closed, one
/// spliced onto a copied checkpoint, or one cut short is not extended.
pub(super) fn read_tail(file: &mut File, key: &SigningKey) -> Result<Tail, AttestError> {
    let len = file
        .metadata()
        .map_err(|e| io_error("reading the bundle", e))?
        .len();
    if len == 0 {
        return Ok(Tail {
            lines: 0,
            entries: 0,
            previous: String::new(),
            open_sessions: 0,
            len: 0,
        });
    }
    match checkpoint_ending_at(file, len, &key.public())? {
        Some((stated, previous)) => Ok(Tail {
            lines: stated.line,
            entries: stated.entries,
            previous,
            open_sessions: stated.open_sessions,
            len,
        }),
        None => Err(AttestError::Incomplete(
            "the bundle does not end with this key's checkpoint: an append cut short by a crash (`plimsoll attest repair` cuts it off), a change, or another key's bundle".into(),
        )),
    }
}

/// What a repair did.
#[derive(Debug, PartialEq, Eq)]
pub struct Repaired {
    /// Bytes cut off the end (0: the bundle was whole).
    pub removed: u64,
    /// Runs the bundle holds after it.
    pub entries: u64,
}

/// Cuts off the end of a bundle that one append left torn: whatever follows
/// the last checkpoint `key` signed, if that is no more than one append
/// writes (a run line and a checkpoint line, the last of them possibly
/// partial). Anything more is not a torn append and is left alone. The run
/// cut off was never reported recorded: its append had not finished.
pub fn repair(path: &Path, key: &SigningKey, sharing: Sharing) -> Result<Repaired, AttestError> {
    let mut file = super::file::open_for_append(path, sharing)?;
    file.lock().map_err(|e| io_error("locking the bundle", e))?;
    let len = file
        .metadata()
        .map_err(|e| io_error("reading the bundle", e))?
        .len();
    let public = key.public();
    // The end of each of the last few whole lines, newest first; a torn
    // append leaves at most two newlines after the checkpoint before it.
    let mut end = whole_lines_end(&mut file, len)?;
    for _ in 0..3 {
        if end == 0 {
            break;
        }
        if let Some((stated, _)) = checkpoint_ending_at(&mut file, end, &public)? {
            if end != len {
                file.set_len(end)
                    .and_then(|()| file.sync_data())
                    .map_err(|e| io_error("cutting the bundle back", e))?;
            }
            return Ok(Repaired {
                removed: len - end,
                entries: stated.entries,
            });
        }
        end = line_start(&mut file, end)?;
    }
    Err(AttestError::Incomplete(
        "no checkpoint of this key's within one append of the bundle's end: not a torn append, left as it is".into(),
    ))
}

/// The checkpoint line ending (with its newline) at `end`, if it is one
/// `key` signed that closes the line before it: what it states, and the
/// digest of the checkpoint line itself.
fn checkpoint_ending_at(
    file: &mut File,
    end: u64,
    key: &VerifyingKey,
) -> Result<Option<(CheckpointPredicate, String)>, AttestError> {
    let start = line_start(file, end)?;
    let Some(line) = read_line(file, start, end)? else {
        return Ok(None);
    };
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(&line) else {
        return Ok(None);
    };
    let Some(signed) = fields
        .remove(SIGNED)
        .and_then(|v| serde_json::from_value::<Envelope>(v).ok())
    else {
        return Ok(None);
    };
    let Ok((closes, stated)) =
        statement::open::<CheckpointPredicate>(&signed, key, LINE_SUBJECT, BUNDLE_CHECKPOINT)
    else {
        return Ok(None);
    };
    let is_checkpoint = fields.get("kind").and_then(Value::as_str) == Some(KIND_CHECKPOINT);
    if !is_checkpoint
        || fields.get("entries").and_then(Value::as_u64) != Some(stated.entries)
        || fields.get("line").and_then(Value::as_u64) != Some(stated.line)
    {
        return Ok(None);
    }
    // The line before must be the one it closes: a file that ends with one
    // of this key's checkpoints after anything else (a copied checkpoint,
    // lines of another bundle) is not this key's bundle.
    if start == 0 {
        return Ok(None);
    }
    let before = line_start(file, start)?;
    match read_line(file, before, start)? {
        Some(prev) if sha256_hex(&prev) == closes => Ok(Some((stated, sha256_hex(&line)))),
        _ => Ok(None),
    }
}

/// The bytes of the line in `start..end` without its newline; None if it
/// does not end with one.
fn read_line(file: &mut File, start: u64, end: u64) -> Result<Option<Vec<u8>>, AttestError> {
    let mut line = vec![0u8; (end - start) as usize];
    file.seek(SeekFrom::Start(start))
        .and_then(|_| file.read_exact(&mut line))
        .map_err(|e| io_error("reading the bundle", e))?;
    Ok(line.strip_suffix(b"\n").map(<[u8]>::to_vec))
}

/// Where the file's whole lines end: after its last newline at or before
/// `len` (0 if none).
fn whole_lines_end(file: &mut File, len: u64) -> Result<u64, AttestError> {
    if len == 0 {
        return Ok(0);
    }
    let mut last = [0u8; 1];
    file.seek(SeekFrom::Start(len - 1))
        .and_then(|_| file.read_exact(&mut last))
        .map_err(|e| io_error("reading the bundle", e))?;
    if last[0] == b'\n' {
        return Ok(len);
    }
    // A partial line at the end: its start is where the whole lines end.
    newline_before(file, len)
}

/// Where the line ending (with its newline) at `end` starts.
fn line_start(file: &mut File, end: u64) -> Result<u64, AttestError> {
    // The byte at end - 1 is the line's own newline; search before it.
    newline_before(file, end - 1)
}

/// Just past the last newline before `end`, or 0.
fn newline_before(file: &mut File, mut end: u64) -> Result<u64, AttestError> {
    const CHUNK: u64 = 64 * 1024;
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
