//! Compiled components kept between starts, so a daemon is ready in a
//! fraction of a second instead of compiling (and, for the wasm provider,
//! snapshotting) its components on every start.
//!
//! Loading compiled code is trusting it: wasmtime runs what it deserializes
//! as machine code. So the cache is only ever used under these rules, and
//! any doubt means compiling afresh, never failing and never loading:
//!
//! - **Only the daemon can write it.** The directory is created mode 0700
//!   and must be owned by the daemon's user with no access for anyone else;
//!   every directory above it (symlinks resolved) must be owned by root or
//!   the daemon's user and writable by no one else unless sticky (`/tmp`).
//!   Another local user therefore has no way to put a file there or to
//!   swap the directory for one they control.
//! - **Opened once, used through the handle.** Files are read and written
//!   through the directory's handle, never by a path; a symlink, a file not
//!   owned by the daemon, one others can write, or one with more than one
//!   link is refused.
//! - **Keyed by everything the code depends on.** The name is the SHA-256
//!   of the cache's format version, the component's own digest, wasmtime's
//!   compatibility hash of the engine's configuration (its version, target
//!   and every setting that affects code), and the caller's inputs (the
//!   wasm provider's memory and output limits, which its snapshot was
//!   built under). A file under the key is only ever that compilation.
//! - **Checked before use.** Each file carries the SHA-256 of its payload,
//!   checked before wasmtime sees a byte: a torn or damaged file is
//!   rebuilt, not loaded. Files are written under a unique temporary name
//!   and renamed into place, so readers never see a partial file.
//!
//! What is identical either way: the bytes the daemon reports as its
//! identity (they are part of the key), and every check made on a
//! component after it is compiled.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, MetadataExt, OpenOptions, OpenOptionsExt};
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use crate::dirs::euid;

/// Bumped whenever what is stored, or how, changes.
const FORMAT: &[u8] = b"plimsoll-compile-cache-1";
const DIGEST_LEN: usize = 32;
/// Entries kept per label.
const KEEP: usize = 4;

/// An opened, checked cache directory.
pub struct CompileCache {
    dir: Dir,
    path: PathBuf,
}

impl CompileCache {
    /// Opens the cache at `path`, creating it (mode 0700) if it is absent.
    /// Refused unless the rules above hold for it and every directory above
    /// it.
    pub fn open(path: &Path) -> io::Result<CompileCache> {
        let (dir, path) = crate::dirs::open_private(path)?;
        Ok(CompileCache { dir, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The key of `component_sha256` compiled by `engine` with `inputs`,
    /// named after `label` (what it is: `quickjs-snapshot`,
    /// `plugin-<name>`), which is also the set old entries are pruned in.
    pub fn key(engine: &Engine, label: &str, component_sha256: &str, inputs: &[&[u8]]) -> String {
        let mut h = Sha256::new();
        h.update(FORMAT);
        h.update([0]);
        h.update(label.as_bytes());
        h.update([0]);
        h.update(component_sha256.as_bytes());
        h.update([0]);
        let mut compat = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut compat);
        h.update(std::hash::Hasher::finish(&compat).to_le_bytes());
        for input in inputs {
            h.update((input.len() as u64).to_le_bytes());
            h.update(input);
        }
        let label: String = label
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        format!("{label}.{}", hex::encode(h.finalize()))
    }

    /// The component stored under `key`, if there is one and every check
    /// holds; `None` means compile.
    pub fn load(&self, engine: &Engine, key: &str) -> Option<Component> {
        let name = file_name(key);
        let bytes = match self.read(&name) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(error = %e, "a compiled component in the cache was refused; compiling");
                return None;
            }
        };
        let (digest, payload) = bytes.split_at_checked(DIGEST_LEN)?;
        if Sha256::digest(payload).as_slice() != digest {
            tracing::warn!("a compiled component in the cache is damaged; compiling");
            return None;
        }
        // SAFETY: wasmtime requires that these bytes came from its own
        // `serialize` by a compatible engine. They did: only this daemon's
        // user can write the directory (checked at open), the file is
        // checked as this user's own and unshared, the key includes the
        // engine's compatibility hash, and the payload's digest matches
        // what was written. wasmtime also checks the header's version and
        // configuration itself and refuses a mismatch.
        match unsafe { Component::deserialize(engine, payload) } {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "a compiled component in the cache did not load; compiling");
                None
            }
        }
    }

    /// Stores `component` under `key`. Best effort: a cache that cannot be
    /// written costs the next start its compile, nothing else.
    pub fn store(&self, key: &str, component: &Component) {
        let stored = component
            .serialize()
            .map_err(|e| io::Error::other(format!("{e:#}")))
            .and_then(|payload| self.write(&file_name(key), &payload));
        if let Err(e) = stored {
            tracing::warn!(error = %e, "a compiled component could not be cached");
            return;
        }
        self.prune(key);
    }

    /// Keeps the newest `KEEP` entries of `key`'s label: each build of the
    /// daemon (or of a plugin) adds one, and old builds' are never used again.
    fn prune(&self, key: &str) {
        let Some((label, _)) = key.split_once('.') else {
            return;
        };
        let prefix = format!("{label}.");
        let Ok(entries) = self.dir.entries() else {
            return;
        };
        // One listing: this label's entries, by age, and any temporary file
        // a crashed start left behind (over an hour old), removed.
        let mut same: Vec<(std::time::SystemTime, OsString)> = Vec::new();
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name();
            let Some(text) = name.to_str() else { continue };
            let Some(modified) = e
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .map(|t| t.into_std())
            else {
                continue;
            };
            if text.ends_with(".tmp") {
                let stale = modified
                    .elapsed()
                    .is_ok_and(|age| age > std::time::Duration::from_secs(3600));
                if stale {
                    let _ = self.dir.remove_file(&name);
                }
            } else if text.starts_with(&prefix) && text.ends_with(".cwasm") {
                same.push((modified, name));
            }
        }
        same.sort();
        let excess = same.len().saturating_sub(KEEP);
        for (_, name) in same.into_iter().take(excess) {
            let _ = self.dir.remove_file(&name);
        }
    }

    fn read(&self, name: &OsString) -> io::Result<Vec<u8>> {
        let mut options = OpenOptions::new();
        options.read(true).follow(FollowSymlinks::No);
        let mut file = self.dir.open_with(name, &options)?;
        let m = file.metadata()?;
        if !m.is_file() || m.uid() != euid() || m.mode() & 0o022 != 0 || m.nlink() != 1 {
            return Err(io::Error::other(
                "not a regular file of this user's, unshared and unwritable by others",
            ));
        }
        let mut bytes = Vec::with_capacity(m.len() as usize);
        file.read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    fn write(&self, name: &OsString, payload: &[u8]) -> io::Result<()> {
        let mut unique = [0u8; 8];
        getrandom::fill(&mut unique).map_err(|e| io::Error::other(e.to_string()))?;
        let mut tmp = name.clone();
        tmp.push(format!(".{}.tmp", hex::encode(unique)));
        let mut options = OpenOptions::new();
        options
            .write(true)
            .create_new(true)
            .mode(0o600)
            .follow(FollowSymlinks::No);
        let written = (|| {
            let mut out = self.dir.open_with(&tmp, &options)?;
            out.write_all(&Sha256::digest(payload))?;
            out.write_all(payload)?;
            out.sync_all()?;
            self.dir.rename(&tmp, &self.dir, name)
        })();
        if written.is_err() {
            let _ = self.dir.remove_file(&tmp);
        }
        written
    }
}

fn file_name(key: &str) -> OsString {
    OsString::from(format!("{key}.cwasm"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("plimsoll-cc-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        d
    }

    #[test]
    fn a_new_cache_is_created_private() {
        let base = scratch("new");
        let c = CompileCache::open(&base.join("cache")).expect("opens");
        let mode = std::fs::metadata(c.path())
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn a_cache_anyone_else_can_reach_or_change_is_refused() {
        let base = scratch("loose");
        let cache = base.join("cache");
        std::fs::create_dir(&cache).expect("mkdir");
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o750)).expect("chmod");
        assert!(CompileCache::open(&cache).is_err(), "group access");
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        assert!(CompileCache::open(&cache).is_ok());
        // A directory above it that others may write (and not sticky).
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert!(CompileCache::open(&cache).is_err(), "writable parent");
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        assert!(
            CompileCache::open(&cache).is_ok(),
            "a sticky parent is /tmp's case"
        );
        assert!(CompileCache::open(Path::new("relative/cache")).is_err());
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn files_that_are_not_the_daemons_own_are_not_read() {
        let base = scratch("files");
        let c = CompileCache::open(&base.join("cache")).expect("opens");
        let name = OsString::from("x.cwasm");
        c.write(&name, b"payload").expect("write");
        assert!(c.read(&name).is_ok());
        let path = c.path().join("x.cwasm");
        // Shared through a second link: refused.
        std::fs::hard_link(&path, c.path().join("y.cwasm")).expect("link");
        assert!(c.read(&name).is_err());
        std::fs::remove_file(c.path().join("y.cwasm")).expect("unlink");
        // Writable by others: refused.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        assert!(c.read(&name).is_err());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        // A symlink to a file elsewhere: refused.
        std::fs::write(base.join("elsewhere"), b"x").expect("write");
        std::os::unix::fs::symlink(base.join("elsewhere"), c.path().join("z.cwasm"))
            .expect("symlink");
        assert!(c.read(&OsString::from("z.cwasm")).is_err());
        // Owned by someone else (the tests run as root, who can chown).
        if euid() == 0 {
            std::os::unix::fs::chown(&path, Some(65534), None).expect("chown");
            assert!(c.read(&name).is_err());
        }
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn a_damaged_or_foreign_file_is_never_handed_to_wasmtime() {
        let base = scratch("damaged");
        let c = CompileCache::open(&base.join("cache")).expect("opens");
        let engine = Engine::default();
        let key = CompileCache::key(&engine, "t", "00", &[]);
        // Bytes that are not what this cache wrote: the digest is wrong.
        c.write(&file_name(&key), b"not a component")
            .expect("write");
        let path = c.path().join(file_name(&key));
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[0] ^= 1;
        std::fs::write(&path, &bytes).expect("damage");
        assert!(c.load(&engine, &key).is_none());
        // Right digest, not a serialized component: wasmtime's own header
        // check refuses it.
        std::fs::remove_file(&path).expect("rm");
        c.write(&file_name(&key), b"not a component")
            .expect("write");
        assert!(c.load(&engine, &key).is_none());
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn pruning_keeps_the_newest_of_a_label_and_drops_stale_temporaries() {
        let base = scratch("prune");
        let c = CompileCache::open(&base.join("cache")).expect("opens");
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        let age = |name: &str, secs: u64| {
            let f = std::fs::File::options()
                .write(true)
                .open(c.path().join(name))
                .expect("open");
            f.set_modified(old + std::time::Duration::from_secs(secs))
                .expect("mtime");
        };
        for i in 0..6u64 {
            let name = format!("a.{i}.cwasm");
            c.write(&OsString::from(&name), b"x").expect("write");
            age(&name, i);
        }
        c.write(&OsString::from("b.0.cwasm"), b"x").expect("write");
        age("b.0.cwasm", 0);
        std::fs::write(c.path().join("a.9.cwasm.1.tmp"), b"x").expect("tmp");
        age("a.9.cwasm.1.tmp", 0);
        std::fs::write(c.path().join("a.9.cwasm.2.tmp"), b"x").expect("fresh tmp");
        c.prune("a.5");
        let mut left: Vec<String> = std::fs::read_dir(c.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "a.2.cwasm",
                "a.3.cwasm",
                "a.4.cwasm",
                "a.5.cwasm",
                "a.9.cwasm.2.tmp",
                "b.0.cwasm"
            ]
        );
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn keys_change_with_every_input() {
        let e = Engine::default();
        let k = CompileCache::key(&e, "a", "d1", &[b"x"]);
        assert!(k.starts_with("a."));
        assert_ne!(k, CompileCache::key(&e, "a", "d2", &[b"x"]));
        assert_ne!(k, CompileCache::key(&e, "a", "d1", &[b"y"]));
        assert_ne!(k, CompileCache::key(&e, "b", "d1", &[b"x"]));
        let mut cfg = wasmtime::Config::new();
        cfg.epoch_interruption(true);
        let other = Engine::new(&cfg).expect("engine");
        assert_ne!(k, CompileCache::key(&other, "a", "d1", &[b"x"]));
        assert_eq!(
            CompileCache::key(&e, "plugin-a/b", "d", &[])
                .split('.')
                .next(),
            Some("plugin-a-b")
        );
    }
}
