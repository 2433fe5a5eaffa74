//! Why signing or checking failed, in kinds a caller can act on: a file it
//! can fix, a key it must replace, or a bundle it must not trust.

use std::fmt;

#[derive(Debug)]
pub enum AttestError {
    /// A file could not be read or written.
    Io {
        what: String,
        source: std::io::Error,
    },
    /// A key that is not an Ed25519 key in the expected form, or a key file others may read.
    Key(String),
    /// A signature that does not verify, or none by the expected key.
    Signature(String),
    /// A bundle, envelope or statement not in the expected form.
    Format(String),
    /// A run record that does not check (digest mismatch, below the floor, broken chain).
    Record(String),
    /// Runs missing from a bundle, or a count that does not match.
    Incomplete(String),
}

impl fmt::Display for AttestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttestError::Io { what, source } => write!(f, "{what}: {source}"),
            AttestError::Key(msg) => write!(f, "key: {msg}"),
            AttestError::Signature(msg) => write!(f, "signature: {msg}"),
            AttestError::Format(msg) => write!(f, "format: {msg}"),
            AttestError::Record(msg) => write!(f, "record: {msg}"),
            AttestError::Incomplete(msg) => write!(f, "incomplete: {msg}"),
        }
    }
}

impl std::error::Error for AttestError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AttestError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
