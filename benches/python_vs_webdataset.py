#!/usr/bin/env python3
"""ringfeed's Python API against WebDataset, and against ringfeed's C consumer.

In one run, on the same page-cache-hot shards (generated once with
`ringfeed gen` under benches/out/python/), for ~100 KB and ~10 KB samples:

- WebDataset: ``wds.WebDataset(urls, shardshuffle=False)`` iterating raw
  samples (no decoding), touching every field's length;
- ringfeed Python: ``ringfeed.Loader(urls, batch_size=B)`` touching every
  sample's field lengths (``batch[name].lengths``, a numpy array per batch);
- ringfeed Python, per-sample loop: the same with a Python loop over each
  sample's lengths (what a per-sample consumer pays);
- the C consumer: ``ringfeed bench --json`` (reference for GB/s).

Each measurement runs in its own process; throughput is counted from the
first batch (or sample) to the end, CPU time (all threads, from getrusage)
over the same window; rounds are interleaved and medians reported. Prints the
ratios against the targets: ringfeed Python >= 30x WebDataset's samples/s on
the small samples, >= 0.8x the C consumer's GB/s on the large ones.

    .venv/bin/python benches/python_vs_webdataset.py [--rounds 3] [--json out.json]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLI = REPO / "target" / "release" / "ringfeed"


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_wds(urls, epochs, batch_size):
    import webdataset as wds

    samples = nbytes = 0
    t0 = c0 = None
    for _ in range(epochs):
        for s in wds.WebDataset(urls, shardshuffle=False):
            if t0 is None:
                t0, c0 = time.perf_counter(), cpu()
                continue
            for k, v in s.items():
                if not k.startswith("__"):
                    nbytes += len(v)
            samples += 1
    return samples, nbytes, time.perf_counter() - t0, cpu() - c0


def run_ringfeed(urls, epochs, batch_size, per_sample=False):
    import ringfeed

    samples = nbytes = 0
    t0 = c0 = None
    with ringfeed.Loader(urls, batch_size=batch_size, epochs=epochs) as loader:
        for b in loader:
            if t0 is None:
                t0, c0 = time.perf_counter(), cpu()
                b.release()
                continue
            for name in b.fields:
                lengths = b[name].lengths
                if per_sample:
                    for n in lengths.tolist():
                        nbytes += n
                else:
                    nbytes += int(lengths.sum())
            samples += len(b)
            b.release()
    return samples, nbytes, time.perf_counter() - t0, cpu() - c0


def run_c(urls, epochs, batch_size):
    out = subprocess.run(
        [str(CLI), "bench", "--json", "--epochs", str(epochs), "--batch-size", str(batch_size), *urls],
        check=True, capture_output=True, text=True,
    ).stdout
    r = json.loads(out)
    return r["samples"], r["bytes"], r["seconds"], r["cpu_seconds"]


RUNNERS = {
    "webdataset": run_wds,
    "ringfeed_py": run_ringfeed,
    "ringfeed_py_loop": lambda u, e, b: run_ringfeed(u, e, b, per_sample=True),
    "c_consumer": run_c,
}


def measure(kind, urls, epochs, batch_size):
    if kind == "c_consumer":
        s, n, wall, c = run_c(urls, epochs, batch_size)
    else:
        out = subprocess.run(
            [sys.executable, __file__, "--one", kind, "--epochs", str(epochs), "--batch-size", str(batch_size), *urls],
            check=True, capture_output=True, text=True,
        ).stdout
        s, n, wall, c = json.loads(out.strip().splitlines()[-1])
    return {"samples": s, "bytes": n, "seconds": wall, "cpu_seconds": c,
            "samples_per_s": s / wall, "gb_per_s": n / wall / 1e9, "cpu_s_per_gb": c / (n / 1e9)}


def ensure_shards(out, name, shards, shard_size, sample_size):
    d = out / name
    if not (d / "shard-000000.tar").is_file():
        subprocess.run([str(CLI), "gen", str(d), "--shards", str(shards), "--shard-size", shard_size,
                        "--sample-size", sample_size, "--fields", "jpg,cls", "--seed", "0"],
                       check=True, capture_output=True)
    files = sorted(str(p) for p in d.glob("shard-*.tar"))
    for f in files:  # page-cache hot
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--epochs", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "benches" / "out" / "python"))
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("urls", nargs="*")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(RUNNERS[a.one](a.urls, a.epochs, a.batch_size)))
        return 0

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    # ringfeed passes are repeated (epochs) so each lasts about a second or more.
    sets = {
        "large (~100 KB samples)": (ensure_shards(out, "large", 8, "64MiB", "100KB"), 1, 8),
        "small (~10 KB samples)": (ensure_shards(out, "small", 8, "32MiB", "10KB"), 1, 8),
    }
    results = {}
    for label, (urls, wds_epochs, rf_epochs) in sets.items():
        kinds = [("webdataset", wds_epochs), ("ringfeed_py", rf_epochs), ("ringfeed_py_loop", rf_epochs),
                 ("c_consumer", rf_epochs)]
        runs = {k: [] for k, _ in kinds}
        for _ in range(a.rounds):
            for kind, epochs in kinds:
                runs[kind].append(measure(kind, urls, epochs, a.batch_size))
        results[label] = runs

    def med(runs, key):
        return statistics.median(r[key] for r in runs)

    print(f"batch_size {a.batch_size}, {a.rounds} rounds (medians), {os.cpu_count()} CPUs")
    for label, runs in results.items():
        print(f"\n{label}")
        print(f"  {'consumer':18} {'samples/s':>12} {'GB/s':>8} {'CPU-s/GB':>9}")
        for kind, rs in runs.items():
            print(f"  {kind:18} {med(rs, 'samples_per_s'):12.0f} {med(rs, 'gb_per_s'):8.3f} {med(rs, 'cpu_s_per_gb'):9.3f}")
    small = results["small (~10 KB samples)"]
    large = results["large (~100 KB samples)"]
    r_small = med(small["ringfeed_py"], "samples_per_s") / med(small["webdataset"], "samples_per_s")
    r_large = med(large["ringfeed_py"], "gb_per_s") / med(large["c_consumer"], "gb_per_s")
    r_small_loop = med(small["ringfeed_py_loop"], "samples_per_s") / med(small["webdataset"], "samples_per_s")
    print()
    print(f"small: ringfeed Python / WebDataset samples/s = {r_small:.1f}x (target >= 30x)"
          f" [{'met' if r_small >= 30 else 'MISSED'}]; per-sample Python loop: {r_small_loop:.1f}x")
    print(f"large: ringfeed Python / C consumer GB/s = {r_large:.2f} (target >= 0.8)"
          f" [{'met' if r_large >= 0.8 else 'MISSED'}]")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
