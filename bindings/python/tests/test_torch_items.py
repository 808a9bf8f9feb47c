"""ringfeed.torch's default items: `Ragged` views of the batch's memory with
every sample's bytes, their lifetime, pickling (shipped through a shared
arena or copied), DataLoader workers receiving batches without a copy, the
engine kept open across epochs, and the resume state asked for on demand."""

import gc
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest

from conftest import require  # noqa: E402

torch = require("torch", "the ringfeed.torch item tests")

import ringfeed  # noqa: E402
from ringfeed import _lease, _transport  # noqa: E402
from ringfeed.torch import Ragged, RingfeedDataset  # noqa: E402
from ringfeed.torch._ragged import LocalSpan, MappedSpan, OwnedSpan  # noqa: E402

from conftest import all_samples, gen, write_tar  # noqa: E402


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return gen(tmp_path_factory.mktemp("items"), shards=4, shard_size="512KiB", sample_size="6KB")


@pytest.fixture(scope="module")
def truth(shards):
    with ringfeed.Loader(shards, batch_size=64) as loader:
        return all_samples(loader)


def item_samples(item):
    """{key: {field: bytes}} of a default item, read through its Ragged fields."""
    out = {}
    keys = [k.decode() for k in item["__key__"].tolist()]
    for name, r in item.items():
        if name == "__key__":
            continue
        present = r.present.tolist()
        for i, key in enumerate(keys):
            if present[i]:
                out.setdefault(key, {})[name] = bytes(r[i].numpy())
    return out


def drained():
    """Batches not yet back with the engine, after collecting and draining."""
    gc.collect()
    _transport.outbox().drain()
    return _lease.live_batches()


def test_items_view_every_sample_byte(shards, truth):
    got = {}
    for item in RingfeedDataset(shards, batch_size=16):
        assert isinstance(item["__key__"], np.ndarray) and item["__key__"].dtype.kind == "S"
        for name in ("jpg", "cls"):
            r = item[name]
            assert isinstance(r, Ragged) and isinstance(r._span, LocalSpan)
            starts, lengths = r.starts.numpy(), r.lengths.numpy()
            assert (starts >= 0).all() and (starts + lengths <= len(r.values)).all()
            values, offsets = r.pack()
            assert bytes(values.numpy()) == b"".join(r.tolist())
            assert offsets.tolist() == [0, *np.cumsum(lengths).tolist()]
        got.update(item_samples(item))
    assert got == truth


def test_fields_some_samples_lack_are_marked_absent(tmp_path):
    members = []
    for i in range(10):
        members.append((f"s{i:02d}.txt", f"text {i}".encode()))
        if i % 3 == 0:
            members.append((f"s{i:02d}.npy", bytes([i]) * (i + 1)))
    shard = write_tar(tmp_path / "partial.tar", members)
    item = next(iter(RingfeedDataset([shard], batch_size=10)))
    npy = item["npy"]
    assert npy.present.tolist() == [i % 3 == 0 for i in range(10)]
    assert npy.lengths.tolist() == [i + 1 if i % 3 == 0 else 0 for i in range(10)]
    assert [bytes(t.numpy()) for t in npy] == [bytes([i]) * (i + 1) if i % 3 == 0 else b"" for i in range(10)]
    assert item["txt"].tolist() == [f"text {i}".encode() for i in range(10)]


def test_views_hold_the_batch_until_they_are_gone(shards):
    gc.collect()
    before = _lease.live_batches()
    ds = RingfeedDataset(shards, batch_size=16)
    it = iter(ds)
    item = next(it)
    jpg = item["jpg"]
    values = jpg.values
    first = bytes(jpg[0].numpy())
    del item, jpg
    gc.collect()
    held = _lease.live_batches()
    assert held == before + 1, "a tensor view keeps its batch (and only it)"
    assert bytes(values[: len(first)].numpy()) == first
    del values
    assert _lease.live_batches() == before
    del it
    ds.close()


def test_to_and_pin_memory_pack(shards):
    item = next(iter(RingfeedDataset(shards, batch_size=8)))
    r = item["jpg"]
    assert r.to("cpu") is r
    values, offsets = r.pack()
    packed = Ragged(OwnedSpan(values), offsets[:-1], offsets[1:] - offsets[:-1], packed=True)
    assert packed.tolist() == r.tolist()
    again, again_offsets = packed.pack()
    assert again.data_ptr() == values.data_ptr(), "a packed Ragged packs without a copy"
    assert torch.equal(again_offsets, offsets)
    with pytest.raises(IndexError):
        r[8]


def test_dataloader_with_pin_memory_delivers_the_same_bytes(shards, truth):
    # Without an accelerator DataLoader skips pinning (and warns); with one it
    # calls Ragged.pin_memory, which packs into pinned memory.
    dl = torch.utils.data.DataLoader(RingfeedDataset(shards, batch_size=16), batch_size=None, pin_memory=True)
    got = {}
    with pytest.warns(UserWarning) if not torch.cuda.is_available() else _nothing():
        for item in dl:
            got.update(item_samples(item))
    assert got == truth


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_pickled_items_are_copied_without_a_shared_arena(shards, truth):
    got = {}
    for item in RingfeedDataset(shards, batch_size=16):
        back = pickle.loads(ForkingPickler.dumps(item))
        assert isinstance(back["jpg"]._span, OwnedSpan)
        got.update(item_samples(back))
    assert got == truth


def test_pickled_items_travel_as_tickets_with_a_shared_arena(shards, truth):
    """The transport within one process: the ticket maps the arena through
    /proc/self/fd, and dropping the received item releases the batch."""
    got = {}
    ds = RingfeedDataset(shards, batch_size=16, shared_arena=True)
    for item in ds:
        wire = ForkingPickler.dumps(item)
        assert len(wire) < 16 * 200, "a ticket, not the bytes"
        del item
        back = pickle.loads(wire)
        assert isinstance(back["jpg"]._span, MappedSpan)
        assert back["jpg"]._span.batch is back["cls"]._span.batch, "one RemoteBatch per batch"
        got.update(item_samples(back))
        del back
    ds.close()
    assert got == truth
    assert drained() == 0
    assert _transport.outbox().pending() == 0


def test_a_missing_worker_is_a_clear_error():
    with pytest.raises(_transport.TransportError, match="/proc/999999999/fd"):
        _transport._receive_batch((12345, 999999999, 5, (0, 0), 1, 7, 4096, (0, 0)), 1)


def test_a_reused_descriptor_is_not_taken_for_the_arena(shards):
    """A ticket whose file is not the one it names (the worker exited and the
    number was reused) is refused, not mapped."""
    with ringfeed.Loader(shards, batch_size=8, shared_arena=True) as loader:
        arena = loader._arena
        box = _transport.outbox()
        token, pid, pipe, pipe_inode, serial, fd, length, inode = box.address(arena)
        other = (inode[0], inode[1] + 1)
        with pytest.raises(_transport.TransportError, match="not the arena"):
            _transport._receive_batch((token + 1, pid, pipe, pipe_inode, serial, fd, length, other), 1)
        with pytest.raises(_transport.TransportError, match="not the pipe"):
            _transport._releaser(token + 2, pid, pipe, (pipe_inode[0], pipe_inode[1] + 1))


def test_a_release_inside_a_release_does_not_deadlock(shards):
    """The garbage collector may end a RemoteBatch while its thread is inside
    Releaser.release: the inner call queues and the holder writes."""
    ds = RingfeedDataset(shards, batch_size=8, shared_arena=True)
    it = iter(ds)
    back = [pickle.loads(ForkingPickler.dumps(next(it))) for _ in range(2)]
    batches = [item["jpg"]._span.batch for item in back]
    releaser = batches[0].releaser
    assert releaser is batches[1].releaser
    assert _transport.outbox().pending() == 2
    with releaser._lock:  # as if this thread were inside release()
        del back, batches
        gc.collect()
        assert len(releaser._queue) == 2, "queued, not blocked"
    releaser.release(0)  # the next release writes what was queued (0: no batch)
    _transport.outbox().drain()
    assert _transport.outbox().pending() == 0
    del it
    ds.close()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_send_batches_without_copying_them(tmp_path_factory, context):
    big = gen(tmp_path_factory.mktemp("big"), shards=4, shard_size="2MiB", sample_size="6KB")
    with ringfeed.Loader(big, batch_size=64) as loader:
        truth = all_samples(loader)
    # Each engine's 1 MiB holds a few batches of an 8 MiB epoch: the epoch
    # only ends if the main process's releases reach the workers' engines
    # (else the DataLoader's time-out fails the test instead of a hang).
    # remainder="drop": no sample repeats to even out the two workers.
    ds = RingfeedDataset(big, batch_size=16, memory_budget="1MiB", chunk_size="64KiB", remainder="drop")
    dl = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context=context, timeout=60
    )
    got, spans = {}, set()
    for item in dl:
        spans.add(type(item["jpg"]._span).__name__)
        for key, fields in item_samples(item).items():
            assert key not in got, f"{key} twice"
            got[key] = fields
    assert spans == {"MappedSpan"}
    assert set(got) <= set(truth)
    assert got == {k: truth[k] for k in got}, "every byte as the shard has it"
    assert len(truth) - len(got) < 2, "at most the remainder is left out"


def test_engine_stays_open_across_epochs(shards):
    ds = RingfeedDataset(shards, batch_size=10, workers=2, seed=3, shuffle=True, shuffle_buffer=20)
    first = [k for item in ds for k in item["__key__"].tolist()]
    engine = ds._loader
    second = [k for item in ds for k in item["__key__"].tolist()]
    assert ds._loader is engine, "the next epoch comes from the same engine"
    with ringfeed.Loader(shards, batch_size=10, workers=2, seed=3, shuffle=True, shuffle_buffer=20,
                         epochs=2) as loader:
        want = [k.encode() for b in loader for k in b.keys]
    assert first + second == want
    ds.set_epoch(0)
    assert [k for item in ds for k in item["__key__"].tolist()] == first
    assert ds._loader is not engine, "another epoch than the engine's next opens a new one"
    closing = RingfeedDataset(shards, batch_size=10, keep_open=False)
    list(closing)
    assert closing._loader is None


def test_the_state_is_asked_for_only_by_state_dict(shards, monkeypatch):
    calls = []
    real = ringfeed.Loader.state
    monkeypatch.setattr(ringfeed.Loader, "state", lambda self: calls.append(1) or real(self))
    ds = RingfeedDataset(shards, batch_size=10)
    it = iter(ds)
    for _ in range(5):
        next(it)
    assert calls == []
    state = ds.state_dict()
    assert len(calls) == 1 and isinstance(state["state"], str)
    rest = [k for item in it for k in item["__key__"].tolist()]
    again = RingfeedDataset(shards, batch_size=10)
    again.load_state_dict(state)
    assert [k for item in again for k in item["__key__"].tolist()] == rest


def test_engine_threads_are_shared_out_among_loader_workers(shards, monkeypatch, tmp_path):
    ds = RingfeedDataset(shards)
    cfg = lambda nw, **kw: ds._engine_config(0, {"rank": 0, "world_size": 1, "loader_worker": 0,  # noqa: E731
                                                   "loader_workers": nw}, None)
    assert [cfg(n)["workers"] for n in (1, 2, 3, 4, 8)] == [4, 2, 1, 1, 1]
    assert RingfeedDataset(shards, workers=3)._engine_config(
        0, {"rank": 0, "world_size": 1, "loader_worker": 0, "loader_workers": 8}, None)["workers"] == 3
    # The engines of two loader workers open at once pin apart: each claims
    # its CPUs (in a claims directory of this test's own).
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    import os

    allowed = sorted(os.sched_getaffinity(0))
    with ringfeed.Loader(shards, workers=1, loader_worker=0, loader_workers=2) as a, \
            ringfeed.Loader(shards, workers=1, loader_worker=1, loader_workers=2) as b:
        ca, cb = a.stats()["worker_cpus"], b.stats()["worker_cpus"]
    assert len(ca) == 1 and set(ca + cb) <= set(allowed)
    if len(allowed) >= 2:
        assert ca != cb
