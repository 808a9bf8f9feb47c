#!/usr/bin/env bash
# The images' base from Debian's packages, with no image registry: mmdebstrap
# makes a Debian 12 (bookworm) root filesystem from Debian's mirrors, and
# podman imports it as an image that docker/build-images.sh builds on
# (`--base IMAGE`).
#
#   docker/debian-base.sh [IMAGE]        default: localhost/ringfeed-base:bookworm
#
# What is in it is what debian:bookworm-slim has: the packages of priority
# required (mmdebstrap's `minbase`: dpkg, apt, coreutils, bash, passwd, ...)
# with merged /usr, the bookworm, bookworm-updates and bookworm-security
# suites in apt's sources, no manuals, no translations and no documentation
# but the copyright files, and what Debian's container images set for
# builds: dpkg's `force-unsafe-io` (a build has no use for fsync), and apt
# keeping neither its package caches nor the packages it downloaded (an
# image's layers would carry them). About 75 MB.
#
# RINGFEED_DEBIAN_MIRROR and RINGFEED_DEBIAN_SECURITY name other mirrors.
# Runs as root (mmdebstrap's root mode); the test command runs it
# (deploy/tests/test_images.py, docs/containers-and-abi-checks.md).
set -euo pipefail

image=${1:-localhost/ringfeed-base:bookworm}
mirror=${RINGFEED_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${RINGFEED_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}

for tool in mmdebstrap podman; do
    command -v "$tool" >/dev/null || {
        echo "$0: $tool is not installed (apt-get install --no-install-recommends mmdebstrap podman)" >&2
        exit 1
    }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The merged-/usr hook makes the links itself: without it, bookworm's
# mmdebstrap installs the usrmerge package, which brings perl (60 MB).
mmdebstrap --quiet --variant=minbase \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt=force-unsafe-io \
    --customize-hook='printf "%s\n" "Dir::Cache::pkgcache \"\";" "Dir::Cache::srcpkgcache \"\";" "APT::Keep-Downloaded-Packages \"false\";" >"$1/etc/apt/apt.conf.d/90image-clean"' \
    --customize-hook='rm -f "$1"/var/cache/apt/*.bin' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    bookworm "$work/rootfs.tar" \
    "deb $mirror bookworm main" \
    "deb $mirror bookworm-updates main" \
    "deb $security bookworm-security main"

podman import --quiet --change 'CMD ["/bin/bash"]' "$work/rootfs.tar" "$image" >/dev/null
echo "$image"
