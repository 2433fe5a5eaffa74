//! The embedded store's only file: the day's paid seconds, per caller and
//! for the daemon, so a restart does not hand every caller a fresh daily
//! allowance on a metered provider.
//!
//! The file is written, synced and renamed into place (never edited) in a
//! directory only the daemon can write (`dirs::open_private`), and a
//! reservation is on disk before the run it pays for is dispatched: a
//! crash can leave seconds booked that a run did not use (the refund is
//! lost with the process), never seconds used that are not booked.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io;
use std::path::Path;

use cap_std::fs::Dir;
use serde::{Deserialize, Serialize};

const NAME: &str = "paid-seconds.json";
/// Locked for the daemon's life: two daemons on one directory would each
/// overwrite the other's counts.
const LOCK: &str = "lock";
/// Bytes read at most: the file holds a number per caller.
const MAX_BYTES: usize = 16 << 20;

/// What the file holds: one UTC day's counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaidDay {
    /// Days since 1970-01-01, UTC.
    pub day: u64,
    pub daemon: u64,
    pub callers: BTreeMap<String, u64>,
}

pub struct PaidFile {
    dir: Dir,
    /// Holds the directory's lock while the store is open.
    _lock: std::fs::File,
}

impl PaidFile {
    /// Opens (creating if absent) the store's directory, and locks it:
    /// refused while another daemon has it open.
    pub fn open(path: &Path) -> io::Result<PaidFile> {
        use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
        use cap_std::fs::OpenOptionsExt;
        let (dir, _) = crate::dirs::open_private(path)?;
        let mut options = cap_std::fs::OpenOptions::new();
        options
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .follow(FollowSymlinks::No);
        let lock = dir.open_with(LOCK, &options)?.into_std();
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(io::Error::other(
                    "another daemon is using this directory; give each its own",
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        Ok(PaidFile { dir, _lock: lock })
    }

    /// The counts for `today`; another day's file counts as empty. A file
    /// that cannot be read or parsed is an error: starting with a fresh
    /// allowance because a file was damaged is what this file prevents.
    pub fn load(&self, today: u64) -> io::Result<PaidDay> {
        let bytes = match crate::dirs::read_nofollow(&self.dir, OsStr::new(NAME)) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(PaidDay {
                    day: today,
                    ..Default::default()
                });
            }
            Err(e) => return Err(e),
        };
        if bytes.len() > MAX_BYTES {
            return Err(io::Error::other(format!("{NAME} is larger than expected")));
        }
        let day: PaidDay = serde_json::from_slice(&bytes)
            .map_err(|e| io::Error::other(format!("{NAME} is damaged: {e}")))?;
        if day.day == today {
            Ok(day)
        } else {
            Ok(PaidDay {
                day: today,
                ..Default::default()
            })
        }
    }

    /// Replaces the file with `day`, synced before it is renamed in.
    pub fn write(&self, day: &PaidDay) -> io::Result<()> {
        let bytes = serde_json::to_vec(day).map_err(io::Error::other)?;
        crate::dirs::replace(&self.dir, OsStr::new(NAME), &bytes, 0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn private_dir() -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!(
            "plimsoll-paid-{}-{}",
            std::process::id(),
            crate::callers::new_token().expect("random")
        ));
        std::fs::create_dir(&p).expect("mkdir");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        p
    }

    #[test]
    fn the_days_counts_survive_and_another_day_starts_empty() {
        let dir = private_dir();
        let f = PaidFile::open(&dir).expect("open");
        assert_eq!(f.load(7).expect("empty").daemon, 0);
        let mut day = PaidDay {
            day: 7,
            daemon: 12,
            ..Default::default()
        };
        day.callers.insert("alice".into(), 12);
        f.write(&day).expect("write");
        drop(f);
        let again = PaidFile::open(&dir).expect("reopen");
        assert_eq!(again.load(7).expect("same day"), day);
        assert_eq!(again.load(8).expect("next day").daemon, 0);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn one_directory_serves_one_daemon_at_a_time() {
        let dir = private_dir();
        let first = PaidFile::open(&dir).expect("open");
        assert!(PaidFile::open(&dir).is_err(), "a second holder");
        drop(first);
        assert!(
            PaidFile::open(&dir).is_ok(),
            "free once the first is closed"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn a_damaged_file_is_an_error_not_a_fresh_allowance() {
        let dir = private_dir();
        std::fs::write(dir.join(NAME), b"{\"day\": 7, \"daemon\": ").expect("write");
        let f = PaidFile::open(&dir).expect("open");
        assert!(f.load(7).is_err());
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        let dir = private_dir();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert!(PaidFile::open(&dir).is_err());
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
