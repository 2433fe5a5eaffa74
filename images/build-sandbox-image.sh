#!/usr/bin/env bash
# Builds the guest image runs use, locally: no image registry is reachable
# from this machine, and a locally built image is one whose contents we can
# name. Debian bookworm, minbase, with node and python3 (its standard
# library, json and http.client included: the grant client needs them);
# nothing else.
#
#   images/build-sandbox-image.sh [tag]     (default plimsoll/sandbox:bookworm)
#
# Prints the content-addressed image ID. The daemon pins runs to the ID it
# resolves at start (SANDBOX_DOCKER_IMAGE may name this tag), so a tag
# re-pointed later is noticed, not followed.
#
# Idempotent: an existing tag is kept (delete it to rebuild). Needs root,
# debootstrap and a running docker engine. The Debian mirror is the one this
# machine's apt already uses.
set -euo pipefail
tag="${1:-plimsoll/sandbox:bookworm}"

if docker image inspect "$tag" >/dev/null 2>&1; then
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
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=nodejs,python3 bookworm "$root" "$mirror" >"$root.log" 2>&1 || {
  tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1
}
rm -f "$root.log"

# Nothing a run needs: package caches, docs, apt's lists.
rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* \
  "$root"/usr/share/doc "$root"/usr/share/man "$root"/usr/share/info
# A plain PATH for every process, and no setuid bits: the runs drop every
# capability and set no-new-privileges, so these could never work anyway;
# removing them keeps the image honest about that.
find "$root" -xdev -perm /6000 -type f -exec chmod ug-s {} +

tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
  --change 'WORKDIR /work' \
  - "$tag" >/dev/null
docker image inspect "$tag" --format '{{.Id}}'
