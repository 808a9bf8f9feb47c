#!/usr/bin/env python3
"""ringfeed's Python API against WebDataset, and against ringfeed's C consumer.

In one run, on the same page-cache-hot shards (generated once with
`ringfeed gen` under benches/out/python/), for ~100 KB and ~10 KB samples,
every contender making the same number of passes (`--epochs`) over them:

- ``wds_dl2``: WebDataset as its users run it, ``wds.WebDataset(urls,
  shardshuffle=False).batched(B)`` through ``torch.utils.data.DataLoader(...,
  batch_size=None, num_workers=2, persistent_workers=True)``, raw samples (no
  decoding), every field's length touched;
- ``wds_1proc``: ``wds.WebDataset(urls, shardshuffle=False)`` iterated in the
  consumer's own process, no DataLoader, no batching (the same touch);
- ``ringfeed_py``: ``ringfeed.Loader(urls, batch_size=B)`` touching every
  field's lengths (``batch[name].lengths``, a numpy array per batch);
- ``ringfeed_py_loop``: the same with a Python loop over each sample's
  lengths (what a per-sample consumer pays);
- ``c_consumer``: ``ringfeed bench --json`` (the reference for GB/s).

On the small samples only, the same with every byte of every field of every
sample touched (``zlib.crc32``), as a consumer that reads its samples does:

- ``wds_dl2_crc``, ``wds_1proc_crc``: WebDataset as above, each field's
  bytes checksummed in the main process;
- ``ringfeed_py_crc``: ``ringfeed.Loader``, each field's per-sample
  memoryviews (``batch[name].memoryviews()``) checksummed;
- ``touch_floor``: the same bytes read into memory first (``tarfile``,
  before its clock opens), then checksummed: what the touch itself costs
  per sample, whatever the loader; the most any loader can reach against
  WebDataset is WebDataset's time per sample over this one.

Two clocks for every contender, both printed:

- whole process: from just before this script spawns the contender's process
  to its exit, CPU from the child's rusage (os.wait4: its threads and the
  workers it waited for); every Python contender imports the same modules
  (numpy, torch, webdataset, ringfeed), so their start-up costs the same;
- own clock: the Python contenders, from the first batch (or sample) to the
  last, the first not counted, CPU over the same window (getrusage of the
  process plus /proc of the live DataLoader workers); the C consumer, its own
  report (after the loader's open to the last batch).

Before each contender's run the shards' page-cache residency is checked
(mincore) and the shards re-read if any page is missing, the same for all;
the residency seen is printed. Rounds are interleaved, each round starting
at another contender. Prints medians, the ratios of the medians shown (with
the lowest and highest per-round ratio) and the targets: ringfeed Python
>= 30x WebDataset's samples/s on the small samples, >= 0.8x the C
consumer's GB/s on the large ones.

    benches/python_vs_webdataset.sh [--rounds 3] [--epochs 8] [--batch-size 256] [--only large|small]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

import _timing

REPO = Path(__file__).resolve().parent.parent
CLI = REPO / "target" / "release" / "ringfeed"

# (name, label in the tables)
CONTENDERS = [
    ("wds_dl2", "WebDataset, DataLoader(num_workers=2)"),
    ("wds_1proc", "WebDataset, one process, no DataLoader"),
    ("ringfeed_py", "ringfeed Python, per batch"),
    ("ringfeed_py_loop", "ringfeed Python, per-sample loop"),
    ("c_consumer", "C consumer (ringfeed bench)"),
    ("wds_dl2_crc", "WebDataset, DataLoader(2), bytes touched"),
    ("wds_1proc_crc", "WebDataset, one process, bytes touched"),
    ("ringfeed_py_crc", "ringfeed Python, bytes touched"),
    ("touch_floor", "the touch alone, bytes in memory"),
]
# Contenders run on the small samples only.
SMALL_ONLY = {"wds_dl2_crc", "wds_1proc_crc", "ringfeed_py_crc", "touch_floor"}


# -- contenders (run with --one, each in its own process) ----------------------


def imports():
    """Every Python contender imports the same modules (their cost is in
    every whole-process time alike)."""
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torch.utils.data  # noqa: F401
    import webdataset  # noqa: F401

    import ringfeed  # noqa: F401


def cpu(workers=()):
    """CPU seconds of this process (all threads) and of the live ``workers``."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime + _timing.proc_cpu_seconds(workers)


class Window:
    """The own clock: opened at the first item, which is not counted."""

    def __init__(self):
        self.t0 = self.c0 = None
        self.samples = self.nbytes = 0

    def first(self, workers=()):
        if self.t0 is None:
            self.t0, self.c0 = time.perf_counter(), cpu(workers)
            return True
        return False

    def close(self, total_samples, total_bytes, workers=()):
        return {"samples": total_samples, "bytes": total_bytes,
                "own_samples": self.samples, "own_bytes": self.nbytes,
                "own_seconds": time.perf_counter() - self.t0, "own_cpu_seconds": cpu(workers) - self.c0}


def field_bytes(v):
    """A field's length; in the ``*_crc`` contenders, its bytes checksummed too."""
    if TOUCH:
        zlib.crc32(v)
    return len(v)


def run_wds_1proc(urls, a):
    import webdataset as wds

    w = Window()
    samples = nbytes = 0
    for _ in range(a.epochs):
        for s in wds.WebDataset(urls, shardshuffle=False):
            n = sum(field_bytes(v) for k, v in s.items() if not k.startswith("__"))
            samples += 1
            nbytes += n
            if not w.first():
                w.samples += 1
                w.nbytes += n
    return w.close(samples, nbytes)


def run_wds_dl2(urls, a):
    import torch.utils.data
    import webdataset as wds

    dl = torch.utils.data.DataLoader(
        wds.WebDataset(urls, shardshuffle=False).batched(a.batch_size), batch_size=None, num_workers=2,
        persistent_workers=True,
    )
    w = Window()
    samples = nbytes = 0
    workers = ()
    for _ in range(a.epochs):
        it = iter(dl)
        workers = [p.pid for p in it._workers]
        for b in it:
            n = sum(field_bytes(v) for k, vs in b.items() if not k.startswith("__") for v in vs)
            k = len(b["__key__"])
            samples += k
            nbytes += n
            if not w.first(workers):
                w.samples += k
                w.nbytes += n
    return w.close(samples, nbytes, workers)


def run_ringfeed(urls, a, per_sample=False):
    import ringfeed

    w = Window()
    samples = nbytes = 0
    with ringfeed.Loader(urls, batch_size=a.batch_size, epochs=a.epochs) as loader:
        for b in loader:
            n = 0
            for name in b.fields:
                if TOUCH:
                    for v in b[name].memoryviews():
                        if v is not None:
                            zlib.crc32(v)
                            n += len(v)
                    continue
                lengths = b[name].lengths
                if per_sample:
                    for x in lengths.tolist():
                        n += x
                else:
                    n += int(lengths.sum())
            k = len(b)
            b.release()
            samples += k
            nbytes += n
            if not w.first():
                w.samples += k
                w.nbytes += n
    return w.close(samples, nbytes)


def run_touch_floor(urls, a):
    import tarfile

    fields = []
    keys = set()
    for u in urls:
        with tarfile.open(u) as t:
            for m in t.getmembers():
                if m.isfile():
                    fields.append(t.extractfile(m).read())
                    keys.add((u, m.name.rsplit(".", 1)[0]))
    per_pass = len(keys)
    w = Window()
    w.first()
    nbytes = 0
    for _ in range(a.epochs):
        for v in fields:
            zlib.crc32(v)
            nbytes += len(v)
    w.samples, w.nbytes = per_pass * a.epochs, nbytes
    return w.close(per_pass * a.epochs, nbytes)


RUNNERS = {
    "wds_1proc": run_wds_1proc,
    "wds_dl2": run_wds_dl2,
    "ringfeed_py": run_ringfeed,
    "ringfeed_py_loop": lambda u, a: run_ringfeed(u, a, per_sample=True),
    "wds_1proc_crc": run_wds_1proc,
    "wds_dl2_crc": run_wds_dl2,
    "ringfeed_py_crc": run_ringfeed,
    "touch_floor": run_touch_floor,
}
# Whether this contender's process touches every byte (set from --one).
TOUCH = False


# -- the driver -----------------------------------------------------------------


def measure(kind, urls, a):
    if kind == "c_consumer":
        cmd = [str(CLI), "bench", "--json", "--epochs", str(a.epochs), "--batch-size", str(a.batch_size), *urls]
    else:
        cmd = [sys.executable, __file__, "--one", kind, "--epochs", str(a.epochs),
               "--batch-size", str(a.batch_size), *urls]
    times, out = _timing.run_timed(cmd)
    if kind == "c_consumer":
        r = json.loads(out)
        m = {"samples": r["samples"], "bytes": r["bytes"], "own_samples": r["samples"], "own_bytes": r["bytes"],
             "own_seconds": r["seconds"], "own_cpu_seconds": r["cpu_seconds"]}
    else:
        m = json.loads(out.strip().splitlines()[-1])
    m.update(times)
    m["samples_per_s"] = m["samples"] / m["wall_seconds"]
    m["gb_per_s"] = m["bytes"] / m["wall_seconds"] / 1e9
    m["cpu_s_per_gb"] = m["cpu_seconds"] / (m["bytes"] / 1e9)
    m["own_samples_per_s"] = m["own_samples"] / m["own_seconds"]
    m["own_gb_per_s"] = m["own_bytes"] / m["own_seconds"] / 1e9
    m["own_cpu_s_per_gb"] = m["own_cpu_seconds"] / (m["own_bytes"] / 1e9)
    return m


def ensure_shards(out, name, shards, shard_size, sample_size):
    d = out / name
    params = f"--shards {shards} --shard-size {shard_size} --sample-size {sample_size} --fields jpg,cls --seed 0"
    stamp = d / ".gen-params"
    if not (stamp.is_file() and stamp.read_text() == params):
        subprocess.run([str(CLI), "gen", str(d), *params.split()], check=True, capture_output=True)
        stamp.write_text(params)
    return sorted(str(p) for p in d.glob("shard-*.tar"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--epochs", type=int, default=8,
                    help="passes over the shards, the same for every contender (8: a second or more of ringfeed)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=["large", "small"])
    ap.add_argument("--out", default=str(REPO / "benches" / "out" / "python"))
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("urls", nargs="*")
    a = ap.parse_args()
    if a.one:
        global TOUCH
        TOUCH = a.one.endswith("_crc")
        imports()
        print(json.dumps(RUNNERS[a.one](a.urls, a)))
        return 0

    sys.stdout.reconfigure(line_buffering=True)  # the tables after the progress lines
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sets = {}
    if a.only in (None, "large"):
        sets["large"] = ("~100 KB samples", ensure_shards(out, "large", 8, "64MiB", "100KB"))
    if a.only in (None, "small"):
        sets["small"] = ("~10 KB samples", ensure_shards(out, "small", 8, "32MiB", "10KB"))
    kinds = [k for k, _ in CONTENDERS]
    results = {s: {k: [] for k in kinds} for s in sets}
    print(f"load average before: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    for r in range(a.rounds):
        for s, (_, urls) in sets.items():
            order = kinds[r % len(kinds):] + kinds[: r % len(kinds)]  # each round starts elsewhere
            for kind in order:
                if kind in SMALL_ONLY and s != "small":
                    continue
                hot = _timing.ensure_hot(urls)
                m = measure(kind, urls, a)
                m.update(hot)
                results[s][kind].append(m)
                print(f"  round {r + 1} {s:5} {kind:16} {m['wall_seconds']:7.2f} s whole, "
                      f"{m['own_seconds']:7.2f} s own clock, resident before {hot['resident_before']:.4f}"
                      f"{' (re-read)' if hot['rewarmed'] else ''}", file=sys.stderr)
    print(f"load average after: {os.getloadavg()[0]:.2f}", file=sys.stderr)

    def med(runs, key):
        return statistics.median(m[key] for m in runs)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    print(f"\nPython API vs WebDataset, commit {commit.strip()}, batch_size {a.batch_size}, {a.epochs} passes, "
          f"{a.rounds} rounds (medians), {os.cpu_count()} CPUs")
    labels = dict(CONTENDERS)
    for s, runs in results.items():
        desc, urls = sets[s]
        total = sum(os.path.getsize(f) for f in urls)
        print(f"\n{s} ({desc}): {len(urls)} shards, {total / 1e9:.2f} GB")
        print(f"  {'':40} {'-- whole process --':^38}   {'-- own clock --':^38}")
        print(f"  {'contender':40} {'s':>7} {'samples/s':>11} {'GB/s':>7} {'CPU-s/GB':>9}   "
              f"{'s':>7} {'samples/s':>11} {'GB/s':>7} {'CPU-s/GB':>9}")
        for kind, rs in runs.items():
            if not rs:
                continue
            print(f"  {labels[kind]:40} {med(rs, 'wall_seconds'):7.2f} {med(rs, 'samples_per_s'):11.0f} "
                  f"{med(rs, 'gb_per_s'):7.3f} {med(rs, 'cpu_s_per_gb'):9.3f}   "
                  f"{med(rs, 'own_seconds'):7.2f} {med(rs, 'own_samples_per_s'):11.0f} "
                  f"{med(rs, 'own_gb_per_s'):7.3f} {med(rs, 'own_cpu_s_per_gb'):9.3f}")
        ms = [m for rs in runs.values() for m in rs]
        print(f"  page cache before each run: {_timing.residency_summary(ms)}")

    def ratio(s, x, y, key, label, target=None):
        if s not in results:
            return
        rx, ry = results[s][x], results[s][y]
        whole = _timing.ratio_of_medians([m[key] for m in rx], [m[key] for m in ry])
        own = _timing.ratio_of_medians([m["own_" + key] for m in rx], [m["own_" + key] for m in ry])
        line = f"  {s:5} {label:46} whole {_timing.fmt_ratio(whole)}, own clock {_timing.fmt_ratio(own)}"
        if "touch_floor" in (x, y):
            # The floor's whole process is reading the shards into memory:
            # only its own clock means anything.
            line = f"  {s:5} {label:46} own clock {_timing.fmt_ratio(own)}"
        if target is not None:
            line += (f"; target >= {target}: whole {'met' if whole[0] >= target else 'MISSED'}, "
                     f"own clock {'met' if own[0] >= target else 'MISSED'}")
        print(line)

    print("\nratios of the medians above (lowest-highest per-round ratio in brackets):")
    ratio("small", "ringfeed_py", "wds_dl2", "samples_per_s", "ringfeed Python / WebDataset DataLoader", 30)
    ratio("small", "ringfeed_py", "wds_1proc", "samples_per_s", "ringfeed Python / WebDataset one process", 30)
    ratio("small", "ringfeed_py_loop", "wds_dl2", "samples_per_s", "per-sample loop / WebDataset DataLoader")
    ratio("small", "wds_dl2", "wds_1proc", "samples_per_s", "WebDataset DataLoader / one process")
    ratio("small", "ringfeed_py", "c_consumer", "samples_per_s", "ringfeed Python / C consumer samples/s")
    ratio("small", "ringfeed_py_crc", "wds_dl2_crc", "samples_per_s", "bytes touched: ringfeed / WDS DataLoader", 30)
    ratio("small", "ringfeed_py_crc", "wds_1proc_crc", "samples_per_s", "bytes touched: ringfeed / WDS one process",
          30)
    ratio("small", "touch_floor", "wds_dl2_crc", "samples_per_s", "the touch alone / WDS DataLoader, touched")
    ratio("small", "touch_floor", "wds_1proc_crc", "samples_per_s", "the touch alone / WDS one process, touched")
    ratio("small", "ringfeed_py_crc", "touch_floor", "samples_per_s", "bytes touched: ringfeed / the touch alone")
    ratio("large", "ringfeed_py", "c_consumer", "gb_per_s", "ringfeed Python / C consumer GB/s", 0.8)
    ratio("large", "ringfeed_py", "wds_dl2", "gb_per_s", "ringfeed Python / WebDataset DataLoader GB/s")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
