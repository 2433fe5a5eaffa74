//! The process's open-file limit, and how many connections fit under it.
//!
//! Every connection is a file descriptor, and so is everything else the
//! daemon opens (the engine's socket, run directories, plugin files). If
//! connections could use them all, an attacker holding idle connections
//! would make every other open fail. So the soft limit is raised to the hard
//! limit at start, and connections are capped well below it.

/// Raises the soft open-file limit to the hard limit; returns the soft
/// limit now in force (the old one if it could not be raised).
pub fn raise() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct they
    // are given, which lives on this stack frame.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return raised.rlim_cur;
            }
        }
    }
    lim.rlim_cur
}

/// Most connections the API may hold under an open-file limit of `nofile`:
/// a quarter of the descriptors (at least 512) stay for everything else.
pub fn connection_ceiling(nofile: u64) -> usize {
    let reserve = (nofile / 4).max(512);
    nofile.saturating_sub(reserve).clamp(16, 16_384) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_leaves_room() {
        assert_eq!(connection_ceiling(20_000), 15_000);
        assert_eq!(connection_ceiling(1024), 512);
        assert_eq!(connection_ceiling(100), 16);
        assert_eq!(connection_ceiling(1 << 20), 16_384);
    }
}
