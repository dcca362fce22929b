#!/usr/bin/env bash
# Makes sure the image the Dockerfile builds FROM (python:3.11-slim) exists locally: pulls it, or, where
# no registry is reachable, builds a stand-in of the same name from Debian packages with debootstrap
# (compose/README.md, "Offline base image"). Exit 0 when the image is there, 3 (with the reason on stdout)
# when it cannot be made here. The debootstrap root is cached in $BASE_DIR and reused.
set -euo pipefail
BASE_IMAGE="python:3.11-slim"
BASE_DIR="${BASE_DIR:-/var/tmp/dpagg-base}"
say() { printf '[base-image] %s\n' "$*"; }
cannot() { printf 'base image %s unavailable: %s\n' "$BASE_IMAGE" "$*"; exit 3; }

if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  say "$BASE_IMAGE present"; exit 0
fi
if timeout 120 docker pull -q "$BASE_IMAGE" >/dev/null 2>&1; then
  say "$BASE_IMAGE pulled"; exit 0
fi
command -v debootstrap >/dev/null 2>&1 || cannot "no registry reachable and no debootstrap to build a stand-in"
[ "$(id -u)" = 0 ] || cannot "no registry reachable, and building a stand-in with debootstrap needs root"

rootfs="$BASE_DIR/rootfs"
if [ ! -e "$BASE_DIR/.debootstrap-done" ]; then
  say "no registry: debootstrap bookworm minbase into $rootfs (a few minutes; log $BASE_DIR/debootstrap.log)"
  rm -rf "$rootfs"; mkdir -p "$BASE_DIR"
  debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates \
    bookworm "$rootfs" >"$BASE_DIR/debootstrap.log" 2>&1 \
    || { tail -20 "$BASE_DIR/debootstrap.log"; cannot "debootstrap failed (no Debian mirror reachable?)"; }
  touch "$BASE_DIR/.debootstrap-done"
fi
rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
# Trust this machine's extra CAs inside the image (pip in the build may go through an intercepting proxy).
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
fi
chroot "$rootfs" update-ca-certificates >/dev/null 2>&1 || true
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar --numeric-owner -C "$rootfs" -c . \
  | docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$BASE_IMAGE" >/dev/null
docker run --rm "$BASE_IMAGE" python -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
  || cannot "the stand-in built from $rootfs does not run Python 3.11"
say "$BASE_IMAGE built from Debian packages (a local stand-in)"
