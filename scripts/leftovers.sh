#!/usr/bin/env bash
# What a test suite can leave behind on this machine, as one line:
#   containers=N run_dirs=N cgroups=N swap_files=N
# containers: labelled io.plimsoll.run; run_dirs: broker directories under
# /run/plimsoll-runs; cgroups: per-sandbox pids cgroups under docker's
# cgroupfs root (gVisor's host cgroups are made there); swap_files: the
# swap file the slot-reset test makes in /var/tmp (on or off).
#
#   scripts/leftovers.sh                 print the line
#   scripts/leftovers.sh --since FILE    fail unless no container, no run
#                                        directory and no test swap file is
#                                        left, and no more cgroups than
#                                        FILE's line counted
set -euo pipefail
count() {
  local containers run_dirs cgroups
  containers=$(docker ps -aq --filter label=io.plimsoll.run | wc -l)
  # A machine that never ran a granted run has no such directory: none left.
  run_dirs=0
  if [ -d /run/plimsoll-runs ]; then
    run_dirs=$(find /run/plimsoll-runs -mindepth 1 -maxdepth 1 | wc -l)
  fi
  cgroups=0
  for root in /sys/fs/cgroup/pids/docker /sys/fs/cgroup/docker; do
    [ -d "$root" ] && cgroups=$((cgroups + $(find "$root" -mindepth 1 -maxdepth 1 -type d | wc -l)))
  done
  swap_files=$(find /var/tmp -maxdepth 1 -name 'plimsoll-test-swap-*' | wc -l)
  echo "containers=$containers run_dirs=$run_dirs cgroups=$cgroups swap_files=$swap_files"
}
if [ "${1:-}" != "--since" ]; then
  count
  exit 0
fi
before=$(cat "$2")
now=$(count)
echo "leftovers: before the suite: $before; after: $now"
get() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
fail=0
[ "$(get "$now" containers)" -eq 0 ] || { echo "leftovers: run containers were left behind" >&2; fail=1; }
[ "$(get "$now" run_dirs)" -eq 0 ] || { echo "leftovers: run directories were left behind" >&2; fail=1; }
[ "$(get "$now" cgroups)" -le "$(get "$before" cgroups)" ] || { echo "leftovers: sandbox cgroups were left behind" >&2; fail=1; }
[ "$(get "$now" swap_files)" -eq 0 ] || { echo "leftovers: a test swap file was left behind (see /proc/swaps)" >&2; fail=1; }
exit $fail
