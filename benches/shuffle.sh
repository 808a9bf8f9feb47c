#!/usr/bin/env bash
# ringfeed with a 10,000-sample shuffle buffer against ringfeed without
# shuffling, on the same page-cache-hot shards, in the same run.
#
# A benchmark program, not a test (docs/design.md): the two configurations
# run interleaved round by round, so a noisy machine moves both alike, and it
# prints their ratio. PASS/MISS marks the targets only (STRICT=1 turns a
# MISS into exit status 1).
#
# Two clocks for both runs, both printed: ringfeed's own (`bench`'s report,
# from after the loader's open to the last batch) and the whole process,
# from just before the spawn to the exit, with the CPU from the child's
# rusage (benches/timed.py). The shards' page-cache residency is checked
# before every run and the shards re-read when a page is missing. Ratios are
# of the medians shown (median shuffled / median plain), with the lowest and
# highest per-round ratio beside.
#
# Targets:
#   shuffled GB/s / plain GB/s            >= 0.95 (own clock and whole process)
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
        # timed.py adds the whole-process wall and CPU to bench's own report.
        timed=(python3 benches/timed.py "$OUT_DIR/round-$r-$who.json" --)
        if [ "$who" = plain ]; then
            "${timed[@]}" "${PLAIN[@]}"
        else
            "${timed[@]}" "${SHUFFLED[@]}"
        fi
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$OUT_DIR" "$ROUNDS" "$STRICT" "$BUFFER" <<'EOF'
import json, statistics, sys
out, rounds, strict, buffer = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
MiB = 1 << 20

def fig(path):
    d = json.load(open(path + ".json"))
    s = d["stats"]
    return {"gbs": d["gb_per_s"], "sps": d["samples_per_s"], "cpu": d["cpu_s_per_gb"],
            "whole_s": d["process_wall_s"], "whole_gbs": d["bytes"] / d["process_wall_s"] / 1e9,
            "whole_cpu": d["process_cpu_s"] / (d["bytes"] / 1e9),
            "peak": s["chunks_peak"] * s["chunk_size"], "budget": d["memory_budget"],
            "rss": d["peak_rss_bytes"], "shuffle_copied": s["shuffle_copied"] / max(d["bytes"], 1),
            "copied": d["copied_per_delivered"], "workers": s["workers"], "samples": d["samples"]}

rows = []
hdr = (f"{'':>5} {'-- own clock (bench report) --':^45}   {'-- whole process --':^45}\n"
       f"{'round':>5} {'plain GB/s':>10} {'shuf GB/s':>10} {'ratio':>6} {'CPU-s/GB p/s':>15}   "
       f"{'plain GB/s':>10} {'shuf GB/s':>10} {'ratio':>6} {'CPU-s/GB p/s':>15}   "
       f"{'plain peak MiB':>14} {'shuf peak MiB':>13} {'shuf RSS MiB':>12} {'shuf copied':>11}")
print()
print(hdr)
print("-" * len(hdr.splitlines()[-1]))
for r in range(1, rounds + 1):
    p = fig(f"{out}/round-{r}-plain")
    s = fig(f"{out}/round-{r}-shuffled")
    row = {"round": r, "plain": p, "shuffled": s, "ratio": s["gbs"] / p["gbs"],
           "whole_ratio": s["whole_gbs"] / p["whole_gbs"]}
    rows.append(row)
    print(f"{r:>5} {p['gbs']:>10.2f} {s['gbs']:>10.2f} {row['ratio']:>6.3f} {p['cpu']:>7.3f}/{s['cpu']:<7.3f}   "
          f"{p['whole_gbs']:>10.2f} {s['whole_gbs']:>10.2f} {row['whole_ratio']:>6.3f} "
          f"{p['whole_cpu']:>7.3f}/{s['whole_cpu']:<7.3f}   "
          f"{p['peak'] / MiB:>14.0f} {s['peak'] / MiB:>13.0f} {s['rss'] / MiB:>12.0f} {s['shuffle_copied']:>11.4f}")

med = lambda xs: statistics.median(xs)
def ratio_of_medians(key):
    """median(shuffled) / median(plain), and the per-round range."""
    per_round = [x["shuffled"][key] / x["plain"][key] for x in rows]
    return (med([x["shuffled"][key] for x in rows]) / med([x["plain"][key] for x in rows]),
            min(per_round), max(per_round))
ratio, lo, hi = ratio_of_medians("gbs")
whole, whole_lo, whole_hi = ratio_of_medians("whole_gbs")
budget = rows[0]["plain"]["budget"]
peak = max(max(x["plain"]["peak"], x["shuffled"]["peak"]) for x in rows)
rss = max(x["shuffled"]["rss"] for x in rows)
copied = med([x["shuffled"]["shuffle_copied"] for x in rows])
targets = [
    (f"shuffled / plain GB/s, own clock (rounds {lo:.3f}-{hi:.3f})", ratio, ratio >= 0.95, ">= 0.95"),
    (f"shuffled / plain GB/s, whole process (rounds {whole_lo:.3f}-{whole_hi:.3f})", whole, whole >= 0.95,
     ">= 0.95"),
    ("peak arena use / budget", peak / budget, peak <= budget, "<= 1"),
    ("peak RSS MiB (shuffled)", rss / MiB, rss <= budget + 64 * MiB, f"<= {(budget >> 20) + 64}"),
]
print()
print(f"buffer {buffer} samples, {rows[0]['plain']['workers']} workers, budget {budget >> 20} MiB, "
      f"{rows[0]['plain']['samples']} samples per run")
print(f"own clock: plain {med([x['plain']['gbs'] for x in rows]):.2f} GB/s, "
      f"shuffled {med([x['shuffled']['gbs'] for x in rows]):.2f} GB/s (medians)")
print(f"whole process: plain {med([x['plain']['whole_gbs'] for x in rows]):.2f} GB/s "
      f"in {med([x['plain']['whole_s'] for x in rows]):.2f} s, "
      f"shuffled {med([x['shuffled']['whole_gbs'] for x in rows]):.2f} GB/s "
      f"in {med([x['shuffled']['whole_s'] for x in rows]):.2f} s (medians)")
print(f"shuffle copied {copied:.4f} bytes per byte delivered")
res = [line.split() for line in open(f"{out}/residency.txt")]
print(f"page cache before each run: resident {min(float(x[1]) for x in res):.4f}-"
      f"{max(float(x[1]) for x in res):.4f}, re-read before {sum(x[2] == '1' for x in res)} of {len(res)} runs")
missed = 0
for name, v, ok, want in targets:
    print(f"{'PASS' if ok else 'MISS'}  {name}: {v:.3f} (target {want})")
    missed += not ok
json.dump({"rounds": rows, "ratio": ratio, "ratio_range": [lo, hi], "whole_ratio": whole,
           "whole_ratio_range": [whole_lo, whole_hi], "peak_over_budget": peak / budget,
           "shuffle_copied": copied}, open(f"{out}/summary.json", "w"), indent=1)
print(f"raw results in {out}")
sys.exit(1 if strict and missed else 0)
EOF
