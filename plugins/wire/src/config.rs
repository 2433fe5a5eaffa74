//! An adapter's configuration: the keys it reads, declared to the host
//! while it describes itself, and their values read through the standard
//! `wasi:config/store`.
//!
//! An adapter lists its keys once (`Startup::config_keys`); `declare_all`
//! declares each, reads the value the host settled on (the operator's, or
//! the default) and checks it, rejecting a bad one with its reason so the
//! operator sees every problem at start. At a run, `value` reads a key
//! again: every call is a fresh instance, and the host answers the same
//! values for the plugin's whole life.

use crate::bindings::plimsoll::provider::config_keys;
use crate::bindings::wasi::config::store;

/// One key an adapter reads.
pub struct Key {
    pub name: &'static str,
    /// One line for the operator.
    pub meaning: &'static str,
    /// Every shipped key has one: an adapter works with no file at all.
    pub default: &'static str,
    /// Whether the value changes what runs (the host names it in the
    /// provider's evidence).
    pub changes_what_runs: bool,
    /// Checks a value; the reason is shown to the operator.
    pub check: fn(&str) -> Result<(), String>,
}

/// Declares `keys` and checks their values. Only `describe` may call this
/// (the host refuses a declaration anywhere else).
pub fn declare_all(keys: &[Key]) {
    for k in keys {
        if !config_keys::declare(k.name, k.meaning, Some(k.default), k.changes_what_runs) {
            // The host lists the reason at start; nothing to check.
            continue;
        }
        if let Err(why) = (k.check)(&value(k)) {
            config_keys::reject(k.name, &why);
        }
    }
}

/// The value of `key` the host settled on.
pub fn value(key: &Key) -> String {
    match store::get(key.name) {
        Ok(Some(v)) => v,
        // Only a key the host never saw declared reads as absent.
        _ => key.default.to_string(),
    }
}

/// A value of 1-`max` characters from `a-z A-Z 0-9` and `extra`.
pub fn name_like(value: &str, max: usize, extra: &str) -> Result<(), String> {
    if value.is_empty() || value.len() > max {
        return Err(format!("must be 1-{max} characters"));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !c.is_ascii_alphanumeric() && !extra.contains(*c))
    {
        return Err(format!(
            "{c:?} is not allowed (letters, digits and {extra:?})"
        ));
    }
    Ok(())
}

/// A whole number in `min..=max`.
pub fn number_in(value: &str, min: u64, max: u64) -> Result<u64, String> {
    let n: u64 = value
        .parse()
        .map_err(|_| format!("must be a whole number from {min} to {max}"))?;
    if !(min..=max).contains(&n) {
        return Err(format!("must be from {min} to {max}"));
    }
    Ok(n)
}
