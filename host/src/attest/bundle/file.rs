//! Opening a bundle's file to write to it: the checks on the file itself
//! (a regular file of this user's, not readable by others unless shared,
//! never reached through a symlink at its own name).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::{Sharing, io_error};
use crate::attest::AttestError;

/// Opens (or creates, owner-only) the bundle for an append. A bundle others
/// may read or write is refused unless the caller asked for a shared one;
/// a symlink is never followed.
pub(super) fn open_for_append(path: &Path, sharing: Sharing) -> Result<File, AttestError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io_error(&format!("opening {}", path.display()), e))?;
    let meta = file
        .metadata()
        .map_err(|e| io_error(&format!("reading {}", path.display()), e))?;
    if !meta.file_type().is_file() {
        return Err(AttestError::Format(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    if meta.uid() != crate::dirs::euid() && sharing == Sharing::Private {
        return Err(AttestError::Key(format!(
            "{} belongs to another user; use a file of your own, or ask for a shared bundle",
            path.display()
        )));
    }
    if meta.mode() & 0o077 != 0 && sharing == Sharing::Private {
        return Err(AttestError::Key(format!(
            "{} may be read or written by others (mode {:o}); use a private file, or ask for a shared bundle",
            path.display(),
            meta.mode() & 0o777
        )));
    }
    Ok(file)
}
