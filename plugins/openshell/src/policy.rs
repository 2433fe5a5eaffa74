//! The sandbox policy every sandbox of this plugin is created with, and the
//! hash the gateway reports for the policy in force.
//!
//! No network policy entry, but for a granted run's sandbox (or a session's
//! on a daemon with a guard): OpenShell denies every connection out that no
//! entry allows, and resolves no name for it. The one entry a guard adds
//! lets node and python reach the guard's name and port through OpenShell's
//! proxy as a raw tunnel (TLS `SKIP`: the sandbox's own TLS, end to end,
//! verified against the authority the daemon hands in). The filesystem is
//! read-only but for `/tmp`, under Landlock as a hard requirement; with an
//! entry, `/var/log` is read-only too, as the supervisor adds it to any
//! policy with a network entry (so the policy read back is the one sent).
//!
//! The hash is OpenShell's policy identity: SHA-256 (lowercase hex) of
//! parts, each prefixed by its length as a little-endian u64: the policy's
//! protobuf encoding with both maps emptied; then `network_policies`, its
//! entry count, and for each entry in key order its key and its rule's
//! bytes (the rule's encoding, then for each endpoint its index and its
//! empty `graphql_persisted_queries` map); then `network_middlewares` and
//! its count (none here).

use prost::Message;
use sha2::{Digest, Sha256};

use crate::messages::{
    FilesystemPolicy, LandlockPolicy, NetworkBinary, NetworkEndpoint, NetworkPolicyEntry,
    NetworkPolicyRule, SandboxPolicy, TLS_SKIP,
};

/// The entry's key and name.
const GUARD_ENTRY: &str = "plimsoll-guard";
/// The binaries that may reach the guard: the images' node and python (an
/// exact path is resolved inside the sandbox, so a symlink is fine). No
/// shell: a listed binary also admits everything it starts.
const GUARD_BINARIES: &[&str] = &["/usr/local/bin/node", "/usr/bin/node", "/usr/bin/python3"];

/// Where the guard is, for a sandbox that may reach it.
#[derive(Clone, Copy)]
pub struct Guard<'a> {
    pub host: &'a str,
    pub port: u16,
}

pub fn sandbox_policy(guard: Option<Guard<'_>>) -> SandboxPolicy {
    let list = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut read_only = list(&[
        "/bin",
        "/usr",
        "/lib",
        "/etc",
        "/proc",
        "/dev/urandom",
        "/sys/fs/cgroup",
    ]);
    let network_policies = match guard {
        None => Vec::new(),
        Some(g) => {
            read_only.push("/var/log".into());
            vec![guard_entry(g).encode_to_vec()]
        }
    };
    SandboxPolicy {
        version: 1,
        filesystem: Some(FilesystemPolicy {
            include_workdir: false,
            read_only,
            read_write: list(&["/tmp", "/dev/null"]),
        }),
        landlock: Some(LandlockPolicy {
            compatibility: "hard_requirement".into(),
        }),
        process: None,
        network_policies,
        network_middlewares: Vec::new(),
    }
}

fn guard_entry(g: Guard<'_>) -> NetworkPolicyEntry {
    NetworkPolicyEntry {
        key: GUARD_ENTRY.into(),
        value: Some(NetworkPolicyRule {
            name: GUARD_ENTRY.into(),
            endpoints: vec![NetworkEndpoint {
                host: g.host.into(),
                port: u32::from(g.port),
                tls: TLS_SKIP,
            }],
            binaries: GUARD_BINARIES
                .iter()
                .map(|p| NetworkBinary {
                    path: p.to_string(),
                })
                .collect(),
        }),
    }
}

/// The policy's identity as the gateway states it; `None` for a policy
/// with a middleware, or an entry this plugin does not model (its rule
/// re-encodes differently: fields it would not hash as the gateway does).
pub fn hash(policy: &SandboxPolicy) -> Option<String> {
    if !policy.network_middlewares.is_empty() {
        return None;
    }
    let mut entries = Vec::new();
    for raw in &policy.network_policies {
        let entry = NetworkPolicyEntry::decode(raw.as_slice()).ok()?;
        let rule = entry.value.clone().unwrap_or_default();
        if entry.encode_to_vec() != *raw {
            return None;
        }
        entries.push((entry.key, rule));
    }
    entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut cleared = policy.clone();
    cleared.network_policies.clear();
    let mut preimage = Vec::new();
    part(&mut preimage, &cleared.encode_to_vec());
    part(&mut preimage, b"network_policies");
    count(&mut preimage, entries.len());
    for (key, rule) in &entries {
        part(&mut preimage, key.as_bytes());
        part(&mut preimage, &rule_bytes(rule));
    }
    part(&mut preimage, b"network_middlewares");
    count(&mut preimage, 0);
    let h = Sha256::digest(&preimage);
    Some(h.iter().map(|b| format!("{b:02x}")).collect())
}

/// A rule's canonical bytes: its encoding (it has no map to clear), then
/// for each endpoint its index and its empty persisted-queries map.
fn rule_bytes(rule: &NetworkPolicyRule) -> Vec<u8> {
    let mut out = Vec::new();
    part(&mut out, &rule.encode_to_vec());
    for i in 0..rule.endpoints.len() {
        count(&mut out, i);
        part(&mut out, b"graphql_persisted_queries");
        count(&mut out, 0);
    }
    out
}

/// One part of the preimage: its length (little-endian u64), then itself.
fn part(out: &mut Vec<u8>, bytes: &[u8]) {
    count(out, bytes.len());
    out.extend_from_slice(bytes);
}

fn count(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u64).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy the vectors below were computed for: the guard entry with
    /// node's path alone (the algorithm's reading of OpenShell's
    /// `deterministic_policy_hash`, whose empty-map case a real 0.1.2
    /// gateway confirmed; see the fake's GATEWAY_VECTORS).
    fn with_node_only(guard: Guard<'_>, var_log: bool) -> SandboxPolicy {
        let mut p = sandbox_policy(None);
        if var_log {
            p.filesystem
                .as_mut()
                .unwrap()
                .read_only
                .push("/var/log".into());
        }
        let mut entry = guard_entry(guard);
        let rule = entry.value.as_mut().unwrap();
        rule.name = "guard".into();
        rule.binaries.truncate(1);
        entry.key = "guard".into();
        p.network_policies.push(entry.encode_to_vec());
        p
    }

    #[test]
    fn the_hash_covers_the_guard_entry_as_the_gateway_computes_it() {
        let g = Guard {
            host: "guard.example.com",
            port: 443,
        };
        assert_eq!(
            hash(&sandbox_policy(None)).as_deref(),
            Some("6fea616f3f83e6fc7ddc89c594ee12853d92ccaaa623086573071da45042a6bd")
        );
        let rule = with_node_only(g, false).network_policies[0].clone();
        let rule = NetworkPolicyEntry::decode(rule.as_slice())
            .unwrap()
            .value
            .unwrap();
        assert_eq!(
            hex(&rule.encode_to_vec()),
            "0a05677561726412180a1167756172642e6578616d706c652e636f6d10bb0320011a150a132f7573722f6c6f63616c2f62696e2f6e6f6465"
        );
        assert_eq!(
            hash(&with_node_only(g, false)).as_deref(),
            Some("74fef01c29e2584e9a64215ad290ec1074f32c6e502fe44d0b633dd9e18fffa4")
        );
        assert_eq!(
            hash(&with_node_only(g, true)).as_deref(),
            Some("489dd33fa829fdd470429284903aaadd0993715065769c2f6d5a09c4ec7255ef")
        );
    }

    #[test]
    fn an_entry_it_does_not_model_is_not_hashed() {
        let mut p = sandbox_policy(None);
        // An endpoint with `protocol` (3), which this plugin never sends.
        let endpoint = [0x0a, 0x01, b'g', 0x1a, 0x04, b'r', b'e', b's', b't'];
        let mut rule = vec![0x12, endpoint.len() as u8];
        rule.extend_from_slice(&endpoint);
        let mut entry = vec![0x0a, 0x01, b'k', 0x12, rule.len() as u8];
        entry.extend_from_slice(&rule);
        p.network_policies.push(entry);
        assert_eq!(hash(&p), None);
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
