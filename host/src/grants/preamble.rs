//! A profile's preamble: JavaScript the operator wrote (or generated from an
//! OpenAPI document) that runs before the snippet, usually an SDK over the
//! grant client.
//!
//! It is read once at start and frozen with the profile. A file is read only
//! from inside the grants file's directory: resolved through cap-std, so
//! neither `..` nor a symlink can name anything outside it, and only a
//! regular file within the bound.

use std::path::Path;
use std::sync::Arc;

use cap_std::ambient_authority;
use cap_std::fs::Dir;

use crate::bounded_read::{self, Unread};

/// The largest preamble, inline or in a file.
pub const MAX_PREAMBLE_BYTES: usize = 256 << 10;

/// The preamble `inline` or `file` names, at most one of them.
pub fn load(
    inline: Option<String>,
    file: Option<&str>,
    dir: Option<&Path>,
) -> Result<Option<Arc<str>>, String> {
    let text = match (inline, file) {
        (Some(_), Some(_)) => {
            return Err("preamble and preamble_file are exclusive: name one".into());
        }
        (None, None) => return Ok(None),
        (Some(text), None) => text,
        (None, Some(name)) => {
            let dir = dir.ok_or("preamble_file needs a grants file to be relative to")?;
            read_inside(dir, name).map_err(|why| format!("preamble_file {name:?}: {why}"))?
        }
    };
    if text.len() > MAX_PREAMBLE_BYTES {
        return Err(format!(
            "the preamble is over {} KiB",
            MAX_PREAMBLE_BYTES >> 10
        ));
    }
    if text.contains('\0') {
        return Err("the preamble holds a NUL character".into());
    }
    Ok(Some(Arc::from(text)))
}

fn read_inside(dir: &Path, name: &str) -> Result<String, String> {
    if name.is_empty() || Path::new(name).is_absolute() {
        return Err("must be a path relative to the grants file's directory".into());
    }
    let root = Dir::open_ambient_dir(dir, ambient_authority())
        .map_err(|e| format!("opening {}: {e}", dir.display()))?;
    // cap-std resolves every component beneath `root` and refuses one that
    // would leave it, `..` and symlinks included.
    // Non-blocking, so a FIFO named here is refused at once instead of
    // holding the start until a writer comes.
    let mut options = cap_std::fs::OpenOptions::new();
    options.read(true);
    cap_std::fs::OpenOptionsExt::custom_flags(&mut options, bounded_read::OPEN_FLAGS);
    let file = root
        .open_with(name, &options)
        .map_err(|e| format!("cannot be read inside the grants directory: {e}"))?;
    let bytes = match bounded_read::read_opened(file.into_std(), MAX_PREAMBLE_BYTES as u64) {
        Ok((bytes, _)) => bytes,
        Err(Unread::Io(e)) => return Err(e.to_string()),
        Err(Unread::NotAFile) => return Err("is not a regular file".into()),
        Err(Unread::TooLarge) => {
            return Err(format!("is over {} KiB", MAX_PREAMBLE_BYTES >> 10));
        }
    };
    String::from_utf8(bytes).map_err(|_| "is not UTF-8 text".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_only_from_inside_the_directory() {
        let base = std::env::temp_dir().join(format!("plimsoll-preamble-{}", std::process::id()));
        let inside = base.join("grants");
        std::fs::create_dir_all(inside.join("sub")).unwrap();
        std::fs::write(inside.join("sdk.js"), "globalThis.x = 1;").unwrap();
        std::fs::write(inside.join("sub/deep.js"), "1").unwrap();
        std::fs::write(base.join("outside.js"), "stolen").unwrap();
        std::os::unix::fs::symlink(base.join("outside.js"), inside.join("link.js")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", inside.join("abs.js")).unwrap();
        std::fs::write(inside.join("big.js"), vec![b'x'; MAX_PREAMBLE_BYTES + 1]).unwrap();
        let fifo =
            std::ffi::CString::new(inside.join("fifo.js").into_os_string().into_encoded_bytes())
                .unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates a node.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let dir = Some(inside.as_path());
        let load = |name: &str| load(None, Some(name), dir);

        assert_eq!(
            load("sdk.js").unwrap().as_deref(),
            Some("globalThis.x = 1;")
        );
        assert_eq!(load("sub/deep.js").unwrap().as_deref(), Some("1"));
        for escape in [
            "../outside.js",
            "link.js",
            "abs.js",
            "fifo.js",
            "/etc/passwd",
            "sub",
            "big.js",
            "",
        ] {
            assert!(load(escape).is_err(), "{escape:?} was read");
        }
        assert!(
            super::load(None, Some("sdk.js"), None).is_err(),
            "read without a directory"
        );
        assert!(
            super::load(Some("1".into()), Some("sdk.js"), dir).is_err(),
            "both named"
        );
        assert!(
            super::load(Some("a\0b".into()), None, dir).is_err(),
            "a NUL"
        );
        std::fs::remove_dir_all(&base).unwrap();
    }
}
