#!/bin/bash
# Builds target/kernel-tls-vm/out/vmlinux-$KVER: the kernel from Debian's vmlinuz, decompressed
# (QEMU boots an ELF vmlinux through PVH, which skips the xz decompression
# that takes ~4 s under TCG).
# Builds target/kernel-tls-vm/out/initramfs.cpio.gz: static busybox, the guest init, and the
# kernel modules (with their dependencies) that the guest needs:
# virtio_pci, 9p over virtio, virtio_console, tls, and all crypto modules.
set -euo pipefail
HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
WORK=${KTLS_VM_DIR:-$HERE/../../target/kernel-tls-vm}
KVER=${KTLS_VM_KVER:-$(ls "$WORK/kernel/lib/modules" | head -n1)}
MODDIR=$WORK/kernel/lib/modules/$KVER
BUSYBOX=$WORK/busybox/bin/busybox


mkdir -p "$WORK/out"
STAGE=$(mktemp -d "$WORK/out/stage.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE"/{bin,dev,proc,sys,etc,lib/modules,host,ctl}

cp "$BUSYBOX" "$STAGE/bin/busybox"
for a in $("$BUSYBOX" --list); do
    [ "$a" = busybox ] || ln -s busybox "$STAGE/bin/$a"
done
cp "$HERE/init" "$STAGE/init"
chmod 755 "$STAGE/init"

# Modules loaded at boot (virtio, 9p, the serial ports, tls) plus every
# crypto module, so that the kernel can load ciphers on demand (kTLS's
# TLS_TX/TLS_RX need gcm, ctr, ghash, chacha20poly1305, ... which are
# modules in Debian's kernel) through /sbin/modprobe (busybox) in here.
BOOT_MODULES="virtio_pci 9pnet_virtio 9p virtio_console tls"
EXTRA_TREES="kernel/crypto kernel/arch/x86/crypto kernel/lib/crypto kernel/net/tls"

declare -A DONE=()
modpath() { find "$MODDIR" -name "$1.ko" -print -quit; }
deps() {
    objcopy -O binary --only-section=.modinfo "$1" /dev/stdout |
        tr '\0' '\n' | sed -n 's/^depends=//p' | tr ',' ' '
}
# add FILE: copy a module and, first, the modules it depends on.
add() {
    local f=$1 name d rel
    name=$(basename "$f" .ko)
    [ -n "${DONE[$name]:-}" ] && return
    DONE[$name]=1
    for d in $(deps "$f"); do
        grep -q "/$d.ko\$" "$MODDIR/modules.builtin" && continue
        rel=$(modpath "$d")
        [ -n "$rel" ] || { echo "module $d (needed by $name) not found" >&2; exit 1; }
        add "$rel"
    done
    rel=${f#"$MODDIR"/}
    mkdir -p "$STAGE/lib/modules/$KVER/$(dirname "$rel")"
    cp "$f" "$STAGE/lib/modules/$KVER/$rel"
}
for m in $BOOT_MODULES; do
    f=$(modpath "$m")
    [ -n "$f" ] || { echo "module $m not found" >&2; exit 1; }
    add "$f"
done
for t in $EXTRA_TREES; do
    while read -r f; do add "$f"; done < <(find "$MODDIR/$t" -name '*.ko')
done
cp "$MODDIR"/modules.builtin "$MODDIR"/modules.order "$STAGE/lib/modules/$KVER/"
"$BUSYBOX" depmod -b "$STAGE" "$KVER"
ln -s bin "$STAGE/sbin"
printf '%s\n' $BOOT_MODULES >"$STAGE/etc/modules.list"
echo "modules: ${#DONE[@]} ($(du -sh "$STAGE/lib/modules" | cut -f1))"

VMLINUZ=$WORK/kernel/boot/vmlinuz-$KVER
VMLINUX=$WORK/out/vmlinux-$KVER
if [ ! -s "$VMLINUX" ] || [ "$VMLINUZ" -nt "$VMLINUX" ]; then
    off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$VMLINUZ" | head -n1 | cut -d: -f1)
    [ -n "$off" ] || { echo "no xz payload in $VMLINUZ" >&2; exit 1; }
    # xz complains about the bytes after the stream; the ELF check below decides.
    tail -c +$((off + 1)) "$VMLINUZ" | xz -dcq >"$VMLINUX.tmp" 2>/dev/null || true
    [ "$(head -c 4 "$VMLINUX.tmp" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] ||
        { echo "decompressing $VMLINUZ did not give an ELF file" >&2; exit 1; }
    mv "$VMLINUX.tmp" "$VMLINUX"
    echo "wrote $VMLINUX"
fi

(cd "$STAGE" && find . | "$BUSYBOX" cpio -o -H newc 2>/dev/null) | gzip -1 >"$WORK/out/initramfs.cpio.gz.tmp"
mv "$WORK/out/initramfs.cpio.gz.tmp" "$WORK/out/initramfs.cpio.gz"
echo "wrote $WORK/out/initramfs.cpio.gz ($(stat -c %s "$WORK/out/initramfs.cpio.gz") bytes)"
