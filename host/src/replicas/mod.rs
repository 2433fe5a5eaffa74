//! Sessions across replicas. A session lives in the replica that opened
//! it; that replica records itself as the holder in the shared store, and
//! a session call that reaches another replica is forwarded to the holder
//! and its answer relayed unchanged.
//!
//! Trust: the replica the caller reached checks the caller's token, as for
//! any call, and forwards only the caller's ID with the call, signed with
//! the secret the replicas share (`mac`), over TLS unless the peer is on
//! loopback: the token never leaves the replica that checked it, and a
//! holder accepts a forwarded call only with a valid tag, at most 30 s
//! old, seen once: once by this process (in memory), and once by any
//! process at this replica's address (its nonce recorded in the store for
//! as long as the call could pass the age check), so a call captured on
//! its way is not taken again after the holder restarts. A holder record
//! in the store is signed too, so writing the store is not enough to send
//! a session's calls elsewhere; it is the holder's to remove, and the
//! holder removes it once nobody can reach the session through it any
//! more (`HolderRecord`).
//!
//! An owner's sessions (OpenSession's `owner`) are all held by one replica
//! (`owners`): an open for an owner whose sessions another replica holds
//! is forwarded there, so the per-owner cap, and which idle session it
//! replaces, is one replica's decision for the whole fleet.

pub mod mac;
pub mod owners;
pub mod settings;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use sha2::Digest;

use crate::state::redis_store::RedisStore;
pub use mac::Secret;
pub use settings::ReplicaSettings;

/// Headers of a forwarded call: the caller the forwarding replica checked,
/// when it signed, and the tag.
pub const FORWARDED_FOR: &str = "plimsoll-forwarded-for";
pub const FORWARDED_AT: &str = "plimsoll-forwarded-at";
pub const FORWARDED_TAG: &str = "plimsoll-forwarded-tag";
/// 16 random bytes in hex, new for every forwarded call.
pub const FORWARDED_NONCE: &str = "plimsoll-forwarded-nonce";
/// The body's SHA-256 (hex), signed, so the tag is checked before the body
/// is read and the body against it after.
pub const FORWARDED_BODY: &str = "plimsoll-forwarded-body-sha256";

/// How old a forwarded call may be when it arrives (or how far ahead of
/// this replica's clock its signer's may be).
const WINDOW: Duration = Duration::from_secs(30);
/// The longest a forwarded call may take: the longest cell, and margin.
const CALL_TIMEOUT: Duration = Duration::from_secs(150);
/// Bytes of a holder's answer relayed at most.
const MAX_ANSWER: usize = 32 << 20;

pub struct Replicas {
    url: String,
    secret: Secret,
    store: Arc<RedisStore>,
    client: reqwest::Client,
    /// Tags accepted recently (with the time they were signed): a captured
    /// call cannot be replayed. Only signed tags get in, so only peers can
    /// grow it, and entries leave once too old to be accepted anyway.
    /// In front of the store's record of nonces (`first_sight`), not instead
    /// of it: a replay within this process's life is refused without a
    /// round trip (a captured call costs the store at most one write per
    /// start), and one is still refused if the store has lost its records
    /// (a Redis restarted empty, a failover).
    seen: Mutex<HashMap<[u8; 32], u64>>,
}

/// A session's holder record, as this replica wrote it. The record is
/// this replica's to remove, and only while it holds exactly what this
/// replica wrote (`lua/release.lua`); dropped without being released (the
/// session forgotten some other way), it is deleted in the background.
#[must_use = "a holder record dropped at once is deleted from the store at once"]
pub struct HolderRecord {
    store: Arc<RedisStore>,
    key: String,
    /// None once released.
    value: Option<String>,
}

impl HolderRecord {
    /// Deletes the record: nobody can reach the session through it any
    /// more (closed, collected, or this replica is stopping).
    pub async fn delete(mut self) {
        if let Some(value) = self.value.take() {
            self.store.release_record(&self.key, &value, 0).await;
        }
    }

    /// Cuts the record's life to at most `keep` from now (never longer than
    /// it was written for): a session that ended by itself is still
    /// answered for by this replica until its summary is collected or
    /// dropped, and through the others while the record lasts.
    pub async fn expire_within(&self, keep: Duration) {
        if let Some(value) = &self.value {
            let ms = keep.as_millis().max(1) as u64;
            self.store.release_record(&self.key, value, ms).await;
        }
    }
}

impl Drop for HolderRecord {
    fn drop(&mut self) {
        if let Some(value) = self.value.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let (store, key) = (self.store.clone(), std::mem::take(&mut self.key));
            rt.spawn(async move { store.release_record(&key, &value, 0).await });
        }
    }
}

/// What the store says of where a session is held.
pub enum Holder {
    /// Another replica, at this address, with a record the replicas
    /// signed: the call goes there.
    Elsewhere(String),
    /// No other replica: no record, this replica's own, or one nobody
    /// signed (ignored). The call is answered here.
    NoneElsewhere,
    /// The store did not answer. The call is answered nowhere: here it
    /// would be told the session does not exist, which may be false.
    Unknown,
}

/// What the store said of a forwarded call's nonce.
pub enum FirstSight {
    /// Not seen before: now recorded.
    Yes,
    /// Recorded already: the call was taken before, by this process or one
    /// before it at this address.
    Replayed,
    /// The store did not answer (it may or may not have recorded it).
    Unknown,
}

/// What became of a forwarded call.
pub enum Forwarded {
    /// The holder answered: relayed as it is.
    Answer {
        status: u16,
        headers: Vec<(String, Vec<u8>)>,
        body: Bytes,
    },
    /// The holder's address refused the connection: nothing was sent, so
    /// nothing ran; the session is gone with its replica.
    Gone,
    /// No connection could be made for another reason (a timeout, TLS, the
    /// name): nothing was sent, and the holder may still be there.
    Unreachable(String),
    /// The call was sent and no answer came: it may have run.
    Lost(String),
}

fn key(fingerprint: &str) -> String {
    format!("plimsoll:session:{fingerprint}")
}

/// A nonce this replica has taken, by its keyed digest.
fn nonce_key(digest: &str) -> String {
    format!("plimsoll:nonce:{digest}")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Replicas {
    /// Reads the secret (a regular file, not a symlink, readable by its
    /// owner only) and builds the client peers are called with.
    pub fn open(s: &ReplicaSettings, store: Arc<RedisStore>) -> Result<Arc<Replicas>, String> {
        let shown = s.secret_file.display();
        let text = read_secret(&s.secret_file)
            .map_err(|e| format!("PLIMSOLL_REPLICA_SECRET_FILE {shown}: {e}"))?;
        let secret =
            Secret::new(&text).map_err(|e| format!("PLIMSOLL_REPLICA_SECRET_FILE {shown}: {e}"))?;
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(CALL_TIMEOUT)
            .connect_timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| format!("the replicas' HTTP client: {e}"))?;
        Ok(Arc::new(Replicas {
            url: s.url.clone(),
            secret,
            store,
            client,
            seen: Mutex::new(HashMap::new()),
        }))
    }

    /// Records this replica as the holder of a session, for at most its
    /// lifetime. The record is returned even if the store did not answer:
    /// a write whose answer was lost may have landed, and releasing a
    /// record that is not there does nothing.
    pub async fn hold(&self, fingerprint: &str, lifetime: Duration) -> HolderRecord {
        let value = format!(
            "{} {}",
            self.url,
            self.secret.sign_holder(fingerprint, &self.url)
        );
        let ms = lifetime.as_millis().max(1) as u64;
        let key = key(fingerprint);
        if let Err(e) = self.store.set_for(&key, &value, ms).await {
            tracing::warn!(error = %e, "the session's holder could not be recorded; other replicas will not find it");
        }
        HolderRecord {
            store: self.store.clone(),
            key,
            value: Some(value),
        }
    }

    /// Which replica the store says holds a session.
    pub async fn holder(&self, fingerprint: &str) -> Holder {
        let value = match self.store.get(&key(fingerprint)).await {
            Ok(Some(value)) => value,
            Ok(None) => return Holder::NoneElsewhere,
            Err(e) => {
                tracing::warn!(error = %e, "the state store did not say which replica holds a session; the call is refused");
                return Holder::Unknown;
            }
        };
        let Some((url, tag)) = value.split_once(' ') else {
            return Holder::NoneElsewhere;
        };
        if url == self.url {
            return Holder::NoneElsewhere;
        }
        if !self.secret.verify_holder(fingerprint, url, tag) || !settings::dialable(url) {
            tracing::warn!(
                "a session's holder record in the store is not one the replicas signed; ignored"
            );
            return Holder::NoneElsewhere;
        }
        Holder::Elsewhere(url.to_string())
    }

    /// Forgets a session whose holder is gone (the holder's address refused
    /// the connection, so it cannot remove the record itself).
    pub async fn forget(&self, fingerprint: &str) {
        let _ = self.store.del(&key(fingerprint)).await;
    }

    /// Sends a session call to its holder, signed for `caller`.
    pub async fn forward(
        &self,
        holder: &str,
        procedure: &str,
        caller: &str,
        body: Bytes,
    ) -> Forwarded {
        let at = now_ms();
        let mut nonce = [0u8; 16];
        if let Err(e) = getrandom::fill(&mut nonce) {
            return Forwarded::Unreachable(format!("no randomness for the call's nonce: {e}"));
        }
        let nonce = hex::encode(nonce);
        let digest = hex::encode(sha2::Sha256::digest(&body));
        let tag = self.secret.sign_call(&mac::Call {
            holder,
            procedure,
            caller,
            at_ms: at,
            nonce: &nonce,
            body_sha256: &digest,
        });
        let sent = self
            .client
            .post(format!("{holder}/plimsoll.v1.SandboxService/{procedure}"))
            .header("content-type", "application/json")
            .header(FORWARDED_FOR, caller)
            .header(FORWARDED_AT, at.to_string())
            .header(FORWARDED_NONCE, &nonce)
            .header(FORWARDED_BODY, digest)
            .header(FORWARDED_TAG, tag)
            .body(body)
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            Err(e) if e.is_connect() && refused(&e) => return Forwarded::Gone,
            Err(e) if e.is_connect() => {
                return Forwarded::Unreachable(format!("connecting to the holder: {e}"));
            }
            Err(e) => return Forwarded::Lost(format!("forwarding to the holder: {e}")),
        };
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .filter(|(n, _)| {
                let n = n.as_str();
                n == "content-type" || n.starts_with("plimsoll-")
            })
            .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
            .collect();
        let mut body = Vec::new();
        let mut resp = resp;
        loop {
            match resp.chunk().await {
                Ok(Some(c)) if body.len() + c.len() <= MAX_ANSWER => body.extend_from_slice(&c),
                Ok(Some(_)) => return Forwarded::Lost("the holder's answer is too large".into()),
                Ok(None) => break,
                Err(e) => return Forwarded::Lost(format!("reading the holder's answer: {e}")),
            }
        }
        Forwarded::Answer {
            status,
            headers,
            body: Bytes::from(body),
        }
    }

    /// Whether a forwarded call's headers are ones a peer signed for this
    /// replica, recently, and not seen before by this process: checked
    /// before a body slot is taken or a byte of the body read. A call taken
    /// here must then pass `first_sight`, which remembers across restarts.
    pub fn accept(
        &self,
        procedure: &str,
        caller: &str,
        at: &str,
        nonce: &str,
        body_sha256: &str,
        tag: &str,
    ) -> bool {
        let Ok(at_ms) = at.parse::<u64>() else {
            return false;
        };
        let lower_hex = |c: u8| c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
        if nonce.len() != 32 || !nonce.bytes().all(lower_hex) {
            return false;
        }
        let now = now_ms();
        let window = WINDOW.as_millis() as u64;
        if now.abs_diff(at_ms) > window {
            return false;
        }
        let Some(tag) = self.secret.verify_call(
            &mac::Call {
                holder: &self.url,
                procedure,
                caller,
                at_ms,
                nonce,
                body_sha256,
            },
            tag,
        ) else {
            return false;
        };
        let Ok(mut seen) = self.seen.lock() else {
            return false;
        };
        // Kept until past the window on the same clock the window is
        // checked on, so a tag is never accepted twice.
        seen.retain(|_, signed| now <= signed.saturating_add(2 * window));
        seen.insert(tag, at_ms).is_none()
    }

    /// Records a forwarded call's nonce in the shared store, unless it is
    /// there already: the check that survives this process. Asked only for
    /// a call `accept` took (signed for this replica, fresh, not seen by
    /// this process), so nobody without the secret can write here.
    ///
    /// Kept for twice the window: a call may arrive signed up to the window
    /// ahead of this replica's clock and is then acceptable until the window
    /// past it, so a record written on arrival outlasts every moment the
    /// call could still pass `accept`. Keyed by the nonce alone (under this
    /// replica's address): a peer never signs two calls with one nonce,
    /// and nobody else can sign at all.
    pub async fn first_sight(&self, nonce: &str) -> FirstSight {
        let key = nonce_key(&self.secret.nonce_digest(&self.url, nonce));
        let keep = 2 * WINDOW.as_millis() as u64;
        match self.store.record_once(&key, keep).await {
            Ok(true) => FirstSight::Yes,
            Ok(false) => FirstSight::Replayed,
            Err(e) => {
                tracing::warn!(error = %e, "the state store did not answer for a forwarded call's nonce; the call is refused");
                FirstSight::Unknown
            }
        }
    }
}

/// Whether a connect error is the peer's address refusing the connection
/// (no daemon listening there), as opposed to a timeout, TLS or a name.
fn refused(e: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        source = err.source();
    }
    false
}

/// Reads the shared secret: a regular file (not a symlink, not a FIFO that
/// would block the start), owned by the daemon's user, readable by no one
/// else, all checked on the handle that is read.
fn read_secret(path: &Path) -> Result<String, String> {
    use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
    use cap_std::fs::{MetadataExt, OpenOptionsExt};
    use std::io::Read;
    let (dir, name) = crate::dirs::parent_of(path).map_err(|e| e.to_string())?;
    let mut options = cap_std::fs::OpenOptions::new();
    options
        .read(true)
        .follow(FollowSymlinks::No)
        .custom_flags(libc::O_NONBLOCK);
    let file = dir.open_with(&name, &options).map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.is_file() || meta.uid() != me || meta.mode() & 0o077 != 0 {
        return Err(
            "must be a regular file owned by the daemon's user, readable by it alone (chmod 600)"
                .into(),
        );
    }
    let mut text = String::new();
    file.take(64 << 10)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    Ok(text)
}
