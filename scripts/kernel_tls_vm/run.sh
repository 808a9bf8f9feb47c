#!/bin/bash
# scripts/kernel_tls_vm/run.sh 'command'
#
# Runs `command` under a kernel that has kernel TLS, for the tests of the
# engine's kernel-TLS path on a host whose kernel has none (setup.sh
# installs what it needs; docs/testing.md). Boots a throwaway QEMU guest
# running Debian's linux-image kernel (which has
# CONFIG_TLS=m), with the host's / shared read-only over 9p, runs `command`
# with bash in the guest (chrooted into the host's /, cwd = this cwd, same
# exported environment, stdin /dev/null), prints its stdout and stderr, and
# exits with its exit status.
# Inside the guest: lo is up, tls is loaded (modprobe tls), crypto modules
# load on demand, /tmp /run /dev/shm are private tmpfs (except one holding
# the cwd; TMPDIR is /dev/shm, always the guest's), and these host
# directories are shared read-write:
#   target/kernel-tls-vm/scratch, plus each path in KTLS_VM_RW.
#
# Environment knobs:
#   KTLS_VM_RW=/a:/b      more host dirs to share read-write (must exist)
#   KTLS_VM_ACCEL=kvm|tcg accelerator (default: kvm if this host's KVM can run
#                         an ordinary kernel, else tcg; see accel_auto below)
#   KTLS_VM_MEM=4G  KTLS_VM_CPUS=2  KTLS_VM_TIMEOUT=600 (seconds, 0 = none)
#   KTLS_VM_HOST_TMP=1    share the host's /tmp read-write instead of a tmpfs
#   KTLS_VM_DEBUG=1       print timing and the guest console log, keep runs/
#   KTLS_VM_LOGLEVEL=4    guest kernel console loglevel
#   KTLS_VM_KERNEL, KTLS_VM_QEMU, KTLS_VM_BIOS, KTLS_VM_QEMU_EXTRA: overrides
# Exit status: the command's; 124 on timeout; 125 if the guest failed to
# run it (the tail of the console log is printed to stderr then).
set -uo pipefail
HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
WORK=${KTLS_VM_DIR:-$HERE/../../target/kernel-tls-vm}

if [ $# -lt 1 ]; then
    echo "usage: $0 'command'" >&2
    exit 2
fi
CMD="$*"

if [ ! -d "$WORK/kernel/lib/modules" ]; then
    echo "run.sh: no guest kernel under $WORK: run scripts/kernel_tls_vm/setup.sh first" >&2
    exit 125
fi
WORK=$(cd "$WORK" && pwd)
KVER=${KTLS_VM_KVER:-$(ls "$WORK/kernel/lib/modules" | head -n1)}
KERNEL=${KTLS_VM_KERNEL:-$WORK/out/vmlinux-$KVER}
INITRD=$WORK/out/initramfs.cpio.gz
QEMU=${KTLS_VM_QEMU:-qemu-system-x86_64}
if [ ! -f "$INITRD" ] || [ ! -f "$WORK/out/vmlinux-$KVER" ] ||
    [ "$HERE/init" -nt "$INITRD" ] || [ "$HERE/build-initramfs.sh" -nt "$INITRD" ]; then
    mkdir -p "$WORK/out"
    KTLS_VM_DIR=$WORK flock "$WORK/out/.build.lock" "$HERE/build-initramfs.sh" >&2 || exit 125
fi

# KVM only helps if it can run an unmodified kernel: hardware VT-x/AMD-V.
# A host whose /dev/kvm comes from kvm_pvm (no vmx/svm in cpuinfo) can only
# run PVM-enabled guest kernels, and hangs on Debian's: use TCG there.
accel_auto() {
    if [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo; then echo kvm; else echo tcg; fi
}
ACCEL=${KTLS_VM_ACCEL:-$(accel_auto)}
# qboot (from qemu-system-data) boots a -kernel about 2 s faster than SeaBIOS.
BIOS_ARGS=()
QBOOT=${KTLS_VM_BIOS:-/usr/share/qemu/qboot.rom}
[ -f "$QBOOT" ] && BIOS_ARGS=(-bios "$QBOOT")
case $ACCEL in
    kvm) ACCEL_ARGS=(-accel kvm -cpu host) ;;
    tcg) ACCEL_ARGS=(-accel tcg,thread=multi,tb-size=256 -cpu max) ;;
    *) echo "run.sh: KTLS_VM_ACCEL must be kvm or tcg" >&2; exit 2 ;;
esac

mkdir -p "$WORK/runs" "$WORK/scratch"
RUN=$(mktemp -d "$WORK/runs/run.XXXXXX")
cleanup() {
    [ -n "${CAT_OUT:-}" ] && kill "$CAT_OUT" 2>/dev/null
    [ -n "${CAT_ERR:-}" ] && kill "$CAT_ERR" 2>/dev/null
    if [ "${KTLS_VM_DEBUG:-0}" = 1 ]; then echo "run.sh: run dir $RUN" >&2; else rm -rf "$RUN"; fi
}
trap cleanup EXIT

echo "$RUN" >"$RUN/rundir"

# The script bash runs in the guest: the environment, the cwd, the command.
{
    for v in $(compgen -e); do
        case $v in
            PWD|OLDPWD|SHLVL|_|BASHOPTS|SHELLOPTS|BASH_*|TERMCAP) continue ;;
        esac
        printf 'export %s=%q\n' "$v" "${!v}"
    done
    # Temporary files in the guest's own tmpfs, wherever the cwd is.
    printf 'export TMPDIR=/dev/shm\n'
    printf 'cd -- %q || exit 125\n' "$PWD"
    printf '%s\n' "$CMD"
} >"$RUN/script.sh"

# Read-write shares.
VIRTFS=(
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
    -virtfs "local,path=$RUN,mount_tag=ctl,security_model=none,multidevs=remap"
)
RW=("$WORK/scratch")
IFS=: read -r -a EXTRA <<<"${KTLS_VM_RW:-}"
RW+=("${EXTRA[@]}")
TMPFS="/tmp /run"
if [ "${KTLS_VM_HOST_TMP:-0}" = 1 ]; then RW+=(/tmp); TMPFS=/run; fi
: >"$RUN/rw"
i=0
for p in "${RW[@]}"; do
    [ -n "$p" ] || continue
    p=$(readlink -f "$p")
    if [ ! -d "$p" ]; then echo "run.sh: $p is not a directory" >&2; exit 2; fi
    case $p in *,*) echo "run.sh: cannot share a path with a comma: $p" >&2; exit 2 ;; esac
    VIRTFS+=(-virtfs "local,path=$p,mount_tag=rw$i,security_model=none,multidevs=remap")
    echo "rw$i $p" >>"$RUN/rw"
    i=$((i + 1))
done
# Do not hide the cwd behind a tmpfs.
T=""
for d in $TMPFS; do
    case "$PWD/" in "$d"/*) ;; *) T="$T $d" ;; esac
done
echo "$T" >"$RUN/tmpfs"

# stdout/stderr of the guest command come back through two FIFOs.
mkfifo "$RUN/stdout.fifo" "$RUN/stderr.fifo"
cat "$RUN/stdout.fifo" &
CAT_OUT=$!
cat "$RUN/stderr.fifo" >&2 &
CAT_ERR=$!

TIMEOUT=${KTLS_VM_TIMEOUT:-600}
START=$(date +%s.%N)
timeout -k 5 "$TIMEOUT" "$QEMU" \
    -nodefaults -no-user-config -nographic -no-reboot \
    -machine pc "${ACCEL_ARGS[@]}" "${BIOS_ARGS[@]}" ${KTLS_VM_QEMU_EXTRA:-} \
    -m "${KTLS_VM_MEM:-4G}" -smp "${KTLS_VM_CPUS:-2}" \
    -kernel "$KERNEL" -initrd "$INITRD" \
    -append "console=ttyS0 quiet loglevel=${KTLS_VM_LOGLEVEL:-4} panic=-1 rdinit=/init mitigations=off random.trust_cpu=on 8250.nr_uarts=1" \
    -serial "file:$RUN/console.log" \
    -monitor none \
    "${VIRTFS[@]}" \
    -device virtio-serial-pci \
    -chardev "file,id=out,path=$RUN/stdout.fifo" -device virtserialport,chardev=out,name=ktls.stdout \
    -chardev "file,id=err,path=$RUN/stderr.fifo" -device virtserialport,chardev=err,name=ktls.stderr \
    </dev/null
QRC=$?
# If qemu never opened a FIFO, its cat still waits in open(): an O_RDWR open
# never blocks and lets it see EOF.
: 1<>"$RUN/stdout.fifo"
: 1<>"$RUN/stderr.fifo"
wait "$CAT_OUT" "$CAT_ERR" 2>/dev/null
CAT_OUT="" CAT_ERR=""
END=$(date +%s.%N)
[ "${KTLS_VM_DEBUG:-0}" = 1 ] && {
    echo "run.sh: accel=$ACCEL qemu exit=$QRC wall=$(echo "$END - $START" | bc)s" >&2
    sed 's/^/[console] /' "$RUN/console.log" >&2
}

if [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then
    echo "run.sh: timed out after ${TIMEOUT}s" >&2
    exit 124
fi
if [ ! -s "$RUN/rc" ]; then
    [ -s "$RUN/init-error" ] && echo "run.sh: guest init failed: $(cat "$RUN/init-error")" >&2
    echo "run.sh: guest did not report an exit status (qemu exit $QRC); console:" >&2
    tail -n 40 "$RUN/console.log" >&2
    exit 125
fi
exit "$(cat "$RUN/rc")"
