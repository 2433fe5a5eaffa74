//! What one replica signs with the shared secret: a forwarded session call
//! (so the replica holding the session can trust the caller it names
//! without the caller's token ever leaving the replica that checked it),
//! and a session's holder record in the store (so whoever can write the
//! store cannot send a session's calls to an address of their choosing).

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// What a forwarded call's tag covers: to which replica (`holder`, its
/// URL), which procedure, for whom, when, with which nonce (two calls
/// alike in everything else, forwarded in the same millisecond, are still
/// two calls, not a replay), and exactly which body (its SHA-256, hex,
/// sent beside the tag so the tag can be checked before the body is read).
pub struct Call<'a> {
    pub holder: &'a str,
    pub procedure: &'a str,
    pub caller: &'a str,
    pub at_ms: u64,
    pub nonce: &'a str,
    pub body_sha256: &'a str,
}

/// The shared secret, read once at start.
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Fields joined with a separator none of them can hold.
fn mac(secret: &Secret, parts: &[&[u8]]) -> HmacSha256 {
    // HMAC takes a key of any length; new_from_slice cannot fail for it.
    let mut m = <HmacSha256 as Mac>::new_from_slice(&secret.0).unwrap_or_else(|_| unreachable!());
    for p in parts {
        m.update(&(p.len() as u64).to_be_bytes());
        m.update(p);
    }
    m
}

/// A tag as written: 64 lowercase hex digits, decoded.
fn canonical(tag: &str) -> Option<[u8; 32]> {
    if tag.len() != 64
        || !tag
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(tag, &mut out).ok()?;
    Some(out)
}

impl Secret {
    pub const MIN_CHARS: usize = 32;

    pub fn new(text: &str) -> Result<Secret, String> {
        let t = text.trim();
        if t.len() < Secret::MIN_CHARS {
            return Err(format!(
                "the replica secret must be at least {} characters",
                Secret::MIN_CHARS
            ));
        }
        Ok(Secret(t.as_bytes().to_vec()))
    }

    /// The MAC over a forwarded call's fields, as signed and as checked.
    fn call_mac(&self, c: &Call<'_>) -> HmacSha256 {
        let at = c.at_ms.to_string();
        mac(
            self,
            &[
                b"call",
                c.holder.as_bytes(),
                c.procedure.as_bytes(),
                c.caller.as_bytes(),
                at.as_bytes(),
                c.nonce.as_bytes(),
                c.body_sha256.as_bytes(),
            ],
        )
    }

    /// The tag of a forwarded call.
    pub fn sign_call(&self, c: &Call<'_>) -> String {
        hex::encode(self.call_mac(c).finalize().into_bytes())
    }

    /// Checks a forwarded call's tag in constant time; the tag must be
    /// exactly what `sign_call` writes (64 lowercase hex digits), so no
    /// second spelling of one tag exists. Returns the tag's bytes.
    pub fn verify_call(&self, c: &Call<'_>, tag: &str) -> Option<[u8; 32]> {
        let tag = canonical(tag)?;
        self.call_mac(c).verify_slice(&tag).ok().map(|()| tag)
    }

    /// A holder record: the session's fingerprint and the replica's URL,
    /// stored as `url` and this tag.
    pub fn sign_holder(&self, fingerprint: &str, url: &str) -> String {
        hex::encode(
            mac(self, &[b"holder", fingerprint.as_bytes(), url.as_bytes()])
                .finalize()
                .into_bytes(),
        )
    }

    pub fn verify_holder(&self, fingerprint: &str, url: &str, tag: &str) -> bool {
        let Some(tag) = canonical(tag) else {
            return false;
        };
        mac(self, &[b"holder", fingerprint.as_bytes(), url.as_bytes()])
            .verify_slice(&tag)
            .is_ok()
    }

    /// A replica's place among the holders of a caller's owner's sessions:
    /// the caller, the owner and the replica's URL, stored as `url` and
    /// this tag.
    pub fn sign_owner_holder(&self, caller: &str, owner: &str, url: &str) -> String {
        hex::encode(self.owner_mac(caller, owner, url).finalize().into_bytes())
    }

    pub fn verify_owner_holder(&self, caller: &str, owner: &str, url: &str, tag: &str) -> bool {
        canonical(tag).is_some_and(|t| self.owner_mac(caller, owner, url).verify_slice(&t).is_ok())
    }

    /// How the store names a caller's owner: a digest keyed with the
    /// secret, so reading the store is not enough to confirm a guessed
    /// owner name (16 bytes, in hex).
    pub fn owner_digest(&self, caller: &str, owner: &str) -> String {
        let parts: [&[u8]; 3] = [b"owner-name", caller.as_bytes(), owner.as_bytes()];
        hex::encode(&mac(self, &parts).finalize().into_bytes()[..16])
    }

    /// How the store names a forwarded call's nonce once the holder at
    /// `holder` (its URL) has taken the call: a digest keyed with the
    /// secret, so the store never holds a value that travels on the wire,
    /// and whoever can write the store but not sign cannot work out the
    /// key of a nonce they saw go by and plant it ahead of the call to
    /// have it refused as a replay (16 bytes, in hex).
    pub fn nonce_digest(&self, holder: &str, nonce: &str) -> String {
        let parts: [&[u8]; 3] = [b"forwarded-nonce", holder.as_bytes(), nonce.as_bytes()];
        hex::encode(&mac(self, &parts).finalize().into_bytes()[..16])
    }

    fn owner_mac(&self, caller: &str, owner: &str, url: &str) -> HmacSha256 {
        let parts: [&[u8]; 4] = [
            b"owner",
            caller.as_bytes(),
            owner.as_bytes(),
            url.as_bytes(),
        ];
        mac(self, &parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(
        holder: &'a str,
        procedure: &'a str,
        caller: &'a str,
        at_ms: u64,
        nonce: &'a str,
        body_sha256: &'a str,
    ) -> Call<'a> {
        Call {
            holder,
            procedure,
            caller,
            at_ms,
            nonce,
            body_sha256,
        }
    }

    #[test]
    fn a_tag_binds_every_field_and_the_secret() {
        let s = Secret::new(&"s".repeat(40)).expect("secret");
        let other = Secret::new(&"t".repeat(40)).expect("secret");
        let h = "http://127.0.0.1:1";
        let tag = s.sign_call(&call(h, "SessionRun", "alice", 5, "n1", "d1"));
        assert!(
            s.verify_call(&call(h, "SessionRun", "alice", 5, "n1", "d1"), &tag)
                .is_some()
        );
        assert!(
            other
                .verify_call(&call(h, "SessionRun", "alice", 5, "n1", "d1"), &tag)
                .is_none()
        );
        assert!(
            s.verify_call(
                &call("http://127.0.0.1:2", "SessionRun", "alice", 5, "n1", "d1"),
                &tag
            )
            .is_none()
        );
        assert!(
            s.verify_call(&call(h, "CloseSession", "alice", 5, "n1", "d1"), &tag)
                .is_none()
        );
        assert!(
            s.verify_call(&call(h, "SessionRun", "bob", 5, "n1", "d1"), &tag)
                .is_none()
        );
        assert!(
            s.verify_call(&call(h, "SessionRun", "alice", 6, "n1", "d1"), &tag)
                .is_none()
        );
        assert!(
            s.verify_call(&call(h, "SessionRun", "alice", 5, "n1", "d2"), &tag)
                .is_none()
        );
        assert!(
            s.verify_call(&call(h, "SessionRun", "alice", 5, "n2", "d1"), &tag)
                .is_none()
        );
        // One tag, one spelling.
        let upper = tag.to_ascii_uppercase();
        assert!(
            s.verify_call(&call(h, "SessionRun", "alice", 5, "n1", "d1"), &upper)
                .is_none()
        );
        assert!(
            s.verify_call(&call(h, "SessionRun", "alice", 5, "n1", "d1"), "zz")
                .is_none()
        );
        let r = s.sign_holder("fp", h);
        assert!(s.verify_holder("fp", h, &r));
        assert!(!s.verify_holder("fp", "http://127.0.0.1:2", &r));
        assert!(!other.verify_holder("fp", h, &r));
        // An owner's holder binds the caller and the owner apart: the same
        // characters split differently are another record.
        let o = s.sign_owner_holder("a:b", "c", h);
        assert!(s.verify_owner_holder("a:b", "c", h, &o));
        assert!(!s.verify_owner_holder("a", "b:c", h, &o));
        assert!(!s.verify_owner_holder("a:b", "c", "http://127.0.0.1:2", &o));
        assert!(!other.verify_owner_holder("a:b", "c", h, &o));
        assert!(!s.verify_holder("a:b", h, &o), "not a session's record");
        let named = s.owner_digest("alice", "ws-1");
        assert_eq!(named.len(), 32);
        assert_ne!(named, other.owner_digest("alice", "ws-1"));
        assert_ne!(named, s.owner_digest("bob", "ws-1"));
        // A nonce's name in the store: bound to the holder and the secret,
        // and not the nonce itself.
        let n = "0123456789abcdef0123456789abcdef";
        let seen = s.nonce_digest(h, n);
        assert_eq!(seen.len(), 32);
        assert_ne!(seen, n);
        assert_eq!(seen, s.nonce_digest(h, n));
        assert_ne!(seen, s.nonce_digest("http://127.0.0.1:2", n));
        assert_ne!(seen, other.nonce_digest(h, n));
        assert_ne!(seen, s.owner_digest(h, n), "not an owner's name");
        assert!(Secret::new("short").is_err());
        assert!(!format!("{s:?}").contains("sss"));
    }
}
