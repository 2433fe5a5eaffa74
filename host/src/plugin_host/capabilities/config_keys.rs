//! The `config-keys` capability and the standard `wasi:config/store` it
//! governs: every plugin has both.
//!
//! While a plugin describes itself it declares the keys it reads (with a
//! meaning, a default or none, and whether the value changes what runs) and
//! may reject a value it was given. Each declaration puts that key's value,
//! the operator's or the default, where `wasi:config/store` answers it, so a
//! plugin never reads a key it did not declare. When `describe` returns,
//! the load settles the declarations against the operator's file
//! (`Declaring::settle`): every problem is listed at once, or the values
//! are fixed for the plugin's life and every later call reads the same map.
//! Outside `describe` a declaration is refused (answered false): what a
//! plugin reads, and what its evidence names, is fixed before any request.
//!
//! Arguments are read in place and checked before anything is copied; the
//! one exception is `wasi:config/store.get`, whose key wasmtime's binding
//! copies whole, bounded only by the plugin's own memory cap.

use std::collections::BTreeMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use wasmtime::component::{Linker, WasmStr};
use wasmtime::{AsContext, StoreContextMut};
use wasmtime_wasi_config::{WasiConfig, WasiConfigVariables};

use crate::plugin_host::config_file::{MAX_KEYS, MAX_VALUE_BYTES, OperatorValues, valid_key};
use crate::text::{sanitize, truncate};

/// Longest meaning a key may carry: one line for the operator.
const MEANING_BYTES: usize = 200;
/// How much of a rejection's reason is kept.
const WHY_BYTES: usize = 512;
/// Problems kept to list: each is host memory a plugin could otherwise
/// grow by calling `reject` in a loop; the rest are counted.
const MAX_PROBLEMS: usize = 64;

/// One key a plugin declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    pub key: String,
    pub meaning: String,
    /// `None`: the operator must give a value.
    pub default: Option<String>,
    /// Whether the value is named in the plugin's evidence.
    pub changes_what_runs: bool,
}

/// The declarations in progress, during `describe`.
pub struct Declaring {
    operator: Arc<OperatorValues>,
    /// What `wasi:config/store` answers during `describe`.
    vars: WasiConfigVariables,
    /// The same values, readable here.
    effective: BTreeMap<String, String>,
    keys: Vec<Declared>,
    problems: Vec<String>,
    /// Problems past `MAX_PROBLEMS`, counted and not kept.
    unlisted: usize,
}

/// What a plugin's configuration settled to, for its whole life.
#[derive(Clone)]
pub struct Settled {
    pub keys: Vec<Declared>,
    /// The value of every declared key that has one.
    pub effective: BTreeMap<String, String>,
    /// The same, as `wasi:config/store` answers them.
    pub values: Arc<WasiConfigVariables>,
    /// SHA-256 of the values that change what runs (none if no key does):
    /// the compact JSON `[[key, value], ...]` sorted by key.
    pub digest: Option<String>,
}

impl std::fmt::Debug for Settled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settled")
            .field("keys", &self.keys)
            .field("effective", &self.effective)
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}

/// One call's configuration: being declared (describe) or settled.
pub enum ConfigState {
    Declaring(Box<Declaring>),
    Settled(Arc<WasiConfigVariables>),
}

impl ConfigState {
    /// The state for `describe`: declarations open against these values.
    pub fn declaring(operator: Arc<OperatorValues>) -> ConfigState {
        ConfigState::Declaring(Box::new(Declaring {
            operator,
            vars: WasiConfigVariables::new(),
            effective: BTreeMap::new(),
            keys: Vec::new(),
            problems: Vec::new(),
            unlisted: 0,
        }))
    }

    fn vars(&self) -> &WasiConfigVariables {
        match self {
            ConfigState::Declaring(d) => &d.vars,
            ConfigState::Settled(v) => v,
        }
    }

    /// The declarations, once `describe` is over; `None` if the store was
    /// never declaring.
    pub fn into_declaring(self) -> Option<Declaring> {
        match self {
            ConfigState::Declaring(d) => Some(*d),
            ConfigState::Settled(_) => None,
        }
    }
}

impl Declaring {
    /// Keeps a problem to list, or counts it once the list is full.
    fn problem(&mut self, p: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(p);
        } else {
            self.unlisted += 1;
        }
    }

    fn declare(&mut self, d: Result<Declared, String>) -> bool {
        let d = match d {
            Ok(d) => d,
            Err(why) => {
                self.problem(why);
                return false;
            }
        };
        if self.keys.len() == MAX_KEYS {
            let over = format!("the plugin declared more than {MAX_KEYS} keys");
            if !self.problems.contains(&over) {
                self.problem(over);
            }
            return false;
        }
        if self.keys.iter().any(|k| k.key == d.key) {
            self.problem(format!("the plugin declared key {:?} twice", d.key));
            return false;
        }
        if let Some(v) = self.operator.get(&d.key).or(d.default.as_deref()) {
            self.vars.insert(d.key.clone(), v);
            self.effective.insert(d.key.clone(), v.to_string());
        }
        self.keys.push(d);
        true
    }

    fn reject(&mut self, key: &str, why: String) {
        self.problem(format!("the plugin refused the value of {key:?}: {why}"));
    }

    /// Holds the declarations to the operator's file: a key the plugin does
    /// not read, a required key with no value, and every problem met while
    /// declaring, all listed; or the settled values.
    pub fn settle(self) -> Result<Settled, Vec<String>> {
        let Declaring {
            operator,
            vars,
            effective,
            keys,
            mut problems,
            unlisted,
        } = self;
        for key in operator.keys() {
            if !keys.iter().any(|k| k.key == key) {
                let known: Vec<&str> = keys.iter().map(|k| k.key.as_str()).collect();
                problems.push(format!(
                    "unknown key {key:?} (this plugin reads: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ));
            }
        }
        for k in keys.iter().filter(|k| k.default.is_none()) {
            if operator.get(&k.key).is_none() {
                problems.push(format!("missing required key {:?}: {}", k.key, k.meaning));
            }
        }
        if unlisted > 0 {
            problems.push(format!(
                "{unlisted} more problem(s) not listed (the plugin caused more than {MAX_PROBLEMS})"
            ));
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        // BTreeMap order: sorted by key.
        let evidence: Vec<(&str, &str)> = effective
            .iter()
            .filter(|(key, _)| keys.iter().any(|k| &k.key == *key && k.changes_what_runs))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let digest = (!evidence.is_empty()).then(|| {
            let json = serde_json::to_vec(&evidence).expect("strings serialize");
            hex::encode(Sha256::digest(&json))
        });
        Ok(Settled {
            keys,
            values: Arc::new(vars),
            effective,
            digest,
        })
    }
}

/// Store data that carries a call's configuration.
pub trait ConfigView: Send + 'static {
    fn config(&mut self) -> &mut ConfigState;
}

pub fn add_to_linker<T: ConfigView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    wasmtime_wasi_config::add_to_linker(linker, |t: &mut T| WasiConfig::from(t.config().vars()))?;
    let mut keys = linker.instance("plimsoll:provider/config-keys@0.1.0")?;
    keys.func_wrap_async(
        "declare",
        |mut store: StoreContextMut<'_, T>,
         (key, meaning, default, changes): (WasmStr, WasmStr, Option<WasmStr>, bool)| {
            let d = read_declaration(&store, &key, &meaning, default.as_ref(), changes);
            let ok = match store.data_mut().config() {
                ConfigState::Declaring(state) => state.declare(d),
                ConfigState::Settled(_) => false,
            };
            Box::new(async move { Ok((ok,)) })
        },
    )?;
    keys.func_wrap_async(
        "reject",
        |mut store: StoreContextMut<'_, T>, (key, why): (WasmStr, WasmStr)| {
            let key = read_key(&store, &key).unwrap_or_else(|_| "(malformed key)".into());
            let why = match why.to_str(store.as_context()) {
                Ok(text) => sanitize(&text, WHY_BYTES),
                Err(_) => "(no reason given)".into(),
            };
            if let ConfigState::Declaring(state) = store.data_mut().config() {
                state.reject(&key, why);
            }
            Box::new(async { Ok(()) })
        },
    )?;
    Ok(())
}

/// A key, checked in place before it is copied.
fn read_key<T: 'static>(store: &StoreContextMut<'_, T>, key: &WasmStr) -> Result<String, String> {
    let text = key
        .to_str(store.as_context())
        .map_err(|_| "the plugin passed an unreadable key".to_string())?;
    if !valid_key(&text) {
        return Err(format!(
            "the plugin declared a malformed key {:?} (1-64 of a-z, 0-9, '.', '_', '-')",
            sanitize(truncate(&text, 64), 64)
        ));
    }
    Ok(text.into_owned())
}

fn read_declaration<T: 'static>(
    store: &StoreContextMut<'_, T>,
    key: &WasmStr,
    meaning: &WasmStr,
    default: Option<&WasmStr>,
    changes_what_runs: bool,
) -> Result<Declared, String> {
    let key = read_key(store, key)?;
    let meaning = meaning
        .to_str(store.as_context())
        .map_err(|_| format!("key {key:?}: an unreadable meaning"))?;
    if meaning.len() > MEANING_BYTES || meaning.contains('\n') {
        return Err(format!(
            "key {key:?}: its meaning must be one line of at most {MEANING_BYTES} bytes"
        ));
    }
    let meaning = sanitize(&meaning, MEANING_BYTES);
    let default = match default {
        None => None,
        Some(d) => {
            let d = d
                .to_str(store.as_context())
                .map_err(|_| format!("key {key:?}: an unreadable default"))?;
            if d.len() > MAX_VALUE_BYTES {
                return Err(format!(
                    "key {key:?}: its default is longer than {MAX_VALUE_BYTES} bytes"
                ));
            }
            Some(d.into_owned())
        }
    };
    Ok(Declared {
        key,
        meaning,
        default,
        changes_what_runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decl(key: &str, default: Option<&str>, changes: bool) -> Result<Declared, String> {
        Ok(Declared {
            key: key.into(),
            meaning: format!("what {key} is"),
            default: default.map(str::to_string),
            changes_what_runs: changes,
        })
    }

    fn declaring(json: &str) -> Declaring {
        match ConfigState::declaring(Arc::new(OperatorValues::parse(json).unwrap())) {
            ConfigState::Declaring(d) => *d,
            ConfigState::Settled(_) => unreachable!(),
        }
    }

    #[test]
    fn every_problem_is_listed_at_once() {
        let mut d = declaring(r#"{"imgae": "x", "size": "huge"}"#);
        assert!(d.declare(decl("image", None, true)));
        assert!(d.declare(decl("size", Some("small"), true)));
        assert!(!d.declare(decl("size", Some("small"), true)));
        assert!(!d.declare(Err("malformed".into())));
        d.reject("size", "must be small or large".into());
        let problems = d.settle().unwrap_err();
        let all = problems.join("\n");
        for needle in [
            "unknown key \"imgae\" (this plugin reads: image, size)",
            "missing required key \"image\"",
            "refused the value of \"size\": must be small or large",
            "declared key \"size\" twice",
            "malformed",
        ] {
            assert!(all.contains(needle), "{needle} not in {all}");
        }
        assert_eq!(problems.len(), 5, "{all}");
    }

    #[test]
    fn the_problems_kept_are_bounded() {
        let mut d = declaring("{}");
        for _ in 0..10_000 {
            d.reject("k", "no".into());
        }
        let problems = d.settle().unwrap_err();
        assert_eq!(problems.len(), MAX_PROBLEMS + 1);
        assert!(problems[MAX_PROBLEMS].starts_with("9936 more problem(s) not listed"));
    }

    #[test]
    fn more_than_the_key_budget_is_refused() {
        let mut d = declaring("{}");
        for i in 0..MAX_KEYS {
            assert!(d.declare(decl(&format!("k{i}"), Some("v"), false)));
        }
        assert!(!d.declare(decl("one-more", Some("v"), false)));
        assert!(d.settle().unwrap_err()[0].contains("more than 64"));
    }

    #[test]
    fn the_digest_names_only_values_that_change_what_runs() {
        let settle = |json: &str| {
            let mut d = declaring(json);
            assert!(d.declare(decl("image", Some("a"), true)));
            assert!(d.declare(decl("log-level", Some("info"), false)));
            d.settle().unwrap()
        };
        let base = settle("{}");
        let expected = hex::encode(Sha256::digest(br#"[["image","a"]]"#));
        assert_eq!(base.digest.as_deref(), Some(expected.as_str()));
        assert_eq!(settle(r#"{"log-level": "debug"}"#).digest, base.digest);
        assert_eq!(settle(r#"{"image": "a"}"#).digest, base.digest);
        assert_ne!(settle(r#"{"image": "b"}"#).digest, base.digest);
        let mut none = declaring("{}");
        assert!(none.declare(decl("log-level", Some("info"), false)));
        assert_eq!(none.settle().unwrap().digest, None);
    }

    #[test]
    fn only_declared_keys_have_values() {
        let mut d = declaring(r#"{"image": "mine"}"#);
        assert!(d.declare(decl("image", Some("theirs"), true)));
        assert!(d.declare(decl("region", Some("eu"), false)));
        assert!(d.declare(decl("optional", None, false)));
        let settled = d.settle();
        assert!(
            settled.is_err(),
            "a required key with no value is a problem"
        );
        let mut d = declaring(r#"{"image": "mine"}"#);
        assert!(d.declare(decl("image", Some("theirs"), true)));
        assert!(d.declare(decl("region", Some("eu"), false)));
        let settled = d.settle().unwrap();
        let effective: Vec<(&str, &str)> = settled
            .effective
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(effective, [("image", "mine"), ("region", "eu")]);
    }
}
