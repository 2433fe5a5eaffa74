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
    check: |v| cpus_in(v).map(drop),
};

const MEMORY_MIB: Key = Key {
    name: "memory-mib",
    meaning: "memory each sandbox is made with, in MiB",
    default: "2048",
    changes_what_runs: true,
    check: |v| memory_mib_in(v).map(drop),
};

/// The sizes Docker's API takes, one rule for the check and the read.
fn cpus_in(v: &str) -> Result<u64, String> {
    config::number_in(v, 1, 16)
}

fn memory_mib_in(v: &str) -> Result<u64, String> {
    config::number_in(v, 256, 65536)
}

/// A checked number: describe refused any other value (and the plugin did
/// not load), so the default stands in only for a host that answered one
/// it never showed describe.
fn number(key: &Key, read: fn(&str) -> Result<u64, String>) -> u64 {
    read(&config::value(key))
        .or_else(|_| read(key.default))
        .expect("a key's default is within its own range")
}

pub fn image() -> String {
    config::value(&IMAGE)
}

pub fn cpus() -> u64 {
    number(&CPUS, cpus_in)
}

pub fn memory_mib() -> u64 {
    number(&MEMORY_MIB, memory_mib_in)
}
