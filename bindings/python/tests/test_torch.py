"""ringfeed.torch: the engine's split over ranks and DataLoader workers, fork and
spawn, epochs, and exact resume through state_dict / StatefulDataLoader."""

from collections import Counter

import pytest
from conftest import gen, require, skip_for_environment

torch = require("torch", "the ringfeed.torch tests")

import ringfeed  # noqa: E402
from ringfeed.torch import RingfeedDataset, rank_and_world, to_tensors  # noqa: E402


@pytest.fixture(scope="module")
def shards4(tmp_path_factory):
    return gen(tmp_path_factory.mktemp("t4"), shards=4, shard_size="256KiB", sample_size="4KB")


def all_keys(shards):
    with ringfeed.Loader(shards, batch_size=64) as loader:
        return sorted(k for b in loader for k in b.keys)


def keys_of(items):
    """The keys of items, as str (the default item carries a numpy bytes array)."""
    return [k.decode() if isinstance(k, bytes) else k for item in items for k in item["__key__"]]


# Shuffled shards and buffer, two engine threads: an order only the plan fixes.
SHUFFLED = dict(workers=2, seed=3, shuffle=True, shuffle_buffer=32)


def tag_worker(batch):
    """`to_tensors` plus the DataLoader worker that made the item."""
    item = to_tensors(batch)
    info = torch.utils.data.get_worker_info()
    item["__worker__"] = info.id if info is not None else -1
    return item


def by_worker(items):
    out = {}
    for item in items:
        out.setdefault(item["__worker__"], []).extend(keys_of([item]))
    return out


def consumer_keys(shards, rank, world_size, loader_worker, loader_workers, batch_size, **cfg):
    """(keys in order, samples padded) of one consumer, read with a plain Loader."""
    with ringfeed.Loader(
        shards, batch_size=batch_size, world_size=world_size, rank=rank,
        loader_worker=loader_worker, loader_workers=loader_workers, **cfg,
    ) as loader:
        keys = [k for b in loader for k in b.keys]
        return keys, loader.stats()["samples_padded"]


def expected(shards, world_size, loader_workers, batch_size, **cfg):
    """{(rank, worker): keys in order} and the total of samples padded."""
    out, padded = {}, 0
    for rank in range(world_size):
        for w in range(loader_workers):
            keys, p = consumer_keys(shards, rank, world_size, w, loader_workers, batch_size, **cfg)
            out[rank, w] = keys
            padded += p
    return out, padded


def assert_every_sample_once_but_pads(keys, shards, padded):
    got = Counter(keys)
    assert sorted(got) == all_keys(shards), "every sample"
    assert sum(got.values()) - len(got) == padded, "only the engine's pads repeat"


def test_default_items(shards4):
    ds = RingfeedDataset(shards4, batch_size=16)
    item = next(iter(ds))
    assert set(item) == {"__key__", "jpg", "cls"}
    keys = item["__key__"]
    assert keys.dtype.kind == "S" and len(keys) == 16
    jpg = item["jpg"]
    assert isinstance(jpg, ringfeed.torch.Ragged) and len(jpg) == 16
    assert jpg.values.dtype == torch.uint8 and jpg.starts.dtype == jpg.lengths.dtype == torch.int64
    values, offsets = jpg.pack()
    assert values.dtype == torch.uint8 and offsets.dtype == torch.int64
    assert len(offsets) == len(keys) + 1 and offsets[-1] == len(values) == jpg.nbytes


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_split_the_data(shards4, context):
    ds = RingfeedDataset(shards4, batch_size=16, workers=1, split_workers=True)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    keys = keys_of(dl)
    want, padded = expected(shards4, 1, 2, 16, workers=1)
    assert_every_sample_once_but_pads(keys, shards4, padded)
    assert Counter(keys) == Counter(want[0, 0] + want[0, 1])


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_with_default_items_one_worker_reads_what_num_workers_0_yields(shards4, context):
    # Items that need no Python of the user's: the first worker reads the
    # rank's whole part, the others yield nothing; the order, the length
    # and the items are those of num_workers=0.
    alone = RingfeedDataset(shards4, batch_size=10, **SHUFFLED)
    assert alone.one_reader()
    want = keys_of(alone)
    for workers in (2, 3):
        ds = RingfeedDataset(shards4, batch_size=10, **SHUFFLED)
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, multiprocessing_context=context)
        assert len(dl) == len(alone) == -(-len(want) // 10)
        assert keys_of(dl) == want, f"{workers} workers"
    # Control: workers that each read their part give another order.
    ds = RingfeedDataset(shards4, batch_size=10, split_workers=True, **SHUFFLED)
    assert not ds.one_reader()
    split = keys_of(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context))
    assert split != want and set(split) == set(want)


def test_which_workers_read(shards4):
    # A transform function is Python per batch: every worker reads its part
    # by default; split_workers=False gives it to the first alone.
    assert not RingfeedDataset(shards4, transform=tag_worker).one_reader()
    assert not RingfeedDataset(shards4).map_batch(lambda item: item).one_reader()
    assert not RingfeedDataset(shards4).decode("rgb8").one_reader()
    assert RingfeedDataset(shards4, transform=to_tensors).one_reader()
    assert RingfeedDataset(shards4, transform={"jpg": {"resize": 8, "center_crop": [8, 8]}, "cls": "int64"}).one_reader()
    ds = RingfeedDataset(shards4, batch_size=10, transform=tag_worker, split_workers=False, **SHUFFLED)
    got = by_worker(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"))
    assert got == {0: keys_of(RingfeedDataset(shards4, batch_size=10, **SHUFFLED))}
    with pytest.raises(TypeError, match="split_workers"):
        RingfeedDataset(shards4, split_workers="yes")


@pytest.mark.parametrize("stop", [1, 7])
def test_stateful_dataloader_with_one_reading_worker(shards4, stop):
    sdl = require("torchdata.stateful_dataloader", "resume through StatefulDataLoader")

    def make():
        ds = RingfeedDataset(shards4, batch_size=10, **SHUFFLED)
        return sdl.StatefulDataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")

    full = keys_of(make())
    dl = make()
    it = iter(dl)
    seen = keys_of([next(it) for _ in range(stop)])
    state = dl.state_dict()
    del it
    dl2 = make()
    dl2.load_state_dict(state)
    assert seen + keys_of(dl2) == full, f"stop after {stop} items"


def test_each_worker_reads_its_consumers_order(shards4):
    ds = RingfeedDataset(shards4, batch_size=10, transform=tag_worker, **SHUFFLED)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    got = by_worker(dl)
    want, _ = expected(shards4, 1, 2, 10, **SHUFFLED)
    assert got == {0: want[0, 0], 1: want[0, 1]}
    assert len(want[0, 0]) == len(want[0, 1]), "equal lengths"


def test_the_parent_may_hold_a_loader_when_workers_fork(shards4):
    with ringfeed.Loader(shards4, batch_size=8) as mine:
        held = next(mine)
        ds = RingfeedDataset(shards4, batch_size=16, workers=1, split_workers=True)
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        _, padded = expected(shards4, 1, 2, 16, workers=1)
        assert_every_sample_once_but_pads(keys_of(dl), shards4, padded)
        assert len(held.keys) == 8
        held.release()


def test_rank_and_world_from_the_environment(shards4, monkeypatch):
    want, padded = expected(shards4, 2, 1, 16, **SHUFFLED)
    parts = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert rank_and_world() == (rank, 2)
        ds = RingfeedDataset(shards4, batch_size=16, **SHUFFLED)
        assert ds.consumer() == {"rank": rank, "world_size": 2, "loader_worker": 0, "loader_workers": 1}
        parts.append(keys_of(ds))
        assert parts[-1] == want[rank, 0]
    assert len(parts[0]) == len(parts[1])
    assert_every_sample_once_but_pads(parts[0] + parts[1], shards4, padded)


@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_ranks_and_workers_together(shards4, monkeypatch, remainder):
    want, padded = expected(shards4, 2, 2, 8, remainder=remainder, **SHUFFLED)
    everything = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        ds = RingfeedDataset(shards4, batch_size=8, transform=tag_worker, remainder=remainder, **SHUFFLED)
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        got = by_worker(dl)
        # rank r of 2 with 2 workers: consumers 2r and 2r + 1 of 4
        assert got == {0: want[rank, 0], 1: want[rank, 1]}
        everything += got[0] + got[1]
    assert len({len(k) for k in want.values()}) == 1, "equal lengths"
    if remainder == "pad":
        assert_every_sample_once_but_pads(everything, shards4, padded)
    else:
        assert padded == 0
        assert len(set(everything)) == len(everything), "nothing repeats"
        assert set(everything) <= set(all_keys(shards4))
        assert len(all_keys(shards4)) - len(everything) < 4, "at most the remainder is left out"


def test_state_dict_resume(shards4):
    full = keys_of(RingfeedDataset(shards4, batch_size=10, **SHUFFLED))
    ds = RingfeedDataset(shards4, batch_size=10, **SHUFFLED)
    it = iter(ds)
    seen = keys_of([next(it) for _ in range(3)])
    state = ds.state_dict()
    assert set(state) == {"epoch", "state"} and state["epoch"] == 0
    assert isinstance(state["state"], str)
    del it
    ds2 = RingfeedDataset(shards4, batch_size=10, **SHUFFLED)
    ds2.load_state_dict(state)
    rest = keys_of(ds2)
    assert seen + rest == full, "the rest of the epoch, in the uninterrupted order"
    assert ds2.state_dict() == {"epoch": 1, "state": None}


def test_the_old_state_form_is_refused(shards4):
    ds = RingfeedDataset(shards4, batch_size=10)
    with pytest.raises(ValueError, match="state"):
        ds.load_state_dict({"epoch": 0, "samples_yielded": 30})


def test_one_iter_is_one_epoch_and_set_epoch_chooses_it(shards4):
    ds = RingfeedDataset(shards4, batch_size=10, **SHUFFLED)
    first, second = keys_of(ds), keys_of(ds)
    assert ds.state_dict() == {"epoch": 2, "state": None}
    assert sorted(first) == sorted(second) == all_keys(shards4) and first != second
    with ringfeed.Loader(shards4, batch_size=10, epoch=1, epochs=2, **SHUFFLED) as loader:
        assert [k for b in loader for k in b.keys] == second
    ds.set_epoch(1)
    assert keys_of(ds) == second


def test_stateful_dataloader(shards4):
    sdl = require("torchdata.stateful_dataloader", "resume through StatefulDataLoader")
    full = keys_of(RingfeedDataset(shards4, batch_size=10, **SHUFFLED))
    ds = RingfeedDataset(shards4, batch_size=10, **SHUFFLED)
    dl = sdl.StatefulDataLoader(ds, batch_size=None, num_workers=0)
    it = iter(dl)
    seen = keys_of([next(it) for _ in range(4)])
    state = dl.state_dict()
    del it
    dl2 = sdl.StatefulDataLoader(RingfeedDataset(shards4, batch_size=10, **SHUFFLED), batch_size=None, num_workers=0)
    dl2.load_state_dict(state)
    rest = keys_of(dl2)
    assert seen + rest == full


@pytest.mark.parametrize("key", RingfeedDataset._OWN_KEYS)
def test_keys_the_dataset_sets_are_refused(shards4, key):
    with pytest.raises(TypeError, match=key):
        RingfeedDataset(shards4, **{key: 1})


@pytest.mark.parametrize("stop", [1, 5, 9])
def test_stateful_dataloader_with_workers(shards4, stop):
    sdl = require("torchdata.stateful_dataloader", "resume through StatefulDataLoader")

    def make():
        ds = RingfeedDataset(shards4, batch_size=10, transform=tag_worker, **SHUFFLED)
        return sdl.StatefulDataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")

    full = list(make())
    dl = make()
    it = iter(dl)
    seen = [next(it) for _ in range(stop)]
    state = dl.state_dict()
    del it
    dl2 = make()
    dl2.load_state_dict(state)
    rest = list(dl2)
    assert Counter(keys_of(seen + rest)) == Counter(keys_of(full)), "the same multiset of samples"
    before, after, uninterrupted = by_worker(seen), by_worker(rest), by_worker(full)
    assert set(uninterrupted) == {0, 1}
    for w, keys in uninterrupted.items():
        assert before.get(w, []) + after.get(w, []) == keys, f"worker {w}, stop after {stop} items"


def test_elastic_resume_from_two_ranks_to_three(shards4, monkeypatch):
    delivered, states = [], []
    for rank, cut in [(0, 2), (1, 4)]:
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        ds = RingfeedDataset(shards4, batch_size=8, **SHUFFLED)
        it = iter(ds)
        delivered += keys_of([next(it) for _ in range(cut)])
        state = ds.state_dict()
        del it
        assert state["epoch"] == 0
        states.append(state["state"])
    lengths = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        ds = RingfeedDataset(shards4, batch_size=8, **SHUFFLED)
        ds.load_state_dict({"epoch": 0, "state": states})
        got = keys_of(ds)
        lengths.append(len(got))
        delivered += got
    assert len(set(lengths)) == 1, lengths
    got = Counter(delivered)
    assert sorted(got) == all_keys(shards4), "nothing lost"
    assert sum(got.values()) - len(got) <= 3, "only pads repeat"


def test_rank_from_torch_distributed_when_initialised(shards4, monkeypatch):
    dist = torch.distributed
    if not dist.is_available():
        skip_for_environment("torch.distributed is not available in this torch build")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RANK", "5")  # ignored: the initialised group wins
    monkeypatch.setenv("WORLD_SIZE", "9")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        assert rank_and_world() == (0, 1)
        assert RingfeedDataset(shards4).consumer() == {
            "rank": 0, "world_size": 1, "loader_worker": 0, "loader_workers": 1,
        }
    finally:
        dist.destroy_process_group()
