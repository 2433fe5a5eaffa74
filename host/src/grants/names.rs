//! The names a grants file gives: profile names, and the JavaScript names
//! a client or an SDK method is installed under.

/// A profile's name: what callers send and audit lines show.
pub fn valid_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// A name a global or an SDK method can take: an identifier of at most 64
/// ASCII characters that is none of the runtime's own.
pub(crate) fn valid_js_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_' || b == b'$')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$')
        && s.len() <= 64
        // Names the runtime itself needs.
        && !matches!(
            s,
            "globalThis" | "console" | "Object" | "Function" | "Promise" | "JSON" | "Math" | "Error"
                | "process" | "require" | "module" | "exports" | "Array" | "String" | "Symbol"
        )
}
