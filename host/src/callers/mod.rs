//! Callers: who is asking, proven by a bearer token.
//!
//! Three modes, chosen at start in this order:
//! - `PLIMSOLL_CLIENTS_FILE`: one entry per caller, each with the SHA-256 of
//!   its token, its scopes and an optional daily allowance of paid seconds;
//! - `PLIMSOLL_TOKEN`: one shared token (caller `static`);
//! - neither: open development mode (caller `anonymous`), which a provider
//!   that runs code refuses unless `PLIMSOLL_INSECURE=1`.
//!
//! Tokens are never stored: the file holds digests, and a presented token is
//! hashed and compared with every digest in constant time, so neither the
//! match nor its position shows in the timing. The file is read once at
//! start; a change needs a restart.

pub mod settings;

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The scope a caller needs to run code.
pub const RUN_SCOPE: &str = "code:run";
/// Shortest token accepted anywhere.
pub const MIN_TOKEN_CHARS: usize = 32;
const MAX_TOKEN_CHARS: usize = 4096;

/// A caller, once its token checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub id: String,
    pub scopes: Vec<String>,
    /// Paid seconds this caller may use per UTC day on a metered provider.
    pub paid_seconds_per_day: Option<u64>,
}

impl Caller {
    pub fn may_run(&self) -> bool {
        self.scopes.iter().any(|s| s == RUN_SCOPE)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub id: String,
    pub token_sha256: String,
    pub scopes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paid_seconds_per_day: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClientsFile {
    pub clients: Vec<Entry>,
}

impl ClientsFile {
    /// Strict parse: unknown fields, trailing data, a missing or repeated
    /// id, a malformed or shared digest, and bad scopes are all errors.
    pub fn parse(text: &str) -> Result<ClientsFile, String> {
        let mut de = serde_json::Deserializer::from_str(text);
        let mut file =
            ClientsFile::deserialize(&mut de).map_err(|e| format!("clients file: {e}"))?;
        de.end()
            .map_err(|_| "clients file: trailing data after the JSON document".to_string())?;
        file.normalise()?;
        Ok(file)
    }

    pub fn normalise(&mut self) -> Result<(), String> {
        let mut ids = std::collections::HashSet::new();
        let mut digests = std::collections::HashSet::new();
        for e in &mut self.clients {
            e.id = e.id.trim().to_string();
            e.token_sha256 = e.token_sha256.to_ascii_lowercase();
            if !valid_id(&e.id) {
                return Err(format!(
                    "clients file: id {:?} must be 1-128 of letters, digits, '.', '_', '-', '@' ('*' is reserved)",
                    e.id
                ));
            }
            if !ids.insert(e.id.clone()) {
                return Err(format!("clients file: id {:?} appears twice", e.id));
            }
            if e.token_sha256.len() != 64 || !e.token_sha256.bytes().all(|b| b.is_ascii_hexdigit())
            {
                return Err(format!(
                    "clients file: {}'s token_sha256 is not 64 hex digits",
                    e.id
                ));
            }
            if !digests.insert(e.token_sha256.clone()) {
                return Err(format!(
                    "clients file: {} shares a token with another caller",
                    e.id
                ));
            }
            let mut seen = std::collections::HashSet::new();
            for s in &e.scopes {
                if s.is_empty() || s.chars().any(char::is_whitespace) || !seen.insert(s) {
                    return Err(format!(
                        "clients file: {} has an empty, spaced or repeated scope",
                        e.id
                    ));
                }
            }
        }
        Ok(())
    }

    /// Reads the file through a handle on its directory; a symlink or
    /// anything but a regular file is refused.
    pub fn read(path: &Path) -> Result<ClientsFile, String> {
        let bytes = crate::dirs::parent_of(path)
            .and_then(|(dir, name)| crate::dirs::read_nofollow(&dir, &name))
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| format!("reading {}: not UTF-8 text", path.display()))?;
        ClientsFile::parse(&text)
    }
}

fn valid_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id != "*"
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-@".contains(&b))
}

/// A token as callers send it: visible ASCII, at least 32 characters.
pub fn valid_token(t: &str) -> bool {
    (MIN_TOKEN_CHARS..=MAX_TOKEN_CHARS).contains(&t.len())
        && t.bytes().all(|b| b.is_ascii_graphic())
}

/// Lowercase hex SHA-256 of a token, as the clients file stores it.
pub fn fingerprint(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A fresh token: 32 random bytes, hex.
pub fn new_token() -> Result<String, String> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| format!("no randomness: {e}"))?;
    Ok(hex::encode(b))
}

/// Why a request was not authenticated. Never carries the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No bearer token, or a malformed header.
    Missing,
    /// A token that matches no caller.
    Unknown,
}

/// How the daemon checks callers.
pub enum Verifier {
    Clients(Vec<(Arc<Caller>, [u8; 32])>),
    Shared(Arc<Caller>, [u8; 32]),
    Open(Arc<Caller>),
}

impl Verifier {
    pub fn clients(file: &ClientsFile) -> Verifier {
        Verifier::Clients(
            file.clients
                .iter()
                .map(|e| {
                    let mut digest = [0u8; 32];
                    // Validated as 64 hex digits by `normalise`.
                    let _ = hex::decode_to_slice(&e.token_sha256, &mut digest);
                    (
                        Arc::new(Caller {
                            id: e.id.clone(),
                            scopes: e.scopes.clone(),
                            paid_seconds_per_day: e.paid_seconds_per_day,
                        }),
                        digest,
                    )
                })
                .collect(),
        )
    }

    pub fn shared(token: &str) -> Verifier {
        Verifier::Shared(
            Arc::new(Caller {
                id: "static".into(),
                scopes: vec![RUN_SCOPE.into()],
                paid_seconds_per_day: None,
            }),
            Sha256::digest(token.as_bytes()).into(),
        )
    }

    pub fn open() -> Verifier {
        Verifier::Open(Arc::new(Caller {
            id: crate::grants::ANONYMOUS.into(),
            scopes: vec![RUN_SCOPE.into()],
            paid_seconds_per_day: None,
        }))
    }

    /// The caller with this ID: for a call another replica forwards, whose
    /// token that replica checked (the same clients file on every
    /// replica).
    pub fn caller(&self, id: &str) -> Option<Arc<Caller>> {
        match self {
            Verifier::Clients(list) => list
                .iter()
                .find(|(c, _)| c.id == id)
                .map(|(c, _)| c.clone()),
            Verifier::Shared(c, _) | Verifier::Open(c) => (c.id == id).then(|| c.clone()),
        }
    }

    pub fn is_open(&self) -> bool {
        matches!(self, Verifier::Open(_))
    }

    pub fn mode(&self) -> &'static str {
        match self {
            Verifier::Clients(_) => "clients file",
            Verifier::Shared(..) => "shared token",
            Verifier::Open(_) => "open (no authentication)",
        }
    }

    /// The caller behind an `Authorization` header value.
    pub fn verify(&self, authorization: Option<&[u8]>) -> Result<Arc<Caller>, Refused> {
        if let Verifier::Open(c) = self {
            return Ok(c.clone());
        }
        let token = authorization
            .and_then(|v| v.strip_prefix(b"Bearer "))
            .and_then(|t| std::str::from_utf8(t).ok())
            .filter(|t| valid_token(t))
            .ok_or(Refused::Missing)?;
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let candidates: Vec<(&Arc<Caller>, &[u8; 32])> = match self {
            Verifier::Clients(list) => list.iter().map(|(c, d)| (c, d)).collect(),
            Verifier::Shared(c, d) => vec![(c, d)],
            Verifier::Open(_) => return Err(Refused::Unknown),
        };
        // Every digest is compared, whatever matched earlier.
        let mut found: Option<Arc<Caller>> = None;
        for (caller, digest) in candidates {
            if constant_time_eq(&presented, digest) {
                found = Some(caller.clone());
            }
        }
        found.ok_or(Refused::Unknown)
    }
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(token: &str) -> String {
        format!(
            r#"{{"clients": [{{"id": "alice", "token_sha256": "{}", "scopes": ["code:run"]}}, {{"id": "bob", "token_sha256": "{}", "scopes": ["read"]}}]}}"#,
            fingerprint(token),
            fingerprint("b".repeat(40).as_str())
        )
    }

    #[test]
    fn tokens_map_to_callers() {
        let token = "a".repeat(40);
        let v = Verifier::clients(&ClientsFile::parse(&file(&token)).expect("parses"));
        let bearer = format!("Bearer {token}");
        let c = v.verify(Some(bearer.as_bytes())).expect("alice");
        assert_eq!(c.id, "alice");
        assert!(c.may_run());
        let bob = format!("Bearer {}", "b".repeat(40));
        assert!(!v.verify(Some(bob.as_bytes())).expect("bob").may_run());
        assert_eq!(v.verify(None), Err(Refused::Missing));
        assert_eq!(v.verify(Some(b"Bearer short")), Err(Refused::Missing));
        assert_eq!(
            v.verify(Some(token.as_bytes())),
            Err(Refused::Missing),
            "no Bearer"
        );
        let wrong = format!("Bearer {}", "c".repeat(40));
        assert_eq!(v.verify(Some(wrong.as_bytes())), Err(Refused::Unknown));
    }

    #[test]
    fn bad_files_are_refused() {
        let good = file(&"a".repeat(40));
        let fp = fingerprint(&"a".repeat(40));
        for (name, text) in [
            ("unknown field", good.replacen("\"scopes\"", "\"scope\"", 1)),
            ("trailing", format!("{good} x")),
            ("dup id", good.replacen("\"bob\"", "\"alice\"", 1)),
            ("reserved id", good.replacen("\"bob\"", "\"*\"", 1)),
            ("short digest", good.replacen(&fp, "abc", 1)),
            (
                "shared digest",
                good.replacen(&fingerprint(&"b".repeat(40)), &fp, 1),
            ),
            ("spaced scope", good.replacen("\"read\"", "\"re ad\"", 1)),
            (
                "repeated scope",
                good.replacen("[\"read\"]", "[\"read\", \"read\"]", 1),
            ),
        ] {
            assert!(ClientsFile::parse(&text).is_err(), "{name} accepted");
        }
    }
}
