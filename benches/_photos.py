"""The photo sets the image benchmarks share (``image_pipeline.py``,
``image_decode.py``, ``dataloader_workers.py``): scikit-image's sample
photographs cut into many different crops at several sizes and JPEG
qualities, so every image is a photo (not noise) and differs from the
others, written as WebDataset shards under ``benches/out/image_pipeline/``
once and reused."""

import importlib.util
import io
import json
import pathlib
import sys
import tarfile

OUT = pathlib.Path(__file__).resolve().parent / "out" / "image_pipeline"
PHOTOS = [
    "astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png",
    "motorcycle_right.png", "hubble_deep_field.jpg", "retina.jpg", "ihc.png", "immunohistochemistry.png",
]

# The photo sets: the long side's range in pixels, JPEG qualities, folder
# suffix. "large" is the set of the README's figure; "imagenet" photos of
# ImageNet's usual size (about 500x375; a mean of 91 KB, 80 % within 53-133).
PHOTO_SETS = {"large": ((660, 820), (88, 96), ""), "imagenet": ((470, 520), (96, 100), "-imagenet")}


def make_shards(n_images, per_shard=128, photos="large"):
    from PIL import Image
    import numpy as np

    (lo_side, hi_side), (lo_q, hi_q), suffix = PHOTO_SETS[photos]
    d = OUT / f"photos-{n_images}{suffix}"
    stamp = d / ".done"
    if stamp.is_file():
        return sorted(str(p) for p in d.glob("photos-*.tar"))
    d.mkdir(parents=True, exist_ok=True)
    spec = importlib.util.find_spec("skimage")
    if spec is None:
        sys.exit("scikit-image is needed for its sample photographs: pip install --no-deps scikit-image")
    data = pathlib.Path(list(spec.submodule_search_locations)[0]) / "data"
    photos = [Image.open(data / p).convert("RGB") for p in PHOTOS if (data / p).is_file()]
    rng = np.random.default_rng(0)
    sizes = []
    i = 0
    for s in range(0, n_images, per_shard):
        with tarfile.open(d / f"photos-{s // per_shard:04d}.tar", "w", format=tarfile.USTAR_FORMAT) as t:
            for _ in range(min(per_shard, n_images - s)):
                img = photos[i % len(photos)]
                w, h = img.size
                cw, ch = int(w * rng.uniform(0.55, 1.0)), int(h * rng.uniform(0.55, 1.0))
                x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
                side = int(rng.uniform(lo_side, hi_side))
                crop = img.crop((x, y, x + cw, y + ch))
                scale = side / max(cw, ch)
                crop = crop.resize((max(1, int(cw * scale)), max(1, int(ch * scale))), Image.BILINEAR)
                if rng.random() < 0.5:
                    crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
                b = io.BytesIO()
                crop.save(b, "JPEG", quality=int(rng.integers(lo_q, hi_q)))
                sizes.append(len(b.getvalue()))
                for name, payload in ((f"{i:07d}.jpg", b.getvalue()), (f"{i:07d}.cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(payload)
                    t.addfile(info, io.BytesIO(payload))
                i += 1
    (d / "sizes.json").write_text(json.dumps({"mean_bytes": sum(sizes) / len(sizes),
                                              "middle_80_percent_bytes": [sorted(sizes)[len(sizes) // 10],
                                                                          sorted(sizes)[len(sizes) * 9 // 10]]}))
    stamp.write_text("")
    return sorted(str(p) for p in d.glob("photos-*.tar"))
