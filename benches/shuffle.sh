#!/usr/bin/env bash
# ringfeed with a 10,000-sample shuffle buffer against ringfeed without
# shuffling, on the same page-cache-hot shards, in the same run.
#
# A benchmark program, not a test (STYLE.md rule 9): the two configurations
# run interleaved round by round, so a noisy machine moves both alike, and it
# prints their ratio. PASS/MISS marks the targets only (STRICT=1 turns a
# MISS into exit status 1).
#
# Targets:
#   shuffled GB/s / plain GB/s            >= 0.95
#   peak arena use (chunks_peak x chunk)  <= memory budget (both runs)
#   peak RSS                              <= memory budget + 64 MiB
# Also reported: the bytes the shuffle buffers copied out of sparse chunks
# per byte delivered (the price of keeping the buffer inside the budget).
#
# Usage: benches/shuffle.sh        (from anywhere; runs in the repo root)
# Knobs (environment):
#   SHARDS_DIR      dataset directory          [benches/out/shards-20k]
#   SHARDS          number of shards           [32]
#   SHARD_SIZE      size of each shard         [64MiB]   32 x 64 MiB = 2.1 GB
#   SAMPLE_SIZE     mean sample payload        [20KB]    ~100,000 samples
#   SEED            generator seed             [0]
#   ROUNDS          interleaved rounds         [5]
#   EPOCHS          passes per run             [3]
#   BUFFER          shuffle buffer, samples    [10000]
#   MEMORY_BUDGET   both runs' budget          [1GiB]
#   WORKERS         both runs' workers         [ringfeed's default]
#   OUT_DIR         where the raw JSON goes    [benches/out/shuffle/<time>]
#   STRICT          1: exit 1 when a target is missed [0]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

SHARDS_DIR=${SHARDS_DIR:-benches/out/shards-20k}
SHARDS=${SHARDS:-32}
SHARD_SIZE=${SHARD_SIZE:-64MiB}
SAMPLE_SIZE=${SAMPLE_SIZE:-20KB}
SEED=${SEED:-0}
ROUNDS=${ROUNDS:-5}
EPOCHS=${EPOCHS:-3}
BUFFER=${BUFFER:-10000}
# 10,000 samples of ~20 KB are ~200 MB; spread over the chunks they came
# from they would pin several times that, so the budget leaves room for the
# buffer and its compaction next to the reads in flight.
MEMORY_BUDGET=${MEMORY_BUDGET:-1GiB}
WORKERS=${WORKERS:-}
OUT_DIR=${OUT_DIR:-benches/out/shuffle/$(date +%Y%m%d-%H%M%S)}
STRICT=${STRICT:-0}

BENCH=shuffle
# shellcheck source=benches/lib.sh
. benches/lib.sh

say "binary"
command -v python3 >/dev/null || die "python3 is needed to read the JSON"
command -v fincore >/dev/null || die "fincore (util-linux) is needed to check the page cache"
build_ringfeed
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
CMDS=$OUT_DIR/commands.txt
: >"$CMDS"

say "dataset"
gen_shards "$SHARDS_DIR"

cat "${FILES[@]}" >/dev/null
echo "resident: $(resident)"

BASE=("$RF" bench "$SHARDS_DIR" --json --epochs "$EPOCHS" --memory-budget "$MEMORY_BUDGET")
[ -n "$WORKERS" ] && BASE+=(--workers "$WORKERS")
PLAIN=("${BASE[@]}")
SHUFFLED=("${BASE[@]}" --config "{\"shuffle\": true, \"shuffle_buffer\": $BUFFER, \"seed\": 1}")
{
    echo "# ringfeed built from $SOURCE"
    echo "# dataset"; show "${GEN[@]}"
    echo "# plain"; show "${PLAIN[@]}"
    echo "# shuffled"; show "${SHUFFLED[@]}"
} >>"$CMDS"

say "warm-up"
show "${PLAIN[@]}"
"${PLAIN[@]}" >"$OUT_DIR/warmup-plain.json"
show "${SHUFFLED[@]}"
"${SHUFFLED[@]}" >"$OUT_DIR/warmup-shuffled.json"

say "rounds"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
: >"$OUT_DIR/residency.txt"
for ((r = 1; r <= ROUNDS; r++)); do
    if ((r % 2)); then order="plain shuffled"; else order="shuffled plain"; fi
    for who in $order; do
        ensure_hot "$r-$who"
        if [ "$who" = plain ]; then
            "${PLAIN[@]}" >"$OUT_DIR/round-$r-$who.json"
        else
            "${SHUFFLED[@]}" >"$OUT_DIR/round-$r-$who.json"
        fi
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$OUT_DIR" "$ROUNDS" "$STRICT" "$BUFFER" <<'EOF'
import json, statistics, sys
out, rounds, strict, buffer = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
MiB = 1 << 20

def fig(path):
    d = json.load(open(path))
    s = d["stats"]
    return {"gbs": d["gb_per_s"], "sps": d["samples_per_s"], "cpu": d["cpu_s_per_gb"],
            "peak": s["chunks_peak"] * s["chunk_size"], "budget": d["memory_budget"],
            "rss": d["peak_rss_bytes"], "shuffle_copied": s["shuffle_copied"] / max(d["bytes"], 1),
            "copied": d["copied_per_delivered"], "workers": s["workers"], "samples": d["samples"]}

rows = []
hdr = (f"{'round':>5} {'plain GB/s':>10} {'shuf GB/s':>10} {'ratio':>6} {'plain peak MiB':>14} "
       f"{'shuf peak MiB':>13} {'shuf RSS MiB':>12} {'shuf copied':>11} {'plain CPU-s/GB':>14} "
       f"{'shuf CPU-s/GB':>13}")
print()
print(hdr)
print("-" * len(hdr))
for r in range(1, rounds + 1):
    p = fig(f"{out}/round-{r}-plain.json")
    s = fig(f"{out}/round-{r}-shuffled.json")
    row = {"round": r, "plain": p, "shuffled": s, "ratio": s["gbs"] / p["gbs"]}
    rows.append(row)
    print(f"{r:>5} {p['gbs']:>10.2f} {s['gbs']:>10.2f} {row['ratio']:>6.3f} {p['peak'] / MiB:>14.0f} "
          f"{s['peak'] / MiB:>13.0f} {s['rss'] / MiB:>12.0f} {s['shuffle_copied']:>11.4f} "
          f"{p['cpu']:>14.3f} {s['cpu']:>13.3f}")

med = lambda xs: statistics.median(xs)
ratio = med([x["ratio"] for x in rows])
budget = rows[0]["plain"]["budget"]
peak = max(max(x["plain"]["peak"], x["shuffled"]["peak"]) for x in rows)
rss = max(x["shuffled"]["rss"] for x in rows)
copied = med([x["shuffled"]["shuffle_copied"] for x in rows])
targets = [
    ("shuffled / plain throughput (median of rounds)", ratio, ratio >= 0.95, ">= 0.95"),
    ("peak arena use / budget", peak / budget, peak <= budget, "<= 1"),
    ("peak RSS MiB (shuffled)", rss / MiB, rss <= budget + 64 * MiB, f"<= {(budget >> 20) + 64}"),
]
print()
print(f"buffer {buffer} samples, {rows[0]['plain']['workers']} workers, budget {budget >> 20} MiB, "
      f"{rows[0]['plain']['samples']} samples per run")
print(f"plain {med([x['plain']['gbs'] for x in rows]):.2f} GB/s, "
      f"shuffled {med([x['shuffled']['gbs'] for x in rows]):.2f} GB/s (medians); "
      f"shuffle copied {copied:.4f} bytes per byte delivered")
missed = 0
for name, v, ok, want in targets:
    print(f"{'PASS' if ok else 'MISS'}  {name}: {v:.3f} (target {want})")
    missed += not ok
json.dump({"rounds": rows, "ratio": ratio, "peak_over_budget": peak / budget,
           "shuffle_copied": copied}, open(f"{out}/summary.json", "w"), indent=1)
print(f"raw results in {out}")
sys.exit(1 if strict and missed else 0)
EOF
