//! What the generator says about an operation it cannot emit, and how text
//! from the document appears in that message.

use crate::text::sanitize;

/// Why an operation is not emitted.
pub(super) enum Refusal {
    /// The operation is left out, with a warning.
    Skip(String),
    /// Nothing is written.
    Fatal(String),
}

/// Text from the document as a message shows it.
pub(super) fn shown(s: &str) -> String {
    sanitize(s, 200)
}
