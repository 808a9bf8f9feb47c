#!/usr/bin/env python3
"""The image pipeline's time per image with several builds of the library,
in one process, interleaved: each build's ``ringfeed_image_transform`` (the
code a loader's ``transform`` runs per sample: decode, crop, resize, flip)
over the same JPEG photos, one image at a time on one thread.

The photos are those of ``benches/image_pipeline.py`` (scikit-image's
sample photographs cut into many crops of 660 to 820 pixels on their long
side at JPEG qualities 88 to 95, ~100 KB each; with ``--photos imagenet``
470 to 520 pixels, about 500x375 as ImageNet's usually are), made there
once and reused. Two specs are timed:

- ``train``: ``random_resized_crop`` 224 with a flip, as a training loader
  runs it: the decode reduced in the DCT domain and windowed to the crop;
- ``full``: the same with ``"reduce": false``: every image decoded whole
  at full size, which times the JPEG decoder itself.

Each round times every build on every image (the builds' order rotating
from round to round), in CPU seconds of this thread (a busy machine takes
CPU from the process, not from the thread's count) and in wall seconds;
medians of the rounds and ratios of medians against the first build are
printed. The first round also checks that every build gives every image
the same pixels, and says how many differ and by how much.

    benches/image_decode.py --lib NAME=PATH [--lib NAME=PATH ...]
                            [--images 512] [--rounds 7] [--spec train,full] [--photos imagenet]

Each PATH is a ``libringfeed.so`` (``target/release/libringfeed.so`` of a
checkout; the first ``--lib`` is the reference). The library is loaded
with ctypes, so builds of other commits load side by side. Needs numpy,
Pillow and scikit-image (for the photos): scripts/test.sh installs them.
"""

import argparse
import ctypes
import json
import pathlib
import statistics
import sys
import tarfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SPECS = {
    "train": {"jpg": {"random_resized_crop": 224, "flip": 0.5}},
    "full": {"jpg": {"random_resized_crop": 224, "flip": 0.5, "reduce": False}},
}


class Info(ctypes.Structure):
    """``ringfeed_image_info`` (include/ringfeed.h)."""

    _fields_ = [
        ("out_bytes", ctypes.c_uint64),
        ("dim0", ctypes.c_uint32),
        ("dim1", ctypes.c_uint32),
        ("dim2", ctypes.c_uint32),
        ("elem_bytes", ctypes.c_uint32),
        ("source_width", ctypes.c_uint32),
        ("source_height", ctypes.c_uint32),
        ("crop_top", ctypes.c_double),
        ("crop_left", ctypes.c_double),
        ("crop_height", ctypes.c_double),
        ("crop_width", ctypes.c_double),
        ("flipped", ctypes.c_uint32),
        ("decode_scale", ctypes.c_double),
    ]


class Build:
    """One build of the library: its ``ringfeed_image_transform``."""

    def __init__(self, name, path):
        self.name = name
        self.lib = ctypes.CDLL(str(pathlib.Path(path).resolve()))
        f = self.lib.ringfeed_image_transform
        f.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64,
                      ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                      ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(Info)]
        f.restype = ctypes.c_int32
        self.transform = f

    def run(self, spec, images, out, info):
        """Transforms every image into `out`; returns (thread CPU s, wall s)."""
        f, text, field, buf, n = self.transform, spec, b"jpg", ctypes.addressof(out), len(out)
        c0, w0 = time.thread_time(), time.perf_counter()
        for position, data in enumerate(images):
            st = f(text, field, data, len(data), 0, 0, position, buf, n, info)
            if st != 0:
                sys.exit(f"{self.name}: image {position} failed with status {st}")
        return time.thread_time() - c0, time.perf_counter() - w0

    def pixels(self, spec, data, position, out, info):
        st = self.transform(spec, b"jpg", data, len(data), 0, 0, position, ctypes.addressof(out), len(out), info)
        if st != 0:
            sys.exit(f"{self.name}: image {position} failed with status {st}")
        return bytes(out), info.decode_scale


def photos(n, kind="large"):
    from _photos import make_shards

    images = []
    for shard in make_shards(n, photos=kind):
        with tarfile.open(shard) as t:
            for m in t.getmembers():
                if m.name.endswith(".jpg"):
                    images.append(t.extractfile(m).read())
    return images[:n]


def compare(builds, spec, images, out, info):
    """How many images some build gives other pixels than the first."""
    differ, worst, scales = 0, 0, set()
    for position, data in enumerate(images):
        ref, scale = builds[0].pixels(spec, data, position, out, info)
        scales.add(scale)
        for b in builds[1:]:
            got, other_scale = b.pixels(spec, data, position, out, info)
            if got != ref or other_scale != scale:
                differ += 1
                worst = max(worst, max(abs(x - y) for x, y in zip(got, ref)))
    return differ, worst, scales


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", action="append", required=True, metavar="NAME=PATH")
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--spec", default="train,full")
    ap.add_argument("--photos", choices=("large", "imagenet"), default="large",
                    help="image_pipeline.py's photo set: 660-820 px, or about 500x375")
    a = ap.parse_args()
    builds = [Build(*item.split("=", 1)) for item in a.lib]
    images = photos(a.images, a.photos)
    mean_kb = sum(map(len, images)) / len(images) / 1e3
    print(f"{len(images)} JPEG photos, {mean_kb:.0f} KB on average; {a.rounds} rounds, "
          f"builds interleaved; times per image")
    out = (ctypes.c_uint8 * (3 * 224 * 224))()
    info = Info()
    for name in a.spec.split(","):
        spec = json.dumps(SPECS[name]).encode()
        differ, worst, scales = compare(builds, spec, images, out, info)
        print(f"\n{name}: {json.dumps(SPECS[name])}; decode scales {sorted(scales)}")
        if len(builds) > 1:
            print(f"  pixels: {differ} of {len(images)} images differ between builds"
                  + (f" (by up to {worst} levels)" if differ else ""))
        cpu = {b.name: [] for b in builds}
        wall = {b.name: [] for b in builds}
        for r in range(a.rounds):
            for i in range(len(builds)):
                b = builds[(r + i) % len(builds)]
                c, w = b.run(spec, images, out, info)
                cpu[b.name].append(c / len(images))
                wall[b.name].append(w / len(images))
        ref = builds[0].name
        for b in builds:
            mc, mw = statistics.median(cpu[b.name]), statistics.median(wall[b.name])
            ratios = sorted(x / y for x, y in zip(cpu[b.name], cpu[ref]))
            print(f"  {b.name:>10}: {mc * 1e3:6.2f} ms CPU ({mw * 1e3:6.2f} ms wall) per image; "
                  f"{mc / statistics.median(cpu[ref]):.3f}x {ref} "
                  f"(rounds {ratios[0]:.3f}-{ratios[-1]:.3f}x)")


if __name__ == "__main__":
    main()
