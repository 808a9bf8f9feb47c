"""The engine's image pipeline (``ringfeed.image.transform``, the code a
loader's ``transform`` runs per sample) against Pillow and torchvision on
real photos: scikit-image's sample photographs (astronaut, cat, coffee,
rocket, motorcycle), read from its wheel's data folder (scripts/test.sh
installs it for them), encoded here as JPEG and PNG of every kind the
pipeline meets.

Crops are compared with the box the pipeline reports, so only the pixels
are under test: decoding (both sides use libjpeg-turbo), the antialiased
bilinear resize (within rounding), flips, layouts, types, normalization.
"""

import importlib.util
import io
import json
import pathlib

import numpy as np
import pytest

import ringfeed
from ringfeed.image import transform

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

PHOTOS = ["astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png"]


def photo_dir():
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("scikit-image (for its sample photographs) is not installed")
    return pathlib.Path(list(spec.submodule_search_locations)[0]) / "data"


@pytest.fixture(scope="module")
def photos():
    d = photo_dir()
    return {name: Image.open(d / name).convert("RGB") for name in PHOTOS}


def jpeg(img, **kw):
    b = io.BytesIO()
    img.save(b, "JPEG", quality=kw.pop("quality", 90), **kw)
    return b.getvalue()


def png(img):
    b = io.BytesIO()
    img.save(b, "PNG")
    return b.getvalue()


def pil_crop_resize(data, box, size, flipped, mode="RGB"):
    """torchvision's RandomResizedCrop on a PIL image, given its box."""
    top, left, h, w = (int(v) for v in box)
    img = Image.open(io.BytesIO(data)).convert(mode)
    out = img.crop((left, top, left + w, top + h)).resize((size[1], size[0]), Image.BILINEAR)
    if flipped:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    a = np.asarray(out)
    return a if a.ndim == 3 else a[:, :, None]


def close(ours, theirs, max_diff=3, mean_diff=0.6):
    d = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
    assert d.max() <= max_diff and d.mean() <= mean_diff, (d.max(), d.mean())


def test_random_resized_crops_match_pillow_on_photos(photos):
    spec = {"jpg": {"random_resized_crop": {"size": 112}, "flip": 0.5, "layout": "hwc", "reduce": False}}
    flips = 0
    for name, img in photos.items():
        for sub in (0, 2):  # 4:4:4 and 4:2:0
            data = jpeg(img, subsampling=sub)
            for pos in range(6):
                out, info = transform(data, spec, seed=3, position=pos)
                assert out.shape == (112, 112, 3) and out.dtype == np.uint8
                assert info["source"] == img.size and info["decode_scale"] == 1.0
                flips += info["flipped"]
                close(out, pil_crop_resize(data, info["crop"], (112, 112), info["flipped"]))
    assert 0 < flips < 60


def test_a_reduced_decode_stays_near_the_full_one(photos):
    # Small outputs from big crops: decoded at 1/2 to 1/8 in the DCT domain.
    spec = {"jpg": {"random_resized_crop": {"size": 48, "scale": [0.5, 1.0]}, "layout": "hwc"}}
    scales = set()
    for img in photos.values():
        data = jpeg(img)
        for pos in range(4):
            out, info = transform(data, spec, position=pos)
            scales.add(info["decode_scale"])
            ref = pil_crop_resize(data, info["crop"], (48, 48), info["flipped"])
            d = np.abs(out.astype(np.int16) - ref.astype(np.int16))
            assert d.mean() < 4.0, (info, d.mean())
    assert min(scales) < 1.0, scales


def test_resize_then_center_crop_matches_torchvision(photos):
    torch = pytest.importorskip("torch")
    T = pytest.importorskip("torchvision.transforms")
    spec = {"jpg": {"resize": 256, "center_crop": 224, "dtype": "float32",
                    "normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}}
    tv = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    for img in photos.values():
        data = jpeg(img)
        out, info = transform(data, spec)
        assert out.shape == (3, 224, 224) and out.dtype == np.float32
        ref = tv(Image.open(io.BytesIO(data)).convert("RGB")).numpy()
        d = np.abs(out - ref) * 0.226 * 255  # back to levels
        assert d.max() <= 4 and d.mean() <= 0.6, (d.max(), d.mean())
    assert torch is not None


def test_every_kind_of_image_decodes_as_pillow_converts_it(photos):
    img = photos["chelsea.png"]
    whole = lambda mode="rgb": {"x": {"resize": [img.size[1], img.size[0]], "layout": "hwc", "decode": mode}}
    rgba = img.copy()
    rgba.putalpha(128)
    cases = {
        "progressive": jpeg(img, progressive=True),
        "grayscale jpeg": jpeg(img.convert("L")),
        "cmyk jpeg": jpeg(img.convert("CMYK")),
        "rgba png": png(rgba),
        "palette png": png(img.convert("P")),
        "gray png": png(img.convert("L")),
    }
    for what, data in cases.items():
        out, info = transform(data, whole())
        ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        # Same size: no resampling, so only the decoders differ.
        close(out, ref, max_diff=2 if "cmyk" in what else 1, mean_diff=0.3)
    # Gray from a colour JPEG: libjpeg's luma (the Y channel, decoded
    # without a colour conversion) against Pillow's luma of the decoded
    # RGB: the same weights, rounded at different steps.
    out, _ = transform(jpeg(img), whole("gray"))
    close(out[:, :, 0], np.asarray(Image.open(io.BytesIO(jpeg(img))).convert("L")), max_diff=3, mean_diff=0.5)


def test_sixteen_bit_pngs_keep_the_high_byte(photos):
    a = np.asarray(photos["coffee.png"]).astype(np.uint16)
    img16 = (a << 8) | 0x7F
    b = io.BytesIO()
    # Pillow writes 16-bit gray only; one channel of the photo, as I;16.
    Image.fromarray(img16[:, :, 1].astype(np.uint16)).save(b, "PNG")
    data = b.getvalue()
    h, w = a.shape[:2]
    out, _ = transform(data, {"p": {"resize": [h, w], "layout": "hwc", "decode": "gray"}})
    assert np.array_equal(out[:, :, 0], a[:, :, 1].astype(np.uint8))


def test_exif_orientation_is_not_applied(photos):
    img = photos["rocket.jpg"]
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW to display
    data = jpeg(img, exif=exif.tobytes())
    out, info = transform(data, {"jpg": {"resize": [img.size[1], img.size[0]], "layout": "hwc"}})
    assert info["source"] == img.size  # as stored, not as displayed
    close(out, np.asarray(Image.open(io.BytesIO(data)).convert("RGB")), max_diff=1, mean_diff=0.3)


def test_bad_images_and_specs_are_named_errors(photos):
    data = jpeg(photos["coffee.png"])
    spec = {"jpg": {"center_crop": 32}}
    for bad, want in [
        (data[: len(data) // 3], "JPEG"),
        (b"", "not a JPEG or PNG image"),
        (b"GIF89a" + bytes(100), "not a JPEG or PNG image"),
        (png(photos["coffee.png"])[:100], "PNG"),
    ]:
        with pytest.raises(ringfeed.FormatError, match=want) as e:
            transform(bad, spec)
        assert "field `jpg`" in str(e.value)
    with pytest.raises(ringfeed.ConfigError, match="field `jpg` option `flip`"):
        transform(data, {"jpg": {"center_crop": 32, "flip": 3}})
    with pytest.raises(ringfeed.ConfigError, match="no output size"):
        transform(data, json.dumps({"jpg": {"flip": 0.5}}))
    with pytest.raises(ringfeed.Error, match="no image field `png`"):
        transform(data, spec, "png")


def test_the_same_key_gives_the_same_pixels_and_another_position_others(photos):
    data = jpeg(photos["astronaut.png"])
    spec = {"jpg": {"random_resized_crop": 64, "flip": 0.5, "dtype": "float16"}}
    a, ia = transform(data, spec, seed=9, epoch=2, position=17)
    b, ib = transform(data, spec, seed=9, epoch=2, position=17)
    assert ia == ib and np.array_equal(a, b) and a.dtype == np.float16
    for kw in ({"seed": 8}, {"epoch": 3}, {"position": 18}):
        args = {"seed": 9, "epoch": 2, "position": 17, **kw}
        assert transform(data, spec, **args)[1]["crop"] != ia["crop"]


def shards_of_photos(tmp_path, photos, per_shard=5):
    """Shards of JPEG crops of the photos, each sample's label its index."""
    import tarfile

    items = []
    for name, img in photos.items():
        w, h = img.size
        for k in range(3):
            box = (k * w // 10, k * h // 12, w - k * w // 9, h - k * h // 11)
            items.append(jpeg(img.crop(box), quality=85 + k))
    urls = []
    for s in range(0, len(items), per_shard):
        path = tmp_path / f"photos-{s // per_shard}.tar"
        with tarfile.open(path, "w") as tar:
            for i, data in enumerate(items[s : s + per_shard], start=s):
                for ext, payload in (("jpg", data), ("cls", str(i).encode())):
                    info = tarfile.TarInfo(f"sample{i:04d}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
        urls.append(str(path))
    return urls, items


def test_a_dataset_with_the_engines_pipeline_yields_image_and_label_tensors(photos, tmp_path):
    torch = pytest.importorskip("torch")
    from ringfeed.torch import RingfeedDataset

    urls, items = shards_of_photos(tmp_path, photos)
    # No random choice: each image's pixels depend on its bytes alone, so
    # rows are checked against the one-image call by their label.
    spec = {"jpg": {"resize": 72, "center_crop": [64, 48]}, "cls": "int64"}
    ds = RingfeedDataset(urls, batch_size=4, transform=spec, shuffle=True, seed=5)
    seen = set()
    for images, labels in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0):
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 64, 48)
        assert labels.dtype == torch.int64 and labels.shape == (images.shape[0],)
        for img, label in zip(images, labels.tolist()):
            want, _ = transform(items[label], spec, "jpg")
            assert np.array_equal(img.numpy(), want), label
            seen.add(label)
        pinned = images.pin_memory() if torch.cuda.is_available() else images
        assert torch.equal(pinned.to("cpu", non_blocking=True), images)
    assert seen == set(range(len(items)))


def test_corrupt_photos_fail_the_dataset_or_are_skipped_counted_and_logged(photos, tmp_path, caplog):
    torch = pytest.importorskip("torch")
    from ringfeed.torch import RingfeedDataset

    urls, items = shards_of_photos(tmp_path, photos)
    # Three photos of the first shard truncated, one of the second a PNG
    # header on JPEG bytes: each one a corrupt image.
    import tarfile

    bad = {1: "truncated", 3: "truncated", 4: "truncated", 6: "garbage"}
    for s in (0, 1):
        path = tmp_path / f"photos-{s}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(s * 5, s * 5 + 5):
                data = items[i]
                if bad.get(i) == "truncated":
                    data = data[: len(data) // 3]
                elif bad.get(i) == "garbage":
                    data = b"\x89PNG\r\n\x1a\n" + data[8:]
                for ext, payload in (("jpg", data), ("cls", str(i).encode())):
                    info = tarfile.TarInfo(f"sample{i:04d}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
    spec = {"jpg": {"resize": 40, "center_crop": 32}, "cls": "int64"}
    # The default: the first corrupt image fails the epoch, named.
    ds = RingfeedDataset(urls, batch_size=4, transform=spec)
    with pytest.raises(ringfeed.errors.FormatError, match=r"field `jpg`.*sample `sample000[1346]`.*photos-[01]\.tar"):
        for _ in ds:
            pass
    # Skipped: the rest arrive with their pixels, the four are counted
    # and logged with shard, key and field.
    ds = RingfeedDataset(urls, batch_size=4, transform=spec, image_errors="skip")
    seen = []
    with caplog.at_level("WARNING", logger="ringfeed"):
        for images, labels in ds:
            for img, label in zip(images, labels.tolist()):
                want, _ = transform(items[label], spec, "jpg")
                assert np.array_equal(img.numpy(), want), label
                seen.append(label)
    assert sorted(seen) == [i for i in range(len(items)) if i not in bad]
    # Counted once each over an epoch (a dataset's engine runs ahead into
    # the next epoch, whose skips it counts too: one epoch's loader here).
    with ringfeed.Loader(urls, batch_size=4, transform=spec, image_errors="skip") as loader:
        assert sum(len(b) for b in loader) == len(items) - len(bad)
        assert loader.stats()["images_skipped"] == 4
    for i in bad:
        assert any(f"sample{i:04d}" in r.getMessage() and "field `jpg`" in r.getMessage()
                   and f"photos-{i // 5}.tar" in r.getMessage() for r in caplog.records), i


def test_a_training_pipeline_ports_from_torchvision(photos, tmp_path):
    torch = pytest.importorskip("torch")
    T = pytest.importorskip("torchvision.transforms")
    from ringfeed.torch import RingfeedDataset, from_torchvision

    pipeline = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(),
                          T.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])])
    spec = from_torchvision(pipeline, "jpg", "cls")
    assert spec["jpg"]["random_resized_crop"]["size"] == [32, 32]
    assert spec["jpg"]["flip"] == 0.5 and spec["jpg"]["dtype"] == "float32"
    urls, items = shards_of_photos(tmp_path, photos)
    ds = RingfeedDataset(urls, batch_size=5, transform=spec, seed=1)
    n = 0
    for images, labels in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0):
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 32, 32)
        assert -2.1 <= float(images.min()) and float(images.max()) <= 2.1
        n += len(labels)
    assert n == len(items)
    with pytest.raises(TypeError, match="keys=True"):
        RingfeedDataset(urls, batch_size=5, keys=True)
    for bad, name in ((T.ColorJitter(0.4), "ColorJitter"), (T.Resize(8, interpolation=T.InterpolationMode.NEAREST), "bilinear")):
        with pytest.raises(ValueError, match=name):
            from_torchvision(T.Compose([bad]))
