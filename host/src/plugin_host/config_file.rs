//! The operator's values for a plugin's configuration keys: one JSON object
//! of strings, in the file `SANDBOX_PLUGIN_CONFIG_FILE` names. Read once at
//! start, strictly: a repeated key (which JSON parsers disagree on), a value
//! that is not a string, a malformed key and trailing data are all refused,
//! so what the operator wrote is exactly what the plugin is given. Which
//! keys are right is the plugin's to say (`capabilities::config_keys`).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};

/// Largest file read: the values are settings, not data.
pub const MAX_FILE_BYTES: u64 = 64 << 10;
/// Most keys a plugin may declare, and an operator may set.
pub const MAX_KEYS: usize = 64;
/// Longest value, the operator's or a plugin's default.
pub const MAX_VALUE_BYTES: usize = 4096;

/// A key as both sides spell it: 1-64 of `a-z 0-9 . _ -`, starting with a
/// letter or digit, so it can be printed in a log or an error as is.
pub fn valid_key(key: &str) -> bool {
    (1..=64).contains(&key.len())
        && key.as_bytes()[0].is_ascii_alphanumeric()
        && key.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
}

/// The operator's values, by key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorValues(BTreeMap<String, String>);

impl OperatorValues {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Reads and parses the file at `path` (a regular file, at most 64 KiB).
    pub fn read(path: &std::path::Path) -> Result<OperatorValues, String> {
        use crate::bounded_read::{Unread, read_regular};
        let bytes = match read_regular(path, MAX_FILE_BYTES) {
            Ok((bytes, _)) => bytes,
            Err(Unread::Io(e)) => return Err(format!("cannot read it: {e}")),
            Err(Unread::NotAFile) => return Err("it is not a regular file".into()),
            Err(Unread::TooLarge) => {
                return Err(format!("it is larger than {} KiB", MAX_FILE_BYTES >> 10));
            }
        };
        let text = String::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_string())?;
        OperatorValues::parse(&text)
    }

    pub fn parse(text: &str) -> Result<OperatorValues, String> {
        let mut de = serde_json::Deserializer::from_str(text);
        let values = de.deserialize_map(StrictMap).map_err(|e| e.to_string())?;
        de.end()
            .map_err(|_| "trailing data after the JSON object".to_string())?;
        Ok(values)
    }
}

/// A JSON object of strings that refuses a key seen twice (serde's own maps
/// keep the last, silently).
struct StrictMap;

impl<'de> Visitor<'de> for StrictMap {
    type Value = OperatorValues;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object whose values are all strings")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OperatorValues, A::Error> {
        use serde::de::Error;
        let mut out = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            if !valid_key(&key) {
                return Err(A::Error::custom(format!(
                    "key {:?} must be 1-64 of a-z, 0-9, '.', '_', '-', starting with a letter or digit",
                    crate::text::truncate(&key, 64)
                )));
            }
            let value: String = map
                .next_value()
                .map_err(|_| A::Error::custom(format!("the value of {key:?} must be a string")))?;
            if value.len() > MAX_VALUE_BYTES {
                return Err(A::Error::custom(format!(
                    "the value of {key:?} is longer than {MAX_VALUE_BYTES} bytes"
                )));
            }
            if out.len() == MAX_KEYS {
                return Err(A::Error::custom(format!("more than {MAX_KEYS} keys")));
            }
            if out.insert(key.clone(), value).is_some() {
                return Err(A::Error::custom(format!("key {key:?} appears twice")));
            }
        }
        Ok(OperatorValues(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flat_object_of_strings_is_read() {
        let v = OperatorValues::parse(r#"{"template": "base", "cpu.count": "2"}"#).unwrap();
        assert_eq!(v.get("template"), Some("base"));
        assert_eq!(v.keys().collect::<Vec<_>>(), ["cpu.count", "template"]);
        assert!(OperatorValues::parse("{}").unwrap().is_empty());
    }

    #[test]
    fn anything_ambiguous_is_refused() {
        for (text, why) in [
            (r#"{"a": "1", "a": "2"}"#, "appears twice"),
            (r#"{"a": 1}"#, "must be a string"),
            (r#"{"a": null}"#, "must be a string"),
            (r#"{"a": "1"} {}"#, "trailing data"),
            (r#"{"A": "1"}"#, "must be 1-64"),
            (r#"{"": "1"}"#, "must be 1-64"),
            (r#"{"-a": "1"}"#, "must be 1-64"),
            (r#"["a"]"#, "object"),
        ] {
            let err = OperatorValues::parse(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
        let long = format!(r#"{{"a": "{}"}}"#, "x".repeat(MAX_VALUE_BYTES + 1));
        assert!(OperatorValues::parse(&long).unwrap_err().contains("longer"));
        let many: Vec<String> = (0..=MAX_KEYS).map(|i| format!(r#""k{i}": "v""#)).collect();
        let many = format!("{{{}}}", many.join(","));
        assert!(
            OperatorValues::parse(&many)
                .unwrap_err()
                .contains("more than")
        );
    }

    #[test]
    fn a_file_over_the_limit_is_refused_unread() {
        let dir = std::env::temp_dir().join(format!("plimsoll-pcfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.json");
        let pad = " ".repeat(MAX_FILE_BYTES as usize);
        std::fs::write(&path, format!("{{}}{pad}")).unwrap();
        assert!(OperatorValues::read(&path).unwrap_err().contains("larger"));
        std::fs::write(&path, r#"{"image": "x"}"#).unwrap();
        assert_eq!(OperatorValues::read(&path).unwrap().get("image"), Some("x"));
        assert!(OperatorValues::read(&dir).unwrap_err().contains("regular"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
