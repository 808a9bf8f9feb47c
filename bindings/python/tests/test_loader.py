import gc
import os
import pickle
import tarfile
import threading
import time
import weakref

import numpy as np
import pytest
import ringfeed

from conftest import all_samples, gen, sample_bytes, synth_content, tar_keys, write_tar


def test_every_sample_once_with_the_generators_bytes(small_shards):
    with ringfeed.Loader(small_shards, batch_size=16, workers=2) as loader:
        got = all_samples(loader)
        stats = loader.stats()
    assert stats["samples_delivered"] == len(got) == len(tar_keys(small_shards))
    assert set(got) == tar_keys(small_shards)
    for key, fields in got.items():
        assert set(fields) == {"jpg", "cls"}
        for name, data in fields.items():
            assert data == synth_content(0, key, name, len(data)), (key, name)


def test_batch_sizes_and_drop_last(small_shards):
    with ringfeed.Loader(small_shards, batch_size=50, drop_last=True) as loader:
        sizes = [len(b) for b in loader]
    assert sizes and all(s == 50 for s in sizes)


def test_brace_pattern_and_path_objects(small_shards):
    from pathlib import Path

    d = Path(small_shards[0]).parent
    with ringfeed.Loader(str(d / "shard-{000000..000001}.tar"), batch_size=8) as a:
        n1 = sum(len(b) for b in a)
    with ringfeed.Loader([Path(p) for p in small_shards], batch_size=8) as b:
        n2 = sum(len(x) for x in b)
    with ringfeed.Loader(d, batch_size=8) as c:
        n3 = sum(len(x) for x in c)
    assert n1 == n2 == n3 == len(tar_keys(small_shards))


def test_epochs_and_iter_epoch(small_shards):
    with ringfeed.Loader(small_shards, batch_size=32, epochs=2) as loader:
        first = [(b.epoch, len(b)) for b in loader.iter_epoch()]
        second = [(b.epoch, len(b)) for b in loader.iter_epoch()]
        third = list(loader.iter_epoch())
    assert {e for e, _ in first} == {0} and {e for e, _ in second} == {1}
    assert sum(n for _, n in first) == sum(n for _, n in second)
    assert third == []
    with ringfeed.Loader(small_shards, batch_size=32, epochs=2) as loader:
        epochs = {b.epoch for b in loader}
    assert epochs == {0, 1}


def test_stats_is_a_dict(small_shards):
    with ringfeed.Loader(small_shards, batch_size=8) as loader:
        first = next(iter(loader))
        n = len(first)
        first.release()
        s = loader.stats()
    assert isinstance(s, dict)
    for k in ("bytes_delivered", "samples_delivered", "io_backend", "memory_kind", "workers"):
        assert k in s
    # Batches ready ahead are not delivered until asked for.
    assert (n, s["batches_delivered"], s["samples_delivered"]) == (8, 1, 8)


def test_version():
    assert ringfeed.__version__ == ringfeed.library_version()
    assert ringfeed.__version__.count(".") == 2


# -- close, threads ---------------------------------------------------------


def test_close_is_idempotent_and_with_closes(small_shards):
    with ringfeed.Loader(small_shards, batch_size=8) as loader:
        pass
    assert loader.closed
    loader.close()
    loader.close()
    with pytest.raises(ringfeed.ClosedError):
        next(loader)
    with pytest.raises(ringfeed.ClosedError):
        loader.stats()


def test_batches_stay_valid_after_close(small_shards):
    loader = ringfeed.Loader(small_shards, batch_size=8)
    b = next(loader)
    loader.close()
    key = b.keys[0]
    data = bytes(b["jpg"][0])
    assert data == synth_content(0, key, "jpg", len(data))
    assert b.release() is True


def test_close_while_another_thread_iterates(small_shards):
    # The engine waits for a consumer: a budget of few chunks and no release
    # keeps the iterating thread blocked in next() when close() comes.
    loader = ringfeed.Loader(small_shards, batch_size=4, prefetch_batches=1)
    errors, seen, started = [], [], threading.Event()

    def consume():
        try:
            for b in loader:
                seen.append(len(b))
                started.set()
                b.release()
                time.sleep(0.01)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
        finally:
            started.set()

    t = threading.Thread(target=consume)
    t.start()
    assert started.wait(10)
    loader.close()
    t.join(10)
    assert not t.is_alive()
    assert seen
    # Either the stream had ended, or the waiter got ClosedError.
    assert all(isinstance(e, ringfeed.ClosedError) for e in errors), errors


def test_close_wakes_a_blocked_waiter(small_shards):
    # Holding every batch uses up a 4-chunk budget: the engine stops, and a
    # thread calling next() blocks in the engine until close() wakes it.
    loader = ringfeed.Loader(small_shards, batch_size=4, chunk_size="64KiB", memory_budget="256KiB",
                             workers=1, prefetch_batches=1)
    held = []
    while True:
        b = loader.next_batch(timeout=1.0)
        if b is None:
            break
        held.append(b)
    assert held and sum(len(b) for b in held) < 100  # stalled, not at the end
    out = []

    def consume():
        try:
            next(loader)
        except BaseException as e:  # noqa: BLE001
            out.append(e)

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.3)
    assert t.is_alive()  # blocked in the engine
    loader.close()
    t.join(10)
    assert not t.is_alive()
    assert len(out) == 1 and isinstance(out[0], ringfeed.ClosedError), out
    for b in held:  # still valid after close
        assert len(b.keys) == 4
        b.release()


def test_loader_is_not_picklable(small_shards):
    with ringfeed.Loader(small_shards, batch_size=8) as loader:
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(loader)


def test_loader_closed_on_gc(small_shards):
    loader = ringfeed.Loader(small_shards, batch_size=8)
    r = weakref.ref(loader)
    del loader
    gc.collect()
    assert r() is None


# -- bad arguments and errors ----------------------------------------------


def test_unknown_keyword_is_a_type_error_naming_it(small_shards):
    with pytest.raises(TypeError, match="batch_sise"):
        ringfeed.Loader(small_shards, batch_sise=3)


def test_bad_values_are_value_errors_naming_the_key(small_shards):
    with pytest.raises(ValueError, match="chunk_size") as e:
        ringfeed.Loader(small_shards, chunk_size=1000)
    assert isinstance(e.value, ringfeed.ConfigError)
    assert e.value.status == -3 and e.value.status_name == "RINGFEED_ERR_CONFIG"
    with pytest.raises(ValueError, match="io_backend"):
        ringfeed.Loader(small_shards, io_backend="carrier-pigeon")
    with pytest.raises(ValueError, match="memory_budget"):
        ringfeed.Loader(small_shards, memory_budget="12 parsecs")
    with pytest.raises(ValueError, match="batch_size"):
        ringfeed.Loader(small_shards, batch_size=0)


def test_bad_types(small_shards):
    with pytest.raises(TypeError, match="urls"):
        ringfeed.Loader(42)
    with pytest.raises(TypeError, match="urls"):
        ringfeed.Loader([small_shards[0], 3])
    with pytest.raises(TypeError, match="batch_size"):
        ringfeed.Loader(small_shards, batch_size="8")
    with pytest.raises(TypeError, match="workers"):
        ringfeed.Loader(small_shards, workers=object())


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope-000.tar"
    with pytest.raises(ringfeed.DatasetError, match="nope-000.tar") as e:
        ringfeed.Loader(str(missing), batch_size=4)
    assert e.value.status_name == "RINGFEED_ERR_DATASET"
    with pytest.raises(ringfeed.DatasetError):
        ringfeed.Loader("gopher://bucket/x.tar")


def test_corrupt_shard_raises_format_error_after_good_batches(tmp_path):
    good = [(f"k{i:04d}.bin", sample_bytes(f"k{i:04d}", "bin", 3000)) for i in range(50)]
    path = write_tar(tmp_path / "bad.tar", good)
    raw = bytearray(open(path, "rb").read())
    # Break the header checksum of member 40 (each member: 512 header + 3072 data).
    off = 40 * (512 + 3072)
    raw[off + 148 : off + 156] = b"9999999\0"
    open(path, "wb").write(bytes(raw))
    seen = 0
    with ringfeed.Loader(path, batch_size=5, workers=1) as loader:
        with pytest.raises(ringfeed.FormatError, match="bad.tar") as e:
            for b in loader:
                seen += len(b)
                b.release()
    assert 35 <= seen <= 40  # every complete batch before the bad header
    assert "offset" in str(e.value) or str(off) in str(e.value)


def test_truncated_and_garbage_shards(tmp_path):
    p = tmp_path / "garbage.tar"
    p.write_bytes(os.urandom(5000))
    with ringfeed.Loader(str(p), batch_size=4) as loader:
        with pytest.raises(ringfeed.FormatError):
            list(loader)


# -- tar flavours written by Python's tarfile ---------------------------------


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_pax_and_gnu_long_names(tmp_path, fmt):
    long_dir = "d" * 120 + "/sub"
    members = []
    for i in range(20):
        key = f"{long_dir}/sample-{i:03d}-ünï"
        members.append((f"{key}.txt", sample_bytes(key, "txt", 100 + i)))
        members.append((f"{key}.seg.png", sample_bytes(key, "seg.png", 7)))
    path = write_tar(tmp_path / "long.tar", members, fmt=fmt)
    with ringfeed.Loader(path, batch_size=6) as loader:
        got = all_samples(loader)
    assert len(got) == 20
    for i in range(20):
        key = f"{long_dir}/sample-{i:03d}-ünï"
        assert got[key]["txt"] == sample_bytes(key, "txt", 100 + i)
        assert got[key]["seg.png"] == sample_bytes(key, "seg.png", 7)


def test_a_stall_on_held_batches_warns(small_shards, monkeypatch):
    from ringfeed import _loader

    monkeypatch.setattr(_loader, "_STALL_WARN_MS", 600)
    with ringfeed.Loader(small_shards, batch_size=4, chunk_size="64KiB", memory_budget="256KiB",
                         workers=1, prefetch_batches=1) as loader:
        held = []
        with pytest.warns(RuntimeWarning, match="not released"):
            while True:
                b = loader.next_batch(timeout=1.0)
                if b is None:
                    break
                held.append(b)
        for b in held:
            b.release()
