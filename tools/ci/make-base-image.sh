#!/usr/bin/env bash
# Make the local base image the image tests build on: no registry is reachable, so a minimal
# Debian bookworm root file system is made with debootstrap from Debian's packages and imported.
set -euo pipefail
TAG="${TORCHRIG_TEST_BASE:-torchrig-test/debian:bookworm}"
if docker image inspect "$TAG" >/dev/null 2>&1; then echo "base image $TAG present"; exit 0; fi
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
root=$(mktemp -d /tmp/torchrig-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=ca-certificates bookworm "$root" "$MIRROR" >/tmp/debootstrap.log 2>&1 \
    || { tail -n 30 /tmp/debootstrap.log >&2; exit 1; }
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
echo "deb $MIRROR bookworm main" > "$root/etc/apt/sources.list"
tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' - "$TAG" >/dev/null
echo "base image $TAG made"
