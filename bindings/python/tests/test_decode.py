"""Decoding as WebDataset users expect: fields by extension (real JPEG and PNG
images made here, JSON, class labels, .npy, text), to_tuple / map /
map_tuple / collate / map_batch through a DataLoader with workers, and
errors that name the shard, key and field."""

import io
import json

import numpy as np
import pytest

from conftest import require  # noqa: E402

torch = require("torch", "the decoding tests")
PIL = require("PIL.Image", "the decoding tests")

import ringfeed  # noqa: E402
from ringfeed.decode import DecodeError, Decoder  # noqa: E402
from ringfeed.torch import RingfeedDataset  # noqa: E402

from conftest import image_shards, make_image  # noqa: E402

SIZE = (32, 24)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return image_shards(tmp_path_factory.mktemp("images"), shards=3, per_shard=20, size=SIZE)


def close_to(img, i):
    """JPEG is lossy: the decoded picture is near the one encoded (PNG exact)."""
    want = make_image(i, SIZE).astype(int)
    diff = np.abs(np.asarray(img).astype(int) - want)
    return diff.max() == 0 if i % 3 == 0 else diff.mean() < 4


@pytest.mark.parametrize("workers", [0, 2])
def test_decoded_tuples_through_a_dataloader(images, workers):
    paths, index = images
    ds = (
        RingfeedDataset(paths, batch_size=8, remainder="drop")
        .decode("torchrgb8")
        .to_tuple("jpg;png", "cls", "__key__")
    )
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, timeout=60 if workers else 0)
    seen = 0
    for imgs, labels, keys in dl:
        assert imgs.dtype == torch.uint8 and imgs.shape[1:] == (3, SIZE[1], SIZE[0])
        assert labels.dtype == torch.int64 and len(labels) == len(imgs) == len(keys)
        for img, label, key in zip(imgs, labels.tolist(), keys):
            i = index[key]
            assert label == i % 10
            assert close_to(img.permute(1, 2, 0).numpy(), i), key
            seen += 1
    assert len(index) - seen < 2 * (1 if workers == 0 else workers)


def test_every_builtin_decoder(images):
    paths, index = images
    ds = RingfeedDataset(paths, batch_size=60).decode("rgb8").collate(list)
    (samples,) = list(ds)
    assert len(samples) == 60
    for s in samples:
        i = index[s["__key__"]]
        assert s["__url__"] == paths[i // 20]
        img = s["png"] if i % 3 == 0 else s["jpg"]
        assert isinstance(img, np.ndarray) and img.dtype == np.uint8 and close_to(img, i)
        assert s["cls"] == i % 10
        assert s["json"] == {"i": i}
        assert s["npy"].tolist() == list(range(i % 5)) and s["npy"].dtype == np.int16
        assert s["txt"] == f"sample {i}"


@pytest.mark.parametrize(
    "spec, check",
    [
        ("pil", lambda v: isinstance(v, PIL.Image) and v.size == SIZE),
        ("pill", lambda v: v.mode == "L"),
        ("l8", lambda v: v.shape == (SIZE[1], SIZE[0]) and v.dtype == np.uint8),
        ("rgba8", lambda v: v.shape == (SIZE[1], SIZE[0], 4)),
        ("rgb", lambda v: v.dtype == np.float32 and 0 <= v.min() and v.max() <= 1),
        ("torchl8", lambda v: tuple(v.shape) == (1, SIZE[1], SIZE[0])),
        ("torch", lambda v: v.dtype == torch.float32 and tuple(v.shape) == (3, SIZE[1], SIZE[0])),
        ("torchvision", lambda v: v.dtype == torch.uint8 and tuple(v.shape) == (3, SIZE[1], SIZE[0])),
    ],
)
def test_image_specs(images, spec, check):
    paths, _ = images
    sample = next(iter(RingfeedDataset(paths, batch_size=4).decode(spec).collate(list)))[1]
    assert check(sample["jpg"])


def test_map_map_tuple_map_batch_and_only(images):
    paths, index = images
    ds = (
        RingfeedDataset(paths, batch_size=10, remainder="drop")
        .decode("torchrgb8", only=["jpg", "png"])
        .map(lambda s: {**s, "cls": int(s["cls"]) + 100})
        .to_tuple("jpg;png", "cls", "json")
        .map_tuple(lambda img: img.float().mean(), None, lambda j: json.loads(j)["i"])
        .map_batch(lambda b: {"mean": b[0], "label": b[1], "i": b[2]})
    )
    for item in ds:
        assert item["mean"].dtype == torch.float32
        assert (item["label"] - 100 == item["i"] % 10).all()


def test_custom_handlers_come_first():
    seen = []

    def shout(name, data):
        seen.append(name)
        return bytes(data).upper() if name == "txt" else None

    d = Decoder(shout)
    out = d({"__key__": "k", "txt": memoryview(b"abc"), "cls": b"7", "bin": b"\x00"})
    assert out == {"__key__": "k", "txt": b"ABC", "cls": 7, "bin": b"\x00"}
    assert seen == ["txt", "cls", "bin"]


def test_pickles_stay_bytes_unless_asked():
    import pickle

    d = Decoder()
    data = pickle.dumps({"x": 1})
    assert d({"a.pyd": data}) == {"a.pyd": data}
    unpickle = Decoder(lambda name, v: pickle.loads(v) if name.endswith("pyd") else None)
    assert unpickle({"a.pyd": data}) == {"a.pyd": {"x": 1}}


def test_bad_specs_are_refused(images):
    paths, _ = images
    with pytest.raises(ValueError, match="unknown image spec 'jpeg2000'"):
        RingfeedDataset(paths).decode("jpeg2000")
    with pytest.raises(TypeError, match="callable"):
        RingfeedDataset(paths).decode(42)
    with pytest.raises(ValueError, match="map_batch"):
        RingfeedDataset(paths, transform=lambda b: b).decode("pil")
    with pytest.raises(ValueError, match="at least one"):
        RingfeedDataset(paths).to_tuple()


@pytest.fixture(scope="module")
def corrupt(tmp_path_factory):
    return image_shards(tmp_path_factory.mktemp("corrupt"), shards=2, per_shard=10, size=SIZE, corrupt=14)


def test_a_corrupt_image_names_its_shard_key_and_field(corrupt):
    paths, _ = corrupt
    ds = RingfeedDataset(paths, batch_size=5).decode("torchrgb8").collate(list)
    with pytest.raises(DecodeError) as e:
        list(ds)
    assert (e.value.shard, e.value.key, e.value.field) == (paths[1], "img01/00014", "jpg")
    assert paths[1] in str(e.value) and "img01/00014" in str(e.value) and "'jpg'" in str(e.value)
    assert isinstance(e.value.__cause__, OSError), "Pillow's error is the cause"


def test_a_corrupt_image_in_a_worker_reaches_the_main_process(corrupt):
    paths, _ = corrupt
    ds = RingfeedDataset(paths, batch_size=5).decode("torchrgb8").to_tuple("jpg;png", "cls")
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, timeout=60)
    with pytest.raises(DecodeError, match=r"img01/00014.*'jpg'"):
        list(dl)


def test_failing_map_and_missing_fields_name_the_sample(images):
    paths, _ = images
    with pytest.raises(DecodeError, match=r"sample 'img00/00000': .* failed: ZeroDivisionError") as e:
        list(RingfeedDataset(paths, batch_size=4).map(lambda s: 1 / 0))
    assert e.value.shard == paths[0] and e.value.field is None
    with pytest.raises(DecodeError, match=r"no field 'seg' \(fields: png, cls, json, npy, txt\)"):
        list(RingfeedDataset(paths, batch_size=4).decode().to_tuple("seg"))


@pytest.mark.parametrize(
    "field, data, cause",
    [
        ("json", b"{not json", "JSONDecodeError"),
        ("cls", b"seven", "ValueError"),
        ("txt", b"\xff\xfe", "UnicodeDecodeError"),
        ("npy", b"\x93NUMPY garbage", "ValueError"),
        ("png", b"\x89PNG\r\n\x1a\n", "UnidentifiedImageError"),
    ],
)
def test_garbage_fields_name_the_sample_and_field(tmp_path, field, data, cause):
    from conftest import write_tar

    shard = write_tar(tmp_path / "bad.tar", [("a.txt", b"fine"), (f"b.{field}", data)])
    with pytest.raises(DecodeError, match=rf"bad\.tar: sample 'b', field '{field}': {cause}") as e:
        list(RingfeedDataset([shard], batch_size=2).decode("rgb8").collate(list))
    assert (e.value.shard, e.value.key, e.value.field) == (shard, "b", field)


def test_undecoded_fields_are_bytes_that_outlive_the_batch(images):
    paths, index = images
    (samples,) = list(RingfeedDataset(paths, batch_size=60).map(lambda s: s).collate(list))
    for s in samples:
        assert isinstance(s["txt"], bytes) and s["txt"] == f"sample {index[s['__key__']]}".encode()
        img = s.get("jpg", s.get("png"))
        assert isinstance(img, bytes) and PIL.open(io.BytesIO(img)).size == SIZE


def test_decode_error_is_exported():
    assert ringfeed.DecodeError is DecodeError and issubclass(DecodeError, ValueError)
