//! The reader every part's settings go through: one view of the process
//! environment, the shape of a declared variable, and the errors a setting
//! can have.
//!
//! Each part of the daemon (listeners, callers, quotas, grants, providers,
//! the plugin host, the docker backend) declares the variables it reads next
//! to the code that reads them, as a `VARIABLES` list, and parses them
//! itself. `config` puts the lists together into the one closed list that
//! `plimsolld -h` prints and that unknown variables are checked against, and
//! holds the rules that span parts. This module is a leaf so every part can
//! use it without importing `config`.

use std::collections::BTreeMap;

/// One environment variable a part reads: name, default, meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var {
    pub name: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
}

/// Shorthand for the declaration lists.
pub const fn var(name: &'static str, default: &'static str, meaning: &'static str) -> Var {
    Var {
        name,
        default,
        meaning,
    }
}

/// The environment as text, read once.
pub struct Env<'a> {
    vars: &'a BTreeMap<String, String>,
}

impl<'a> Env<'a> {
    pub fn new(vars: &'a BTreeMap<String, String>) -> Env<'a> {
        Env { vars }
    }

    /// A variable's value, trimmed; unset and empty are the same.
    pub fn get(&self, name: &str) -> Option<&'a str> {
        self.vars
            .get(name)
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
    }

    /// A variable whose name the operator chose (the one holding a key, or
    /// a grant's secret), read as it is.
    pub fn named(&self, name: &str) -> Option<&'a String> {
        self.vars.get(name)
    }

    /// Every variable set, by name.
    pub fn names(&self) -> impl Iterator<Item = &'a String> {
        self.vars.keys()
    }

    /// Whether a variable is set to something.
    pub fn is_set(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// A 0-or-1 switch; anything else is refused.
    pub fn flag(&self, name: &'static str) -> Result<bool, ConfigError> {
        match self.get(name) {
            None | Some("0") => Ok(false),
            Some("1") => Ok(true),
            Some(_) => Err(ConfigError::Invalid {
                name,
                why: "must be 0 or 1".into(),
            }),
        }
    }

    /// A whole number in `min..=max`, if set.
    pub fn u32_in(
        &self,
        name: &'static str,
        min: u32,
        max: u32,
    ) -> Result<Option<u32>, ConfigError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let n: u32 = v.parse().map_err(|_| ConfigError::Invalid {
            name,
            why: format!("must be a whole number from {min} to {max}"),
        })?;
        if n < min || n > max {
            return Err(ConfigError::Invalid {
                name,
                why: format!("must be from {min} to {max}"),
            });
        }
        Ok(Some(n))
    }
}

/// What is wrong with a configuration. Messages name the variable and never
/// repeat a secret's value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{name}: {why}")]
    Invalid { name: &'static str, why: String },
    #[error("SANDBOX_PROVIDER={name:?} is neither a built-in provider ({known}) nor a valid plugin name ([a-z0-9-]{{1,32}})", known = known.join(", "))]
    UnknownProvider {
        name: String,
        known: &'static [&'static str],
    },
    #[error("{0} is not valid UTF-8 text")]
    NotText(String),
    #[error(
        "{0} is set, but the {1} provider cannot enforce it; unset it rather than believe it holds"
    )]
    Unenforceable(&'static str, &'static str),
}

/// Shorthand for the common case.
pub fn invalid(name: &'static str, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        name,
        why: why.into(),
    }
}
