"""Batches a DataLoader's main process holds while the workers they came
through go away: the workers of a node engine ship each batch by its key,
and the main process keeps it with the engine (``ringfeed_node_claim``)
before it reads a byte. Held items keep their bytes whatever happens to the
workers — the DataLoader shuts them down after an ``islice``, they are
SIGKILLed after they shipped, they have no file descriptor left — while
later epochs read through the same engine's 1 MiB arena.

Each test has a control: the same run with the main process letting go of
each batch the moment it has kept it (``_transport._claim`` patched to
release at once), which is what an unprotected hand-over amounts to; there
the held items' memory is read into. And the main process's holdings are
its own: the workers go on, and later epochs finish, while it keeps more
than the budget of a stream."""

import itertools
import os
import resource
import signal
import time

import pytest

from ringfeed import _ffi, _transport

from conftest import gen, require

torch = require("torch", "the DataLoader tests of the node engine")

from ringfeed.torch import RingfeedDataset  # noqa: E402


@pytest.fixture()
def runtime(runtime_dir, monkeypatch):
    """A private directory for node sockets; one engine for the whole test."""
    monkeypatch.setenv("RINGFEED_NODE_LINGER_MS", "60000")
    return runtime_dir / "ringfeed"


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    # Many small shards of distinct bytes: a chunk read into again holds
    # other bytes than before.
    return gen(tmp_path_factory.mktemp("holds"), shards=12, shard_size="192KiB", sample_size="5KB", seed=4)


def let_go_at_once(monkeypatch):
    """The control: the main process keeps each batch and lets go of it at
    once, so nothing holds it once its worker has."""
    keep = _transport._claim

    def claim_then_release(key):
        address = keep(key)
        assert _ffi.lib.ringfeed_node_release(key) == _ffi.RINGFEED_OK
        return address

    monkeypatch.setattr(_transport, "_claim", claim_then_release)


def dataset(shards, cls=RingfeedDataset):
    # split_workers: each DataLoader worker reads its part, on the node engine.
    return cls(shards, batch_size=8, memory_budget="1MiB", chunk_size="64KiB", shuffle=True, seed=5,
               remainder="drop", split_workers=True)


def item_bytes(item):
    return [item[name].tolist() for name in ("jpg", "cls")]


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_gone(pids, seconds=60):
    deadline = time.monotonic() + seconds
    while not all(gone(p) for p in pids):
        assert time.monotonic() < deadline, f"workers {pids} still running"
        time.sleep(0.05)


def later_epochs(ds, epochs=(1, 2)):
    """Every item of more epochs, through new workers and the same engine."""
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, timeout=120)
    n = 0
    for epoch in epochs:
        ds.set_epoch(epoch)
        n += sum(1 for _ in dl)
    return n


def hold_six(shards, cls=RingfeedDataset):
    """Six items of a DataLoader with two node-engine workers, held: the
    dataset, the iterator, the items, their bytes, the workers' pids."""
    ds = dataset(shards, cls)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    it = iter(dl)
    held = list(itertools.islice(it, 6))
    return ds, it, held, [item_bytes(i) for i in held], [w.pid for w in it._workers]


def judge(before, held, protected):
    # Through the node engine, kept by this process.
    assert all(isinstance(i["jpg"]._span.batch, _transport.NodeHeld) for i in held)
    after = [item_bytes(i) for i in held]
    if protected:
        assert after == before, "a held item was read into"
    else:
        changed = sum(a != b for a, b in zip(after, before))
        assert changed > 0, "the control read nothing into the items it let go"


@pytest.mark.parametrize("protected", [True, False], ids=["kept", "control"])
def test_items_held_from_islice_keep_their_bytes_past_the_dataloaders_shutdown(shards, runtime, monkeypatch,
                                                                                protected):
    if not protected:
        let_go_at_once(monkeypatch)
    ds, it, held, before, pids = hold_six(shards)
    del it  # the DataLoader shuts its workers down (SIGTERM for one that lingers)
    wait_gone(pids)
    assert later_epochs(ds) > 2 * len(held)
    judge(before, held, protected)


class Parked(RingfeedDataset):
    """A dataset whose workers stop once each shipped three items, in the
    dataset's own code, after saying so with a file named by their pid in
    ``self.park``: the six items ``hold_six`` takes are all there are.

    They are killed there and nowhere else because a worker SIGKILLed inside
    the DataLoader's own ``done_event.is_set()`` (each worker asks it once an
    index) dies holding that event's lock, and the DataLoader's shutdown then
    waits on it forever (PyTorch's, whatever the dataset: a test run hung
    there). Parked, a worker holds none of the DataLoader's locks."""

    park = None

    def __iter__(self):
        for n, item in enumerate(super().__iter__()):
            yield item
            if n == 2 and self.park and torch.utils.data.get_worker_info() is not None:
                open(os.path.join(self.park, str(os.getpid())), "w").close()
                time.sleep(3600)


def wait_parked(park, pids, seconds=120):
    deadline = time.monotonic() + seconds
    while sorted(os.listdir(park)) != sorted(str(p) for p in pids):
        assert time.monotonic() < deadline, f"workers {pids} never parked: {os.listdir(park)}"
        time.sleep(0.05)


@pytest.mark.parametrize("protected", [True, False], ids=["kept", "control"])
def test_items_held_keep_their_bytes_when_their_workers_are_killed(shards, runtime, monkeypatch, protected,
                                                                   tmp_path):
    if not protected:
        let_go_at_once(monkeypatch)
    Parked.park = str(tmp_path)
    try:
        ds, it, held, before, pids = hold_six(shards, Parked)
        wait_parked(tmp_path, pids)
        for p in pids:
            os.kill(p, signal.SIGKILL)
        wait_gone(pids)
    except RuntimeError as e:  # the DataLoader's SIGCHLD handler says it too
        assert "killed by signal" in str(e), e
    finally:
        Parked.park = None  # later epochs' workers run to the end
    del it
    assert later_epochs(ds) > 2 * len(held)
    judge(before, held, protected)


class Starved(RingfeedDataset):
    """A dataset whose workers have every file descriptor taken once they
    yielded their first item: a hand-over that needs one fails."""

    def __iter__(self):
        for n, item in enumerate(super().__iter__()):
            if n == 0 and torch.utils.data.get_worker_info() is not None:
                fds = [int(f) for f in os.listdir("/proc/self/fd")]
                _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                resource.setrlimit(resource.RLIMIT_NOFILE, (max(fds) + 1, hard))
                taken = []
                try:
                    while True:
                        taken.append(os.open("/dev/null", os.O_RDONLY))
                except OSError as e:
                    starved = e.errno
                item["starved"] = starved
            yield item


@pytest.mark.parametrize("protected", [True, False], ids=["kept", "control"])
def test_items_held_keep_their_bytes_when_their_workers_have_no_descriptor_left(shards, runtime, monkeypatch,
                                                                                 protected):
    import errno

    if not protected:
        let_go_at_once(monkeypatch)
    ds = dataset(shards, Starved)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, timeout=120)
    held = []
    for item in dl:
        if "starved" in item:
            assert item["starved"] == errno.EMFILE, "the worker still had descriptors"
            held.append(item)
    assert len(held) == 2, "each worker's first item"
    before = [item_bytes(i) for i in held]
    ds = dataset(shards)
    assert later_epochs(ds) > 2 * len(held)
    judge(before, held, protected)


def test_what_the_main_process_keeps_never_stalls_the_workers(shards, runtime):
    """Eight items kept from the first epoch, more than a stream's share of
    the 2 MiB budget, while persistent workers run two more epochs through
    the same engine: the kept memory is charged to the main process, the
    epochs finish, and the kept items keep their bytes."""
    ds = RingfeedDataset(shards, batch_size=8, memory_budget="2MiB", chunk_size="64KiB", remainder="drop",
                         split_workers=True)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True, timeout=120)
    kept = [item for item in dl][:8]
    before = [item_bytes(i) for i in kept]
    for epoch in (1, 2):
        ds.set_epoch(epoch)
        assert sum(1 for _ in dl) > len(kept)
    assert [item_bytes(i) for i in kept] == before


def test_nothing_stays_kept_or_in_transit_once_the_main_process_lets_go(shards, runtime):
    """Every item of four epochs taken and dropped, the workers still alive
    (persistent): the engine holds none of their batches for the main
    process, and none in transit (a batch the main process kept and let go
    of before its worker's release came must not be left in transit)."""
    import glob

    import ringfeed

    ds = RingfeedDataset(shards, batch_size=8, memory_budget="2MiB", chunk_size="64KiB", remainder="drop",
                         split_workers=True)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True, timeout=120)
    for epoch in range(4):
        ds.set_epoch(epoch)
        for item in dl:
            del item
    socket = glob.glob(str(runtime / "node-*.sock"))[0]
    with ringfeed.Loader(shards, batch_size=8, node=socket, loader_workers=2, workers=2,
                         memory_budget="2MiB", chunk_size="64KiB", remainder="drop") as watcher:
        deadline = time.monotonic() + 60
        while True:
            node = watcher.stats()["node"]
            if node["batches_kept"] == 0 and node["batches_in_transit"] == 0:
                break
            assert time.monotonic() < deadline, node
            time.sleep(0.05)
    del dl


def test_a_ticket_whose_key_is_not_one_is_a_named_error_and_maps_nothing():
    """What a pickled node ticket carries is the batch's key; one that is
    garbage, or names no engine, is refused before any byte is read."""
    nowhere = (b'{"socket": "/nonexistent/n.sock", "engine": "0123456789abcdef0123456789abcdef", '
               b'"batch": 2, "cap": "0123456789abcdef"}')
    for key, says in [(b"garbage", "not a batch key"), (b"{}", "not a batch key"),
                      (nowhere, "cannot reach")]:
        with pytest.raises(_transport.TransportError, match=says):
            _transport._receive_node(key)
