"""Whole objects through the Python API (ringfeed.objects), on the S3 test
server and on local files: round trips at the sizes around a part, the
views over library memory without a copy, file-likes for torch.save and
torch.load, and the ways it fails (missing bucket, existing object, bad
types and keys, use after close)."""

import hashlib
import io
import itertools
import sys
import time

import numpy as np
import pytest
import ringfeed

from conftest import require, skip_for_environment

PART = 5 << 20
SIZES = [0, 1, PART - 1, PART, PART + 1, 3 * PART + 7]
_names = itertools.count()


def pattern(n, seed=0):
    """`n` bytes checkable at any offset."""
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.fixture(params=["s3", "local"])
def store(request, tmp_path):
    """``(new_url, config)``: a function giving a fresh object URL, and the
    keywords for it, on the S3 server or in a local folder."""
    if request.param == "s3":
        server = request.getfixturevalue("s3_server")
        config = dict(server.config(), part_size="5MiB")
        return (lambda: f"s3://{server.bucket}/objects/{next(_names)}.bin"), config
    return (lambda: str(tmp_path / f"{next(_names)}.bin")), {"part_size": "5MiB"}


@pytest.mark.parametrize("size", SIZES)
def test_write_object_then_read_object_round_trips(store, size):
    new_url, config = store
    url, data = new_url(), pattern(size, size)
    assert ringfeed.write_object(url, data, **config) == size
    with ringfeed.read_object(url, **config) as buf:
        assert len(buf) == size and buf.url == url
        assert bytes(buf) == data
    assert ringfeed.list_objects(url, **config) == [(url, size)]


@pytest.mark.parametrize("size", SIZES)
def test_object_writer_in_uneven_pieces_round_trips(store, size):
    new_url, config = store
    url, data = new_url(), pattern(size, size + 1)
    with ringfeed.ObjectWriter(url, **config) as f:
        pos = 0
        for step in itertools.cycle([1, 4096, PART // 3 + 5, 0, PART + 11]):
            if pos >= size:
                break
            assert f.write(memoryview(data)[pos : pos + step]) == len(data[pos : pos + step])
            pos += step
            assert f.tell() == min(pos, size)
    out = bytearray(size + 10)
    assert ringfeed.read_object_into(url, out, **config) == size
    assert bytes(out[:size]) == data


def test_a_gigabyte_round_trips_through_s3(s3_server, capsys):
    config = dict(s3_server.config(), part_size="16MiB")
    url = f"s3://{s3_server.bucket}/big/1GB.bin"
    data = np.random.default_rng(7).integers(0, 256, 1 << 30, dtype=np.uint8)
    want = hashlib.sha256(data).hexdigest()
    t0 = time.perf_counter()
    ringfeed.write_object(url, data, **config)
    t1 = time.perf_counter()
    with ringfeed.read_object(url, **config) as buf:
        t2 = time.perf_counter()
        got = hashlib.sha256(buf.memoryview()).hexdigest()
    (s3_server.root / s3_server.bucket / "big" / "1GB.bin").unlink()
    assert got == want
    with capsys.disabled():
        print(f"\n1 GiB through S3: write {t1 - t0:.1f} s ({1 / (t1 - t0):.2f} GiB/s), "
              f"read {t2 - t1:.1f} s ({1 / (t2 - t1):.2f} GiB/s)")


def test_views_share_the_library_memory(tmp_path):
    url = str(tmp_path / "views.bin")
    ringfeed.write_object(url, b"0123456789")
    torch = require("torch", "the DLPack view of an ObjectBuffer")
    with ringfeed.read_object(url) as buf:
        a = buf.numpy()
        mv = buf.memoryview()
        t = torch.from_dlpack(buf)
        n = np.from_dlpack(buf)
        addr = buf.address
        assert a.ctypes.data == addr and n.ctypes.data == addr and t.data_ptr() == addr
        assert np.frombuffer(mv, np.uint8).ctypes.data == addr
        assert not a.flags.writeable and mv.readonly
        assert t.dtype == torch.uint8 and t.shape == (10,) and buf.__dlpack_device__() == (1, 0)
    # Closed, the buffer refuses; the views made before still read.
    assert bytes(a) == bytes(mv) == bytes(t.numpy()) == bytes(n) == b"0123456789"


def test_memoryview_of_the_buffer_itself(tmp_path):
    if sys.version_info < (3, 12):
        skip_for_environment("memoryview(obj) of a Python class needs PEP 688 (Python 3.12); "
                             "ObjectBuffer.memoryview() is tested instead")
    url = str(tmp_path / "mv.bin")
    ringfeed.write_object(url, b"abc")
    buf = ringfeed.read_object(url)
    mv = memoryview(buf)
    assert np.frombuffer(mv, np.uint8).ctypes.data == buf.address and bytes(mv) == b"abc"


def test_a_closed_buffer_raises_released_error(tmp_path):
    url = str(tmp_path / "closed.bin")
    ringfeed.write_object(url, b"xyz")
    buf = ringfeed.read_object(url)
    buf.close()
    buf.close()
    assert buf.closed and "closed" in repr(buf)
    for use in (len, bytes, lambda b: b.numpy(), lambda b: b.memoryview(), lambda b: b.__dlpack__()):
        with pytest.raises(ringfeed.ReleasedError, match="closed"):
            use(buf)


def test_read_object_into_a_small_buffer_names_the_size(store):
    new_url, config = store
    url = new_url()
    ringfeed.write_object(url, b"x" * 100, **config)
    with pytest.raises(ringfeed.BufferTooSmallError) as e:
        ringfeed.read_object_into(url, bytearray(99), **config)
    assert e.value.size == 100
    arr = np.zeros(100, np.uint8)
    assert ringfeed.read_object_into(url, arr, **config) == 100 and arr.tobytes() == b"x" * 100


def test_list_and_read_objects_of_a_prefix(store):
    new_url, config = store
    urls = [new_url() for _ in range(3)]
    for i, u in enumerate(urls):
        ringfeed.write_object(u, bytes([i]) * (i + 1), **config)
    prefix = urls[0].rsplit("/", 1)[0] + "/"
    listed = dict(ringfeed.list_objects(prefix, **config))
    assert all(listed[u] == i + 1 for i, u in enumerate(urls))
    by_list = ringfeed.read_objects(urls, **config)
    assert list(by_list) == urls
    assert [bytes(b) for b in by_list.values()] == [bytes([i]) * (i + 1) for i in range(3)]
    by_prefix = ringfeed.read_objects(prefix, **config)
    assert set(urls) <= set(by_prefix) and bytes(by_prefix[urls[2]]) == b"\2\2\2"
    with pytest.raises(ringfeed.DatasetError, match="names"):
        ringfeed.read_object(prefix, **config)


def test_torch_save_and_load_through_object_files(store):
    torch = require("torch", "torch.save / torch.load through ringfeed object files")
    new_url, config = store
    url = new_url()
    state = {"w": torch.randn(64, 32), "b": torch.arange(7), "step": 3, "big": torch.randn(2 << 20)}
    with ringfeed.open_object(url, "wb", **config) as f:
        torch.save(state, f)
    with ringfeed.open_object(url, **config) as f:
        got = torch.load(f)
    assert got.keys() == state.keys() and got["step"] == 3
    assert all(torch.equal(got[k], state[k]) for k in ("w", "b", "big"))


def test_object_reader_reads_seeks_and_tells(tmp_path):
    url = str(tmp_path / "reader.bin")
    data = pattern(1000)
    ringfeed.write_object(url, data)
    f = ringfeed.open_object(url)
    assert f.readable() and f.seekable() and not f.writable()
    assert f.read(10) == data[:10] and f.tell() == 10
    assert f.seek(-5, io.SEEK_END) == 995 and f.read() == data[995:]
    assert f.read(3) == b"" and f.seek(2000) == 2000 and f.read() == b""
    f.seek(100)
    out = bytearray(50)
    assert f.readinto(out) == 50 and bytes(out) == data[100:150]
    assert io.BufferedReader(ringfeed.open_object(url)).read() == data
    with pytest.raises(ValueError):
        f.seek(-1)
    f.close()
    assert f.buffer.closed
    with pytest.raises(ValueError):
        f.read()


def test_an_existing_object_is_refused_unless_overwrite(store):
    new_url, config = store
    url = new_url()
    ringfeed.write_object(url, b"first", **config)
    with pytest.raises(ringfeed.ObjectExistsError):
        ringfeed.write_object(url, b"second", **config)
    # A writer is refused at open, before it sends anything.
    with pytest.raises(FileExistsError):
        ringfeed.ObjectWriter(url, **config)
    assert bytes(ringfeed.read_object(url, **config)) == b"first"
    ringfeed.write_object(url, b"second", overwrite=True, **config)
    with ringfeed.open_object(url, "wb", overwrite=True, **config) as f:
        f.write(b"third")
    assert bytes(ringfeed.read_object(url, **config)) == b"third"


def test_a_missing_bucket_is_named(s3_server):
    config = s3_server.config()
    with pytest.raises(ringfeed.Error, match="NoSuchBucket"):
        ringfeed.write_object("s3://no-such-bucket/k", b"data", **config)
    with pytest.raises(ringfeed.Error, match="NoSuchBucket"):
        with ringfeed.ObjectWriter("s3://no-such-bucket/k", **config) as f:
            f.write(b"data")
    with pytest.raises(ringfeed.Error, match="NoSuchBucket"):
        ringfeed.read_object("s3://no-such-bucket/k", **config)


def test_aborted_and_dropped_writers_leave_nothing(store):
    new_url, config = store
    aborted, raised, dropped = new_url(), new_url(), new_url()
    f = ringfeed.ObjectWriter(aborted, **config)
    f.write(pattern(PART + 1))
    f.abort()
    f.abort()
    with pytest.raises(RuntimeError, match="boom"):
        with ringfeed.ObjectWriter(raised, **config) as f:
            f.write(b"partial")
            raise RuntimeError("boom")
    f = ringfeed.ObjectWriter(dropped, **config)
    f.write(b"never committed")
    del f
    for url in (aborted, raised, dropped):
        with pytest.raises(ringfeed.DatasetError):
            ringfeed.read_object(url, **config)


def test_a_closed_writer_refuses_writes(tmp_path):
    url = str(tmp_path / "w.bin")
    f = ringfeed.open_object(url, "wb")
    assert f.writable() and not f.readable()
    f.write(b"abc")
    f.close()
    f.close()
    assert bytes(ringfeed.read_object(url)) == b"abc"
    with pytest.raises(ringfeed.ClosedError):
        f.write(b"more")
    with pytest.raises(ValueError):
        f.tell()


def test_bad_arguments_raise_named_errors(tmp_path):
    url = str(tmp_path / "bad.bin")
    ringfeed.write_object(url, b"abc")
    with pytest.raises(TypeError, match="url"):
        ringfeed.read_object(42)
    with pytest.raises(TypeError, match="bytes-like"):
        ringfeed.write_object(str(tmp_path / "x"), "text is not bytes")
    with pytest.raises(TypeError, match="writable"):
        ringfeed.read_object_into(url, b"read-only")
    with pytest.raises(TypeError, match="not a JSON value"):
        ringfeed.read_object(url, part_size=object())
    with pytest.raises(TypeError, match="urls"):
        ringfeed.read_object(url, urls=[url])
    with pytest.raises(ringfeed.ConfigError, match="partsize"):
        ringfeed.read_object(url, partsize="5MiB")
    with pytest.raises(ringfeed.ConfigError, match="checksum"):
        ringfeed.write_object(str(tmp_path / "y"), b"", checksum="sha1")
    with pytest.raises(ringfeed.ConfigError, match="part_size"):
        ringfeed.ObjectWriter(str(tmp_path / "z"), part_size="lots")
    with pytest.raises(ValueError, match="mode"):
        ringfeed.open_object(url, "r+b")
    with pytest.raises(TypeError):
        ringfeed.read_objects(42)
