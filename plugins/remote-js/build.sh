#!/usr/bin/env bash
# Builds the remote-js plugin: adapter.js into a WebAssembly component of the
# `cloud-adapter` world (wit/provider), with componentize-js pinned in
# package-lock.json. Usage: build.sh [OUT]; OUT defaults to
# $CARGO_TARGET_DIR/plugins/remote-js.wasm, CARGO_TARGET_DIR to the
# repository's target/ (where the shipped plugins go). Needs node >= 20, and
# the npm registry only while node_modules is missing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-${CARGO_TARGET_DIR:-$here/../../target}/plugins/remote-js.wasm}"
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"

cd "$here"
if [ ! -d node_modules ]; then
    # Exactly the lockfile's versions; no package runs an install script
    # (componentize-js ships its engine, StarlingMonkey, as wasm in the package).
    npm ci --ignore-scripts --no-audit --no-fund
fi
node build.mjs "$out"
echo "built $out ($(wc -c <"$out") bytes)"
