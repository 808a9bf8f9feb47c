#!/usr/bin/env bash
# What following the Hugging Face Hub's redirects costs a read: the same
# shards read by `ringfeed bench` as hf:// URLs from the Hub emulator
# (examples/hub_emulator.rs: every shard's resolve/ URL answers 302 to its
# content host, which serves the ranges) and as plain http:// URLs from the
# object-store emulator's plain HTTP (examples/store_emulator.rs, bandwidth
# models off), both with the same first-byte latency LATENCY on every
# request, so each round trip costs what a far server's does.
#
# A benchmark program, not a test (docs/design.md). For each contender it
# prints the median GB/s over ROUNDS interleaved rounds (the ratio hf/http
# is the redirects' cost), and the requests each read made: ringfeed's own
# count (`http_requests`: API calls and GETs, retries included) and, for
# hf://, the emulator's: resolve/ requests (the redirects) and
# content-host GETs, against the ranged reads the loader made (its `reads`
# stat). The claim it checks: one redirect a shard, not one a range
# (resolves = SHARDS, content GETs = reads; hedges, when a late range is
# raced, add GETs, and ringfeed counts them in `hedges_sent`).
#
# Usage: benches/hub_redirects.sh        (from anywhere; runs in the repo root)
# Knobs (environment):
#   SHARDS, SHARD_SIZE, SAMPLE_SIZE, SEED  [32, 64MiB, 100KB, 0]
#   CHUNK      the loader's chunk_size (a range per chunk) [8MiB]
#   LATENCY    first-byte latency of every answer, both servers, or off [20ms]
#   WORKERS    loader workers [4]
#   ROUNDS     rounds (each contender once per round) [3]
#   BASELINE   another ringfeed binary (the commit before redirects were
#              followed) read over http:// the same way, contender `base`:
#              what following redirects costs a read that has none [unset]
#   OUT_DIR    where the data and the logs go [benches/out/hub_redirects]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
BENCH=hub_redirects
. benches/lib.sh

SHARDS=${SHARDS:-32}
SHARD_SIZE=${SHARD_SIZE:-64MiB}
SAMPLE_SIZE=${SAMPLE_SIZE:-100KB}
SEED=${SEED:-0}
CHUNK=${CHUNK:-8MiB}
LATENCY=${LATENCY:-20ms}
WORKERS=${WORKERS:-4}
ROUNDS=${ROUNDS:-3}
OUT_DIR=${OUT_DIR:-$ROOT/benches/out/hub_redirects}
mkdir -p "$OUT_DIR"

build_ringfeed
show cargo build --release --example hub_emulator --example store_emulator
cargo build --release --example hub_emulator --example store_emulator
HUB=$ROOT/target/release/examples/hub_emulator
STORE=$ROOT/target/release/examples/store_emulator

# The Hub emulator serves ORG/NAME folders: the shards go in org/bench/train.
DATA=$OUT_DIR/data
gen_shards "$DATA/org/bench/train"

# Each server prints its endpoint on stdout once it listens; both are
# stopped (by their ids) when the script ends.
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
start() {  # start NAME CMD...: runs CMD, sets URL to its first line
    local name=$1
    shift
    "$@" --ignore-stdin >"$OUT_DIR/$name.url" 2>"$OUT_DIR/$name.log" &
    PIDS+=($!)
    for _ in $(seq 1 600); do
        URL=$(head -n 1 "$OUT_DIR/$name.url")
        [ -z "$URL" ] || return 0
        sleep 0.1
    done
    die "$name did not start: $(cat "$OUT_DIR/$name.log")"
}
if [ "$LATENCY" = off ]; then
    start hub "$HUB" "$DATA"
    HUB_URL=$URL
    start store "$STORE" "$DATA" --unlimited
else
    start hub "$HUB" "$DATA" --latency "$LATENCY"
    HUB_URL=$URL
    start store "$STORE" "$DATA" --unlimited --latency "$LATENCY:$LATENCY"
fi
STORE_URL=$URL
echo "hub emulator $HUB_URL, object-store emulator $STORE_URL, latency $LATENCY"

LAST=$((SHARDS - 1))
HF_URL="hf://datasets/org/bench/train/shard-{000000..$(printf %06d "$LAST")}.tar"
HTTP_URL="$STORE_URL/org/bench/train/shard-{000000..$(printf %06d "$LAST")}.tar"
hub_stat() {
    curl -s "$HUB_URL/_hub/stats" | python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"
}

run() {  # run NAME URL [BINARY]: one bench, its JSON in $OUT_DIR/NAME-ROUND.json
    local name=$1 url=$2 bin=${3:-$RF} out=$OUT_DIR/$1-$round.json
    local cmd=(env HF_ENDPOINT="$HUB_URL" HF_HOME="$OUT_DIR/hf-home" "$bin" bench "$url"
               --workers "$WORKERS" --chunk-size "$CHUNK" --json)
    [ "$round" -gt 1 ] || show "${cmd[@]}"
    local r0 g0
    r0=$(hub_stat resolves)
    g0=$(hub_stat content_gets)
    ensure_hot "$name-$round"
    "${cmd[@]}" >"$out"
    echo "$(($(hub_stat resolves) - r0)) $(($(hub_stat content_gets) - g0))" >"$OUT_DIR/$name-$round.hub"
}

NAMES=(hf http)
[ -z "${BASELINE:-}" ] || NAMES+=(base)
contender() {
    case $1 in
        hf) run hf "$HF_URL" ;;
        http) run http "$HTTP_URL" ;;
        base) run base "$HTTP_URL" "$(realpath "$BASELINE")" ;;
    esac
}
for round in $(seq 1 "$ROUNDS"); do
    # A rotating order: no contender always runs first.
    for i in "${!NAMES[@]}"; do
        contender "${NAMES[$(((i + round) % ${#NAMES[@]}))]}"
    done
done

say "results ($SHARDS shards of $SHARD_SIZE, chunk $CHUNK; latency $LATENCY; $WORKERS workers; $ROUNDS rounds)"
python3 - "$OUT_DIR" "$ROUNDS" "$SHARDS" "${NAMES[@]}" <<'EOF'
import json, statistics, sys
out, rounds, shards, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
med = {}
for name in names:
    runs = [json.load(open(f"{out}/{name}-{r}.json")) for r in range(1, rounds + 1)]
    hub = [list(map(int, open(f"{out}/{name}-{r}.hub").read().split())) for r in range(1, rounds + 1)]
    gbs = [r["gb_per_s"] for r in runs]
    cpu = [r["cpu_s_per_gb"] for r in runs]
    med[name] = statistics.median(gbs)
    print(f"{name:5} {med[name]:.3f} GB/s median (runs {', '.join(f'{g:.3f}' for g in gbs)}), "
          f"{statistics.median(cpu):.3f} CPU-s/GB median")
    for r, h in zip(runs, hub):
        s = r["stats"]
        line = (f"      requests {s['http_requests']} (ringfeed's count), reads {s['reads']}, "
                f"hedges {s['hedges_sent']}")
        if name == "hf":
            line += f"; at the emulator: resolve/ {h[0]} (shards {shards}), content GETs {h[1]}"
        print(line)
print(f"hf/http {med['hf'] / med['http']:.3f}")
if "base" in med:
    print(f"http/base {med['http'] / med['base']:.3f}")
EOF
