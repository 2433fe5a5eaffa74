#!/usr/bin/env bash
# Prepares the one dependency plimsoll builds with a change of its own:
# wasmtime 48.0.8, with the pooling allocator's dirty-page scan made to
# count a written page the kernel has swapped out, or is migrating, as
# dirty. Why: docs/wasm-slot-reset.md. Cargo.toml's [patch.crates-io]
# points at the result, patched/wasmtime (not in git), so this runs before
# any cargo command: `make setup` calls it.
#
# The crate is the published one, checked against the same SHA-256
# Cargo.lock recorded for it before the patch; the change is one edit,
# applied by pattern and refused unless the pattern matches exactly once.
# Idempotent: a stamp records the crate digest and the edit applied.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=48.0.8
SHA256=a2afcadb2e7d0417cb8f3f322c66eff49338b288f22290c0ca0bd3e9570732aa
FILE=src/runtime/vm/sys/unix/pagemap.rs
# The scan's question: a page is reset by copy when it is written, neither
# the zero page nor a file page, and present. Upstream stops there, which
# leaves a written page that is swapped out (or migrating: the kernel shows
# both as swap entries) neither copied over nor discarded: the next instance
# in the slot would read it. The edit asks for present *or* swapped. (Not
# for "written" alone: the kernel reports never-touched pages as written.)
FROM='            Categories::WRITTEN | Categories::PRESENT | Categories::PFNZERO | Categories::FILE,'
TO='            Categories::WRITTEN | Categories::PFNZERO | Categories::FILE,
        )
        .category_anyof_mask(Categories::PRESENT | Categories::SWAPPED'
STAMP="wasmtime-$VERSION $SHA256 pagemap-present-or-swapped-v2"

DEST=patched/wasmtime
# Done already only if the stamp matches and the edited file is still the one
# this script wrote: a hand-edited tree (say, the published file put back to
# watch the swap test fail) is made again, never built silently.
if [ -f "$DEST/.plimsoll-patch" ] \
  && [ "$(head -n1 "$DEST/.plimsoll-patch")" = "$STAMP" ] \
  && [ "$(sed -n 2p "$DEST/.plimsoll-patch")" = "$(sha256sum < "$DEST/$FILE" | cut -d' ' -f1)" ]; then
  exit 0
fi

# Staged next to its destination (same filesystem, so the final move is a
# rename), and stamped last: an interrupted run leaves no valid stamp.
mkdir -p patched
work=$(mktemp -d patched/.work.XXXXXX)
trap 'rm -rf "$work"' EXIT

crate=""
for c in "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/wasmtime-$VERSION.crate; do
  [ -f "$c" ] && crate=$c && break
done
if [ -z "$crate" ]; then
  echo "patch-wasmtime: downloading wasmtime $VERSION from crates.io"
  crate=$work/wasmtime.crate
  curl -fsSL --proto '=https' -o "$crate" \
    "https://static.crates.io/crates/wasmtime/wasmtime-$VERSION.crate"
fi
echo "$SHA256  $crate" | sha256sum -c --quiet - || {
  echo "patch-wasmtime: $crate does not have the digest Cargo.lock pinned" >&2
  exit 1
}

tar -xzf "$crate" -C "$work"
src=$work/wasmtime-$VERSION
count=$(grep -cxF -- "$FROM" "$src/$FILE" || true)
if [ "$count" != 1 ]; then
  echo "patch-wasmtime: expected the scan mask once in $FILE, found $count" >&2
  exit 1
fi
python3 - "$src/$FILE" "$FROM" "$TO" <<'PY'
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
assert text.count(old) == 1, "the scan mask is not there exactly once"
open(path, "w").write(text.replace(old, new, 1))
PY
grep -qF -- "Categories::PRESENT | Categories::SWAPPED" "$src/$FILE"

rm -f "$DEST/.plimsoll-patch"
rm -rf "$DEST"
mv "$src" "$DEST"
printf '%s\n%s\n' "$STAMP" "$(sha256sum < "$DEST/$FILE" | cut -d' ' -f1)" > "$DEST/.plimsoll-patch"
echo "patch-wasmtime: $DEST ready"
