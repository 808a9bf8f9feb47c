"""load_safetensors: files written by hand to the format's spec and by the
safetensors package load equal, as views of the object's memory; every
kind of malformed header is a SafetensorsError, never a crash."""

import json
import struct

import numpy as np
import pytest
import ringfeed
from ringfeed._safetensors import parse_header

from conftest import require

NUMPY_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32,
                "I16": np.int16, "I8": np.int8, "U8": np.uint8, "U16": np.uint16, "BOOL": np.bool_}


def safetensors_bytes(arrays, metadata=None, pad=True):
    """A safetensors file by the spec: {name: (dtype name, numpy array)}."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, a) in arrays.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def sample_arrays():
    rng = np.random.default_rng(3)
    out = {name: (name, (rng.standard_normal((3, 5)) * 100).astype(t)) for name, t in NUMPY_DTYPES.items()}
    out["BOOL"] = ("BOOL", rng.integers(0, 2, (4, 2)).astype(bool))
    out["scalar"] = ("F32", np.array(2.5, np.float32))
    out["empty"] = ("I64", np.zeros((0, 3), np.int64))
    out["odd"] = ("U8", np.arange(7, dtype=np.uint8))  # leaves the next tensor unaligned
    out["after_odd"] = ("F64", np.arange(3, dtype=np.float64))
    return out


def test_hand_written_file_loads_equal_with_numpy_and_torch(tmp_path):
    torch = require("torch", "safetensors into torch tensors")
    arrays = sample_arrays()
    url = str(tmp_path / "model.safetensors")
    ringfeed.write_object(url, safetensors_bytes(arrays, {"format": "pt"}))
    got, meta = ringfeed.load_safetensors(url, framework="numpy", metadata=True)
    assert meta == {"format": "pt"} and got.keys() == arrays.keys()
    for name, (_, a) in arrays.items():
        assert got[name].dtype == a.dtype and np.array_equal(got[name], a), name
    tensors = ringfeed.load_safetensors(url)
    for name, (_, a) in arrays.items():
        assert np.array_equal(tensors[name].numpy(), a), name


def test_tensors_view_the_buffer_without_a_copy(tmp_path):
    torch = require("torch", "safetensors into torch tensors")
    arrays = sample_arrays()
    url = str(tmp_path / "view.safetensors")
    ringfeed.write_object(url, safetensors_bytes(arrays))
    buf = ringfeed.read_object(url)
    lo, hi = buf.address, buf.address + len(buf)
    tensors = ringfeed.load_safetensors(buf)
    arrays_np = ringfeed.load_safetensors(buf, framework="numpy")
    for name, t in tensors.items():
        if t.numel():
            assert lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= hi, name
            assert lo <= arrays_np[name].ctypes.data < hi, name
    buf.close()
    del buf
    # The tensors keep the object's memory.
    assert torch.equal(tensors["F32"], torch.from_numpy(arrays["F32"][1]))


def test_files_of_the_safetensors_package_load_equal(s3_server):
    torch = require("torch", "safetensors into torch tensors")
    st = require("safetensors.torch", "comparison with files the safetensors package writes")
    config = s3_server.config()
    state = {
        "embed": torch.randn(100, 16),
        "half": torch.randn(8, 8).half(),
        "bf16": torch.randn(5, 3).to(torch.bfloat16),
        "ids": torch.arange(-50, 50, dtype=torch.int64),
        "mask": torch.rand(9) > 0.5,
        "bytes": torch.arange(256, dtype=torch.uint8),
        "scalar": torch.tensor(1.5),
    }
    url = f"s3://{s3_server.bucket}/st/model.safetensors"
    ringfeed.write_object(url, st.save(state, metadata={"step": "7"}), overwrite=True, **config)
    got, meta = ringfeed.load_safetensors(url, metadata=True, **config)
    assert meta == {"step": "7"} and got.keys() == state.keys()
    for name, t in state.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    with pytest.raises(ringfeed.SafetensorsError, match="BF16"):
        ringfeed.load_safetensors(url, framework="numpy", **config)


def _header(obj, data=b"", n=None):
    text = json.dumps(obj).encode() if not isinstance(obj, bytes) else obj
    return struct.pack("<Q", len(text) if n is None else n) + text + data


GOOD = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
BAD_FILES = {
    "short": b"\x01\x00",
    "length over the limit": struct.pack("<Q", 1 << 40) + b"{}",
    "length past the end": _header({}, n=100),
    "not JSON": _header(b"{not json"),
    "not UTF-8": _header(b'{"\xff": 1}'),
    "a JSON list": _header([1, 2]),
    "entry not an object": _header({"t": 3}),
    "unknown dtype": _header({"t": dict(GOOD, dtype="F128")}, bytes(8)),
    "negative shape": _header({"t": dict(GOOD, shape=[-2])}, bytes(8)),
    "float shape": _header({"t": dict(GOOD, shape=[2.0])}, bytes(8)),
    "offsets past the data": _header({"t": dict(GOOD, data_offsets=[0, 8])}, bytes(4)),
    "offsets reversed": _header({"t": dict(GOOD, data_offsets=[8, 0])}, bytes(8)),
    "offsets negative": _header({"t": dict(GOOD, data_offsets=[-8, 0])}, bytes(8)),
    "one offset": _header({"t": dict(GOOD, data_offsets=[8])}, bytes(8)),
    "size not the shape's": _header({"t": dict(GOOD, shape=[3])}, bytes(12)),
    "metadata not str": _header({"__metadata__": {"a": 1}}),
    "no dtype": _header({"t": {"shape": [2], "data_offsets": [0, 8]}}, bytes(8)),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_malformed_headers_raise_safetensors_error(name):
    with pytest.raises(ringfeed.SafetensorsError) as e:
        parse_header(BAD_FILES[name])
    assert isinstance(e.value, ValueError) and isinstance(e.value, ringfeed.FormatError)


def test_a_malformed_file_raises_through_load(tmp_path):
    url = str(tmp_path / "bad.safetensors")
    ringfeed.write_object(url, BAD_FILES["offsets past the data"])
    with pytest.raises(ringfeed.SafetensorsError, match="data_offsets"):
        ringfeed.load_safetensors(url, framework="numpy")
    with pytest.raises(ValueError, match="framework"):
        ringfeed.load_safetensors(url, framework="jax")
    with pytest.raises(TypeError):
        ringfeed.load_safetensors(3.5)


def test_an_empty_file_has_no_tensors(tmp_path):
    url = str(tmp_path / "empty.safetensors")
    ringfeed.write_object(url, _header({}))
    assert ringfeed.load_safetensors(url, framework="numpy") == {}
