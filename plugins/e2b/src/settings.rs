//! What an operator may choose for this adapter (SANDBOX_PLUGIN_CONFIG_FILE):
//! the template every sandbox is made from. It changes what runs, so the
//! host names it in the provider's evidence.

use crate::wire::config::{self, Key};

pub const KEYS: &[Key] = &[TEMPLATE];

const TEMPLATE: Key = Key {
    name: "template",
    meaning: "the E2B template every sandbox is made from (it must have node and a POSIX shell)",
    default: "base",
    changes_what_runs: true,
    check: |v| config::name_like(v, 128, "-_./:"),
};

/// The template runs use.
pub fn template() -> String {
    config::value(&TEMPLATE)
}
