//! What `plimsoll run` reads and writes on this machine: the snippet, a
//! project directory's files, and the artifacts it was asked for.
//!
//! All of it is bounded and follows no link it did not name: the snippet is
//! read only from a regular file and only up to the API's bound; a project
//! is walked through directory handles without following symlinks or
//! opening pipes and devices; artifacts are written only under the names
//! asked for, through handles, replacing (never writing through) whatever
//! is at the name. An answer is the daemon's (or a plugin's) word, so
//! nothing in it chooses where a file goes.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::path::Path;

use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt, OpenOptionsSyncExt};
use plimsoll::admission::{
    MAX_ARTIFACTS, MAX_CODE_BYTES, MAX_PATH_BYTES, MAX_PROJECT_BYTES, MAX_PROJECT_FILES,
    valid_relative_path,
};
use plimsoll::api::MAX_REQUEST_BYTES;
use plimsoll::bounded_read::{self, Unread};
use plimsoll::dirs::Dir;
use serde_json::{Value, json};

use crate::client;

/// The snippet at `path`: a regular file of UTF-8 text, at most the API's
/// bound for a snippet.
pub(crate) fn read_snippet(path: &Path) -> Result<String, String> {
    let bytes = read_bounded(path, MAX_CODE_BYTES, "a snippet")?;
    String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8 text", path.display()))
}

/// A request written as JSON (`plimsoll attest run`), at most what the API
/// reads as a body.
pub(crate) fn read_request(path: &Path) -> Result<Value, String> {
    let bytes = read_bounded(path, MAX_REQUEST_BYTES, "a request")?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: not JSON: {e}", path.display()))
}

/// The bytes of the regular file at `path`, if at most `limit`
/// (`plimsoll::bounded_read`: a pipe, device or directory is not read, and
/// nothing past the bound).
fn read_bounded(path: &Path, limit: usize, what: &str) -> Result<Vec<u8>, String> {
    let shown = path.display();
    match bounded_read::read_regular(path, limit as u64) {
        Ok((bytes, _)) => Ok(bytes),
        Err(Unread::Io(e)) => Err(format!("{shown}: {e}")),
        Err(Unread::NotAFile) => Err(format!(
            "{shown}: not a regular file (a pipe, device or directory is not read)"
        )),
        Err(Unread::TooLarge) => Err(format!(
            "{shown}: larger than the {} KiB the daemon accepts for {what}",
            limit >> 10
        )),
    }
}

/// Reads everything `from` holds if that is at most `limit` bytes; `None`
/// if there is more. Never reads more than `limit + 1` bytes.
fn read_at_most(from: impl Read, limit: usize) -> io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    from.take(limit as u64 + 1).read_to_end(&mut bytes)?;
    Ok((bytes.len() <= limit).then_some(bytes))
}

/// The `--artifact` names, checked before anything is sent: each a clean
/// relative path (subdirectories allowed; no `.` or `..` part, no leading
/// `/`, no backslash or control character), given once, as many as the API
/// takes. The daemon checks the same; checking here as well means that
/// only a name that passed this check is ever written.
pub(crate) fn check_artifact_names(names: &[String]) -> Result<(), String> {
    if names.len() > MAX_ARTIFACTS {
        return Err(format!("at most {MAX_ARTIFACTS} --artifact paths"));
    }
    let mut seen = HashSet::new();
    for name in names {
        if !valid_relative_path(name) {
            return Err(format!(
                "--artifact {name:?}: want a relative path in the project, without `.` or `..` parts"
            ));
        }
        if !seen.insert(name.as_str()) {
            return Err(format!("--artifact {name:?} is given twice"));
        }
    }
    Ok(())
}

/// Every regular file under `dir`, by relative path; contents must be
/// UTF-8, as the API carries them. `dir` itself is opened as given; below
/// it, everything goes through directory handles: a symlink is never
/// followed (one found is skipped, one swapped in while reading is
/// refused), a pipe or device is never opened, and what is read is held to
/// the API's bounds (files, bytes, path length) as it is read, not as it
/// was listed.
pub(crate) fn project_files(dir: &Path) -> Result<Vec<Value>, String> {
    let root = Dir::open_ambient_dir(dir, cap_std::ambient_authority())
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut walk = ProjectWalk {
        top: dir,
        files: Vec::new(),
        bytes: 0,
    };
    walk.directory(&root, "")?;
    Ok(walk.files)
}

struct ProjectWalk<'a> {
    top: &'a Path,
    files: Vec<Value>,
    bytes: usize,
}

impl ProjectWalk<'_> {
    fn too_big(&self) -> String {
        format!(
            "{}: a project is at most {MAX_PROJECT_FILES} files and {} MiB",
            self.top.display(),
            MAX_PROJECT_BYTES >> 20
        )
    }

    /// The files under `d`, whose relative path is `prefix` ("" at the top).
    /// Depth-first, holding one directory handle per level; the path length
    /// bound keeps the depth (and so the open handles) bounded.
    fn directory(&mut self, d: &Dir, prefix: &str) -> Result<(), String> {
        let top = self.top;
        let here = |e: io::Error| format!("{}: {e}", top.join(prefix).display());
        // By name, so a project is sent the same way every time.
        let mut entries = std::collections::BTreeMap::new();
        for entry in d.entries().map_err(here)? {
            let entry = entry.map_err(here)?;
            // lstat: a symlink is reported as one, not as what it names.
            let kind = entry.metadata().map_err(here)?.file_type();
            entries.insert(entry.file_name(), kind);
        }
        for (name, kind) in entries {
            if !(kind.is_dir() || kind.is_file()) {
                // Symlinks, pipes, sockets and devices are not sent.
                continue;
            }
            let rel = match name.to_str() {
                Some(n) if prefix.is_empty() => n.to_string(),
                Some(n) => format!("{prefix}/{n}"),
                None => {
                    return Err(format!(
                        "{}: the name is not UTF-8",
                        top.join(prefix).join(&name).display()
                    ));
                }
            };
            if rel.len() > MAX_PATH_BYTES {
                return Err(format!(
                    "{}: a path in the project is longer than the {MAX_PATH_BYTES} bytes the API takes",
                    top.display()
                ));
            }
            let shown = || top.join(&rel).display().to_string();
            if kind.is_dir() {
                let sub = d
                    .open_dir_nofollow(&name)
                    .map_err(|e| format!("{}: {e}", shown()))?;
                self.directory(&sub, &rel)?;
                continue;
            }
            if self.files.len() >= MAX_PROJECT_FILES {
                return Err(self.too_big());
            }
            let room = MAX_PROJECT_BYTES - self.bytes;
            let bytes = read_regular(d, &name, room)
                .map_err(|e| format!("{}: {e}", shown()))?
                .ok_or_else(|| self.too_big())?;
            self.bytes += bytes.len();
            let content = String::from_utf8(bytes)
                .map_err(|_| format!("{}: not UTF-8 (files must be UTF-8 text)", shown()))?;
            self.files.push(json!({"path": rel, "content": content}));
        }
        Ok(())
    }
}

/// The regular file `name` in `d`, if it holds at most `limit` bytes. Not
/// followed if it is now a symlink, not waited on if it is now a pipe, and
/// refused unless the descriptor opened is a regular file.
fn read_regular(d: &Dir, name: &OsStr, limit: usize) -> io::Result<Option<Vec<u8>>> {
    let mut options = cap_std::fs::OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No).nonblock(true);
    let file = d.open_with(name, &options)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    read_at_most(file, limit)
}

/// Writes the answer's artifacts under `out`, but only those the command
/// line asked for (names already checked by `check_artifact_names`), each
/// once: an answer carrying anything else (a `.git/hooks/pre-commit`, a
/// second body for a name) has it ignored and counted. `out` is created if
/// needed and opened as given; below it nothing is followed (see
/// `write_artifact`).
pub(crate) fn write_artifacts(project: &Value, asked: &[String], out: &Path) -> Result<(), String> {
    let artifacts = project["artifacts"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if artifacts.is_empty() {
        return Ok(());
    }
    let mut pending: HashSet<&str> = asked.iter().map(String::as_str).collect();
    let mut wanted = Vec::new();
    for artifact in artifacts {
        if let Some(name) = artifact["path"].as_str().filter(|p| pending.remove(*p)) {
            wanted.push((name, artifact));
        }
    }
    let ignored = artifacts.len() - wanted.len();
    if ignored > 0 {
        // The names are not printed: they are the answer's text, not ours.
        eprintln!("plimsoll: ignored {ignored} artifact(s) in the answer that were not asked for");
    }
    if wanted.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let root = Dir::open_ambient_dir(out, cap_std::ambient_authority())
        .map_err(|e| format!("{}: {e}", out.display()))?;
    for (name, artifact) in wanted {
        let target = out.join(name);
        write_artifact(&root, name, &client::bytes(&artifact["content"])).map_err(|e| {
            format!(
                "{}: {e} (nothing under --out is followed through a symlink)",
                target.display()
            )
        })?;
        eprintln!(
            "plimsoll: wrote {}",
            client::shown(&target.display().to_string())
        );
    }
    Ok(())
}

/// Writes `bytes` as `name` (a clean relative path) under `root`. Each
/// directory on the way is created if absent and opened without following
/// a symlink (one there is an error, never a way out). The file is written
/// to a new temporary name beside it (created exclusively, so nothing that
/// exists, link or not, is opened) and renamed over `name`: whatever was at
/// `name` (a symlink, a hard link to a file elsewhere) is replaced, never
/// written through.
fn write_artifact(root: &Dir, name: &str, bytes: &[u8]) -> io::Result<()> {
    let unclean = || io::Error::other("not a clean relative path");
    let mut parts: Vec<&str> = name.split('/').collect();
    let file = parts.pop().filter(|p| clean_part(p)).ok_or_else(unclean)?;
    let mut dir = root.try_clone()?;
    for part in parts {
        if !clean_part(part) {
            return Err(unclean());
        }
        match dir.create_dir(part) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        dir = dir.open_dir_nofollow(part)?;
    }
    replace_file(&dir, file, bytes)
}

fn clean_part(p: &str) -> bool {
    !p.is_empty() && p != "." && p != ".."
}

/// Replaces `name` in `dir` with a regular file holding `bytes`, by way of
/// a temporary file made with O_CREAT|O_EXCL (never an existing entry) and
/// a rename, which replaces the entry at `name` itself rather than what it
/// may point to. Mode 0666 less the umask, as a plain write would.
fn replace_file(dir: &Dir, name: &str, bytes: &[u8]) -> io::Result<()> {
    use cap_std::fs::OpenOptionsExt;
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let mut options = cap_std::fs::OpenOptions::new();
    options
        .write(true)
        .create_new(true)
        .follow(FollowSymlinks::No)
        .mode(0o666);
    // A name taken by something else (a left-over file, a planted link) is
    // skipped, never reused.
    for _ in 0..16 {
        let tmp = format!(
            ".plimsoll-{}-{}.tmp",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut file = match dir.open_with(&tmp, &options) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        let written = file
            .write_all(bytes)
            .and_then(|()| dir.rename(&tmp, dir, name));
        drop(file);
        if written.is_err() {
            let _ = dir.remove_file(&tmp);
        }
        return written;
    }
    Err(io::Error::other("no free temporary name beside it"))
}
