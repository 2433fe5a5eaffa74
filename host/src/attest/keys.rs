//! Ed25519 keys for signed run records, in the PEM forms every tool reads:
//! the private key as PKCS#8 ("PRIVATE KEY"), the public key as
//! SubjectPublicKeyInfo ("PUBLIC KEY"), both per RFC 8410.
//!
//! A key is named by its key ID: the lowercase hex SHA-256 of the public
//! key's SubjectPublicKeyInfo DER. Anyone holding the public key file can
//! compute it, so an envelope's `keyid` can be matched without trusting the
//! envelope.
//!
//! These are files the operator names on the command line or in the
//! configuration, so plain `std::fs` paths are used, not a directory handle.

use std::fmt;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{PrivatePkcs8KeyDer, SubjectPublicKeyInfoDer};
use sha2::{Digest, Sha256};

use super::AttestError;
use crate::bounded_read::{Unread, read_regular};

/// The DER of an Ed25519 SubjectPublicKeyInfo up to the key itself (RFC 8410
/// sections 4 and 10.1): SEQUENCE (42 bytes) { SEQUENCE (5) { OID 1.3.101.112
/// }, BIT STRING (33 bytes, 0 unused bits) }. The 32 key bytes follow. The
/// algorithm has no parameters, so every Ed25519 public key shares this
/// prefix, and any other prefix is some other kind of key.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// The largest key file read. A PEM Ed25519 key is a few hundred bytes;
/// the limit only stops a wrong path (a log, an image) being read whole.
const KEY_FILE_LIMIT: u64 = 64 * 1024;

/// A private key that signs. Its bytes never leave it: there is no accessor
/// and its `Debug` shows only the key ID.
pub struct SigningKey {
    pair: Ed25519KeyPair,
    public: VerifyingKey,
}

impl SigningKey {
    /// Reads a PKCS#8 PEM private key file; refuses one that group or others
    /// may read or write (mode & 0o077 != 0), and one that is not a regular
    /// file.
    pub fn load(path: &Path) -> Result<SigningKey, AttestError> {
        let (pem, mode) = read_key_file(path, "private key")?;
        if mode & 0o077 != 0 {
            return Err(AttestError::Key(format!(
                "private key {} may be read or written by group or others (mode {:04o}); \
                 it must be 0600 or stricter",
                path.display(),
                mode & 0o7777
            )));
        }
        SigningKey::from_pkcs8_pem(&pem)
    }

    /// Parses a PEM "PRIVATE KEY" (PKCS#8) holding an Ed25519 key.
    pub fn from_pkcs8_pem(pem: &[u8]) -> Result<SigningKey, AttestError> {
        let der = PrivatePkcs8KeyDer::from_pem_slice(pem).map_err(|e| {
            AttestError::Key(format!("not a PEM \"PRIVATE KEY\" (PKCS#8) document: {e}"))
        })?;
        // `from_pkcs8_maybe_unchecked` rather than `from_pkcs8`: the only
        // difference is that it also takes PKCS#8 v1 documents, which hold
        // no public key, and `openssl genpkey -algorithm ed25519` writes v1.
        // For a v1 key the public key is derived from the seed, so there is
        // no stored copy that could disagree with it; a v2 document (ours)
        // is still checked for a public key that matches the private one.
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der())
            .map_err(|e| AttestError::Key(format!("not an Ed25519 PKCS#8 private key: {e}")))?;
        Ok(SigningKey::from_pair(pair))
    }

    fn from_pair(pair: Ed25519KeyPair) -> SigningKey {
        let mut raw = [0u8; 32];
        raw.copy_from_slice(pair.public_key().as_ref());
        SigningKey {
            public: VerifyingKey::from_raw(raw),
            pair,
        }
    }

    pub fn key_id(&self) -> &str {
        self.public.key_id()
    }

    pub fn public(&self) -> VerifyingKey {
        self.public.clone()
    }

    /// An Ed25519 signature (64 bytes) over `message`.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.pair.sign(message).as_ref().to_vec()
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("key_id", &self.public.key_id)
            .finish_non_exhaustive()
    }
}

/// A public key that checks signatures, with its key ID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyingKey {
    raw: [u8; 32],
    key_id: String,
}

impl VerifyingKey {
    /// Reads a PEM "PUBLIC KEY" (SubjectPublicKeyInfo) file holding an
    /// Ed25519 key.
    pub fn load(path: &Path) -> Result<VerifyingKey, AttestError> {
        let (pem, _mode) = read_key_file(path, "public key")?;
        VerifyingKey::from_spki_pem(&pem)
    }

    /// Parses a PEM "PUBLIC KEY"; refuses any key but Ed25519.
    pub fn from_spki_pem(pem: &[u8]) -> Result<VerifyingKey, AttestError> {
        let spki = SubjectPublicKeyInfoDer::from_pem_slice(pem).map_err(|e| {
            AttestError::Key(format!(
                "not a PEM \"PUBLIC KEY\" (SubjectPublicKeyInfo) document: {e}"
            ))
        })?;
        let der: &[u8] = &spki;
        let not_ed25519 = || {
            AttestError::Key(
                "the public key is not an Ed25519 SubjectPublicKeyInfo (RFC 8410)".to_string(),
            )
        };
        let rest = der
            .strip_prefix(&ED25519_SPKI_PREFIX[..])
            .ok_or_else(not_ed25519)?;
        let raw = <[u8; 32]>::try_from(rest).map_err(|_| not_ed25519())?;
        Ok(VerifyingKey::from_raw(raw))
    }

    /// The key from its 32 raw bytes (RFC 8032's encoding of the point).
    pub fn from_raw(raw: [u8; 32]) -> VerifyingKey {
        let key_id = hex::encode(Sha256::digest(spki_der_of(&raw)));
        VerifyingKey { raw, key_id }
    }

    /// Lowercase hex SHA-256 of `spki_der()`.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    pub fn raw(&self) -> &[u8; 32] {
        &self.raw
    }

    /// The SubjectPublicKeyInfo DER (44 bytes) the key ID is computed over.
    pub fn spki_der(&self) -> Vec<u8> {
        spki_der_of(&self.raw)
    }

    /// The PEM "PUBLIC KEY" form, as `generate` writes it to PREFIX.pub.
    pub fn to_spki_pem(&self) -> String {
        pem_encode("PUBLIC KEY", &self.spki_der())
    }

    /// Whether `signature` is this key's Ed25519 signature over `message`.
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, &self.raw[..])
            .verify(message, signature)
            .is_ok()
    }
}

/// Writes PREFIX.key (mode 0600, created with O_EXCL via
/// OpenOptions::create_new + std::os::unix::fs::OpenOptionsExt::mode) and
/// PREFIX.pub (0644, also create_new), fsyncs both; if the .pub cannot be
/// written, removes the .key it just wrote. Never overwrites an existing
/// file (an existing file is an Io error naming it). Returns the public key.
///
/// The suffixes are appended to the prefix as given ("keys/prod.v2" gives
/// "keys/prod.v2.key"), never put in place of an extension.
pub fn generate(prefix: &Path) -> Result<VerifyingKey, AttestError> {
    let key_path = with_suffix(prefix, ".key");
    let pub_path = with_suffix(prefix, ".pub");
    let rng = SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| {
        AttestError::Key("the system's random source failed while generating a key".to_string())
    })?;
    // Parse back what will be written, so the file holds a key `load` takes.
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
        .map_err(|e| AttestError::Key(format!("a freshly generated key does not parse: {e}")))?;
    let public = SigningKey::from_pair(pair).public();
    write_new(
        &key_path,
        pem_encode("PRIVATE KEY", pkcs8.as_ref()).as_bytes(),
        0o600,
        "private key",
    )?;
    if let Err(e) = write_new(
        &pub_path,
        public.to_spki_pem().as_bytes(),
        0o644,
        "public key",
    ) {
        // A private key without its public half is of no use to anyone who
        // checks; leave nothing behind rather than half a pair.
        let _ = fs::remove_file(&key_path);
        return Err(e);
    }
    Ok(public)
}

fn spki_der_of(raw: &[u8; 32]) -> Vec<u8> {
    let mut der = Vec::with_capacity(ED25519_SPKI_PREFIX.len() + raw.len());
    der.extend_from_slice(&ED25519_SPKI_PREFIX);
    der.extend_from_slice(raw);
    der
}

/// PEM text (RFC 7468): the label's BEGIN line, the DER in standard padded
/// base64 at 64 characters a line, the END line, each ending in a newline.
fn pem_encode(label: &str, der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::with_capacity(body.len() + body.len() / 64 + 2 * label.len() + 40);
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    let mut rest = body.as_str();
    while !rest.is_empty() {
        // Base64 is ASCII, so any byte index is a character boundary.
        let (line, tail) = rest.split_at(rest.len().min(64));
        out.push_str(line);
        out.push('\n');
        rest = tail;
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut name = prefix.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// Reads a key file whole, with its permission bits. The type and mode are
/// taken from the opened file itself, so they describe what was read.
fn read_key_file(path: &Path, what: &str) -> Result<(Vec<u8>, u32), AttestError> {
    let shown = path.display();
    match read_regular(path, KEY_FILE_LIMIT) {
        Ok((bytes, meta)) => Ok((bytes, meta.permissions().mode())),
        Err(Unread::Io(source)) => Err(AttestError::Io {
            what: format!("reading {what} {shown}"),
            source,
        }),
        Err(Unread::NotAFile) => Err(AttestError::Key(format!(
            "{what} {shown} is not a regular file"
        ))),
        Err(Unread::TooLarge) => Err(AttestError::Key(format!(
            "{what} {shown} is larger than any key file ({KEY_FILE_LIMIT} bytes)"
        ))),
    }
}

/// Creates `path` (failing if anything is there), sets its mode exactly
/// (the umask does not narrow a public key's 0644), writes and fsyncs it.
/// A failure after creating it removes it, so no partial key is left.
fn write_new(path: &Path, contents: &[u8], mode: u32, what: &str) -> Result<(), AttestError> {
    let io = |source: std::io::Error| AttestError::Io {
        what: format!("writing {what} {}", path.display()),
        source,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(io)?;
    if let Err(source) = fill(&mut file, contents, mode) {
        drop(file);
        let _ = fs::remove_file(path);
        return Err(io(source));
    }
    Ok(())
}

fn fill(file: &mut File, contents: &[u8], mode: u32) -> std::io::Result<()> {
    file.set_permissions(Permissions::from_mode(mode))?;
    file.write_all(contents)?;
    file.sync_all()
}

/// A key held only in memory, for other modules' tests.
#[cfg(test)]
pub(crate) fn ephemeral() -> SigningKey {
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("generate");
    SigningKey::from_pair(Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("parse"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh empty directory for one test (tests run in parallel, so
    /// each passes its own tag).
    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("plimsoll-attest-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn mode_of(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn generated_files_load_and_sign_verify_round_trip() {
        let dir = scratch("round-trip");
        let prefix = dir.join("signer.v1");
        let public = generate(&prefix).unwrap();
        // The suffix is appended, not put in place of ".v1".
        let signing = SigningKey::load(&dir.join("signer.v1.key")).unwrap();
        let loaded = VerifyingKey::load(&dir.join("signer.v1.pub")).unwrap();
        assert_eq!(loaded, public);
        assert_eq!(signing.public(), public);
        assert_eq!(signing.key_id(), public.key_id());

        let sig = signing.sign(b"a run record");
        assert_eq!(sig.len(), 64);
        assert!(loaded.verify(b"a run record", &sig));
        assert!(!loaded.verify(b"another run record", &sig));
        let mut flipped = sig.clone();
        flipped[10] ^= 0x01;
        assert!(!loaded.verify(b"a run record", &flipped));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn generated_files_are_0600_and_0644() {
        let dir = scratch("modes");
        let prefix = dir.join("k");
        generate(&prefix).unwrap();
        assert_eq!(mode_of(&dir.join("k.key")), 0o600);
        assert_eq!(mode_of(&dir.join("k.pub")), 0o644);
        let text = fs::read_to_string(dir.join("k.key")).unwrap();
        assert!(text.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{text}");
        assert!(text.ends_with("-----END PRIVATE KEY-----\n"), "{text}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn generating_twice_fails_and_keeps_the_first_key() {
        let dir = scratch("twice");
        let prefix = dir.join("k");
        let first = generate(&prefix).unwrap();
        let key_before = fs::read(dir.join("k.key")).unwrap();
        let pub_before = fs::read(dir.join("k.pub")).unwrap();
        match generate(&prefix) {
            Err(AttestError::Io { what, source }) => {
                assert!(what.contains("k.key"), "{what}");
                assert_eq!(source.kind(), std::io::ErrorKind::AlreadyExists);
            }
            other => panic!("expected an Io error, got {other:?}"),
        }
        assert_eq!(fs::read(dir.join("k.key")).unwrap(), key_before);
        assert_eq!(fs::read(dir.join("k.pub")).unwrap(), pub_before);
        let signing = SigningKey::load(&dir.join("k.key")).unwrap();
        assert_eq!(signing.public(), first);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_existing_public_file_fails_generate_and_leaves_no_private_key() {
        let dir = scratch("pub-exists");
        let prefix = dir.join("k");
        fs::write(dir.join("k.pub"), b"someone else's").unwrap();
        match generate(&prefix) {
            Err(AttestError::Io { what, .. }) => assert!(what.contains("k.pub"), "{what}"),
            other => panic!("expected an Io error, got {other:?}"),
        }
        assert!(!dir.join("k.key").exists());
        assert_eq!(fs::read(dir.join("k.pub")).unwrap(), b"someone else's");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn load_refuses_a_private_key_others_may_read() {
        let dir = scratch("loose-mode");
        let prefix = dir.join("k");
        generate(&prefix).unwrap();
        let key = dir.join("k.key");
        fs::set_permissions(&key, Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(SigningKey::load(&key), Err(AttestError::Key(_))));
        fs::set_permissions(&key, Permissions::from_mode(0o620)).unwrap();
        assert!(matches!(SigningKey::load(&key), Err(AttestError::Key(_))));
        fs::set_permissions(&key, Permissions::from_mode(0o400)).unwrap();
        assert!(SigningKey::load(&key).is_ok());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn load_refuses_what_is_not_a_regular_file() {
        let dir = scratch("not-regular");
        let sub = dir.join("k.key");
        fs::create_dir(&sub).unwrap();
        fs::set_permissions(&sub, Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(SigningKey::load(&sub), Err(AttestError::Key(_))));
        assert!(matches!(
            SigningKey::load(&dir.join("missing.key")),
            Err(AttestError::Io { .. })
        ));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn key_id_is_hex_sha256_of_the_spki_der() {
        let public = ephemeral().public();
        let der = public.spki_der();
        assert_eq!(der.len(), 44);
        assert_eq!(der[..12], ED25519_SPKI_PREFIX);
        assert_eq!(&der[12..], &public.raw()[..]);
        assert_eq!(public.key_id(), hex::encode(Sha256::digest(der.as_slice())));
        assert_eq!(public.key_id().len(), 64);
        assert_eq!(VerifyingKey::from_raw(*public.raw()), public);
    }

    #[test]
    fn spki_pem_round_trips() {
        let public = ephemeral().public();
        let pem = public.to_spki_pem();
        assert!(pem.starts_with("-----BEGIN PUBLIC KEY-----\n"), "{pem}");
        assert!(pem.ends_with("-----END PUBLIC KEY-----\n"), "{pem}");
        assert_eq!(VerifyingKey::from_spki_pem(pem.as_bytes()).unwrap(), public);
    }

    #[test]
    fn a_public_key_that_is_not_ed25519_is_refused() {
        let public = ephemeral().public();
        // X25519's OID (1.3.101.110) in place of Ed25519's: same shape,
        // another kind of key.
        let mut der = public.spki_der();
        der[8] = 0x6e;
        let pem = pem_encode("PUBLIC KEY", &der);
        assert!(matches!(
            VerifyingKey::from_spki_pem(pem.as_bytes()),
            Err(AttestError::Key(_))
        ));
        // The right prefix with a short key.
        let der = public.spki_der();
        let pem = pem_encode("PUBLIC KEY", &der[..43]);
        assert!(matches!(
            VerifyingKey::from_spki_pem(pem.as_bytes()),
            Err(AttestError::Key(_))
        ));
        // The right bytes under another label.
        let pem = pem_encode("CERTIFICATE", &public.spki_der());
        assert!(matches!(
            VerifyingKey::from_spki_pem(pem.as_bytes()),
            Err(AttestError::Key(_))
        ));
    }

    #[test]
    fn a_public_key_pem_is_not_a_private_key() {
        let pem = ephemeral().public().to_spki_pem();
        assert!(matches!(
            SigningKey::from_pkcs8_pem(pem.as_bytes()),
            Err(AttestError::Key(_))
        ));
        assert!(matches!(
            SigningKey::from_pkcs8_pem(b"not pem at all"),
            Err(AttestError::Key(_))
        ));
    }

    #[test]
    fn a_pkcs8_v1_key_loads_as_the_same_key() {
        let v2 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        let v2 = v2.as_ref();
        // ring's v2 document: version 1, the algorithm, the 32-byte seed in
        // an OCTET STRING in an OCTET STRING, then the public key.
        let v2_head: [u8; 16] = [
            0x30, 0x51, 0x02, 0x01, 0x01, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        assert_eq!(v2[..16], v2_head);
        // RFC 8410 section 10.3's v1 form: version 0, no public key.
        let mut v1: Vec<u8> = vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        v1.extend_from_slice(&v2[16..48]);
        let from_v2 = SigningKey::from_pkcs8_pem(pem_encode("PRIVATE KEY", v2).as_bytes()).unwrap();
        let from_v1 =
            SigningKey::from_pkcs8_pem(pem_encode("PRIVATE KEY", &v1).as_bytes()).unwrap();
        assert_eq!(from_v1.public(), from_v2.public());
        assert!(from_v2.public().verify(b"m", &from_v1.sign(b"m")));
    }

    #[test]
    fn debug_shows_the_key_id_and_nothing_secret() {
        let key = ephemeral();
        let shown = format!("{key:?}");
        assert!(shown.contains(key.key_id()), "{shown}");
        assert!(!shown.contains("pair"), "{shown}");
    }

    #[test]
    fn pem_lines_are_64_characters() {
        let pem = pem_encode("PRIVATE KEY", &[7u8; 100]);
        let lines: Vec<&str> = pem.lines().collect();
        assert_eq!(lines.first(), Some(&"-----BEGIN PRIVATE KEY-----"));
        assert_eq!(lines.last(), Some(&"-----END PRIVATE KEY-----"));
        // 100 bytes are 136 base64 characters: 64, 64, 8.
        assert_eq!(
            lines[1..lines.len() - 1]
                .iter()
                .map(|l| l.len())
                .collect::<Vec<_>>(),
            vec![64usize, 64, 8]
        );
    }
}
