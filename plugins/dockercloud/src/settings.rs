//! What an operator may choose for this adapter (SANDBOX_PLUGIN_CONFIG_FILE):
//! the image every sandbox boots and its size. All three change what runs,
//! so the host names them in the provider's evidence; the size is also what
//! each new sandbox is checked against (`checks`).

use crate::wire::config::{self, Key};

pub const KEYS: &[Key] = &[IMAGE, CPUS, MEMORY_MIB];

const IMAGE: Key = Key {
    name: "image",
    meaning: "the OCI image every sandbox boots (it must have node and a POSIX shell)",
    default: "docker.io/library/node:22-bookworm-slim",
    changes_what_runs: true,
    check: |v| config::name_like(v, 255, "-_./:@"),
};

const CPUS: Key = Key {
    name: "cpus",
    meaning: "virtual CPUs each sandbox is made with",
    default: "1",
    changes_what_runs: true,
    check: |v| config::number_in(v, 1, 16).map(drop),
};

const MEMORY_MIB: Key = Key {
    name: "memory-mib",
    meaning: "memory each sandbox is made with, in MiB",
    default: "2048",
    changes_what_runs: true,
    check: |v| config::number_in(v, 256, 65536).map(drop),
};

pub fn image() -> String {
    config::value(&IMAGE)
}

/// The checked values, so a fallback is never needed in practice; the
/// default stands in only if the host answered something unchecked.
pub fn cpus() -> u64 {
    config::number_in(&config::value(&CPUS), 1, 16).unwrap_or(1)
}

pub fn memory_mib() -> u64 {
    config::number_in(&config::value(&MEMORY_MIB), 256, 65536).unwrap_or(2048)
}
