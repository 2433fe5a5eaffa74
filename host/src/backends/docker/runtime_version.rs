//! Which gVisor the kernel tier rests on. A runsc older than the release
//! the workload corpus (tests/workloads) was proven with is refused at
//! start: Debian 12's own runsc (2022-12-19) answers coreutils' statx with
//! EINVAL, so `ls`, `ls -la` and `stat` fail in every sandbox it runs, and
//! a four-year-old gVisor is a security cost of its own. The version is
//! the executable's own statement, read once at start with a fixed
//! argument and no environment; readiness then holds the executable to
//! the file it was (`verify::FileIdentity`), so a runsc swapped later is
//! noticed without running it again.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// The oldest gVisor release (its date) the kernel tier accepts: the one
/// the corpus passed under (Debian's `0.0~20240729.0`).
pub(super) const MIN_RUNSC_RELEASE: u32 = 20_240_729;

/// How long `runsc --version` may take.
const VERSION_TIME: Duration = Duration::from_secs(10);
/// More than any version banner needs.
const VERSION_BYTES: usize = 4096;

/// Reads the version the runsc at `path` states, and refuses one older
/// than `MIN_RUNSC_RELEASE` or one whose version cannot be read.
pub(super) async fn runsc_version(path: &Path) -> Result<String, String> {
    let run = tokio::process::Command::new(path)
        .arg("--version")
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(VERSION_TIME, run).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(format!("running {} --version: {e}", path.display())),
        Err(_) => {
            return Err(format!(
                "{} --version did not answer within {} s",
                path.display(),
                VERSION_TIME.as_secs()
            ));
        }
    };
    if !out.status.success() {
        return Err(format!(
            "{} --version exited {}",
            path.display(),
            out.status
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout[..out.stdout.len().min(VERSION_BYTES)]);
    check_runsc_version(&text)
}

/// The version from `runsc --version`'s first line, if its release is
/// new enough. Debian states `0.0~YYYYMMDD.N`, upstream `release-YYYYMMDD.N`.
pub(super) fn check_runsc_version(banner: &str) -> Result<String, String> {
    let line = banner.lines().next().unwrap_or("");
    let Some(version) = line.strip_prefix("runsc version ").map(str::trim) else {
        return Err(format!(
            "runsc --version printed {:?}, not a version this host can read",
            crate::text::sanitize(line, 100)
        ));
    };
    let version = crate::text::sanitize(version, 64);
    let Some(release) = release_date(&version) else {
        return Err(format!(
            "runsc states version {version:?}, whose release date this host cannot read; the kernel tier needs a gVisor release of {MIN_RUNSC_RELEASE} or later"
        ));
    };
    if release < MIN_RUNSC_RELEASE {
        return Err(format!(
            "runsc {version} is older than the gVisor release {MIN_RUNSC_RELEASE} the workload corpus was proven with (older ones fail `ls` and `stat`); scripts/setup.sh installs the pinned one"
        ));
    }
    Ok(version)
}

/// `20240729` from `0.0~20240729.0`, `release-20240729.0` or `20240729.0`.
fn release_date(version: &str) -> Option<u32> {
    let rest = version
        .strip_prefix("0.0~")
        .or_else(|| version.strip_prefix("release-"))
        .unwrap_or(version);
    let digits = rest.split(['.', '-', '+']).next()?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proven_release_and_newer_pass() {
        // Recorded from Debian's bookworm-backports runsc.
        let v = check_runsc_version("runsc version 0.0~20240729.0\nspec: 1.1.0-rc.1\n")
            .expect("proven release");
        assert_eq!(v, "0.0~20240729.0");
        // Upstream's own spelling.
        assert!(check_runsc_version("runsc version release-20251110.0\nspec: 1.1.0\n").is_ok());
    }

    #[test]
    fn debian_12s_runsc_and_unreadable_versions_are_refused() {
        // Recorded from Debian 12's runsc, under which `ls` fails.
        let e = check_runsc_version("runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n")
            .expect_err("2022 release");
        assert!(e.contains("older than the gVisor release 20240729"), "{e}");
        for bad in [
            "",
            "gVisor\n",
            "runsc version\n",
            "runsc version 0.0~2024.0\n",
            "runsc version latest\n",
            "runsc version 0.0~2024072x.0\n",
        ] {
            assert!(check_runsc_version(bad).is_err(), "{bad:?} passed");
        }
    }
}
