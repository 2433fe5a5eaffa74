//! Where a plugin's bytes come from: `<name>.wasm` in the operator's
//! plugin directory, read through a handle on that directory (nothing that
//! leads out of it), or the adapter shipped inside the daemon; and the
//! names a plugin may take.

use std::path::{Path, PathBuf};

use super::error::PluginError;

/// Names the daemon's built-in providers use; a plugin may not take them.
pub const BUILT_IN: &[&str] = &["disabled", "wasm", "docker"];

/// Where a plugin's component comes from.
#[derive(Debug, Clone)]
pub enum PluginSource {
    /// `<name>.wasm` in the operator's plugin directory.
    Dir(PathBuf),
    /// Shipped inside the daemon.
    Embedded(&'static [u8]),
}

/// The shape of a plugin name, 1-32 of `a-z 0-9 -`, whoever takes it: a
/// provider's name, or a file `plimsoll plugin check` loads (which may
/// carry a built-in name, as the docker adapter does).
pub fn name_shape(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A name the operator may give a plugin.
pub(super) fn valid_name(name: &str) -> bool {
    name_shape(name) && !BUILT_IN.contains(&name)
}

/// The plugins a directory holds, for error messages.
pub fn list_dir(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|f| f.strip_suffix(".wasm").map(str::to_string))
        .filter(|n| valid_name(n))
        .collect();
    names.sort();
    names
}

/// The file a plugin name refers to, if it is there.
pub fn locate(dir: &Path, name: &str) -> Result<PathBuf, PluginError> {
    if !valid_name(name) {
        return Err(PluginError::BadName(name.to_string()));
    }
    let path = dir.join(format!("{name}.wasm"));
    if !path.is_file() {
        let found = list_dir(dir);
        return Err(PluginError::NotFound {
            path: path.display().to_string(),
            builtin: BUILT_IN.join(", "),
            found: if found.is_empty() {
                "none".into()
            } else {
                found.join(", ")
            },
        });
    }
    Ok(path)
}

/// Reads `<name>.wasm` through a handle on the plugin directory: a name
/// that leads out of it (a symlink to elsewhere, say) is refused, and so is
/// anything but a regular file. The bytes read are the bytes pinned and
/// compiled; the file is not opened again.
pub(super) fn read_in(dir: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let d = crate::dirs::Dir::open_ambient_dir(dir, cap_std::ambient_authority())?;
    let mut file = d.open(format!("{name}.wasm"))?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["example", "remote-plimsoll", "e2b", "a"] {
            assert!(valid_name(good), "{good}");
        }
        for bad in [
            "",
            "wasm",
            "disabled",
            "Upper",
            "../x",
            "a.b",
            "x".repeat(33).as_str(),
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
