#!/usr/bin/env bash
# ringfeed and its peers against the object-store emulator: S3's shape of
# performance (first-byte latency, bandwidth per connection and per object,
# a request-rate limit) on one machine, every client reading the same
# objects from the same emulator in one run.
#
# A benchmark program, not a test (docs/design.md): every contender is
# timed over its whole process by benches/timed.py (spawn to exit, CPU from
# wait4, start-up and every thread included) and counted in the objects'
# bytes; ROUNDS interleaved rounds, a rotating order, medians, ratios of
# medians. PASS/MISS marks the Show targets of the issue on line rate from
# an object store (STRICT=1 turns a MISS into exit status 1). Between
# contenders the emulator's counters are reset and read at
# /_emulator/stats, so each gets its own requests, 503s and transfers in
# flight (time-weighted mean over its requests' window, and max).
#
# The server: examples/store_emulator.rs (release build) serving
# DATA_DIR, each folder a bucket, accepting the dummy credentials unchecked,
# 1250 MB/s per object (one stored part) in every scenario.
#
# The contenders (scenarios A and B):
#   rf        ringfeed bench s3://big/shard-{...}.tar --json, defaults, the
#             endpoint by --endpoint-url and dummy credentials in the env
#   rf_rif16  the same with --reads-in-flight 16
#   boto3     benches/boto3_ranged.py: 32 threads of PART (8 MiB) ranges
#   s3torch   benches/_s3torch_read.py: s3torchconnector (the AWS CRT), an
#             S3IterableDataset over the objects, each read() whole
#   s3dlio    benches/_s3dlio_read.py: s3dlio.get_many of the objects
#             (endpoint by AWS_ENDPOINT_URL)
#   curl32, curl64, curl128
#             one curl --parallel --parallel-max N over a config of every
#             PART range to /dev/null: the reference ceiling on this machine
#             is the best of the three
# Peers are pip-installed into PEER_VENV when missing (benches/out, not a
# shared environment); one that cannot be is printed SKIPPED with the
# reason, never counted.
#
# Scenarios (SCENARIOS, default "A B C D E F L"):
#   A  latency 20ms:120ms (median:p99, lognormal), 90MB/s a connection,
#      SHARDS shards of SHARD_SIZE (16 x 256 MiB)
#   B  50ms:300ms, 60MB/s a connection
#   C  A with the latency model off: ringfeed only, for its CPU-s per GB
#   D  latency 20ms:120ms, no bandwidth model, a request-rate limit of
#      RATE_N/s per bucket (burst a tenth of a second): ringfeed with
#      --chunk-size PART against RATE_N x the bytes ringfeed sent per GET
#   E  SMALL_SHARDS shards of SMALL_SIZE (1,000 x 1 MiB) on model A:
#      ringfeed's GB/s and its first batch against the model's p99
#   F  one object of OBJECT_SIZE (1 GiB) on model A: ringfeed get to
#      /dev/null against curl x4 ranged (a quarter each) and curl 64 x PART
#   L  A over PASSES passes of the data (ringfeed --epochs, boto3
#      --epochs, every curl range PASSES times): what a run longer than a
#      few seconds sees, once the memory a reader holds is touched (on a
#      VM whose host backs a page only at its first touch, that costs
#      ~2.5 ms per MB: benches/first_touch.sh)
# Targets (the issue's Show), ratios of the whole-process medians:
#   A, B, L  ringfeed defaults / curl ceiling GB/s      >= 0.9
#         ringfeed defaults / boto3 GB/s                >= 1.75
#         ringfeed CPU-s per GB / its own in C (A, B)   <= 1.25
#   D     ringfeed GB/s / (RATE_N x its bytes per GET)  >= 0.9
#   E     ringfeed GB/s / its GB/s in A                 >= 0.5
#         first batch / p99 first byte (120 ms)         <= 3
#   F     ringfeed get / curl x4, / curl ceiling        >= 0.9
#
# Usage: benches/object_store.sh           (from anywhere; runs in the repo root)
# Knobs (environment):
#   SCENARIOS     which to run                         [A B C D E F L]
#   PASSES        scenario L's passes over the data    [3]
#   ROUNDS        interleaved rounds                   [3]
#   CONTENDERS    run only these (names above; curl: all three) [all]
#   SHARDS, SHARD_SIZE          scenario A-D data      [16, 256MiB]
#   SMALL_SHARDS, SMALL_SIZE    scenario E data        [1000, 1MiB]
#   OBJECT_SIZE   scenario F's object                  [1GiB]
#   SAMPLE_SIZE, SEED           ringfeed gen           [100KB, 0]
#   PART          range size of boto3, curl, D         [8MiB]
#   RATE_N        scenario D's requests a second       [200]
#   DATA_DIR      the emulator's root                  [benches/out/object_store/data]
#   PEER_VENV     the peers' virtual environment       [benches/out/peers-venv]
#   TORCH_SITE    site-packages holding torch, made visible to PEER_VENV
#                 (s3torchconnector needs torch)       [.venv's, if it has torch]
#   RF_BIN        a ringfeed binary built elsewhere    [build this tree]
#   EMU_BIN       an emulator binary built elsewhere   [build this tree]
#   OUT_DIR       raw JSON and logs                    [benches/out/object_store/<time>]
#   STRICT        1: exit 1 when a target is missed    [0]
#   PAGES         the free memory each contender starts on [asis]: on a
#                 VM whose balloon reports free pages to its host, a page
#                 free for ~2 s faults on the host at its next first touch
#                 (1.5-3 ms per MB), so whoever follows a contender that
#                 freed much memory starts on backed pages and a round's
#                 order decides part of its time. warm: 2 GiB of huge
#                 pages touched and freed just before each contender;
#                 cold: 5 s idle before each; asis: nothing (the figures
#                 in docs/benchmarks.md)
#
# Measured: docs/benchmarks.md, "An object store's shape" (2026-12-03, commit 4cf4d38).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

SCENARIOS=${SCENARIOS:-A B C D E F L}
PASSES=${PASSES:-3}
ROUNDS=${ROUNDS:-3}
CONTENDERS=${CONTENDERS:-}
# 16 x 256 MiB: the issue's large-shard dataset, 4.3 GB, a few seconds a
# contender at the rates the models allow here.
SHARDS=${SHARDS:-16}
SHARD_SIZE=${SHARD_SIZE:-256MiB}
SMALL_SHARDS=${SMALL_SHARDS:-1000}
SMALL_SIZE=${SMALL_SIZE:-1MiB}
OBJECT_SIZE=${OBJECT_SIZE:-1GiB}
SAMPLE_SIZE=${SAMPLE_SIZE:-100KB}
SEED=${SEED:-0}
# 8 MiB: boto3's and the CRT's default part, and the issue's.
PART=${PART:-8MiB}
RATE_N=${RATE_N:-200}
DATA_DIR=${DATA_DIR:-benches/out/object_store/data}
PEER_VENV=${PEER_VENV:-benches/out/peers-venv}
OUT_DIR=${OUT_DIR:-benches/out/object_store/$(date +%Y%m%d-%H%M%S)}
STRICT=${STRICT:-0}

BENCH=object_store
# shellcheck source=benches/lib.sh
. benches/lib.sh

say "tools"
command -v curl >/dev/null || die "curl is needed"
curl --version | head -1
build_ringfeed
if [ -n "${EMU_BIN:-}" ]; then
    EMU=$(realpath "$EMU_BIN")
else
    show cargo build --release --example store_emulator
    cargo build --release --example store_emulator
    EMU=$ROOT/target/release/examples/store_emulator
fi

say "peers"
SKIPS="{}"
skip() { SKIPS=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d[sys.argv[2]]=sys.argv[3]; print(json.dumps(d))' "$SKIPS" "$1" "$2"); echo "SKIPPED $1: $2"; }
if [ ! -x "$PEER_VENV/bin/python" ]; then
    PYTHON=python3
    [ -x .venv/bin/python ] && PYTHON=.venv/bin/python
    show "$PYTHON" -m venv "$PEER_VENV"
    "$PYTHON" -m venv "$PEER_VENV" || die "python -m venv failed (apt-get install python3-venv)"
fi
# Not realpath: the venv's python is a link whose own path makes it the venv's.
PEER_PY=$(cd "$PEER_VENV" && pwd)/bin/python
# torch is large: the peers' environment sees an existing one (the
# project's .venv) through a .pth file rather than installing its own.
TORCH_SITE=${TORCH_SITE:-}
if [ -z "$TORCH_SITE" ] && [ -x .venv/bin/python ] && .venv/bin/python -c "import torch" 2>/dev/null; then
    TORCH_SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
fi
if [ -n "$TORCH_SITE" ]; then
    echo "$TORCH_SITE" >"$("$PEER_PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/ringfeed-torch-site.pth"
fi
for pair in boto3:boto3 s3torch:s3torchconnector s3dlio:s3dlio; do
    who=${pair%%:*} pkg=${pair#*:}
    if ! "$PEER_PY" -c "import $pkg" 2>/dev/null; then
        show "$PEER_PY" -m pip install -q "$pkg"
        "$PEER_PY" -m pip install -q "$pkg" >"/tmp/object_store-pip-$who.log" 2>&1 || true
    fi
    if ver=$("$PEER_PY" -c "import importlib.metadata as m; print(m.version('$pkg'))" 2>/dev/null) &&
        "$PEER_PY" -c "import $pkg" 2>/dev/null; then
        echo "$pkg $ver"
    else
        why=$("$PEER_PY" -c "import $pkg" 2>&1 | tail -1 || true)
        skip "$who" "$pkg not importable after pip install: ${why:-see /tmp/object_store-pip-$who.log}"
    fi
done

say "datasets"
mkdir -p "$DATA_DIR" "$OUT_DIR"
DATA_DIR=$(cd "$DATA_DIR" && pwd)
OUT_DIR=$(cd "$OUT_DIR" && pwd)
ALL_FILES=()
for spec in "big:$SHARDS:$SHARD_SIZE" "small:$SMALL_SHARDS:$SMALL_SIZE" "obj:1:$OBJECT_SIZE"; do
    IFS=: read -r bucket n sz <<<"$spec"
    case $bucket in
        big) [[ $SCENARIOS =~ [ABCDL] ]] || continue ;;
        small) [[ $SCENARIOS == *E* ]] || continue ;;
        obj) [[ $SCENARIOS == *F* ]] || continue ;;
    esac
    SHARDS=$n SHARD_SIZE=$sz gen_shards "$DATA_DIR/$bucket"
    ALL_FILES+=("${FILES[@]}")
done
# In the page cache, so the emulator's models and not the disk are timed.
FILES=("${ALL_FILES[@]}")
cat "${FILES[@]}" >/dev/null
command -v fincore >/dev/null && echo "resident: $(resident)"

say "runs"
status=0
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
RF=$RF EMU=$EMU PEER_PY=$PEER_PY DATA_DIR=$DATA_DIR OUT_DIR=$OUT_DIR ROUNDS=$ROUNDS \
    SCENARIOS=$SCENARIOS PASSES=$PASSES STRICT=$STRICT PART=$PART RATE_N=$RATE_N SHARDS=$SHARDS \
    SMALL_SHARDS=$SMALL_SHARDS CONTENDERS=$CONTENDERS SKIPS=$SKIPS \
    python3 benches/object_store.py || status=$?
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "ringfeed built from $SOURCE"
exit $status
