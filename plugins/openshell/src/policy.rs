//! The sandbox policy every sandbox of this plugin is created with, and the
//! hash the gateway reports for the policy in force.
//!
//! No network policy entry: OpenShell denies every connection out that no
//! entry allows, and resolves no name for it. The filesystem is read-only
//! but for `/tmp`, under Landlock as a hard requirement.
//!
//! The hash is OpenShell's policy identity: SHA-256 (lowercase hex) of the
//! policy's protobuf encoding with both maps emptied, prefixed by its
//! length, then for each map its name and its entry count (none here), each
//! length and count a little-endian u64. The maps are only ever empty here,
//! so no entry encoding is needed; a read-back with an entry is refused
//! before any hash is compared.

use prost::Message;
use sha2::{Digest, Sha256};

use crate::messages::{FilesystemPolicy, LandlockPolicy, SandboxPolicy};

pub fn sandbox_policy() -> SandboxPolicy {
    let list = |items: &[&str]| items.iter().map(|s| s.to_string()).collect();
    SandboxPolicy {
        version: 1,
        filesystem: Some(FilesystemPolicy {
            include_workdir: false,
            read_only: list(&[
                "/bin",
                "/usr",
                "/lib",
                "/etc",
                "/proc",
                "/dev/urandom",
                "/sys/fs/cgroup",
            ]),
            read_write: list(&["/tmp", "/dev/null"]),
        }),
        landlock: Some(LandlockPolicy {
            compatibility: "hard_requirement".into(),
        }),
        process: None,
        network_policies: Vec::new(),
        network_middlewares: Vec::new(),
    }
}

/// The policy's identity as the gateway states it; `None` for a policy
/// with map entries (never one of this plugin's).
pub fn hash(policy: &SandboxPolicy) -> Option<String> {
    if !policy.network_policies.is_empty() || !policy.network_middlewares.is_empty() {
        return None;
    }
    let encoded = policy.encode_to_vec();
    let mut preimage = Vec::with_capacity(encoded.len() + 80);
    part(&mut preimage, &encoded);
    for map in ["network_policies", "network_middlewares"] {
        part(&mut preimage, map.as_bytes());
        // No entries.
        preimage.extend_from_slice(&0u64.to_le_bytes());
    }
    let h = Sha256::digest(&preimage);
    Some(h.iter().map(|b| format!("{b:02x}")).collect())
}

/// One part of the preimage: its length (little-endian u64), then itself.
fn part(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}
