//! Sessions on hosted sandboxes: no process a call starts may outlive the
//! call (SECURITY.md, promise 13), and the services keep no such promise
//! themselves. These two shell scripts, run in the sandbox as the user the
//! calls run as, keep it: one at open finds the sandbox's main process (the
//! one process of ours to spare, found before any call's code ran, so code
//! cannot pose as it later), one after every call kills every other process
//! of ours, round after round, until a round finds none.
//!
//! `SWEEP` reads `/proc` with shell builtins only (`read`, `kill`, `[`),
//! so it forks nothing a round could race with; zombies are skipped (they
//! hold nothing but a PID) unless a thread of theirs still runs.
//! `SWEEP_MARKED` is for services whose calls run as root.

/// Prints `main=<pid>` for each process of ours whose command line is
/// exactly the script's arguments (the main process's argv), then
/// `done=yes`. Run at open, before any call.
pub const FIND_MAIN: &str = r#"want=
for a in "$@"; do want="$want$a "; done
for d in /proc/[0-9]*; do
  [ -O "$d" ] || continue
  got=$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null) || continue
  [ "$got" = "$want" ] && echo "main=${d#/proc/}"
done
echo "done=yes"
"#;

/// Kills every process of ours except PID 1, the main process (`$1`, 0 for
/// none) and the sweep's own ancestors, in up to 20 rounds; prints
/// `left=<n>`, the processes the last round still had to kill (0: none
/// outlived the call).
pub const SWEEP: &str = r#"keep=" 1 $1 "
p=$$
while [ "$p" -gt 1 ] 2>/dev/null; do
  keep="$keep$p "
  read -r s < "/proc/$p/stat" || break
  s=${s##*) }
  set -- $s
  p=$2
done
round=0
while :; do
  n=0
  for d in /proc/[0-9]*; do
    q=${d#/proc/}
    case "$keep" in *" $q "*) continue ;; esac
    [ -O "$d" ] || continue
    read -r s < "$d/stat" 2>/dev/null || continue
    s=${s##*) }
    case "$s" in
      Z*) set -- "$d"/task/*; [ "$#" -gt 1 ] || continue ;;
    esac
    kill -9 "$q" 2>/dev/null && n=$((n + 1))
  done
  round=$((round + 1))
  [ "$n" -eq 0 ] || [ "$round" -ge 20 ] && break
done
echo "left=$n"
"#;

/// Where the calls run as root beside the service's own processes, a user
/// cannot tell them apart: each call's commands carry a session's mark in
/// their environment instead (`$1`, as `NAME=value`), and this kills every
/// process whose initial environment holds it, in up to 20 rounds; prints
/// `left=<n>` as `SWEEP` does. The sweep itself runs without the mark.
/// A process that replaced its environment (`env -i`) escapes it: within a
/// session that is one trust domain, and the VM is the boundary.
pub const SWEEP_MARKED: &str = r#"want=$1
round=0
while :; do
  n=0
  for d in /proc/[0-9]*; do
    q=${d#/proc/}
    [ "$q" = "$$" ] && continue
    grep -qzxF -e "$want" "$d/environ" 2>/dev/null || continue
    read -r s < "$d/stat" 2>/dev/null || continue
    s=${s##*) }
    case "$s" in
      Z*) set -- "$d"/task/*; [ "$#" -gt 1 ] || continue ;;
    esac
    kill -9 "$q" 2>/dev/null && n=$((n + 1))
  done
  round=$((round + 1))
  [ "$n" -eq 0 ] || [ "$round" -ge 20 ] && break
done
echo "left=$n"
"#;

/// The main process's PID from `FIND_MAIN`'s output: `Some(0)` when none
/// of ours matched (nothing to spare), `None` when the script did not
/// finish or more than one matched (a sandbox that is not what was made).
pub fn main_pid(stdout: &[u8]) -> Option<u32> {
    let text = String::from_utf8_lossy(stdout);
    if !text.lines().any(|l| l == "done=yes") {
        return None;
    }
    let found: Vec<u32> = text
        .lines()
        .filter_map(|l| l.strip_prefix("main=")?.parse().ok())
        .collect();
    match found[..] {
        [] => Some(0),
        [pid] => Some(pid),
        _ => None,
    }
}

/// Whether `SWEEP`'s output says no process outlived the call.
pub fn swept_clean(stdout: &[u8]) -> bool {
    String::from_utf8_lossy(stdout)
        .lines()
        .any(|l| l == "left=0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_main_process_is_one_or_none() {
        assert_eq!(main_pid(b"main=7\ndone=yes\n"), Some(7));
        assert_eq!(main_pid(b"done=yes\n"), Some(0));
        assert_eq!(main_pid(b"main=7\nmain=9\ndone=yes\n"), None);
        assert_eq!(main_pid(b"main=7\n"), None);
    }

    #[test]
    fn only_left_zero_is_clean() {
        assert!(swept_clean(b"left=0\n"));
        assert!(!swept_clean(b"left=3\n"));
        assert!(!swept_clean(b""));
    }
}
