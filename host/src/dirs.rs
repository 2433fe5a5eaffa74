//! Directory handles for everything the daemon creates, writes or reads
//! under a directory it does not fully own by path: the grant broker's run
//! directories and their root, the gVisor sandboxes' host cgroups, the
//! plugin directory, the clients file.
//!
//! A directory is opened once, by path, without following a symlink at its
//! last component; everything after goes through the handle (cap-std), so
//! no `..`, absolute path or symlink swapped in between a check and a use
//! can send a create, write or read anywhere else. Subdirectories are
//! opened the same way, never by a path built from a string.

use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use cap_fs_ext::DirExt;
pub use cap_std::fs::Dir;

/// Opens a directory only this daemon can write (the compile cache, the
/// embedded state store), creating it mode 0700 if it is absent. Refused
/// unless it is owned by the daemon's user with no access for anyone else,
/// and every directory above it (symlinks resolved) is owned by root or the
/// daemon's user and writable by no one else unless sticky (`/tmp`): no
/// other local user can put a file there or swap the directory. Returns the
/// handle and the resolved path.
pub fn open_private(path: &Path) -> io::Result<(Dir, std::path::PathBuf)> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if !path.is_absolute() {
        return Err(io::Error::other("the directory must be an absolute path"));
    }
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let real = path.canonicalize()?;
    let me = euid();
    for ancestor in real.ancestors().skip(1) {
        let m = std::fs::symlink_metadata(ancestor)?;
        let others_write = m.mode() & 0o022 != 0;
        let sticky = m.mode() & 0o1000 != 0;
        if (m.uid() != 0 && m.uid() != me) || (others_write && !sticky) {
            return Err(io::Error::other(format!(
                "{} can be changed by another user",
                ancestor.display()
            )));
        }
    }
    let dir = open_nofollow(&real)?;
    let m = dir.dir_metadata()?;
    if cap_std::fs::MetadataExt::uid(&m) != me || cap_std::fs::MetadataExt::mode(&m) & 0o077 != 0 {
        return Err(io::Error::other(format!(
            "{} must be owned by this user with mode 0700",
            real.display()
        )));
    }
    Ok((dir, real))
}

/// Opens the directory at `path`, refusing a symlink at its last component.
/// The components before it are resolved as the system does (`/var/run` is
/// a symlink on Debian).
pub fn open_nofollow(path: &Path) -> io::Result<Dir> {
    let (parent, name) = match (path.parent(), path.file_name()) {
        (Some(p), Some(n)) if !p.as_os_str().is_empty() => (p, n),
        _ => {
            return Dir::open_ambient_dir(path, cap_std::ambient_authority());
        }
    };
    let parent = Dir::open_ambient_dir(parent, cap_std::ambient_authority())?;
    parent.open_dir_nofollow(name)
}

/// Opens the subdirectory `name` of `dir`, refusing a symlink.
pub fn sub_nofollow(dir: &Dir, name: &str) -> io::Result<Dir> {
    dir.open_dir_nofollow(name)
}

/// The path of `name` inside the directory `dir` holds open, through the
/// process's own descriptor table: whatever is later renamed or swapped in
/// at the directory's old path, this names the directory the handle holds.
/// For the few calls that take only a path (binding a Unix socket).
pub fn path_in(dir: &Dir, name: &str) -> std::path::PathBuf {
    Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name)
}

/// The directory holding the file at `path`, opened, and the file's name
/// in it.
pub fn parent_of(path: &Path) -> io::Result<(Dir, std::ffi::OsString)> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} names no file", path.display())))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok((
        Dir::open_ambient_dir(parent, cap_std::ambient_authority())?,
        name.to_os_string(),
    ))
}

/// Reads the regular file `name` in `dir`; a symlink or anything but a
/// regular file is refused.
pub fn read_nofollow(dir: &Dir, name: &std::ffi::OsStr) -> io::Result<Vec<u8>> {
    use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
    use std::io::Read;
    let mut options = cap_std::fs::OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No);
    let mut file = dir.open_with(name, &options)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Replaces `name` in `dir` whole: a new file (mode `mode`, never an
/// existing one) written and synced beside it, then renamed over it and the
/// directory synced, all within the directory the handle holds.
pub fn replace(dir: &Dir, name: &std::ffi::OsStr, bytes: &[u8], mode: u32) -> io::Result<()> {
    use cap_std::fs::OpenOptionsExt;
    use std::io::Write;
    let mut tmp = name.to_os_string();
    tmp.push(".tmp");
    let _ = dir.remove_file(&tmp);
    let mut options = cap_std::fs::OpenOptions::new();
    options.write(true).create_new(true).mode(mode);
    let written = (|| {
        let mut out = dir.open_with(&tmp, &options)?;
        out.write_all(bytes)?;
        out.sync_all()?;
        dir.rename(&tmp, dir, name)?;
        // The rename is in the directory's own data: synced too, or a
        // power cut could bring the old file back.
        std::fs::File::open(self_path(dir))?.sync_all()
    })();
    if written.is_err() {
        let _ = dir.remove_file(&tmp);
    }
    written
}

/// The directory `dir` holds, named through the process's descriptor table,
/// for the calls that take only a path (its ownership and mode: the handle
/// itself is opened for lookups only, where fchown and fchmod do not work).
pub fn self_path(dir: &Dir) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()))
}

/// The effective uid: the user whose files the daemon (or the CLI) may
/// trust as its own.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("plimsoll-dirs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch");
        d
    }

    #[test]
    fn a_symlink_at_the_last_component_is_refused() {
        let base = scratch("last");
        std::fs::create_dir(base.join("real")).expect("real");
        std::os::unix::fs::symlink(base.join("real"), base.join("link")).expect("link");
        assert!(open_nofollow(&base.join("real")).is_ok());
        assert!(open_nofollow(&base.join("link")).is_err());
        let d = open_nofollow(&base).expect("base");
        assert!(sub_nofollow(&d, "link").is_err());
        assert!(sub_nofollow(&d, "real").is_ok());
        assert!(sub_nofollow(&d, "../real").is_err(), "no way up");
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn a_handle_keeps_its_directory_when_the_path_is_swapped() {
        let base = scratch("swap");
        std::fs::create_dir(base.join("run")).expect("run");
        std::fs::create_dir(base.join("elsewhere")).expect("elsewhere");
        let run = open_nofollow(&base.join("run")).expect("run");
        // The path now names a symlink to somewhere else...
        std::fs::rename(base.join("run"), base.join("moved")).expect("move");
        std::os::unix::fs::symlink(base.join("elsewhere"), base.join("run")).expect("swap");
        // ...but writes through the handle land in the directory opened.
        run.write("f", b"x").expect("write");
        assert!(base.join("moved/f").exists());
        assert!(!base.join("elsewhere/f").exists());
        // And the descriptor path names it too.
        std::os::unix::net::UnixListener::bind(path_in(&run, "s")).expect("bind");
        assert!(base.join("moved/s").exists());
        assert!(!base.join("elsewhere/s").exists());
        // A handle refuses an absolute path or a way up.
        assert!(run.write("/etc/plimsoll-test", b"x").is_err());
        assert!(run.write("../elsewhere/g", b"x").is_err());
        assert!(!base.join("elsewhere/g").exists());
        let _ = std::fs::remove_dir_all(&base);
    }
}
