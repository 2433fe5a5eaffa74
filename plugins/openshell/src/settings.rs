//! What an operator may choose for this adapter (SANDBOX_PLUGIN_CONFIG_FILE):
//! the image every sandbox runs, its limits, and the gateway workspace it
//! is made in. All four change what (or where) code runs, so the host names
//! them in the provider's evidence.

use crate::wire::config::{self, Key};

pub const KEYS: &[Key] = &[IMAGE, MEMORY, CPU, WORKSPACE];

const IMAGE: Key = Key {
    name: "image",
    meaning: "the OCI image every sandbox runs (it must have node and a POSIX shell)",
    default: "docker.io/library/node:22-bookworm-slim",
    changes_what_runs: true,
    check: |v| config::name_like(v, 255, "-_./:@"),
};

const MEMORY: Key = Key {
    name: "memory",
    meaning: "each sandbox's memory limit, as a Kubernetes quantity (256Mi, 1Gi)",
    default: "256Mi",
    changes_what_runs: true,
    check: quantity,
};

const CPU: Key = Key {
    name: "cpu",
    meaning: "each sandbox's CPU limit, as a Kubernetes quantity (1, 500m)",
    default: "1",
    changes_what_runs: true,
    check: quantity,
};

const WORKSPACE: Key = Key {
    name: "workspace",
    meaning: "the gateway workspace sandboxes are made, listed and deleted in",
    default: "default",
    changes_what_runs: true,
    check: |v| config::name_like(v, 63, "-"),
};

/// A whole number with at most one unit suffix: the subset of Kubernetes'
/// quantity syntax a limit needs, and nothing a gateway could read two ways.
fn quantity(v: &str) -> Result<(), String> {
    let digits = v.bytes().take_while(u8::is_ascii_digit).count();
    let unit = &v[digits..];
    if digits == 0
        || digits > 12
        || !["", "m", "Ki", "Mi", "Gi", "Ti", "k", "M", "G"].contains(&unit)
    {
        return Err(
            "must be a whole number with an optional unit (m, Ki, Mi, Gi, Ti, k, M, G)".into(),
        );
    }
    Ok(())
}

pub fn image() -> String {
    config::value(&IMAGE)
}

pub fn memory() -> String {
    config::value(&MEMORY)
}

pub fn cpu() -> String {
    config::value(&CPU)
}

pub fn workspace() -> String {
    config::value(&WORKSPACE)
}
