//! Sessions on hosted sandboxes: no process a call starts may outlive the
//! call (SECURITY.md, promise 13), and the services keep no such promise
//! themselves. These shell scripts, run in the sandbox as the user the
//! calls run as, keep it: one at open finds the sandbox's main process (the
//! one process of ours to spare, found before any call's code ran, so code
//! cannot pose as it later), one after every call kills every other process
//! of ours, round after round, until a round finds none.
//!
//! `sweep()` finds ours by user; `sweep_marked()` is for services whose
//! calls run as root, and finds them by a mark in their environment.

/// Prints `main=<pid>:<start time>` for each process of ours whose command
/// line is exactly the script's arguments (the main process's argv), then
/// `done=yes`. Run at open, before any call. The start time (in clock
/// ticks after boot) tells the process from a later one given its PID.
pub const FIND_MAIN: &str = r#"want=
for a in "$@"; do want="$want$a "; done
for d in /proc/[0-9]*; do
  [ -O "$d" ] || continue
  got=$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null) || continue
  [ "$got" = "$want" ] || continue
  read -r s < "$d/stat" || continue
  s=${s##*) }
  set -- $s
  shift 19
  echo "main=${d#/proc/}:$1"
done
echo "done=yes"
"#;

/// What both sweeps share: rounds over `/proc`, killing each process
/// `pick` chooses, until a round kills nothing and ends with the same
/// processes it began with (so a chain of processes each forking the next
/// and exiting, which no single listing catches, keeps the rounds going),
/// at most 20; prints `left=<n>`, 0 only for such a round. Zombies are
/// skipped (they hold nothing but a PID) unless a thread of theirs runs.
///
/// So is a process already on its way out (`doomed`): every thread of it
/// has begun to exit (PF_EXITING, 0x4, in its flags) or has SIGKILL
/// pending (bit 8 of its own or the shared pending mask). No such thread
/// returns to code of its own, so the process can neither fork nor act
/// again; it stays in `/proc` only while the kernel frees what it held,
/// which for a process holding gigabytes outlasts all 20 rounds, and
/// counting it as left over ended sessions for nothing. Each thread is
/// asked, not only the first: a first thread that exited on its own while
/// others run is exiting, and the others are not.
const ROUNDS: &str = r#"doomed() {
  for t in "$1"/task/*; do
    read -r ds < "$t/stat" || continue
    ds=${ds##*) }
    set -- $ds
    [ $(($7 & 4)) -ne 0 ] && continue
    dk=1
    { while read -r k v; do
        case "$k" in
          SigPnd:|ShdPnd:) [ $((0x$v & 256)) -ne 0 ] && dk=0 ;;
        esac
      done < "$t/status"; } || continue
    [ "$dk" -eq 0 ] || return 1
  done
  return 0
}
round=0
while :; do
  set -- /proc/[0-9]*
  before=$*
  n=0
  for d in /proc/[0-9]*; do
    q=${d#/proc/}
    case "$keep" in *" $q "*) continue ;; esac
    pick "$d" 2>/dev/null || continue
    read -r s 2>/dev/null < "$d/stat" || continue
    s=${s##*) }
    case "$s" in
      Z*) set -- "$d"/task/*; [ "$#" -gt 1 ] || continue ;;
    esac
    doomed "$d" 2>/dev/null && continue
    kill -9 "$q" 2>/dev/null && n=$((n + 1))
  done
  set -- /proc/[0-9]*
  round=$((round + 1))
  [ "$n" -eq 0 ] && [ "$before" = "$*" ] && break
  [ "$round" -ge 20 ] && { n=$((n + 1)); break; }
done
echo "left=$n"
"#;

/// Kills every process of ours (real, effective or saved uid the sweep's
/// own) except PID 1, the main process (`$1`, `<pid>:<start time>` as
/// `FIND_MAIN` printed it, or 0 for none; spared only while its start time
/// matches) and the sweep's own ancestors. With no main process and no
/// ancestor of ours, one `kill -1` goes first: no fork outruns a signal to
/// every process at once. Then `ROUNDS`. Reads `/proc` with shell builtins
/// only, so the sweep itself forks nothing.
pub fn sweep() -> String {
    format!("{SWEEP_HEAD}{ROUNDS}")
}

const SWEEP_HEAD: &str = r#"main=${1%%:*}; start=${1#*:}
while read -r k u1 u2 u3 u4; do [ "$k" = "Uid:" ] && { me=$u1; break; }; done < /proc/$$/status
[ -n "$me" ] || { echo "left=unknown"; exit 1; }
pick() {
  while read -r k u1 u2 u3 u4; do
    [ "$k" = "Uid:" ] || continue
    [ "$u1" = "$me" ] || [ "$u2" = "$me" ] || [ "$u3" = "$me" ]
    return
  done < "$1/status"
  return 1
}
keep=" 1 $$ "
kin=0
read -r s < "/proc/$$/stat"
s=${s##*) }
set -- $s
p=$2
while [ "$p" -gt 1 ] 2>/dev/null; do
  keep="$keep$p "
  pick "/proc/$p" 2>/dev/null && kin=$((kin + 1))
  read -r s < "/proc/$p/stat" || break
  s=${s##*) }
  set -- $s
  p=$2
done
if [ "$main" -gt 0 ] 2>/dev/null && read -r s < "/proc/$main/stat" 2>/dev/null; then
  s=${s##*) }
  set -- $s
  shift 19
  [ "$1" = "$start" ] && keep="$keep$main "
fi
[ "$main" = 0 ] && [ "$kin" -eq 0 ] && kill -9 -1 2>/dev/null
"#;

/// For services whose calls run as root beside the service's own
/// processes, where a user cannot tell them apart: each call's commands
/// carry a session's mark in their environment (`$1`, as `NAME=value`),
/// and this kills every process whose initial environment holds it, then
/// `ROUNDS`. The sweep itself runs without the mark. Best effort against
/// code that sets out to escape it: a process that replaced its
/// environment (`env -i`), changed to a user whose environment root cannot
/// read, or replaced the tools the sweep calls is not found; within a
/// session that is one trust domain, and the VM is the boundary.
pub fn sweep_marked() -> String {
    format!("{MARKED_HEAD}{ROUNDS}")
}

const MARKED_HEAD: &str = r#"want=$1
pick() { grep -qzxF -e "$want" "$1/environ"; }
keep=" 1 $$ "
"#;

/// The main process from `FIND_MAIN`'s output, as `SWEEP` takes it:
/// `<pid>:<start time>`, or `0` when none of ours matched (nothing to
/// spare); `None` when the script did not finish or more than one matched
/// (a sandbox that is not what was made).
pub fn main_process(stdout: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(stdout);
    if !text.lines().any(|l| l == "done=yes") {
        return None;
    }
    let found: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("main="))
        .collect();
    let valid = |m: &str| {
        m.split_once(':').is_some_and(|(p, t)| {
            !p.is_empty()
                && !t.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && t.bytes().all(|b| b.is_ascii_digit())
        })
    };
    match found[..] {
        [] => Some("0".to_string()),
        [m] if valid(m) => Some(m.to_string()),
        _ => None,
    }
}

/// Whether a sweep's output says no process outlived the call: exactly
/// one line, `left=0` (a line some process wrote beside it is not).
pub fn swept_clean(stdout: &[u8]) -> bool {
    stdout == b"left=0\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_main_process_is_one_or_none() {
        assert_eq!(
            main_process(b"main=7:123\ndone=yes\n").as_deref(),
            Some("7:123")
        );
        assert_eq!(main_process(b"done=yes\n").as_deref(), Some("0"));
        assert_eq!(main_process(b"main=7:1\nmain=9:2\ndone=yes\n"), None);
        assert_eq!(main_process(b"main=7:1\n"), None);
        assert_eq!(main_process(b"main=7\ndone=yes\n"), None);
        assert_eq!(main_process(b"main=7:1 x\ndone=yes\n"), None);
    }

    #[test]
    fn only_a_lone_left_zero_is_clean() {
        assert!(swept_clean(b"left=0\n"));
        assert!(!swept_clean(b"left=3\n"));
        assert!(!swept_clean(b"left=0\nleft=3\n"));
        assert!(!swept_clean(b"left=3\nleft=0\n"));
        assert!(!swept_clean(b""));
    }
}
