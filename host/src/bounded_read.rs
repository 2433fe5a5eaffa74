//! Reading a file someone named on a command line or in the environment (a
//! key, a bundle, a request): a regular file only, and never more of it
//! than a bound.
//!
//! The file is opened without blocking, so a FIFO named in its place is
//! refused at once instead of holding the open until a writer comes, and
//! with O_NOCTTY, so a terminal never becomes this process's controlling
//! one. It is checked on the descriptor itself (no race with a rename), and
//! read no further than one byte past the bound, so `/dev/zero` or a huge
//! file costs nothing.

use std::fs::{Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Why a file was not read.
#[derive(Debug)]
pub enum Unread {
    /// It could not be opened or read.
    Io(io::Error),
    /// It is a pipe, device, socket or directory.
    NotAFile,
    /// It holds more than the bound.
    TooLarge,
}

/// The flags every file read here is opened with (see above). A caller
/// that opens through a directory handle of its own uses them too.
pub const OPEN_FLAGS: i32 = libc::O_NONBLOCK | libc::O_NOCTTY;

/// The bytes of the regular file at `path`, if at most `limit`, and its
/// metadata as read from the descriptor.
pub fn read_regular(path: &Path, limit: u64) -> Result<(Vec<u8>, Metadata), Unread> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(OPEN_FLAGS)
        .open(path)
        .map_err(Unread::Io)?;
    read_opened(file, limit)
}

/// `read_regular` for a file already opened with `OPEN_FLAGS`.
pub fn read_opened(file: std::fs::File, limit: u64) -> Result<(Vec<u8>, Metadata), Unread> {
    let meta = file.metadata().map_err(Unread::Io)?;
    if !meta.is_file() {
        return Err(Unread::NotAFile);
    }
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(Unread::Io)?;
    if bytes.len() as u64 > limit {
        return Err(Unread::TooLarge);
    }
    Ok((bytes, meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_regular_file_within_the_bound_is_read() {
        let dir = std::env::temp_dir().join(format!("plimsoll-bounded-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("f");
        std::fs::write(&file, b"12345").expect("write");
        assert_eq!(read_regular(&file, 5).expect("read").0, b"12345");
        assert!(matches!(read_regular(&file, 4), Err(Unread::TooLarge)));
        assert!(matches!(read_regular(&dir, 5), Err(Unread::NotAFile)));
        assert!(matches!(
            read_regular(Path::new("/dev/zero"), 5),
            Err(Unread::NotAFile)
        ));
        assert!(matches!(
            read_regular(&dir.join("none"), 5),
            Err(Unread::Io(_))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
