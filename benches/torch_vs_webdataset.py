#!/usr/bin/env python3
"""ringfeed.torch against ringfeed's own Loader, WebDataset and a bare decode loop.

In one run, each contender in its own process, every process importing the
same modules (numpy, torch, webdataset, Pillow, ringfeed) and timed whole by
this script, from just before the spawn to the exit, with the CPU time of the
child and the workers it waited for (os.wait4's rusage); the contender's own
loop clock (from before it builds its DataLoader to the last item) is
printed beside it. Before every run the set's page-cache residency is
checked (mincore) and the shards re-read when a page is missing, the same
for every contender; the residency seen is printed. Rounds are interleaved,
each starting at another contender; medians are compared as ratios of the
medians shown, with the lowest and highest per-round ratio beside.

Raw bytes, ~10 KB samples (``ringfeed gen``, page-cache hot), `--epochs`
passes, batches of `--batch-size`; every consumer sums every field's lengths:

- ``loader``: ``ringfeed.Loader`` in a plain loop;
- ``rf_dl0`` / ``rf_dl2``: ``RingfeedDataset`` through ``DataLoader(batch_size=None,
  num_workers=0 / 2)`` (workers persistent across the passes);
- ``wds_dl2``: ``wds.WebDataset(urls).batched(B)`` through ``DataLoader(num_workers=2)``,
  the way its users run it.

JPEG decoding, ~100 KB real images made with Pillow (448x448, one class label
each), batches of 64, every image decoded to a uint8 CHW tensor by Pillow:

- ``floor``: a bare loop decoding the same image bytes, read into memory first;
- ``rf_dec2`` (and ``rf_dec0``): ``RingfeedDataset(...).decode("torchrgb8").to_tuple("jpg", "cls")``
  through ``DataLoader(num_workers=2)`` (0);
- ``wds_dec2``: ``wds.WebDataset(urls).decode("torchrgb8").to_tuple("jpg", "cls").batched(64)``
  through ``DataLoader(num_workers=2)``.

Prints the ratios the PyTorch issue asks for: (a) rf_dl0 / loader >= 0.9,
(b) rf_dl2 / rf_dl0 >= 1.0, (c) rf_dec2 / floor >= 0.9 and rf_dec2 / wds_dec2
> 1, (d) rf_dl2 / wds_dl2 >= 15 (samples per second, whole process).

    benches/torch_vs_webdataset.sh [--rounds 3] [--epochs 2] [--only raw|jpeg]
"""

import time

START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import _timing  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CLI = REPO / "target" / "release" / "ringfeed"
JPEG_BATCH = 64
JPEG_SIDE = 448


def imports():
    """Every contender imports the same modules (their cost is in every time)."""
    import numpy  # noqa: F401
    import PIL.Image  # noqa: F401
    import torch  # noqa: F401
    import torch.utils.data  # noqa: F401
    import webdataset  # noqa: F401

    import ringfeed  # noqa: F401
    import ringfeed.torch  # noqa: F401


# -- contenders (run with --one) ----------------------------------------------


def raw_loader(urls, a):
    import ringfeed

    n = nbytes = 0
    with ringfeed.Loader(urls, batch_size=a.batch_size, epochs=a.epochs) as loader:
        for b in loader:
            for name in b.fields:
                nbytes += int(b[name].lengths.sum())
            n += len(b)
            b.release()
    return n, nbytes


def raw_rf(urls, a, workers):
    import torch.utils.data
    from ringfeed.torch import RingfeedDataset

    dl = torch.utils.data.DataLoader(
        RingfeedDataset(urls, batch_size=a.batch_size), batch_size=None, num_workers=workers,
        persistent_workers=workers > 0,
    )
    n = nbytes = 0
    for _ in range(a.epochs):
        for item in dl:
            for name, r in item.items():
                if name != "__key__":
                    nbytes += int(r.lengths.sum())
            n += len(item["__key__"])
    return n, nbytes


def raw_wds(urls, a):
    import torch.utils.data
    import webdataset as wds

    dl = torch.utils.data.DataLoader(
        wds.WebDataset(urls, shardshuffle=False).batched(a.batch_size), batch_size=None, num_workers=2,
        persistent_workers=True,
    )
    n = nbytes = 0
    for _ in range(a.epochs):
        for b in dl:
            for name, values in b.items():
                if not name.startswith("__"):
                    nbytes += sum(len(v) for v in values)
            n += len(b["__key__"])
    return n, nbytes


def jpeg_floor(urls, a):
    import tarfile

    from ringfeed.decode import ImageHandler

    images = []
    for u in urls:
        with tarfile.open(u) as t:
            for m in t:
                if m.name.endswith(".jpg"):
                    images.append(t.extractfile(m).read())
    decode = ImageHandler("torchrgb8")
    n = nbytes = 0
    for data in images:
        img = decode("jpg", data)
        n += 1
        nbytes += len(data)
        assert img.shape[0] == 3
    return n, nbytes


def jpeg_rf(urls, a, workers):
    import torch.utils.data
    from ringfeed.torch import RingfeedDataset

    ds = RingfeedDataset(urls, batch_size=JPEG_BATCH).decode("torchrgb8").to_tuple("jpg", "cls")
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    n = 0
    for imgs, labels in dl:
        assert imgs.shape[1:] == (3, JPEG_SIDE, JPEG_SIDE) and len(labels) == len(imgs)
        n += len(imgs)
    return n, 0


def jpeg_wds(urls, a):
    import torch.utils.data
    import webdataset as wds

    ds = wds.WebDataset(urls, shardshuffle=False).decode("torchrgb8").to_tuple("jpg", "cls").batched(JPEG_BATCH)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    n = 0
    for imgs, labels in dl:
        assert imgs.shape[1:] == (3, JPEG_SIDE, JPEG_SIDE) and len(labels) == len(imgs)
        n += len(imgs)
    return n, 0


CONTENDERS = {
    "loader": ("raw", raw_loader),
    "rf_dl0": ("raw", lambda u, a: raw_rf(u, a, 0)),
    "rf_dl2": ("raw", lambda u, a: raw_rf(u, a, 2)),
    "wds_dl2": ("raw", raw_wds),
    "floor": ("jpeg", jpeg_floor),
    "rf_dec0": ("jpeg", lambda u, a: jpeg_rf(u, a, 0)),
    "rf_dec2": ("jpeg", lambda u, a: jpeg_rf(u, a, 2)),
    "wds_dec2": ("jpeg", jpeg_wds),
}


def run_one(kind, urls, a):
    imports()
    t0 = time.perf_counter()
    n, nbytes = CONTENDERS[kind][1](urls, a)
    t1 = time.perf_counter()
    print(json.dumps({"samples": n, "bytes": nbytes, "loop_seconds": t1 - t0, "in_process_seconds": t1 - START}))


# -- data -------------------------------------------------------------------------


def raw_shards(out, shards, shard_size):
    d = out / "raw"
    params = f"--shards {shards} --shard-size {shard_size} --sample-size 10KB --fields jpg,cls --seed 0"
    stamp = d / ".gen-params"
    if not (stamp.is_file() and stamp.read_text() == params):
        subprocess.run([str(CLI), "gen", str(d), *params.split()], check=True)
        stamp.write_text(params)
    return sorted(str(p) for p in d.glob("shard-*.tar"))


def jpeg_shards(out, shards, per_shard):
    """Shards of ~100 KB JPEGs: smooth colour fields under noise, as photos
    compress; with a class label each."""
    import io
    import tarfile

    import numpy as np
    from PIL import Image

    d = out / "jpeg"
    params = f"{shards} {per_shard} {JPEG_SIDE}"
    stamp = d / ".params"
    if not (stamp.is_file() and stamp.read_text() == params):
        d.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        y, x = np.mgrid[0:JPEG_SIDE, 0:JPEG_SIDE]
        i = 0
        for s in range(shards):
            with tarfile.open(d / f"images-{s:04d}.tar", "w", format=tarfile.USTAR_FORMAT) as t:
                for _ in range(per_shard):
                    phase = rng.integers(0, 255, 3)
                    base = np.stack([(x + phase[0]) % 256, (y + phase[1]) % 256, ((x + y) // 2 + phase[2]) % 256], -1)
                    a = (base + rng.normal(0, 24, base.shape)).clip(0, 255).astype(np.uint8)
                    buf = io.BytesIO()
                    Image.fromarray(a).save(buf, format="JPEG", quality=90)
                    for name, data in ((f"{i:07d}.jpg", buf.getvalue()), (f"{i:07d}.cls", str(i % 10).encode())):
                        info = tarfile.TarInfo(name)
                        info.size = len(data)
                        t.addfile(info, io.BytesIO(data))
                    i += 1
        stamp.write_text(params)
    return sorted(str(p) for p in d.glob("images-*.tar"))


# -- the driver -------------------------------------------------------------------


def measure(kind, urls, a):
    cmd = [sys.executable, __file__, "--one", kind, "--epochs", str(a.epochs), "--batch-size", str(a.batch_size)]
    hot = _timing.ensure_hot(urls)
    times, out = _timing.run_timed([*cmd, *urls])
    r = json.loads(out.strip().splitlines()[-1])
    r.update(times)
    r.update(hot)
    r["samples_per_s"] = r["samples"] / r["wall_seconds"]
    r["loop_samples_per_s"] = r["samples"] / r["loop_seconds"]
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2, help="passes over the raw set")
    ap.add_argument("--batch-size", type=int, default=256, help="raw set batches")
    ap.add_argument("--raw-shards", type=int, default=32)
    ap.add_argument("--raw-shard-size", default="64MiB")
    ap.add_argument("--jpeg-shards", type=int, default=8)
    ap.add_argument("--jpeg-per-shard", type=int, default=1000)
    ap.add_argument("--only", choices=["raw", "jpeg"])
    ap.add_argument("--out", default=str(REPO / "benches" / "out" / "torch"))
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("urls", nargs="*")
    a = ap.parse_args()
    if a.one:
        run_one(a.one, a.urls, a)
        return 0

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sets = {}
    if a.only in (None, "raw"):
        sets["raw"] = raw_shards(out, a.raw_shards, a.raw_shard_size)
    if a.only in (None, "jpeg"):
        sets["jpeg"] = jpeg_shards(out, a.jpeg_shards, a.jpeg_per_shard)
    runs = {k: [] for k, (s, _) in CONTENDERS.items() if s in sets}
    sys.stdout.reconfigure(line_buffering=True)  # the tables after the progress lines
    for r in range(a.rounds):
        order = list(runs)
        order = order[r % len(order):] + order[: r % len(order)]  # each round starts elsewhere
        for kind in order:
            runs[kind].append(measure(kind, sets[CONTENDERS[kind][0]], a))
            m = runs[kind][-1]
            print(f"  round {r + 1} {kind:9} {m['wall_seconds']:7.2f} s whole, {m['loop_seconds']:7.2f} s loop, "
                  f"resident before {m['resident_before']:.4f}{' (re-read)' if m['rewarmed'] else ''}",
                  file=sys.stderr)

    def med(kind, key):
        return statistics.median(m[key] for m in runs[kind])

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    print(f"\nringfeed.torch benchmark, commit {commit.strip()}, {a.rounds} rounds (medians), {os.cpu_count()} CPUs")
    for s, files in sets.items():
        total = sum(os.path.getsize(f) for f in files)
        desc = (f"~10 KB samples, batches of {a.batch_size}, {a.epochs} passes" if s == "raw"
                else f"~100 KB JPEGs {JPEG_SIDE}x{JPEG_SIDE}, batches of {JPEG_BATCH}, 1 pass")
        print(f"\n{s}: {len(files)} shards, {total / 1e9:.2f} GB, {desc}")
        print(f"  {'contender':10} {'samples':>9} {'whole s':>8} {'samples/s':>11} {'CPU s':>7} "
              f"{'loop s':>8} {'loop samples/s':>15}")
        for kind in runs:
            if CONTENDERS[kind][0] == s:
                print(f"  {kind:10} {runs[kind][0]['samples']:9d} {med(kind, 'wall_seconds'):8.2f} "
                      f"{med(kind, 'samples_per_s'):11.0f} {med(kind, 'cpu_seconds'):7.2f} "
                      f"{med(kind, 'loop_seconds'):8.2f} {med(kind, 'loop_samples_per_s'):15.0f}")
        ms = [m for kind in runs if CONTENDERS[kind][0] == s for m in runs[kind]]
        print(f"  page cache before each run: {_timing.residency_summary(ms)}")

    def ratio(label, x, y, target, ge=True):
        if x not in runs or y not in runs:
            return
        whole = _timing.ratio_of_medians([m["samples_per_s"] for m in runs[x]], [m["samples_per_s"] for m in runs[y]])
        loop = _timing.ratio_of_medians([m["loop_samples_per_s"] for m in runs[x]],
                                        [m["loop_samples_per_s"] for m in runs[y]])
        met = whole[0] >= target if ge else whole[0] > target
        print(f"  {label:38} whole {_timing.fmt_ratio(whole)} ({'met' if met else 'MISSED'}: "
              f"{'>=' if ge else '>'} {target}), loop clocks {_timing.fmt_ratio(loop)}")

    print("\nratios of the medians above, samples per second (lowest-highest per-round ratio in brackets):")
    ratio("(a) rf_dl0 / loader", "rf_dl0", "loader", 0.9)
    ratio("(b) rf_dl2 / rf_dl0", "rf_dl2", "rf_dl0", 1.0)
    ratio("(c) rf_dec2 / floor", "rf_dec2", "floor", 0.9)
    ratio("(c) rf_dec2 / wds_dec2", "rf_dec2", "wds_dec2", 1.0, ge=False)
    ratio("    rf_dec2 / rf_dec0 (workers scale)", "rf_dec2", "rf_dec0", 1.0, ge=False)
    ratio("(d) rf_dl2 / wds_dl2", "rf_dl2", "wds_dl2", 15)
    ratio("    rf_dl0 / wds_dl2", "rf_dl0", "wds_dl2", 15)
    if a.json:
        Path(a.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
