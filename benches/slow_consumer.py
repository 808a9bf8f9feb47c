#!/usr/bin/env python3
"""The cache's default fill under a consumer slower than the network: a
Python loop that hashes every byte of every sample (SHA-256, about as slow
per byte as a trainer's step is per sample), reading remote shards with a
`cache_dir` and `cache_fill` at its default ("spare"), run RUNS times on
the same cache directory. Each run prints the cache's counts, the HTTP
requests sent, its wall time and the consumer's rate; the cache directory
is emptied before the first run only.

A benchmark program, not a test: nothing here passes or fails. What to
look at: how many shards the first run fills (`written`), and whether a
later run still fetches from the network (`misses`, `requests`).

Usage (the shards served over HTTP with ranges and ETags, e.g. by the nginx
benches/cache.sh starts; RINGFEED_LIB picks the library to measure):

    benches/slow_consumer.py 'http://127.0.0.1:18090/b/shard-{000000..000001}.tar' \
        /var/tmp/rf-cache --runs 3 --cache-min-free 1GiB
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("cache_dir")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--cache-min-free", help="cache_min_free (default: ringfeed's, 10%% of the disk)")
    ap.add_argument("--json", action="store_true", help="one JSON line per run")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
    import ringfeed

    if os.path.isdir(a.cache_dir):
        shutil.rmtree(a.cache_dir)
    for run in range(1, a.runs + 1):
        t0 = time.monotonic()
        nbytes = 0
        kw = {"cache_min_free": a.cache_min_free} if a.cache_min_free else {}
        with ringfeed.Loader(a.url, batch_size=a.batch_size, cache_dir=a.cache_dir, **kw) as loader:
            for b in loader:
                with b:
                    for name in b.fields:
                        for mv in b[name]:
                            if mv is not None:
                                hashlib.sha256(mv).digest()
                                nbytes += len(mv)
            s = loader.stats()
        wall = time.monotonic() - t0
        row = {
            "run": run,
            "wall_s": round(wall, 3),
            "consumer_mb_s": round(nbytes / wall / 1e6, 1),
            "hits": s["cache_hits"],
            "misses": s["cache_misses"],
            "written": s["cache_written"],
            "uncached": s["cache_uncached"],
            "http_requests": s["http_requests"],
            "cache_notes": [n for n in s["notes"] if "cache" in n.lower()],
        }
        # Written counts what the writer finished by the time of the stats;
        # the entries on disk after close are the fill's whole outcome.
        row["entries_after_close"] = sum(1 for f in os.listdir(a.cache_dir) if f.endswith(".rfc")
                                         and not f.startswith("."))
        print(json.dumps(row) if a.json else
              f"run {run}: {row['wall_s']} s, consumer {row['consumer_mb_s']} MB/s; cache hits "
              f"{row['hits']}, misses {row['misses']}, uncached {row['uncached']}; entries after "
              f"close {row['entries_after_close']}; http requests {row['http_requests']}"
              + "".join(f"\n  note: {n}" for n in row["cache_notes"]))


if __name__ == "__main__":
    main()
