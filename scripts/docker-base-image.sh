#!/usr/bin/env bash
# Make a local Debian bookworm image with python3 (3.11), venv and pip, for hosts that
# cannot pull from a container registry: debootstrap a minimal root filesystem from the
# Debian mirror and `docker import` it. Does nothing when the image already exists.
#
#   scripts/docker-base-image.sh [IMAGE]        (default local/python-base:bookworm)
#
# Env: DOCKER (client, default: docker on PATH), DEBIAN_MIRROR (default
# http://deb.debian.org/debian), SUITE (default bookworm), FORCE=1 to rebuild.
# Needs root and debootstrap (apt-get install debootstrap).
set -euo pipefail

IMAGE="${1:-local/python-base:bookworm}"
DOCKER="${DOCKER:-docker}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE="${SUITE:-bookworm}"

if [ "${FORCE:-0}" != 1 ] && "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "docker-base-image: $IMAGE already exists"
    exit 0
fi

if ! command -v debootstrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "docker-base-image: installing debootstrap"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    else
        echo "docker-base-image: debootstrap is required (apt-get install debootstrap)" >&2
        exit 1
    fi
fi

ROOTFS="$(mktemp -d "${TMPDIR:-/tmp}/headscope-rootfs.XXXXXX")"
cleanup() { rm -rf "$ROOTFS"; }
trap cleanup EXIT

start=$(date +%s)
echo "docker-base-image: debootstrap $SUITE from $MIRROR into $ROOTFS"
debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-pip,ca-certificates \
    "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 || {
    tail -40 "$ROOTFS.log" >&2
    rm -f "$ROOTFS.log"
    exit 1
}
rm -f "$ROOTFS.log"

# Slim the image a little: no apt lists or package caches, no docs/man pages.
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin \
       "$ROOTFS"/var/cache/apt/archives/*.deb \
       "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/*
# Point apt inside the image at the same mirror (debootstrap already writes sources.list).
echo "deb $MIRROR $SUITE main" >"$ROOTFS/etc/apt/sources.list"

tar --numeric-owner -C "$ROOTFS" -c . | "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$IMAGE" >/dev/null
echo "docker-base-image: $IMAGE made in $(( $(date +%s) - start ))s ($("$DOCKER" image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
