#!/bin/bash
# Installs what run.sh needs, as root on Debian: QEMU from Debian's packages,
# and Debian's kernel (built with CONFIG_TLS=m) and a static busybox
# unpacked under target/kernel-tls-vm/ (nothing is installed as the host's
# kernel; /boot is untouched); then builds the guest's boot files
# (build-initramfs.sh). Idempotent: what is there is kept.
set -euo pipefail
HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
WORK=${KTLS_VM_DIR:-$HERE/../../target/kernel-tls-vm}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
export DEBIAN_FRONTEND=noninteractive
# The test command installs other packages in the background meanwhile:
# wait for dpkg's and apt's locks rather than fail on them.
apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }
if ! command -v qemu-system-x86_64 >/dev/null || ! command -v xz >/dev/null || ! command -v objcopy >/dev/null; then
    apt_get update -qq
    apt_get install -y -qq --no-install-recommends qemu-system-x86 xz-utils binutils >/dev/null
fi
if ! ls "$WORK"/kernel/boot/vmlinuz-* >/dev/null 2>&1 || [ ! -x "$WORK/busybox/bin/busybox" ]; then
    # linux-image-amd64 is a metapackage: the versioned image it points to.
    image() { apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -n1; }
    IMG=$(image || true)
    [ -n "$IMG" ] || { apt_get update -qq; IMG=$(image || true); }
    [ -n "$IMG" ] || { echo "setup.sh: no linux-image-amd64 in the package lists" >&2; exit 1; }
    rm -rf "$WORK/debs" "$WORK/kernel" "$WORK/busybox"
    mkdir -p "$WORK/debs"
    (cd "$WORK/debs" && apt_get download "$IMG" busybox-static)
    dpkg-deb -x "$WORK"/debs/"$IMG"_*.deb "$WORK/kernel"
    dpkg-deb -x "$WORK"/debs/busybox-static_*.deb "$WORK/busybox"
    rm -rf "$WORK/debs"
fi
grep -q '^CONFIG_TLS=[my]' "$WORK"/kernel/boot/config-* || { echo "setup.sh: the guest kernel lacks CONFIG_TLS" >&2; exit 1; }
KTLS_VM_DIR=$WORK "$HERE/build-initramfs.sh"
