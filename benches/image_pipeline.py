#!/usr/bin/env python3
"""The engine's image pipeline against the ways people feed vision training
today, on ~100 KB JPEG photos to 224x224 with random-resized-crop and flip,
batches of 128 (issue 29's comparison):

- ``rf_engine``: ``RingfeedDataset(urls, batch_size=128, transform=spec)``
  through a ``DataLoader(num_workers=0)``: the engine decodes, crops and
  flips on its own threads; each item is ``(images, labels)`` tensors;
- ``wds_dl2``: ``webdataset.WebDataset(urls).decode("pil")`` with
  torchvision's ``RandomResizedCrop(224)``, ``RandomHorizontalFlip()`` and
  ``PILToTensor()``, batched by 128, through a ``DataLoader(num_workers=2)``;
- ``floor``: two processes decoding and cropping the same bytes, read into
  memory first, with Pillow and torchvision's transforms (no I/O, no
  batching, no pickling): what two CPUs of Python decoding can do;
- ``litdata``: LitData's ``StreamingDataset`` (a subclass whose
  ``__getitem__`` decodes with Pillow and applies the same torchvision
  transforms) through ``StreamingDataLoader(batch_size=128,
  num_workers=2)``, over the same JPEGs converted once (untimed) into
  LitData's chunks with ``litdata.optimize``, as its users prepare data;
- ``spdl``: an SPDL pipeline (``spdl.pipeline.PipelineBuilder``) reading
  the shards with ``spdl.io.iter_tarfile``, decoding each JPEG with
  ``spdl.io`` (FFmpeg) through a crop/scale/flip filter of the same random
  crop parameters on 2 threads, aggregated by 128 and stacked into a
  tensor: the thread-pool pipeline without worker processes.

LitData and SPDL run where they install (``pip install litdata spdl``;
SPDL needs FFmpeg's libraries: on Debian ``libavcodec59 libavfilter8
libavformat59 libavdevice59``); a missing one is reported and left out.

The photos are scikit-image's sample photographs (astronaut, cat, coffee,
rocket, motorcycle, ...), cut into many different crops at several sizes
and JPEG qualities, so every image is a photo (not noise) and differs from
the others. Each contender runs as its own process, timed from spawn to
exit with the CPU time wait4 reports (``benches/timed.py``), ROUNDS
interleaved rounds in a rotating order; medians and ratios of medians are
printed. Over ``--epochs`` passes, start-up is a small part of each run.

    benches/image_pipeline.py [--images 2048] [--epochs 2] [--rounds 3] [--only NAME,...]
                              [--store local|emulator] [--latency 20ms:120ms]

``--store emulator`` serves the shards (and LitData's chunks) from the
project's object-store emulator (``store_emulator``, S3's first-byte
latency, 90 MB/s a connection) instead of local files, and every
contender reads them the way its users read a bucket: ringfeed
``s3://`` URLs; WebDataset ``pipe:curl -sf URL``; LitData
``StreamingDataset("s3://...")`` with boto3 pointed at the emulator
(``storage_options``; its chunk prefetch through obstore is allowed plain
HTTP, which LitData has no option for) and an empty chunk cache each run; SPDL's source
fetching each shard over HTTP, two shards ahead on threads. The floor
decodes from memory in both modes (it is the decode floor, not a reader).
Needs ``cargo build --release --example store_emulator`` and curl.

Needs the repository's .venv with torch, torchvision, webdataset, Pillow
and scikit-image (for its photos): scripts/test.sh installs them. ringfeed
is this checkout's package with the release library
(``benches/_checkout.py``).
"""

import argparse
import io
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tarfile
import time

from _checkout import use_checkout
from _photos import PHOTO_SETS, make_shards

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "out" / "image_pipeline"
BATCH = 128
SIDE = 224
SPEC = {"jpg": {"random_resized_crop": SIDE, "flip": 0.5}, "cls": "int64"}
BUCKET = "rfbench"
# Where the shards are read from in a contender's process: None (the local
# files) or the emulator's {"endpoint": ...} (set by --store-json).
STORE = None


def remote(path, folder="photos"):
    """The HTTP URL (S3 path style) of a local shard on the emulator."""
    return f"{STORE['endpoint']}/{BUCKET}/{folder}/{pathlib.Path(path).name}"


def s3_config():
    return {"s3_endpoint": STORE["endpoint"], "s3_region": "us-east-1",
            "aws_access_key_id": "x", "aws_secret_access_key": "y"}


# -- contenders (each run as its own process: `--run NAME`) ------------------

_STARTED = time.perf_counter()
_FIRST = []


def first_batch():
    """Notes when the contender's first batch arrived (its start-up)."""
    if not _FIRST:
        _FIRST.append(time.perf_counter() - _STARTED)


def run_rf_engine(urls, epochs):
    import torch
    from ringfeed.torch import RingfeedDataset

    config = {}
    if STORE:
        urls = [f"s3://{BUCKET}/photos/{pathlib.Path(u).name}" for u in urls]
        config = s3_config()
    ds = RingfeedDataset(urls, batch_size=BATCH, transform=SPEC, shuffle=True, seed=0, **config)
    n = 0
    for e in range(epochs):
        ds.set_epoch(e)
        for images, labels in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0):
            assert images.shape[1:] == (3, SIDE, SIDE) and images.dtype == torch.uint8
            n += len(labels)
            first_batch()
    return n


def tv_transform():
    import torchvision.transforms as T

    return T.Compose([T.RandomResizedCrop(SIDE, antialias=True), T.RandomHorizontalFlip(), T.PILToTensor()])


def run_wds_dl2(urls, epochs):
    import torch
    import webdataset as wds

    tf = tv_transform()
    if STORE:
        urls = [f"pipe:curl -sf {remote(u)}" for u in urls]
    ds = (
        wds.WebDataset(urls, shardshuffle=False)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map_tuple(tf, lambda c: c)
        .batched(BATCH)
    )
    n = 0
    for _ in range(epochs):
        for images, labels in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2):
            assert images.shape[1:] == (3, SIDE, SIDE)
            n += len(labels)
            first_batch()
    return n


def _floor_part(args):
    paths, lo, hi, epochs = args
    from PIL import Image

    tf = tv_transform()
    blobs = []
    for p in paths:
        with tarfile.open(p) as t:
            for m in t.getmembers():
                if m.name.endswith(".jpg"):
                    blobs.append(t.extractfile(m).read())
    n = 0
    for _ in range(epochs):
        for b in blobs[lo:hi]:
            tf(Image.open(io.BytesIO(b)).convert("RGB"))
            n += 1
    return n


def run_floor(urls, epochs):
    import multiprocessing as mp

    total = 0
    for p in urls:
        with tarfile.open(p) as t:
            total += sum(1 for m in t.getmembers() if m.name.endswith(".jpg"))
    with mp.get_context("fork").Pool(2) as pool:
        # Its start-up: the pool's; the bytes are read into memory in the
        # workers, untimed as start-up, as a floor should be.
        first_batch()
        half = total // 2
        parts = [(urls, 0, half, epochs), (urls, half, total, epochs)]
        return sum(pool.map(_floor_part, parts))


def litdata_dir(urls):
    """The shards' JPEGs and labels as LitData chunks (made once, untimed)."""
    d = pathlib.Path(urls[0]).parent / "litdata"
    if (d / ".done").is_file():
        return d
    from litdata import optimize

    # One input a shard; the function yields its samples (optimize runs it
    # in worker processes of its own).
    optimize(fn=_litdata_items, inputs=list(urls), output_dir=str(d), chunk_bytes="64MB", num_workers=1)
    (d / ".done").write_text("")
    return d


def _litdata_items(path):
    with tarfile.open(path) as t:
        sample = {}
        for m in t.getmembers():
            key, ext = m.name.split(".", 1)
            sample[ext] = t.extractfile(m).read()
            if "jpg" in sample and "cls" in sample:
                yield {"jpg": sample["jpg"], "cls": int(sample["cls"])}
                sample = {}


def run_litdata(urls, epochs):
    import torch
    from litdata import StreamingDataLoader, StreamingDataset
    from PIL import Image

    tf = tv_transform()

    class Photos(StreamingDataset):
        def __getitem__(self, index):
            item = super().__getitem__(index)
            return tf(Image.open(io.BytesIO(item["jpg"])).convert("RGB")), item["cls"]

    if STORE:
        import tempfile

        # boto3 pointed at the emulator; a fresh chunk cache, so every
        # chunk is downloaded in the run.
        opts = {"endpoint_url": STORE["endpoint"], "aws_access_key_id": "x",
                "aws_secret_access_key": "y", "region_name": "us-east-1"}
        cache = tempfile.mkdtemp(prefix="litdata-cache-")
        # LitData's chunk prefetch goes through obstore, which refuses a
        # plain-HTTP endpoint unless its client options allow it; LitData
        # passes none of its own, so they are added to its defaults here.
        import litdata.streaming.downloader as dl

        dl._OBSTORE_CLIENT_OPTIONS = {**dl._OBSTORE_CLIENT_OPTIONS, "allow_http": True}
        ds = Photos(f"s3://{BUCKET}/litdata", cache_dir=cache, storage_options=opts, shuffle=True, seed=0)
    else:
        ds = Photos(str(litdata_dir(urls)), shuffle=True, seed=0)
    dl = StreamingDataLoader(ds, batch_size=BATCH, num_workers=2)
    n = 0
    for _ in range(epochs):
        for images, labels in dl:
            assert images.shape[1:] == (3, SIDE, SIDE) and images.dtype == torch.uint8
            n += len(labels)
            first_batch()
    return n


def _rrc_params(width, height, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's RandomResizedCrop.get_params, on a size."""
    import math

    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def run_spdl(urls, epochs):
    import random

    import numpy as np
    import spdl.io
    import torch
    from spdl.pipeline import PipelineBuilder

    rng = random.Random(0)

    def load(p):
        if STORE:
            import urllib.request

            with urllib.request.urlopen(remote(p), timeout=60) as r:
                return r.read()
        with open(p, "rb") as f:
            return f.read()

    def shards(order):
        # The next two shards fetched on threads while one is decoded.
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2) as ex:
            ahead = [ex.submit(load, p) for p in order[:2]]
            for i in range(len(order)):
                if i + 2 < len(order):
                    ahead.append(ex.submit(load, order[i + 2]))
                yield ahead.pop(0).result()

    def source(order):
        for data in shards(order):
            sample = {}
            for name, payload in spdl.io.iter_tarfile(data):
                key, ext = name.split(".", 1)
                sample[ext] = payload
                if "jpg" in sample and "cls" in sample:
                    yield bytes(sample["jpg"]), int(bytes(sample["cls"]))
                    sample = {}

    def decode(item):
        data, label = item
        packets = spdl.io.demux_image(data)
        top, left, h, w = _rrc_params(packets.width, packets.height, rng)
        flip = ",hflip" if rng.random() < 0.5 else ""
        desc = f"crop={w}:{h}:{left}:{top},scale={SIDE}:{SIDE}:flags=bilinear{flip},format=rgb24"
        frames = spdl.io.decode_packets(packets, filter_desc=desc)
        return spdl.io.to_numpy(spdl.io.convert_frames(frames)), label

    def collate(items):
        images = torch.from_numpy(np.stack([i for i, _ in items])).permute(0, 3, 1, 2)
        return images, torch.tensor([c for _, c in items])

    n = 0
    for e in range(epochs):
        order = list(urls)
        random.Random(e).shuffle(order)
        pipeline = (
            PipelineBuilder()
            .add_source(source(order))
            .pipe(decode, concurrency=2)
            .aggregate(BATCH, drop_last=False)
            .pipe(collate)
            .add_sink(4)
            .build(num_threads=2)
        )
        with pipeline.auto_stop():
            for images, labels in pipeline:
                assert images.shape[1:] == (3, SIDE, SIDE)
                n += len(labels)
                first_batch()
    return n


RUNS = {"rf_engine": run_rf_engine, "wds_dl2": run_wds_dl2, "floor": run_floor, "litdata": run_litdata,
        "spdl": run_spdl}
# Peers that run only where they install.
OPTIONAL = {"litdata": "litdata", "spdl": "spdl.io"}


def available(name):
    module = OPTIONAL.get(name)
    if module is None:
        return True
    try:
        __import__(module)
        if name == "spdl":
            # A first call loads libspdl, which needs FFmpeg's libraries.
            import spdl.io
            from PIL import Image

            b = io.BytesIO()
            Image.new("RGB", (8, 8)).save(b, "JPEG")
            spdl.io.demux_image(b.getvalue())
    except Exception as e:  # noqa: BLE001
        print(f"{name}: left out, it does not load here ({type(e).__name__}: {e})"[:300])
        return False
    return True


def start_emulator(urls, latency, litdata):
    """The emulator over a root holding the shards (and LitData's chunks)
    as hard links: ROOT/rfbench/photos/*.tar, ROOT/rfbench/litdata/*."""
    import shutil

    exe = os.environ.get("EMULATOR") or str(HERE.parent / "target/release/examples/store_emulator")
    if not os.access(exe, os.X_OK):
        sys.exit(f"no emulator at {exe}: cargo build --release --example store_emulator")
    if shutil.which("curl") is None:
        sys.exit("curl is needed (webdataset's pipe:curl)")
    root = pathlib.Path(urls[0]).parent / "emulator-root"
    shutil.rmtree(root, ignore_errors=True)
    folders = [("photos", [pathlib.Path(u) for u in urls])]
    if litdata:
        d = litdata_dir(urls)
        folders.append(("litdata", [p for p in d.iterdir() if p.is_file() and not p.name.startswith(".")]))
    for folder, files in folders:
        (root / BUCKET / folder).mkdir(parents=True)
        for f in files:
            os.link(f, root / BUCKET / folder / f.name)
    argv = [exe, str(root), "--latency", latency]
    print("$ " + " ".join(argv))
    # stdin a pipe: the emulator stops when this program dies.
    emu = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    endpoint = emu.stdout.readline().decode().strip()
    if not endpoint.startswith("http://"):
        sys.exit(f"store_emulator printed {endpoint!r}")
    return {"endpoint": endpoint}, emu


def child(name, urls, epochs, store):
    global _STARTED, STORE
    STORE = store
    _STARTED = t = time.perf_counter()
    n = RUNS[name](urls, epochs)
    print(json.dumps({"samples": n, "own_s": time.perf_counter() - t, "first_s": _FIRST[0] if _FIRST else 0.0}))


def decode_floor(a, urls, med):
    """The decode alone, per image, against the pipeline's cost: the
    engine's transform (`ringfeed_image_transform`, benches/image_decode.py)
    and Pillow's whole decode, each on one thread over the same photos;
    then the images/s both CPUs would give were the transform all the
    pipeline cost, against the references measured above."""
    import image_decode
    from PIL import Image

    images = []
    for shard in urls:
        with tarfile.open(shard) as t:
            images += [t.extractfile(m).read() for m in t.getmembers() if m.name.endswith(".jpg")]
    build = image_decode.Build("engine", a.decode_floor)
    out = (image_decode.ctypes.c_uint8 * (3 * SIDE * SIDE))()
    info = image_decode.Info()
    per = {}
    for name in ("train", "full"):
        spec = json.dumps(image_decode.SPECS[name]).encode()
        per[name] = statistics.median(build.run(spec, images, out, info)[0] / len(images)
                                      for _ in range(a.rounds)) * 1e3

    def pillow():
        t = time.thread_time()
        for b in images:
            Image.open(io.BytesIO(b)).convert("RGB")
        return (time.thread_time() - t) / len(images) * 1e3

    per["pillow"] = statistics.median(pillow() for _ in range(a.rounds))
    cpus = len(os.sched_getaffinity(0))
    print(f"\ndecode alone, one thread, CPU-ms per image (medians of {a.rounds}):")
    print(f"  engine transform (train spec: reduced, windowed decode, crop, resize, flip) {per['train']:.2f}")
    print(f"  engine transform, whole decode at full size (\"reduce\": false)            {per['full']:.2f}")
    print(f"  Pillow whole decode (Image.open().convert(\"RGB\"))                         {per['pillow']:.2f}")
    if "rf_engine" in med:
        rf_cpu = med["rf_engine"][1]
        print(f"  rf_engine's pipeline: {rf_cpu:.2f} CPU-ms per image, {rf_cpu / per['train']:.2f}x its transform "
              f"alone")
        best = cpus * 1e3 / per["train"]
        print(f"  the transform alone on all {cpus} CPUs: {best:.0f} images/s at most; rf_engine reaches "
              f"{med['rf_engine'][0] / best:.2f} of it")
        for ref in ("wds_dl2", "floor"):
            if ref in med:
                print(f"  that bound / {ref} images/s: {best / med[ref][0]:.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--photos", choices=tuple(PHOTO_SETS), default="large",
                    help="large: 660-820 px on the long side; imagenet: about 500x375, ImageNet's usual size")
    ap.add_argument("--decode-floor", metavar="LIB", help="also time the engine's transform alone per image "
                    "(benches/image_decode.py's train spec, one thread) with this libringfeed.so")
    ap.add_argument("--store", choices=("local", "emulator"), default="local")
    ap.add_argument("--latency", default="20ms:120ms", help="the emulator's first-byte latency MEDIAN:P99")
    ap.add_argument("--store-json", help=argparse.SUPPRESS)
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--urls", help=argparse.SUPPRESS)
    a = ap.parse_args()
    use_checkout()
    if a.run:
        return child(a.run, json.loads(a.urls), a.epochs, json.loads(a.store_json or "null"))
    urls = make_shards(a.images, photos=a.photos)
    sizes = json.loads((pathlib.Path(urls[0]).parent / "sizes.json").read_text())
    mean = sizes["mean_bytes"]
    names = [n for n in RUNS if (not a.only or n in a.only.split(",")) and available(n)]
    if "litdata" in names:
        litdata_dir(urls)
    store, emu = None, None
    if a.store == "emulator":
        store, emu = start_emulator(urls, a.latency, "litdata" in names)
    where = f"from the emulator ({a.latency})" if store else "from local files"
    band = sizes.get("middle_80_percent_bytes")
    band = f" (80 % within {band[0] / 1e3:.0f}-{band[1] / 1e3:.0f} KB)" if band else ""
    print(f"{a.images} JPEG photos ({a.photos}), mean {mean / 1e3:.0f} KB{band}, {a.epochs} epochs, batches of "
          f"{BATCH}, to {SIDE}x{SIDE}, read {where}")
    results = {n: [] for n in names}
    for r in range(a.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        print(f"round {r + 1}: {' '.join(order)}", flush=True)
        for n in order:
            out = OUT / f"r{r}-{n}.json"
            cmd = [sys.executable, str(HERE / "timed.py"), str(out), "--", sys.executable, __file__,
                   "--run", n, "--urls", json.dumps(urls), "--epochs", str(a.epochs),
                   "--store-json", json.dumps(store)]
            subprocess.run(cmd, check=True)
            j = json.loads(out.read_text())
            # Start-up: spawn to the first batch (the imports before the
            # run, then the run's own wait for its first batch).
            start = j["process_wall_s"] - j["own_s"] + j["first_s"]
            results[n].append((j["samples"] / j["process_wall_s"], j["process_cpu_s"] / j["samples"] * 1e3,
                               start, j["process_wall_s"]))
    print(f"\nmedians of {a.rounds} rounds, whole process")
    print(f"  {'contender':12} {'images/s':>9} {'CPU-ms/image':>13} {'start-up s':>11} {'of run s':>9}")
    med = {}
    for n in names:
        rate = statistics.median(x[0] for x in results[n])
        cpu = statistics.median(x[1] for x in results[n])
        start = statistics.median(x[2] for x in results[n])
        wall = statistics.median(x[3] for x in results[n])
        med[n] = (rate, cpu)
        print(f"  {n:12} {rate:9.0f} {cpu:13.2f} {start:11.2f} {wall:9.1f}")
    if "rf_engine" in med:
        rf = med["rf_engine"]
        for ref, target in (("wds_dl2", 2.0), ("floor", 1.5)):
            if ref in med:
                r = rf[0] / med[ref][0]
                print(f"  rf_engine / {ref} images/s: {r:.2f} (target >= {target})")
        if "wds_dl2" in med:
            print(f"  rf_engine / wds_dl2 CPU per image: {rf[1] / med['wds_dl2'][1]:.2f} (target <= 0.5)")
        for ref in ("litdata", "spdl"):
            if ref in med:
                print(f"  rf_engine / {ref} images/s: {rf[0] / med[ref][0]:.2f}, "
                      f"CPU per image: {rf[1] / med[ref][1]:.2f}")
    if a.decode_floor:
        decode_floor(a, urls, med)
    (OUT / "summary.json").write_text(json.dumps({"medians": med, "rounds": results, "store": a.store,
                                                  "latency": a.latency if store else None}, indent=1))
    if emu:
        emu.stdin.close()
        emu.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
