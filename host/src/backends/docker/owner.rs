//! Which daemon process made a container, in a form a later daemon on the
//! same machine can check: boot, PID namespace, user, PID and the process's
//! start time. Expiry alone lets a killed daemon's session containers (which live
//! for a session's lifetime) outlast it by half an hour; with this, the next
//! daemon that sweeps removes them as soon as it can prove their maker gone.
//!
//! The proof is deliberately narrow. A container whose label was written in
//! another boot or another PID namespace (a daemon in its own container
//! sharing the engine) is never judged by PID: our `/proc` says nothing
//! about that process, and expiry still decides for it. Nor is one written
//! by another user: with `/proc` mounted `hidepid`, another user's live
//! process looks exactly like a dead one.

use std::sync::OnceLock;

/// This process's identity, computed once.
pub(super) fn this_process() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let pid = std::process::id();
        format!(
            "{}/{}/{}/{}/{}",
            boot_id().unwrap_or_default(),
            pid_namespace().unwrap_or_default(),
            user().unwrap_or_default(),
            pid,
            start_time(pid).unwrap_or_default()
        )
    })
}

/// True only when `label` names a process of this boot, PID namespace and
/// user that no longer runs (its PID is free, or held by a process that
/// started at another time). Anything empty, unreadable or foreign answers
/// false.
pub(super) fn is_gone(label: &str) -> bool {
    let parts: Vec<&str> = label.split('/').collect();
    let [boot, ns, uid, pid, start] = parts[..] else {
        return false;
    };
    if [boot, ns, uid, pid, start].iter().any(|p| p.is_empty()) {
        return false;
    }
    let (Some(our_boot), Some(our_ns), Some(our_uid)) = (boot_id(), pid_namespace(), user()) else {
        return false;
    };
    if boot != our_boot || ns != our_ns || uid != our_uid {
        return false;
    }
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    match start_time(pid) {
        None => std::path::Path::new("/proc/self").exists(),
        Some(now) => now != start,
    }
}

/// The real user of this process, from `/proc/self/status`.
fn user() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1).map(str::to_string)
}

fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_string())
}

fn pid_namespace() -> Option<String> {
    let link = std::fs::read_link("/proc/self/ns/pid").ok()?;
    Some(link.to_string_lossy().into_owned())
}

/// Field 22 of `/proc/PID/stat`: clock ticks after boot when the process
/// started. Read after the last `)` because the command name may hold
/// spaces and parentheses.
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: state is field 3, so start time is the 20th here.
    rest.split_whitespace().nth(19).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_not_gone() {
        assert!(!is_gone(this_process()));
        assert_eq!(this_process().split('/').count(), 5);
    }

    #[test]
    fn a_dead_pid_or_a_reused_one_is_gone() {
        let me = this_process();
        let mut parts: Vec<&str> = me.split('/').collect();
        // A process that ran and exited: its PID is free (or reused, with
        // another start time).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id().to_string();
        child.wait().unwrap();
        parts[3] = &pid;
        assert!(is_gone(&parts.join("/")));
        // Our own PID with another start time: reused.
        let mut reused: Vec<&str> = me.split('/').collect();
        reused[4] = "1";
        assert!(is_gone(&reused.join("/")));
    }

    #[test]
    fn foreign_or_malformed_labels_are_never_gone() {
        let me = this_process();
        let parts: Vec<&str> = me.split('/').collect();
        let other_boot = format!("00000000-0000/{}/{}/{}", parts[1], 999_999, parts[3]);
        assert!(!is_gone(&other_boot));
        let other_ns = format!("{}/pid:[1]/{}/{}", parts[0], 999_999, parts[3]);
        assert!(!is_gone(&other_ns));
        for bad in [
            "",
            "a/b",
            "a/b/c/d/e",
            &format!("{}/{}/x/1", parts[0], parts[1]),
        ] {
            assert!(!is_gone(bad), "{bad}");
        }
    }
}
