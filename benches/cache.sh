#!/usr/bin/env bash
# The local disk cache: epoch 1 from an HTTP endpoint with cache writing
# against without, and a later run from the cache files against fio reading
# the same files.
#
# A benchmark program, not a test (docs/design.md): it prints ringfeed's
# figures as ratios against references measured in the same run, interleaved
# round by round, so a noisy machine moves them alike. PASS/MISS marks the
# targets only (STRICT=1 turns a MISS into exit status 1).
#
# The server: nginx (Debian package) on 127.0.0.1 serving SERVE_ROOT, whose
# subfolder BUCKET holds the shards (as benches/http_vs_curl.sh runs it). The
# cache: CACHE_DIR, on a disk (the script refuses tmpfs), emptied before
# every fill and removed at the end.
#
# What runs, every round in a rotating order, each a whole process timed by
# benches/timed.py (spawn to exit; CPU from wait4):
#   nocache   ringfeed bench http://127.0.0.1:PORT/BUCKET/shard-{...}.tar
#             --epochs 1 --json: epoch 1 over the network, no cache. The
#             shards are kept hot in nginx's page cache (checked before the
#             run), so the network path is what is timed.
#   fill      the same with --config {"cache_dir": CACHE_DIR, ...}, CACHE_DIR
#             emptied first: epoch 1 with cache writing, as configured by
#             default (`cache_fill` "spare": the reads never wait for the
#             disk; the writer queues what the batches still hold and gives
#             a fill up only when it alone holds more than 64 MiB, and close
#             waits at most a twentieth of the reading time for unfinished
#             fills: docs/cache.md). The process's exit includes that wait.
#             The report must say every shard missed; how many entries it
#             wrote is printed. The write-back of what it left dirty in the
#             page cache (`sync` right after the run) is timed apart and
#             printed, outside the figure.
#   fillall   the same with `cache_fill` "always": every shard written, the
#             reads waiting for the disk when it is slower than the network
#             (CACHE_DIR must then hold SHARDS entries). No target: it shows
#             what writing everything costs on this disk.
#   cached    untimed, a run with `cache_fill` "always" completes the cache
#             (only the shards a spare fill left out are fetched); then the
#             page cache dropped (sync; echo 3 > /proc/sys/vm/drop_caches,
#             checked with fincore on the entries), and the fill command
#             again: every shard must be a cache hit (the run dies otherwise),
#             its bytes read from the cache disk (after a HEAD each).
#   fioJ      the page cache dropped the same way, then fio reading the entry
#             files CACHE_DIR/*.rfc start to end, O_DIRECT on io_uring
#             (--direct=1 --ioengine=io_uring --rw=read --bs=8M --iodepth=4
#             --fixedbufs=1), files dealt round-robin to J jobs (threads of
#             one process), each reading its files one after the other; once
#             for every J in FIO_JOBS (1 and 2). The reference is the one
#             with the higher median GB/s in the run: the harder bar of the
#             two, both are printed. fio's buffers are 4 KiB pages and
#             ringfeed's arena huge pages where it gets them (the summary
#             says which): on a virtual disk that takes at most 254 segments
#             a request, that alone makes ringfeed's O_DIRECT requests larger
#             (docs/benchmarks.md, local_vs_fio.sh COLD=1).
# After a drop, the ringfeed and fio binaries and their libraries are read
# back into memory (not the data), so a cold run times the data's reads and
# not the loading of a 50 MB executable.
# Before nocache and fill alike, a scratch file as big as the shards plus
# 512 MiB is written into the cache's file system and deleted at once (no
# disk I/O: its pages are never written back), untimed (PRIME_MEMORY). On
# a VM whose balloon reports free memory to its host (virtio-balloon free
# page reporting, as on the Firecracker dev VM), page-cache writes into
# pages freed more than ~2 s earlier fault them back from the host: fio
# writing 512 MiB buffered ran at 0.45-0.7 GB/s that way and at 8.5-10.5
# GB/s into pages freed just before. Without the priming, fill would time
# the host's page faults, depending on how long ago the round's previous
# drop was, not the cache's writer.
#
# One warm-up run of each, not counted, fills the cache for round 1 (every
# cached and fio run reads the entries of the latest fill). GB/s counts the
# shards' bytes (the objects' sizes, the same for every contender) over the
# whole process's wall time; fio reads whole 8 MiB blocks of each entry
# (header included, the last partial block not), which the summary prints
# next to the shards' bytes. Each contender's own clock is printed beside
# (ringfeed's counts payload from open to the end, fio's its bytes over its
# runtime).
#   second    untimed, right after each fill (and its sync): the fill
#             command again, on the cache that fill left. It prints the
#             fraction of the shards it read from the cache: what a
#             restarted job gets from the default fill.
# Targets, ratios of the medians (whole process, GB/s):
#   fill / nocache                 >= 0.9   (cache writing costs epoch 1 little)
#   cached / fio (the reference)   >= 0.9   (the cache reads at the disk's speed)
#   second: shards from the cache  >= 0.9   (the default fill caches what an
#                                            idle disk can take; median of the
#                                            rounds; no target with SLOW_DISK)
#
# A network slower than the disk, and a disk slower than the network: this
# machine's loopback and disk are what they are, so two knobs change one
# side. NET_RATE caps each of nginx's connections (`limit_rate`: ringfeed
# keeps about workers x reads_in_flight of them busy), for a network slower
# than the disk. SLOW_DISK caps the writes to the cache's disk of every
# ringfeed contender (not of the untimed runs that complete the cache): each
# runs in a block-I/O cgroup of its own with a write limit on the disk under
# CACHE_DIR (cgroup v1 blkio.throttle.write_bps_device, or v2 io.max wbps).
# The cache writer writes O_DIRECT, which the limit charges to the process
# at once (cgroup v1 does not charge buffered write-back to it: the fillall
# figure shows whether the limit bit).
#
# Usage: benches/cache.sh        (from anywhere; runs in the repo root)
# Knobs (environment):
#   SERVE_ROOT      nginx root; shards go in SERVE_ROOT/BUCKET [benches/out/cache/s3root]
#   BUCKET          bucket name (the subfolder)  [ringfeed-bench]
#   SHARDS          number of shards             [16]
#   SHARD_SIZE      size of each shard           [64MiB]   16 x 64 MiB = 1.07 GB
#   SAMPLE_SIZE     mean sample payload          [100KB]
#   SEED            generator seed               [0]
#   PORT            nginx port on 127.0.0.1      [18090]
#   NGINX_WORKERS   nginx worker_processes       [2]
#   ROUNDS          interleaved rounds           [5]
#   CACHE_DIR       the cache directory, on a disk (not tmpfs); made if
#                   missing, refused if it holds files this script did not
#                   put there; removed at the end   [benches/out/cache/dir]
#   CACHE_SIZE      cache_size                   [twice the shards, in GiB]
#   CACHE_MIN_FREE  cache_min_free; empty = ringfeed's default  []
#   CACHE_DIRECT    cache_direct; empty = ringfeed's default, or "on" where
#                   the page cache cannot be dropped  []
#   FIO_JOBS        fio job counts to measure    [1 2]
#   FIO_BS          fio block size               [8M]
#   FIO_IODEPTH     fio iodepth per job          [4]
#   WORKERS, CHUNK_SIZE, READS_IN_FLIGHT, MEMORY_BUDGET, IO_BACKEND
#                   ringfeed flags; empty = ringfeed's default
#   RINGFEED_ARGS   more ringfeed bench flags, word-split
#   PRIME_MEMORY    1: write and delete the scratch file before nocache
#                   and fill (above)             [1]
#   KEEP_CACHE      1: leave CACHE_DIR in place at the end [0]
#   OUT_DIR         raw JSON and commands        [benches/out/cache/<time>]
#   STRICT          1: exit 1 when a target is missed [0]
#   NET_RATE        nginx limit_rate per connection (e.g. 40m); empty = none []
#   SLOW_DISK       write limit on the cache's disk, bytes/s (e.g. 200000000);
#                   empty = none (needs root and a blkio/io cgroup) []
#   RF_BIN          a ringfeed binary to measure instead of building this tree
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

SERVE_ROOT=${SERVE_ROOT:-benches/out/cache/s3root}
BUCKET=${BUCKET:-ringfeed-bench}
SHARDS=${SHARDS:-16}
SHARD_SIZE=${SHARD_SIZE:-64MiB}
SAMPLE_SIZE=${SAMPLE_SIZE:-100KB}
SEED=${SEED:-0}
# Not http_vs_curl.sh's 18080, so the two can run on one machine.
PORT=${PORT:-18090}
NGINX_WORKERS=${NGINX_WORKERS:-2}
ROUNDS=${ROUNDS:-5}
CACHE_DIR=${CACHE_DIR:-benches/out/cache/dir}
CACHE_SIZE=${CACHE_SIZE:-}
CACHE_MIN_FREE=${CACHE_MIN_FREE:-}
CACHE_DIRECT=${CACHE_DIRECT:-}
FIO_JOBS=${FIO_JOBS:-1 2}
FIO_BS=${FIO_BS:-8M}
FIO_IODEPTH=${FIO_IODEPTH:-4}
WORKERS=${WORKERS:-}
CHUNK_SIZE=${CHUNK_SIZE:-}
READS_IN_FLIGHT=${READS_IN_FLIGHT:-}
MEMORY_BUDGET=${MEMORY_BUDGET:-}
IO_BACKEND=${IO_BACKEND:-}
RINGFEED_ARGS=${RINGFEED_ARGS:-}
PRIME_MEMORY=${PRIME_MEMORY:-1}
KEEP_CACHE=${KEEP_CACHE:-0}
OUT_DIR=${OUT_DIR:-benches/out/cache/$(date +%Y%m%d-%H%M%S)}
STRICT=${STRICT:-0}
NET_RATE=${NET_RATE:-}
SLOW_DISK=${SLOW_DISK:-}

BENCH=cache
# shellcheck source=benches/lib.sh
. benches/lib.sh

# --- 1. tools and binary ----------------------------------------------------
say "tools"
need_tools nginx:nginx curl:curl fio:fio fincore:util-linux
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
FIO=$(command -v fio)
command -v python3 >/dev/null || die "python3 is needed (timing, JSON)"
"$NGINX" -v 2>&1
fio --version
build_ringfeed

mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
CMDS=$OUT_DIR/commands.txt
: >"$CMDS"

# Dropping the page cache: drop_caches where permitted (root outside a
# container), else POSIX_FADV_DONTNEED on each entry file (clean pages go;
# sync first makes them clean), and ringfeed is told to read the cache with
# O_DIRECT, so that its reads reach the disk either way.
if [ -w /proc/sys/vm/drop_caches ] && sync && echo 1 2>/dev/null >/proc/sys/vm/drop_caches; then
    CAN_DROP=1
    DROP_HOW="sync; echo 3 > /proc/sys/vm/drop_caches"
    echo "page cache: dropped with drop_caches before each cached and fio run"
else
    CAN_DROP=0
    DROP_HOW="sync; POSIX_FADV_DONTNEED on each entry file"
    CACHE_DIRECT=${CACHE_DIRECT:-on}
    echo "page cache: not root (or drop_caches not writable here): dropping the entries with" \
        "POSIX_FADV_DONTNEED instead, and cache_direct is \"$CACHE_DIRECT\""
fi

# --- 2. dataset -------------------------------------------------------------
say "dataset"
gen_shards "$SERVE_ROOT/$BUCKET"
{
    echo "# ringfeed built from $SOURCE"
    echo "# in $ROOT"
    echo "# dataset"
    show "${GEN[@]}"
} >>"$CMDS"
SERVE_ROOT=$(cd "$SERVE_ROOT" && pwd)
KEYS=()
for f in "${FILES[@]}"; do KEYS+=("$(basename "$f")"); done
# Sums in bash: mawk's printf %d saturates at 2^31 - 1.
DATA_BYTES=0
for f in "${FILES[@]}"; do DATA_BYTES=$((DATA_BYTES + $(stat -c %s "$f"))); done
echo "$SHARDS shards, $DATA_BYTES bytes in $SHARDS_DIR"
last=$((SHARDS - 1))
width=${#KEYS[0]}
width=$((width - 10)) # "shard-" and ".tar"
RANGE="{$(printf "%0${width}d" 0)..$(printf "%0${width}d" "$last")}"
[ "$(printf "shard-%0${width}d.tar" "$last")" = "${KEYS[last]}" ] ||
    die "shards are not numbered shard-0..$last: ${KEYS[last]}"

# --- 3. the cache directory -------------------------------------------------
say "cache directory"
# A marker says the directory is this script's to empty: it refuses to
# delete files from a directory it did not make.
MARK=.ringfeed-bench-cache
mkdir -p "$CACHE_DIR"
CACHE_DIR=$(cd "$CACHE_DIR" && pwd)
case "$CACHE_DIR" in *:*) die "fio's --filename cannot take a ':' in $CACHE_DIR" ;; esac
if [ ! -e "$CACHE_DIR/$MARK" ]; then
    [ -z "$(ls -A "$CACHE_DIR")" ] ||
        die "$CACHE_DIR is not empty and was not made by this script: set CACHE_DIR to a new directory"
    touch "$CACHE_DIR/$MARK"
fi
fstype=$(stat -f -c %T "$CACHE_DIR")
echo "$CACHE_DIR is on $fstype ($(df --output=source "$CACHE_DIR" | tail -1))"
case "$fstype" in
    tmpfs | ramfs) die "the cache must be on a disk, not $fstype: set CACHE_DIR" ;;
esac
df -h "$CACHE_DIR" | sed 's/^/  /'
avail=$(($(df --output=avail -B1 "$CACHE_DIR" | tail -1)))
[ "$avail" -ge $((DATA_BYTES * 2)) ] ||
    die "$CACHE_DIR has $avail B free, less than twice the shards ($DATA_BYTES B)"
# Empties the cache (all but the marker), and syncs, so the next run
# starts on a quiet disk.
empty_cache() {
    find "$CACHE_DIR" -mindepth 1 -maxdepth 1 ! -name "$MARK" -exec rm -rf {} +
    sync
}
cleanup_cache() {
    if [ "$KEEP_CACHE" = 1 ]; then
        echo "cache left in $CACHE_DIR (KEEP_CACHE=1)"
    elif [ -e "$CACHE_DIR/$MARK" ]; then
        rm -rf "$CACHE_DIR"
        echo "cache directory removed"
    fi
}
empty_cache
mapfile -t ENTRIES < <(find "$CACHE_DIR" -maxdepth 1 -name '[!.]*.rfc' | sort)
[ -n "$CACHE_SIZE" ] || CACHE_SIZE="$(((DATA_BYTES * 2 + (1 << 30) - 1) >> 30))GiB"

# --- 4. nginx ---------------------------------------------------------------
say "page cache"
cat "${FILES[@]}" >/dev/null
echo "shards resident after one read: $(resident)"
say "nginx"
port_free "$PORT" || die "port $PORT on 127.0.0.1 is taken (set PORT=)"
NG=$OUT_DIR/nginx
mkdir -p "$NG/tmp"
cat >"$NG/nginx.conf" <<EOF
# Written by benches/cache.sh, as benches/http_vs_curl.sh writes its own
# (the reasons for each setting are there).
worker_processes $NGINX_WORKERS;
pid $NG/nginx.pid;
error_log $NG/error.log warn;
events {
    worker_connections 4096;
    multi_accept on;
}
http {
    access_log off;
    default_type application/octet-stream;
    types { }
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 300s;
    keepalive_requests 10000000;
    open_file_cache max=1024 inactive=300s;
    client_body_temp_path $NG/tmp/body;
    proxy_temp_path $NG/tmp/proxy;
    fastcgi_temp_path $NG/tmp/fastcgi;
    uwsgi_temp_path $NG/tmp/uwsgi;
    scgi_temp_path $NG/tmp/scgi;
    server {
        listen 127.0.0.1:$PORT;
        root $SERVE_ROOT;
        location / { ${NET_RATE:+limit_rate $NET_RATE;} }
    }
}
EOF
on_exit() {
    stop_nginx
    cleanup_cache
    [ -z "${CGROUP:-}" ] || rmdir "$CGROUP" 2>/dev/null || true
}
trap on_exit EXIT
NGINX_CMD=("$NGINX" -p "$NG" -e "$NG/error.log" -c "$NG/nginx.conf")
show "${NGINX_CMD[@]}"
"${NGINX_CMD[@]}"
BASE=http://127.0.0.1:$PORT
check_ranged_get
# The cache checks a shard's version with its ETag: nginx must send one.
curl -sf -I "$BASE/$BUCKET/${KEYS[0]}" | grep -qi '^etag:' || die "nginx sent no ETag"
echo "nginx $NGINX_WORKERS workers at $BASE/$BUCKET/ (root $SERVE_ROOT)${NET_RATE:+, limit_rate $NET_RATE per connection}"

# The slow disk (SLOW_DISK, in the header): a cgroup whose processes write
# to the disk under CACHE_DIR at most SLOW_DISK bytes/s. THROTTLED runs a
# command in it.
THROTTLED=()
CGROUP=
if [ -n "$SLOW_DISK" ]; then
    src=$(df --output=source "$CACHE_DIR" | tail -1)
    disk=$(lsblk -no PKNAME "$src" 2>/dev/null | head -1)
    disk=/dev/${disk:-${src#/dev/}}
    majmin=$(lsblk -ndo MAJ:MIN "$disk" | tr -d ' ')
    [ -n "$majmin" ] || die "SLOW_DISK: no block device under $CACHE_DIR ($src)"
    if [ -d /sys/fs/cgroup/blkio ]; then
        CGROUP=/sys/fs/cgroup/blkio/ringfeed-bench-cache-$$
        mkdir "$CGROUP" || die "SLOW_DISK: cannot make $CGROUP (root is needed)"
        echo "$majmin $SLOW_DISK" >"$CGROUP/blkio.throttle.write_bps_device"
    elif grep -qw io /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
        CGROUP=/sys/fs/cgroup/ringfeed-bench-cache-$$
        echo +io >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
        mkdir "$CGROUP" || die "SLOW_DISK: cannot make $CGROUP (root is needed)"
        echo "$majmin wbps=$SLOW_DISK" >"$CGROUP/io.max"
    else
        die "SLOW_DISK: neither a cgroup v1 blkio hierarchy nor a v2 io controller here"
    fi
    THROTTLED=(sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CGROUP")
    echo "slow disk: writes to $disk ($majmin) at most $SLOW_DISK B/s for the timed ringfeed runs ($CGROUP)"
fi
{
    echo "# nginx (config: nginx/nginx.conf)"
    show "${NGINX_CMD[@]}"
} >>"$CMDS"

# --- 5. the contenders ------------------------------------------------------
HTTP_URL="$BASE/$BUCKET/shard-$RANGE.tar"
RF_FLAGS=(--json --epochs 1)
[ -n "$WORKERS" ] && RF_FLAGS+=(--workers "$WORKERS")
[ -n "$CHUNK_SIZE" ] && RF_FLAGS+=(--chunk-size "$CHUNK_SIZE")
[ -n "$READS_IN_FLIGHT" ] && RF_FLAGS+=(--reads-in-flight "$READS_IN_FLIGHT")
[ -n "$MEMORY_BUDGET" ] && RF_FLAGS+=(--memory-budget "$MEMORY_BUDGET")
[ -n "$IO_BACKEND" ] && RF_FLAGS+=(--io-backend "$IO_BACKEND")
# shellcheck disable=SC2206 # word splitting is the point
[ -n "$RINGFEED_ARGS" ] && RF_FLAGS+=($RINGFEED_ARGS)
# The cache's keys, as one JSON object (json.dumps quotes the path).
cache_config() { # $1: the directory
    python3 - "$1" "$CACHE_SIZE" "$CACHE_MIN_FREE" "$CACHE_DIRECT" ${2:+"$2"} <<'EOF'
import json, sys
d, size, min_free, direct = sys.argv[1:5]
c = {"cache_dir": d, "cache_size": size}
if len(sys.argv) > 5:
    c["cache_fill"] = sys.argv[5]
if min_free:
    c["cache_min_free"] = min_free
if direct:
    c["cache_direct"] = direct
print(json.dumps(c))
EOF
}
CACHE_CONFIG=$(cache_config "$CACHE_DIR")
NOCACHE_CMD=("${THROTTLED[@]}" "$RF" bench "$HTTP_URL" "${RF_FLAGS[@]}")
CACHE_CMD=("${THROTTLED[@]}" "$RF" bench "$HTTP_URL" "${RF_FLAGS[@]}" --config "$CACHE_CONFIG")
# Untimed: completes the cache for the cached and fio runs, at the disk's
# own speed.
ALWAYS_UNTIMED=("$RF" bench "$HTTP_URL" "${RF_FLAGS[@]}" --config "$(cache_config "$CACHE_DIR" always)")
ALWAYS_CMD=("${THROTTLED[@]}" "${ALWAYS_UNTIMED[@]}")

# The report's names for the cache's figures (in "stats", or at the top).
CACHE_HITS=cache_hits
CACHE_MISSES=cache_misses
CACHE_BYTES=cache_bytes
CACHE_WRITTEN=cache_written
# Prints the named fields of a ringfeed report, space-separated, "?" for a
# missing one: $1 the JSON file, the rest field names.
fields() {
    python3 - "$@" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
s = d.get("stats", {})
print(" ".join(str(s.get(k, d.get(k, "?"))) for k in sys.argv[2:]))
EOF
}

# Runs a contender: $1 = JSON file, the rest the command. benches/timed.py
# times the whole process and keeps the contender's own JSON report.
run_json() {
    local out=$1
    shift
    python3 "$ROOT/benches/timed.py" "$out" -- "$@" ||
        die "this command failed (stderr in $out.stderr):$(printf ' %q' "$@" | cut -c1-400)"
}

# Does this build have the cache, and does its report name the figures as
# this script reads them? One shard, twice, in a directory of its own,
# written with `cache_fill` "always" (a spare fill of one shard read in a
# fraction of a second is given up at close when the disk is slower than
# the network: what the figures below measure, not what this probe asks).
say "cache support (one shard, written then read back)"
PROBE_DIR=$CACHE_DIR/probe
mkdir -p "$PROBE_DIR"
PROBE_CMD=("$RF" bench "$BASE/$BUCKET/${KEYS[0]}" --json --epochs 1 --config "$(cache_config "$PROBE_DIR" always)")
show "${PROBE_CMD[@]}"
for pass in 1 2; do
    if ! "${PROBE_CMD[@]}" >"$OUT_DIR/probe-$pass.json" 2>"$OUT_DIR/probe-$pass.stderr"; then
        sed 's/^/  /' "$OUT_DIR/probe-$pass.stderr"
        grep -q 'unknown key `cache_' "$OUT_DIR/probe-$pass.stderr" &&
            die "this build has no disk cache (the cache_* keys are unknown)"
        die "ringfeed with the cache failed on one shard (above)"
    fi
    read -r h m b w < <(fields "$OUT_DIR/probe-$pass.json" "$CACHE_HITS" "$CACHE_MISSES" "$CACHE_BYTES" "$CACHE_WRITTEN")
    echo "  pass $pass: hits $h, misses $m, bytes from the cache $b, written $w"
done
python3 - "$OUT_DIR/probe-2.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
s = d.get("stats", {})
cache = {k: v for k, v in {**d, **s}.items() if "cache" in k and k != "cuda_registered"}
print("  the report's cache fields:", json.dumps(cache))
for n in s.get("notes", []):
    if "cache" in n.lower():
        print("  note:", n)
EOF
[ "$h" = 1 ] && [ "$m" = 0 ] ||
    die "one shard written then read again was not a cache hit (hits $h, misses $m; fields $CACHE_HITS, $CACHE_MISSES: see probe-2.json)"
rm -rf "$PROBE_DIR"

# fio on the entries: J jobs (threads of one process, as ringfeed's workers
# are), the entries (sorted) dealt round-robin, each job reading its files
# start to end one after the other, O_DIRECT, into registered buffers
# (fixedbufs, as ringfeed registers its arena). Sets FIO_CMD.
fio_cmd() { # $1: jobs
    local j i names
    mapfile -t ENTRIES < <(find "$CACHE_DIR" -maxdepth 1 -name '[!.]*.rfc' | sort)
    [ "${#ENTRIES[@]}" -gt 0 ] || die "no cache entries in $CACHE_DIR for fio"
    FIO_CMD=("$FIO" --output-format=json --thread --direct=1 --ioengine=io_uring
             --rw=read --bs="$FIO_BS" --iodepth="$FIO_IODEPTH" --fixedbufs=1
             --file_service_type=sequential)
    for ((j = 0; j < $1; j++)); do
        names=()
        for ((i = j; i < ${#ENTRIES[@]}; i += $1)); do names+=("${ENTRIES[i]}"); done
        [ "${#names[@]}" -gt 0 ] || continue
        FIO_CMD+=(--name="j$j" --filename="$(IFS=:; echo "${names[*]}")")
    done
}

# The fraction of the entries' bytes in the page cache.
entries_resident() {
    fincore --bytes --noheadings --raw -o RES,SIZE "$CACHE_DIR"/*.rfc |
        awk '{r = ($1 < $2) ? $1 : $2; res += r; size += $2} END {printf "%.4f\n", size ? res / size : 0}'
}
# Drops the page cache (see DROP_HOW) before a cold run, reads the two
# binaries and their libraries back, and checks with fincore that the
# entries are out. Appends "LABEL RESIDENT_AFTER" to dropped.txt.
BINS=("$RF" "$FIO")
mapfile -t -O 2 BINS < <(ldd "$RF" "$FIO" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
drop_cache() {
    local res
    sync
    if [ "$CAN_DROP" = 1 ]; then
        echo 3 >/proc/sys/vm/drop_caches
    else
        python3 - "$CACHE_DIR"/*.rfc <<'EOF'
import os, sys
for f in sys.argv[1:]:
    fd = os.open(f, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
EOF
    fi
    cat "${BINS[@]}" >/dev/null
    res=$(entries_resident)
    echo "$1 $res" >>"$OUT_DIR/dropped.txt"
    python3 -c "import sys; sys.exit(0 if float('$res') <= 0.01 else 1)" ||
        echo "  WARNING: $res of the entries' bytes still cached before $1"
}

# Writes and deletes the scratch file (PRIME_MEMORY, in the header).
# Appends "LABEL NS" (the time it took) to primed.txt.
prime_memory() {
    [ "$PRIME_MEMORY" = 1 ] || return 0
    local t0 t1
    t0=$(now_ns)
    python3 - "$CACHE_DIR/.prime" $((DATA_BYTES + (512 << 20))) <<'EOF'
import os, sys
path, n = sys.argv[1], int(sys.argv[2])
buf = b"\x5a" * (8 << 20)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
try:
    while n > 0:
        n -= os.write(fd, buf[:min(n, len(buf))])
finally:
    os.close(fd)
    os.unlink(path)
EOF
    t1=$(now_ns)
    echo "$1 $((t1 - t0))" >>"$OUT_DIR/primed.txt"
}
run_nocache() {
    ensure_hot "$2"
    prime_memory "$2"
    run_json "$1" "${NOCACHE_CMD[@]}"
}
run_fill() { fill_with "$1" "$2" spare "${CACHE_CMD[@]}"; }
run_fillall() { fill_with "$1" "$2" always "${ALWAYS_CMD[@]}"; }
fill_with() { # $1 out, $2 label, $3 mode, the rest: the command
    local out=$1 label=$2 mode=$3 t0 t1 m w u n h
    shift 3
    ensure_hot "$label"
    empty_cache
    prime_memory "$label"
    run_json "$out" "$@"
    set -- "$out" "$label"
    t0=$(now_ns)
    sync
    t1=$(now_ns)
    echo "$2 $((t1 - t0))" >>"$OUT_DIR/writeback.txt"
    read -r m w u < <(fields "$1" "$CACHE_MISSES" "$CACHE_WRITTEN" cache_uncached)
    n=$(find "$CACHE_DIR" -maxdepth 1 -name '[!.]*.rfc' | wc -l)
    echo "  fill ($mode): misses $m, written $w, uncached $u, $n entries in the cache, write-back after exit $(((t1 - t0) / 1000000)) ms"
    echo "$2 $n" >>"$OUT_DIR/entries.txt"
    [ "$m" = "$SHARDS" ] || die "fill: $m cache misses reported, expected $SHARDS ($1)"
    if [ "$mode" = spare ]; then
        # The second run, on what this fill left (untimed).
        "${CACHE_CMD[@]}" >"$1.second" 2>"$1.second.stderr" || die "the second run failed: $1.second.stderr"
        read -r h m < <(fields "$1.second" "$CACHE_HITS" "$CACHE_MISSES")
        echo "  second run: $h of $SHARDS shards from the cache (misses $m)"
        echo "$2 $h" >>"$OUT_DIR/second.txt"
        return 0
    fi
    [ "$u" = 0 ] || die "fill: $u shards read uncached (the report's notes say why: $1)"
    # Too little free space (cache_min_free, 10% by default) is the likely
    # cause of entries missing: say how much there is.
    [ "$n" = "$SHARDS" ] || die "fill: $n entries in $CACHE_DIR, expected $SHARDS" \
        "(its file system has $(df --output=pcent "$CACHE_DIR" | tail -1 | tr -d ' ') used;" \
        "cache_min_free: ${CACHE_MIN_FREE:-default}; see $1 and $1.stderr)"
}
# Completes the cache a spare fill left partial (untimed): the cached and
# fio runs read every shard's entry.
complete_cache() {
    "${ALWAYS_UNTIMED[@]}" >"$1.complete" 2>&1 || die "completing the cache failed: $1.complete"
}
run_cached() {
    local h m b
    complete_cache "$1"
    drop_cache "$2"
    run_json "$1" "${CACHE_CMD[@]}"
    read -r h m b < <(fields "$1" "$CACHE_HITS" "$CACHE_MISSES" "$CACHE_BYTES")
    echo "  cached: hits $h, misses $m, bytes from the cache $b"
    [ "$h" = "$SHARDS" ] && [ "$m" = 0 ] ||
        die "cached: every shard must be a cache hit: hits $h, misses $m, of $SHARDS ($1)"
}
for J in $FIO_JOBS; do
    eval "run_fio$J() { complete_cache \"\$1\"; drop_cache \"\$2\"; fio_cmd $J; run_json \"\$1\" \"\${FIO_CMD[@]}\"; }"
done

{
    echo "# nocache: ringfeed over HTTP, no cache"
    show "${NOCACHE_CMD[@]}"
    echo "# fill (cache emptied before; then sync, timed apart) and cached (page cache dropped before: $DROP_HOW)"
    show "${CACHE_CMD[@]}"
} >>"$CMDS"

WHO=(nocache fill fillall cached)
for J in $FIO_JOBS; do WHO+=("fio$J"); done

say "warm-up (one run of each, not counted; the fill leaves the cache for round 1)"
: >"$OUT_DIR/residency.txt"
: >"$OUT_DIR/dropped.txt"
: >"$OUT_DIR/writeback.txt"
: >"$OUT_DIR/entries.txt"
: >"$OUT_DIR/primed.txt"
: >"$OUT_DIR/second.txt"
for who in "${WHO[@]}"; do
    echo "$who"
    "run_$who" "$OUT_DIR/warmup-$who.json" "warmup-$who"
done
for J in $FIO_JOBS; do
    fio_cmd "$J"
    { echo "# fio$J (page cache dropped before; the entries as they are after a fill)"; show "${FIO_CMD[@]}"; } >>"$CMDS"
done
ENTRY_BYTES=0
for f in "${ENTRIES[@]}"; do ENTRY_BYTES=$((ENTRY_BYTES + $(stat -c %s "$f"))); done
echo "${#ENTRIES[@]} entries, $ENTRY_BYTES bytes in $CACHE_DIR (the shards: $DATA_BYTES bytes)"
avail=$(($(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) * 1024))
echo "MemAvailable $avail B; shards $DATA_BYTES B"

# --- 6. interleaved rounds --------------------------------------------------
say "rounds"
# Other work on the machine slows every contender alike (that is why the
# rounds interleave), but it makes the absolute GB/s a floor, not a figure.
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
n=${#WHO[@]}
for ((r = 1; r <= ROUNDS; r++)); do
    # Rotate who goes first so none always runs on a warmer machine.
    order=()
    for ((i = 0; i < n; i++)); do order+=("${WHO[(i + r - 1) % n]}"); done
    echo "round $r: ${order[*]}"
    for who in "${order[@]}"; do
        "run_$who" "$OUT_DIR/round-$r-$who.json" "$r-$who"
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# --- 7. tables and summary --------------------------------------------------
python3 - "$OUT_DIR" "$ROUNDS" "$STRICT" "${WHO[*]}" "$DATA_BYTES" "$ENTRY_BYTES" "$SOURCE" \
    "$CACHE_HITS" "$CACHE_MISSES" "$CACHE_BYTES" "$CACHE_WRITTEN" "$DROP_HOW" "$SHARDS" \
    "net ${NET_RATE:-unlimited} a connection, disk writes ${SLOW_DISK:-unlimited} B/s" "$SLOW_DISK" <<'EOF'
import json, statistics, sys
out, rounds, strict = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
who, data, entry_bytes, source = sys.argv[4].split(), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
F = dict(zip(("hits", "misses", "bytes", "written"), sys.argv[8:12]))
drop_how = sys.argv[12]
shards, setting, slow_disk = int(sys.argv[13]), sys.argv[14], sys.argv[15] != ""
med = statistics.median
mark = lambda ok: "PASS" if ok else "MISS"
GB = data / 1e9
fios = [w for w in who if w.startswith("fio")]

def load(path):
    d = json.load(open(path))
    # Whole process, in the shards' bytes (the same count for everyone).
    f = {"gbs": GB / d["process_wall_s"], "cpu": d["process_cpu_s"] / GB,
         "wall": d["process_wall_s"]}
    if "jobs" in d:  # fio
        jobs = d["jobs"]
        b = sum(j["read"]["io_bytes"] for j in jobs)
        secs = max(j["read"]["runtime"] for j in jobs) / 1e3
        cpu = sum((j["usr_cpu"] + j["sys_cpu"]) / 100 * j["read"]["runtime"] / 1e3 for j in jobs)
        f.update(own_gbs=b / secs / 1e9, own_cpu=cpu / (b / 1e9), read_bytes=b)
    else:  # ringfeed
        s = d["stats"]
        f.update(own_gbs=d["gb_per_s"], own_cpu=d["cpu_s_per_gb"], read_bytes=s["bytes_read"],
                 requests=s["http_requests"], ttfb=s["time_to_first_batch_ns"] / 1e9,
                 rss=d["peak_rss_bytes"],
                 cache={k: s.get(v, d.get(v)) for k, v in F.items()},
                 cache_fields={k: v for k, v in {**d, **s}.items()
                               if "cache" in k and k != "cuda_registered"},
                 cache_notes=[n for n in s.get("notes", []) if "cache" in n.lower()],
                 stats=s)
    return f

dropped = dict(line.split() for line in open(f"{out}/dropped.txt"))
writeback = {k: int(v) / 1e9 for k, v in (line.split() for line in open(f"{out}/writeback.txt"))}
rows = []
for r in range(1, rounds + 1):
    row = {w: load(f"{out}/round-{r}-{w}.json") for w in who}
    row["writeback_s"] = writeback[f"{r}-fill"]
    row["resident_after_drop"] = {w: float(dropped[f"{r}-{w}"]) for w in who if f"{r}-{w}" in dropped}
    rows.append(row)

def stat(w, k):
    xs = [x[w][k] for x in rows]
    return med(xs), min(xs), max(xs)

# The fio reference: the job count with the higher median GB/s.
ref = max(fios, key=lambda w: stat(w, "gbs")[0])

def ratio(a, b, k="gbs"):
    """The ratio of the medians, the per-round ratios, and their range."""
    per = [x[a][k] / x[b][k] for x in rows]
    return stat(a, k)[0] / stat(b, k)[0], per

print()
print(f"whole process (spawn to exit; CPU from wait4), {GB:.3f} GB of shards a run; own clock in brackets")
hdr = (f"{'round':>5} " + " ".join(f"{w + ' GB/s':>16}" for w in who) + "  " +
       " ".join(f"{w + ' CPU/GB':>16}" for w in who) +
       f" {'fill/nocache':>12} {'cached/' + ref:>12} {'sync s':>7}")
print(hdr)
print("-" * len(hdr))
for i, row in enumerate(rows, 1):
    print(f"{i:>5} " + " ".join(f"{row[w]['gbs']:>6.3f} [{row[w]['own_gbs']:>6.3f}] " for w in who) + " " +
          " ".join(f"{row[w]['cpu']:>6.3f} [{row[w]['own_cpu']:>6.3f}] " for w in who) +
          f" {row['fill']['gbs'] / row['nocache']['gbs']:>12.3f}"
          f" {row['cached']['gbs'] / row[ref]['gbs']:>12.3f} {row['writeback_s']:>7.2f}")

names = {"nocache": "ringfeed http, no cache", "fill": "ringfeed http, cache writing",
         "fillall": "ringfeed http, cache writing all",
         "cached": "ringfeed from the cache, cold"}
for w in fios:
    j = w[3:]
    names[w] = f"fio --direct=1, {j} job{'s' if j != '1' else ''}"
print()
print(f"summary: medians of {rounds} rounds [min-max], ringfeed built from {source}")
print(f"  {'':32} {'GB/s whole':>21} {'CPU-s/GB whole':>21} {'GB/s own':>8} {'CPU/GB own':>10} {'wall s':>7}")
for w in who:
    g, c = stat(w, "gbs"), stat(w, "cpu")
    print(f"  {names[w]:<32} {g[0]:>6.3f} [{g[1]:.3f}-{g[2]:.3f}] {c[0]:>7.3f} [{c[1]:.3f}-{c[2]:.3f}]"
          f" {stat(w, 'own_gbs')[0]:>8.3f} {stat(w, 'own_cpu')[0]:>10.3f} {stat(w, 'wall')[0]:>7.3f}")
primed = [int(line.split()[1]) / 1e9 for line in open(f"{out}/primed.txt")]
if primed:
    print(f"  memory primed before each nocache and fill (PRIME_MEMORY): {min(primed):.2f}-{max(primed):.2f} s a time, untimed")
wb = [x["writeback_s"] for x in rows]
ent = dict(line.split() for line in open(f"{out}/entries.txt"))
spare_n = [int(ent[f"{r}-fill"]) for r in range(1, rounds + 1)]
print(f"  entries written by the spare fill: {' '.join(map(str, spare_n))} of {rows[0]['fill']['cache']['misses']} "
      f"(the rest is filled by a later epoch)")
sec = dict(line.split() for line in open(f"{out}/second.txt"))
second = [int(sec[f"{r}-fill"]) / shards for r in range(1, rounds + 1)]
print(f"  second run after each spare fill: " + " ".join(f"{x:.2f}" for x in second) +
      f" of the shards from the cache ({setting})")
print(f"  write-back (sync) right after each fill, outside its figure: median {med(wb):.2f} s "
      f"[{min(wb):.2f}-{max(wb):.2f}]")
fill_c, cached_c = rows[0]["fill"]["cache"], rows[0]["cached"]["cache"]
print(f"  fill report (round 1): hits {fill_c['hits']}, misses {fill_c['misses']}, written {fill_c['written']}; "
      f"cached report: hits {cached_c['hits']}, misses {cached_c['misses']}, "
      f"bytes from the cache {cached_c['bytes']} (shards {data})")
for w in ("fill", "cached"):
    print(f"  {w} run's cache fields (round 1): {json.dumps(rows[0][w]['cache_fields'])}")
notes = sorted({n for x in rows for w in ("fill", "cached") for n in x[w]["cache_notes"]})
for n in notes:
    print(f"  note from ringfeed: {n}")
print(f"  http requests a run: nocache {rows[0]['nocache']['requests']}, fill {rows[0]['fill']['requests']}, "
      f"cached {rows[0]['cached']['requests']}")
print(f"  fio reads {rows[0][ref]['read_bytes']} B of the {entry_bytes} B of entry files "
      f"({rows[0][ref]['read_bytes'] / data:.4f} x the shards' bytes: whole blocks only)")
st = rows[0]["cached"]["stats"]
MiB = 1 << 20
print(f"  ringfeed (cached run): {st['workers']} workers, {st['io_backend']}, chunk {st['chunk_size'] // MiB} MiB, "
      f"arena {st['arena_bytes'] // MiB} MiB in {st['memory_kind']} memory, cache reads {st.get('cache_reads', '?')}")
res = [v for x in rows for v in x["resident_after_drop"].values()]
print(f"  page cache before each cold run ({drop_how}): entries resident at most {max(res):.4f}")
print(f"  fio reference: {names[ref]} (the higher median of {', '.join(fios)})")

checks, ratios = {}, {}
def target(name, a, b, bound):
    r, per = ratio(a, b)
    ok = r >= bound
    checks[name] = ok
    ratios[name] = {"ratio_of_medians": r, "per_round": per}
    print(f"  {names[a] + ' / ' + names[b] + ' GB/s':<72} {r:6.3f} [{min(per):.3f}-{max(per):.3f}]"
          f"  target >= {bound}  {mark(ok)}")
def info(name, a, b, k):
    r, per = ratio(a, b, k)
    ratios[name] = {"ratio_of_medians": r, "per_round": per}
    what = {"gbs": "GB/s", "cpu": "CPU-s/GB", "own_gbs": "GB/s, own clocks"}[k]
    print(f"  {names[a] + ' / ' + names[b] + ' ' + what:<72} {r:6.3f} [{min(per):.3f}-{max(per):.3f}]")

print()
print("ratios of the whole-process medians [per-round min-max]")
target("fill_vs_nocache_gbs", "fill", "nocache", 0.9)
target("cached_vs_fio_gbs", "cached", ref, 0.9)
ratios["second_run_from_cache"] = {"median": med(second), "per_round": second}
if slow_disk:
    print(f"  {'second run: the fraction of shards from the cache (slow disk: no target)':<72} {med(second):6.3f} [{min(second):.3f}-{max(second):.3f}]")
else:
    checks["second_run_from_cache"] = med(second) >= 0.9
    print(f"  {'second run: the fraction of shards from the cache':<72} {med(second):6.3f} [{min(second):.3f}-{max(second):.3f}]"
          f"  target >= 0.9  {mark(checks['second_run_from_cache'])}")
for w in fios:
    if w != ref:
        info(f"cached_vs_{w}_gbs", "cached", w, "gbs")
info("fillall_vs_nocache_gbs", "fillall", "nocache", "gbs")
info("fill_vs_nocache_cpu", "fill", "nocache", "cpu")
info("cached_vs_fio_cpu", "cached", ref, "cpu")
# Own clocks leave out each process's start-up and exit (fio's is ~0.2 s
# here, ringfeed's arena about as long): the same comparison, stricter for
# short runs; no target.
info("fill_vs_nocache_own_gbs", "fill", "nocache", "own_gbs")
info("cached_vs_fio_own_gbs", "cached", ref, "own_gbs")
print("per-round ratios: fill/nocache " + " ".join(f"{x:.3f}" for x in ratios["fill_vs_nocache_gbs"]["per_round"]) +
      "; cached/" + ref + " " + " ".join(f"{x:.3f}" for x in ratios["cached_vs_fio_gbs"]["per_round"]))

summary = {"source": source, "setting": setting, "shard_bytes_per_run": data, "entry_bytes": entry_bytes,
           "fio_reference": ref, "drop": drop_how,
           "rounds": [{**{w: {k: v for k, v in x[w].items() if k != "stats"} for w in who},
                       "writeback_s": x["writeback_s"], "resident_after_drop": x["resident_after_drop"]}
                      for x in rows],
           "median": {w: {k: stat(w, k)[0] for k in ("gbs", "cpu", "own_gbs", "own_cpu", "wall")} for w in who},
           "ratios": ratios, "targets": {k: mark(v) for k, v in checks.items()}}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
if strict and not all(checks.values()):
    sys.exit(1)
EOF

finish_run
