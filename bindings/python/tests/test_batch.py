import gc
import weakref

import numpy as np
import pytest
import ringfeed

from conftest import sample_bytes, synth_content, tar_keys, write_tar


def first_batch(urls, **kw):
    loader = ringfeed.Loader(urls, **kw)
    b = next(loader)
    loader.close()
    return b


def test_keys_fields_lengths(small_shards):
    b = first_batch(small_shards, batch_size=16, workers=1)
    with b:
        assert len(b) == 16
        assert b.fields == ("jpg", "cls")
        assert "jpg" in b and "png" not in b
        keys = b.keys
        assert len(keys) == 16 and all(k.count("-") == 1 for k in keys)
        jpg = b["jpg"]
        lengths = jpg.lengths
        assert lengths.dtype == np.int64 and lengths.shape == (16,)
        assert b.nbytes == int(lengths.sum() + b["cls"].lengths.sum())
        for i, k in enumerate(keys):
            mv = jpg[i]
            assert isinstance(mv, memoryview) and mv.readonly and len(mv) == lengths[i]
            assert bytes(mv) == synth_content(0, k, "jpg", len(mv))
        assert jpg.present.all()
        # Iterating and memoryviews() give the same views as indexing.
        by_index = [bytes(jpg[i]) for i in range(16)]
        assert [bytes(mv) for mv in jpg] == by_index
        assert [bytes(mv) for mv in jpg.memoryviews()] == by_index
        assert all(mv.readonly for mv in jpg.memoryviews())
        assert b.sample(0)["cls"] == b["cls"][0]
        with pytest.raises(KeyError, match="png"):
            b["png"]


def test_gather_and_offsets(small_shards):
    with first_batch(small_shards, batch_size=8) as b:
        v = b["jpg"]
        key0 = b.keys[0]
        values, offsets = v.gather()
        assert offsets[0] == 0 and offsets[-1] == len(values) and len(offsets) == 9
        for i in range(8):
            assert values[offsets[i] : offsets[i + 1]].tobytes() == bytes(v[i])
        assert not v.contiguous  # tar headers lie between members
        with pytest.raises(ValueError, match="not contiguous"):
            v.values
    # the copies outlive the batch
    assert values[: offsets[1]].tobytes() == synth_content(0, key0, "jpg", int(offsets[1]))


def test_contiguous_values_zero_copy(small_shards):
    # A batch of one sample is contiguous: values is a view of the engine's bytes.
    with first_batch(small_shards, batch_size=1) as b:
        v = b["jpg"]
        assert v.contiguous
        arr = v.values
        assert arr.ctypes.data == int(v.addresses[0])
        assert not arr.flags.writeable
        assert arr.tobytes() == bytes(v[0])
        assert list(v.offsets) == [0, len(arr)]


def test_use_after_release_raises(small_shards):
    b = first_batch(small_shards, batch_size=4)
    view = b["jpg"]
    mv = view[0]
    assert b.release() is True
    assert b.released
    for use in (lambda: b.keys, lambda: b.fields, lambda: b["jpg"], lambda: view.lengths,
                lambda: view[1], lambda: view.gather(), lambda: view.fixed(copy=True),
                lambda: view.__dlpack__()):
        with pytest.raises(ringfeed.ReleasedError):
            use()
    with pytest.raises(ValueError, match="released"):
        mv[0]
    with pytest.raises(ValueError):
        bytes(mv)
    assert b.release() is False  # idempotent


def test_exported_arrays_keep_the_batch_alive(fixed_shards):
    b = first_batch(fixed_shards, batch_size=10)
    lease = weakref.ref(b._lease)
    # Which shard comes first depends on the engine's workers: take the keys.
    key0, key1 = b.keys[0], b.keys[1]
    arr = b["vec"].fixed()
    mv = b["vec"][1]
    held = np.frombuffer(mv, np.uint8)  # a buffer export on the memoryview
    assert b.release() is False  # deferred: arr and held still read the memory
    assert lease() is not None
    assert arr[0].tobytes() == sample_bytes(key0, "vec", 1000)
    assert held.tobytes() == sample_bytes(key1, "vec", 1000)
    del arr
    gc.collect()
    assert lease() is not None
    del held, mv
    gc.collect()
    assert lease() is None  # the C release happened with the last export


def test_release_on_gc(small_shards):
    loader = ringfeed.Loader(small_shards, batch_size=4)
    b = next(loader)
    mv = b["jpg"][0]
    lease = weakref.ref(b._lease)
    del b
    gc.collect()
    assert lease() is None
    with pytest.raises(ValueError):
        bytes(mv)
    # the loader goes on: the released chunks are reusable, and every
    # sample after the first batch of 4 comes, once
    assert sum(len(x) for x in loader) == len(tar_keys(small_shards)) - 4
    loader.close()


def test_with_batch_releases(small_shards):
    with ringfeed.Loader(small_shards, batch_size=4) as loader:
        with next(loader) as b:
            assert len(b) == 4
        assert b.released


def test_fixed_zero_copy_at_constant_stride(fixed_shards):
    with first_batch(fixed_shards, batch_size=32) as b:
        v = b["vec"]
        assert v.fixed_zero_copy
        arr = v.fixed()
        assert arr.shape == (32, 1000) and arr.dtype == np.uint8
        assert arr.ctypes.data == int(v.addresses[0])
        assert arr.strides == (1536, 1)  # 512-byte header + 1000 bytes padded to 1024
        assert not arr.flags.writeable
        keys = b.keys
        for i in (0, 17, 31):
            assert arr[i].tobytes() == sample_bytes(keys[i], "vec", 1000)
        words = v.fixed(np.uint32)
        assert words.shape == (32, 250) and words.ctypes.data == arr.ctypes.data
        assert v.fixed(copy=False).ctypes.data == arr.ctypes.data
        c = v.fixed(copy=True)
        assert c.ctypes.data != arr.ctypes.data and np.array_equal(c, arr) and c.flags.writeable
        with pytest.raises(ValueError, match="whole number"):
            v.fixed("S7")  # 1000 is not a multiple of 7


def test_fixed_when_not_at_constant_stride(fixed_shards):
    # 64 KiB chunks: some batches straddle two chunks, and fixed() copies them.
    seen_copy = seen_view = 0
    with ringfeed.Loader(fixed_shards, batch_size=10, chunk_size="64KiB", workers=1) as loader:
        for b in loader:
            with b:
                v = b["vec"]
                arr = v.fixed()
                for i, k in enumerate(b.keys):
                    assert arr[i].tobytes() == sample_bytes(k, "vec", 1000)
                if v.fixed_zero_copy:
                    seen_view += 1
                else:
                    seen_copy += 1
                    assert arr.flags.writeable  # a copy
                    with pytest.raises(ValueError, match="constant stride"):
                        v.fixed(copy=False)
    assert seen_copy and seen_view


def test_fixed_refuses_ragged_fields(small_shards):
    with first_batch(small_shards, batch_size=8) as b:
        assert not b["jpg"].fixed_zero_copy
        with pytest.raises(ValueError, match="not fixed-size"):
            b["jpg"].fixed()


def test_samples_with_different_fields(tmp_path):
    members = []
    for i in range(12):
        key = f"s{i:03d}"
        members.append((f"{key}.a", sample_bytes(key, "a", 10 + i)))
        if i % 3 == 0:
            members.append((f"{key}.b", sample_bytes(key, "b", 5)))
    path = write_tar(tmp_path / "mixed.tar", members)
    with first_batch(path, batch_size=12, workers=1) as b:
        assert set(b.fields) == {"a", "b"}
        bv = b["b"]
        assert list(bv.present) == [i % 3 == 0 for i in range(12)]
        assert list(bv.lengths) == [5 if i % 3 == 0 else 0 for i in range(12)]
        assert bv[1] is None and bytes(bv[3]) == sample_bytes("s003", "b", 5)
        assert list(b["a"].lengths) == [10 + i for i in range(12)]
        with pytest.raises(ValueError, match="missing"):
            bv.fixed()
        values, offsets = bv.gather()
        assert len(values) == 20


def test_same_count_different_names(tmp_path):
    members = []
    for i in range(10):
        key = f"s{i:03d}"
        second = "bb" if i != 7 else "bc"  # same count and length, another name
        members += [(f"{key}.a", sample_bytes(key, "a", 9)), (f"{key}.{second}", sample_bytes(key, second, 4))]
    path = write_tar(tmp_path / "names.tar", members)
    with first_batch(path, batch_size=10, workers=1) as b:
        assert set(b.fields) == {"a", "bb", "bc"}
        assert list(b["bc"].present) == [i == 7 for i in range(10)]
        assert b["a"].present.all()
        assert bytes(b["bb"][0]) == sample_bytes("s000", "bb", 4)


def test_key_array_of_equal_and_unequal_keys(tmp_path):
    names = ["a", "bb", "ccc/dddd", "e", "ffffffffff", "g"]
    shard = write_tar(tmp_path / "keys.tar", [(f"{k}.txt", k.encode()) for k in names])
    with ringfeed.Loader([shard], batch_size=6) as loader:
        b = next(loader)
        keys = b.key_array()
        assert keys.tolist() == [k.encode() for k in names] and keys.dtype == np.dtype("S10")
        assert b.keys == names
    with ringfeed.Loader([shard], batch_size=1) as loader:
        assert [b.key_array().tolist() for b in loader] == [[k.encode()] for k in names]


def test_key_array_and_sources_of_generated_shards(small_shards):
    with ringfeed.Loader(small_shards, batch_size=37, workers=2) as loader:
        for b in loader:
            with b:
                assert b.key_array().astype(str).tolist() == b.keys
                # generated keys start with their shard's number
                for i, key in enumerate(b.keys):
                    assert b.source(i) == small_shards[int(key.split("-")[0])]
                with pytest.raises(IndexError):
                    b.source(len(b))
        with pytest.raises(ringfeed.ReleasedError):
            b.source(0)


def test_gather_of_fields_some_samples_lack(tmp_path):
    members = []
    for i in range(8):
        members.append((f"k{i}.txt", f"t{i}".encode()))
        if i % 2:
            members.append((f"k{i}.bin", bytes([i]) * 100))
    shard = write_tar(tmp_path / "some.tar", members)
    with ringfeed.Loader([shard], batch_size=8) as loader:
        b = next(loader)
        values, offsets = b["bin"].gather()
        assert offsets.tolist() == [0, 0, 100, 100, 200, 200, 300, 300, 400]
        assert bytes(values) == b"".join(bytes([i]) * 100 for i in (1, 3, 5, 7))
        # Absent where the sample lacks the field, its bytes where it has it,
        # by index, by iteration and by memoryviews() alike.
        want = [bytes([i]) * 100 if i % 2 else None for i in range(8)]
        for got in ([b["bin"][i] for i in range(8)], list(b["bin"]), b["bin"].memoryviews()):
            assert [None if mv is None else bytes(mv) for mv in got] == want
        views = b["bin"].memoryviews()
        b.release()
        # Released with the batch, like the views taken by index.
        with pytest.raises(ValueError, match="released"):
            bytes(views[1])
