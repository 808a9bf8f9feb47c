"""Four consumers on one node (2 ranks x 2 DataLoader workers), three ways:

  (a) four standalone engines, one per consumer process (node="off");
  (b) four consumer processes attached to one node engine (`ringfeed node`,
      started by this script and timed with the rest);
  (c) the reference: one standalone engine, one consumer, all the data.

Each round times every process of a mode over the same window (from the
first spawn to the last exit): GB/s delivered, CPU-s per GB of every process
(wait4), the peak of the summed PSS of the live processes (sampled every
20 ms from /proc/<pid>/smaps_rollup: shared memory counted once), the summed
peak RSS (wait4; counts an arena mapped by two processes twice) and the peak
summed locked memory (VmLck). Prints the medians and the ratios of the
medians against (c), with per-round ranges.

usage: python3 benches/node_share.py RINGFEED_PROGRAM ROUNDS SHARD...
Each consumer runs the installed `ringfeed` Python package.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CONSUMER = r"""
import json, sys, time, ringfeed
cfg = json.loads(sys.argv[1])
urls = cfg.pop("urls")
t0 = time.monotonic_ns()
n = 0
first = None
with ringfeed.Loader(urls, **cfg) as loader:
    for b in loader:
        if first is None:
            first = time.monotonic_ns() - t0
        n += b.nbytes
print(json.dumps({"bytes": n, "first_batch_ns": first}))
"""


def read_kib(path, key):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_mode(mode, program, shards, batch_size):
    job = dict(urls=shards, batch_size=batch_size)
    procs = []
    engine = None
    tmp = tempfile.mkdtemp(prefix="rf-node-bench-")
    t0 = time.monotonic()
    before = os.times()
    if mode == "b":
        socket = os.path.join(tmp, "node.sock")
        engine = subprocess.Popen(
            [program, "node", *shards, "--socket", socket, "--linger-ms", "50",
             "--batch-size", str(batch_size), "--workers", "2",
             "--config", json.dumps({"world_size": 2, "loader_workers": 2})],
            stderr=subprocess.DEVNULL,
        )
        while not os.path.exists(socket):
            time.sleep(0.005)
    if mode == "c":
        layouts = [dict()]
    else:
        layouts = [
            dict(rank=r, world_size=2, loader_worker=w, loader_workers=2, workers=2,
                 node=(socket if mode == "b" else "off"))
            for r in (0, 1) for w in (0, 1)
        ]
    for extra in layouts:
        cfg = dict(job, **extra)
        procs.append(subprocess.Popen([sys.executable, "-c", CONSUMER, json.dumps(cfg)],
                                      stdout=subprocess.PIPE, text=True))
    live = [p.pid for p in procs] + ([engine.pid] if engine else [])
    peak_pss = peak_lck = 0
    while any(p.poll() is None for p in procs):
        pss = sum(read_kib(f"/proc/{pid}/smaps_rollup", "Pss:") for pid in live)
        lck = sum(read_kib(f"/proc/{pid}/status", "VmLck:") for pid in live)
        peak_pss, peak_lck = max(peak_pss, pss), max(peak_lck, lck)
        time.sleep(0.02)
    outs = [json.loads(p.communicate()[0]) for p in procs]
    if engine:
        engine.wait()
    wall = time.monotonic() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    # Peak RSS of every process of this mode, summed (ru_maxrss per child).
    total = sum(o["bytes"] for o in outs)
    return {
        "gb_s": total / wall / 1e9,
        "cpu_s_per_gb": cpu / (total / 1e9),
        "pss_mib": peak_pss / 1024,
        "locked_mib": peak_lck / 1024,
        "bytes": total,
        "first_batch_ms": max(o["first_batch_ns"] or 0 for o in outs) / 1e6,
    }


def main():
    program, rounds, shards = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    batch_size = 256
    results = {m: [] for m in "abc"}
    for i in range(rounds):
        for m in "cab":
            r = run_mode(m, program, shards, batch_size)
            results[m].append(r)
            print(f"round {i + 1} ({m}): {json.dumps(r)}", flush=True)
    names = {"a": "(a) 4 standalone engines", "b": "(b) 4 consumers, 1 node engine",
             "c": "(c) 1 engine, 1 consumer"}
    keys = ["gb_s", "cpu_s_per_gb", "pss_mib", "locked_mib", "first_batch_ms"]
    med = {m: {k: statistics.median(r[k] for r in results[m]) for k in keys} for m in "abc"}
    print(f"\nmedians over {rounds} rounds; bytes per round equal: "
          f"{len({r['bytes'] for m in 'abc' for r in results[m]}) == 1}")
    print(f"{'':32} {'GB/s':>7} {'CPU-s/GB':>9} {'PSS MiB':>8} {'locked':>7} {'1st batch ms':>12}")
    for m in "abc":
        d = med[m]
        print(f"{names[m]:32} {d['gb_s']:7.2f} {d['cpu_s_per_gb']:9.3f} {d['pss_mib']:8.0f} "
              f"{d['locked_mib']:7.0f} {d['first_batch_ms']:12.1f}")
    print("\nratios of the medians to (c) [per-round range]:")
    for m in "ab":
        parts = []
        for k in ("gb_s", "cpu_s_per_gb", "pss_mib"):
            per = [r[k] / c[k] for r, c in zip(results[m], results["c"])]
            parts.append(f"{k} {med[m][k] / med['c'][k]:.3f} [{min(per):.2f}-{max(per):.2f}]")
        print(f"  {names[m]}: " + ", ".join(parts))
    b, c, a = med["b"], med["c"], med["a"]
    print("\ntargets: (b) CPU/GB <= 1.1x (c): %s; (b) PSS <= 1.25x (c): %s; (b) GB/s >= 0.9x (c): %s; "
          "(b) ahead of (a) on all three: %s" % (
              b["cpu_s_per_gb"] <= 1.1 * c["cpu_s_per_gb"], b["pss_mib"] <= 1.25 * c["pss_mib"],
              b["gb_s"] >= 0.9 * c["gb_s"],
              b["gb_s"] > a["gb_s"] and b["cpu_s_per_gb"] < a["cpu_s_per_gb"] and b["pss_mib"] < a["pss_mib"]))


if __name__ == "__main__":
    main()
