#!/usr/bin/env python3
"""``RingfeedDataset`` through ``DataLoader(num_workers=N)`` for N in 0, 1,
2 and 8, as people set it, on two workloads:

- ``raw``: ~10 KB samples (``ringfeed gen``, 8 shards of 32 MiB, page-cache
  hot), batches of 256, every field's bytes touched by the training loop
  (``zlib.crc32`` over each sample's bytes, a slice of the item's
  ``Ragged.numpy()`` values, in the main process);
- ``image``: the engine's image pipeline (``transform``: random-resized-crop
  224 and flip, ``cls`` as int64) over ``benches/image_pipeline.py``'s
  ImageNet-size photos (about 500x375), batches of 128.

Each run is its own process, timed from spawn to exit with the CPU wait4
reports for it and every worker (``benches/timed.py``); ``--rounds``
interleaved rounds in a rotating order; medians, and each N's ratio of
medians to the first N listed (0 by default; images or samples per
second, whole process), with the per-round range.

    benches/dataloader_workers.py [--rounds 3] [--epochs 2] [--only raw|image] [--workers 0,1,2,8]

Needs the repository's .venv (torch, numpy, Pillow, scikit-image) and a
release build (``cargo build --release``): scripts/test.sh makes both.
ringfeed is this checkout's package with that library
(``benches/_checkout.py``), not the one installed in the .venv.
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import sys

from _checkout import use_checkout

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out" / "dataloader_workers"
SPEC = {"jpg": {"random_resized_crop": 224, "flip": 0.5}, "cls": "int64"}


def run_raw(urls, epochs, workers):
    import zlib

    import torch.utils.data
    from ringfeed.torch import RingfeedDataset

    ds = RingfeedDataset(urls, batch_size=256)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                     persistent_workers=workers > 0)
    n = 0
    for e in range(epochs):
        ds.set_epoch(e)
        for item in dl:
            for name in ("jpg", "cls"):
                values, starts, lengths = item[name].numpy()
                mv = memoryview(values)
                for at, k in zip(starts.tolist(), lengths.tolist()):
                    zlib.crc32(mv[at : at + k])
            n += len(item["__key__"])
    return n


def run_image(urls, epochs, workers):
    import torch.utils.data
    from ringfeed.torch import RingfeedDataset

    ds = RingfeedDataset(urls, batch_size=128, transform=SPEC, shuffle=True, seed=0)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                     persistent_workers=workers > 0)
    n = 0
    for e in range(epochs):
        ds.set_epoch(e)
        for images, labels in dl:
            assert images.shape[1:] == (3, 224, 224)
            n += len(labels)
    return n


def raw_shards():
    d = OUT / "raw"
    params = "--shards 8 --shard-size 32MiB --sample-size 10KB --fields jpg,cls --seed 0"
    stamp = d / ".gen-params"
    if not (stamp.is_file() and stamp.read_text() == params):
        cli = REPO / "target" / "release" / "ringfeed"
        subprocess.run([str(cli), "gen", str(d), *params.split()], check=True, capture_output=True)
        stamp.write_text(params)
    return sorted(str(p) for p in d.glob("shard-*.tar"))


def image_shards():
    sys.path.insert(0, str(HERE))
    from _photos import make_shards

    return make_shards(2048, photos="imagenet")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--only", choices=("raw", "image"))
    ap.add_argument("--workers", default="0,1,2,8")
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--urls", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    use_checkout()
    if a.run:
        n = {"raw": run_raw, "image": run_image}[a.run](json.loads(a.urls), a.epochs, a.n)
        print(json.dumps({"samples": n}))
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    sets = {}
    if a.only in (None, "raw"):
        sets["raw"] = raw_shards()
    if a.only in (None, "image"):
        sets["image"] = image_shards()
    ns = [int(x) for x in a.workers.split(",")]
    runs = [(s, n) for s in sets for n in ns]
    results = {r: [] for r in runs}
    for r in range(a.rounds):
        order = runs[r % len(runs):] + runs[: r % len(runs)]
        for s, n in order:
            out = OUT / f"r{r}-{s}-{n}.json"
            cmd = [sys.executable, str(HERE / "timed.py"), str(out), "--", sys.executable, __file__,
                   "--run", s, "--urls", json.dumps(sets[s]), "--epochs", str(a.epochs), "--n", str(n)]
            subprocess.run(cmd, check=True)
            j = json.loads(out.read_text())
            results[(s, n)].append((j["samples"] / j["process_wall_s"], j["process_cpu_s"] / j["samples"] * 1e6))
            print(f"  round {r + 1} {s:5} num_workers={n}: {j['process_wall_s']:.2f} s", file=sys.stderr)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    print(f"DataLoader(num_workers=N), commit {commit}, {a.epochs} epochs, medians of {a.rounds} rounds, "
          f"whole process")
    for s in sets:
        unit = "samples" if s == "raw" else "images"
        print(f"\n{s}: {'N':>3} {unit + '/s':>12} {'CPU-us/' + unit[:-1]:>16} {f'/ N={ns[0]}':>8}  rounds")
        base = [x[0] for x in results[(s, ns[0])]]
        for n in ns:
            rates = [x[0] for x in results[(s, n)]]
            cpu = statistics.median(x[1] for x in results[(s, n)])
            per = sorted(x / y for x, y in zip(rates, base))
            print(f"{'':{len(s) + 1}} {n:>3} {statistics.median(rates):12.0f} {cpu:16.1f} "
                  f"{statistics.median(rates) / statistics.median(base):8.2f}  [{per[0]:.2f}-{per[-1]:.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
