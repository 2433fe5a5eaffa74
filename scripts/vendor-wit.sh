#!/usr/bin/env bash
# Puts the one standard WIT package the plugin worlds import from outside
# this repository, wasi:config (the operator's values for a plugin), where
# wit-bindgen and wasmtime's bindgen look for it: wit/provider/deps/config.
# It is taken from the wasmtime-wasi-config crate the host links it with,
# checked against the digest Cargo.lock recorded, so the host and every
# plugin agree on the exact package version. The directory is not in git.
# Idempotent: a stamp records the crate digest.
set -euo pipefail
cd "$(dirname "$0")/.."

CRATE=wasmtime-wasi-config
read -r VERSION SHA256 < <(python3 - "$CRATE" <<'PY'
import sys, tomllib
lock = tomllib.load(open("Cargo.lock", "rb"))
hits = [p for p in lock["package"] if p["name"] == sys.argv[1]]
assert len(hits) == 1, f"expected one {sys.argv[1]} in Cargo.lock, found {len(hits)}"
print(hits[0]["version"], hits[0]["checksum"])
PY
)
DEST=wit/provider/deps/config
STAMP="$CRATE-$VERSION $SHA256"
if [ -f "$DEST/.plimsoll-vendor" ] && [ "$(cat "$DEST/.plimsoll-vendor")" = "$STAMP" ]; then
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
crate=""
for c in "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/$CRATE-$VERSION.crate; do
  [ -f "$c" ] && crate=$c && break
done
if [ -z "$crate" ]; then
  echo "vendor-wit: downloading $CRATE $VERSION from crates.io"
  crate=$work/$CRATE.crate
  curl -fsSL --proto '=https' -o "$crate" \
    "https://static.crates.io/crates/$CRATE/$CRATE-$VERSION.crate"
fi
echo "$SHA256  $crate" | sha256sum -c --quiet - || {
  echo "vendor-wit: $crate does not have the digest Cargo.lock pinned" >&2
  exit 1
}
tar -xzf "$crate" -C "$work" "$CRATE-$VERSION/wit/deps/config"
rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
mv "$work/$CRATE-$VERSION/wit/deps/config" "$DEST"
printf '%s\n' "$STAMP" > "$DEST/.plimsoll-vendor"
echo "vendor-wit: $DEST ready ($CRATE $VERSION)"
