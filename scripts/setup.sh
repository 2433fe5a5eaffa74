#!/usr/bin/env bash
# Installs what building and testing plimsoll needs on a fresh Debian 12
# machine, and nothing else. Idempotent: each step is skipped when done.
#   - clang + wasi-libc: compile QuickJS's C for wasm32-wasip2 (rquickjs-sys)
#   - llvm: llvm-ar for that archive
#   - the wasm32-wasip2 Rust target: the guest components
#   - patched/wasmtime: wasmtime 48.0.8 with its slot-reset scan fixed
#     (scripts/patch-wasmtime.sh)
#   - wit/provider/deps/config: wasi:config's WIT, which plugins import
#     (scripts/vendor-wit.sh)
#   - a venv with the published Python client, for the compatibility suite
#   - a venv with E2B's official SDK, to prove the fake E2B against it
#   - a venv with securesystemslib and in-toto-attestation, to check signed
#     run bundles with verifiers nobody here wrote
#   - openssl: a test CA for the fake E2B's TLS
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v clang >/dev/null || need_apt+=(clang)
command -v llvm-ar >/dev/null || need_apt+=(llvm)
[ -d /usr/include/wasm32-wasi ] || need_apt+=(wasi-libc)
command -v dockerd >/dev/null || need_apt+=(docker.io)
dpkg -s busybox-static >/dev/null 2>&1 || need_apt+=(busybox-static)
# The E2B adapter tests make a test CA and a server certificate for fake-e2b.
command -v openssl >/dev/null || need_apt+=(openssl)
# The sandbox image's node comes from the npm registry (images/).
command -v curl >/dev/null || need_apt+=(curl ca-certificates)
# The shared-state tests start their own redis-server (Debian's) on loopback.
command -v redis-server >/dev/null || need_apt+=(redis-server)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# gVisor: a runsc no older than the release the workload corpus passed under
# (20240729), from Debian's bookworm-backports (Debian 12's own, from 2022,
# fails `ls` and `stat` in every sandbox: its statx answers EINVAL). Only
# runsc is pinned to backports; every other package keeps the priority apt
# gives backports (installed only when asked for by name), so nothing else
# on the system moves, and later runsc fixes from backports still arrive.
RUNSC_MIN_RELEASE=20240729
runsc_release() {
  /usr/bin/runsc --version 2>/dev/null | sed -n '1s/^runsc version \(0\.0~\|release-\)\{0,1\}\([0-9]\{8\}\).*/\2/p'
}
# The suite and the pin are written every time (an older setup pinned
# every backports package down; this replaces it).
mirror="$(awk '/^URIs:/ && $2 ~ /debian\/?$/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
[ -n "$mirror" ] || mirror="http://deb.debian.org/debian"
cat > /etc/apt/sources.list.d/plimsoll-bookworm-backports.sources <<SOURCES
Types: deb
URIs: $mirror
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
cat > /etc/apt/preferences.d/plimsoll-runsc <<'PREFS'
Package: runsc
Pin: release n=bookworm-backports
Pin-Priority: 990
PREFS
if [ "$(runsc_release || true)" \< "$RUNSC_MIN_RELEASE" ]; then
  echo "setup: installing runsc from bookworm-backports"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends runsc/bookworm-backports >/dev/null
fi
release="$(runsc_release || true)"
if [ -z "$release" ] || [ "$release" \< "$RUNSC_MIN_RELEASE" ]; then
  echo "setup: /usr/bin/runsc states release '${release:-none}', older than $RUNSC_MIN_RELEASE" >&2; exit 1
fi

if ! rustup target list --installed | grep -qx wasm32-wasip2; then
  echo "setup: adding the wasm32-wasip2 Rust target"
  rustup target add wasm32-wasip2
fi

# wasmtime with the slot-reset scan fixed (docs/wasm-slot-reset.md): cargo
# cannot read the workspace until patched/wasmtime exists.
scripts/patch-wasmtime.sh
# The JavaScript example plugin (plugins/remote-js) is built with
# componentize-js, which needs node 20 or newer and npm (its packages come
# from the npm registry, pinned in its package-lock.json).
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$node_major" -lt 20 ] || ! command -v npm >/dev/null; then
  echo "setup: node 20 or newer with npm is needed to build plugins/remote-js (found node major ${node_major})" >&2
  exit 1
fi

# wasi:config's WIT, which the plugin worlds import (from the crate the host
# links it with).
scripts/vendor-wit.sh

# The published client, pinned, unmodified: the compatibility contract.
# jsonschema: fake-dockercloud, which the adapter tests start in-process,
# checks every request and answer against Docker's published shapes.
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import plimsoll_client, pytest, anthropic, agents, jsonschema' 2>/dev/null; then
  echo "setup: creating .venv with plimsoll-client 0.23.0 (with its anthropic and openai-agents extras), jsonschema and pytest"
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check 'plimsoll-client[anthropic,openai-agents]==0.23.0' 'jsonschema==4.26.0' 'pytest>=8,<9'
fi
# The official MCP SDK, pinned: the real client the MCP tests drive /mcp and
# `plimsoll mcp` with (openai-agents brings some version of it already).
if [ "$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("mcp"))' 2>/dev/null)" != "2.3.0" ]; then
  echo "setup: pinning mcp 2.3.0 in .venv"
  .venv/bin/pip install -q --disable-pip-version-check 'mcp==2.3.0'
fi
# grpcio: fake-openshell, started in-process by the adapter tests, is a
# gRPC server.
if ! .venv/bin/python -c 'import grpc' 2>/dev/null; then
  echo "setup: adding grpcio to .venv"
  .venv/bin/pip install -q --disable-pip-version-check 'grpcio==1.85.3'
fi

# E2B's official SDK, pinned, in a venv of its own (its HTTP stack must not
# change what the published client is tested with): the client nobody here
# wrote that the fake E2B is proven against; and jsonschema, which checks
# fake-dockercloud's every request and answer against the shapes Docker
# publishes for its Sandboxes API.
if [ ! -x .venv-e2b/bin/python ] || ! .venv-e2b/bin/python -c 'import e2b, pytest, jsonschema' 2>/dev/null; then
  echo "setup: creating .venv-e2b with e2b 2.63.0, jsonschema and pytest"
  python3 -m venv .venv-e2b
  .venv-e2b/bin/pip install -q --disable-pip-version-check 'e2b==2.63.0' 'jsonschema==4.26.0' 'pytest>=8,<9'
fi

# OpenShell's published Python package (its generated stubs), pinned, in a
# venv of its own: the client nobody here wrote that fake-openshell is
# proven against.
if [ ! -x .venv-openshell/bin/python ] || ! .venv-openshell/bin/python -c 'import openshell, grpc, pytest' 2>/dev/null; then
  echo "setup: creating .venv-openshell with openshell 0.1.2 and pytest"
  python3 -m venv .venv-openshell
  .venv-openshell/bin/pip install -q --disable-pip-version-check 'openshell==0.1.2' 'grpcio==1.85.3' 'pytest>=8,<9'
fi

# securesystemslib (DSSE) and in-toto-attestation (Statement v1), pinned, in
# a venv of their own: the verifiers nobody here wrote that
# tests/attest/verify_with_others.py checks our signed bundles with
# (docs/attest.md). Their cryptography and protobuf stay out of .venv, so the
# published client's environment stays as users have it.
if [ ! -x .venv-attest/bin/python ] || ! .venv-attest/bin/python -c 'import securesystemslib, in_toto_attestation, cryptography' 2>/dev/null; then
  echo "setup: creating .venv-attest with securesystemslib 1.6.0 (with its crypto extra) and in-toto-attestation 0.9.3"
  python3 -m venv .venv-attest
  .venv-attest/bin/pip install -q --disable-pip-version-check 'securesystemslib[crypto]==1.6.0' 'in-toto-attestation==0.9.3'
fi

# dockerd with gVisor registered. --network=none: runsc refuses to start in
# this VM without it; --host-uds=open: a bind-mounted Unix socket (the broker)
# cannot be connected to from inside otherwise.
if [ ! -f /etc/docker/daemon.json ]; then
  mkdir -p /etc/docker
  cat > /etc/docker/daemon.json <<'JSON'
{
  "runtimes": {
    "runsc": {
      "path": "/usr/bin/runsc",
      "runtimeArgs": ["--network=none", "--host-uds=open"]
    }
  }
}
JSON
fi
if ! docker info >/dev/null 2>&1; then
  echo "setup: starting dockerd"
  nohup dockerd >/var/log/plimsoll-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start; see /var/log/plimsoll-dockerd.log" >&2; exit 1; }
fi
