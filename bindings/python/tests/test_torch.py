"""ringfeed.torch: worker and rank splits, fork and spawn, state."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/test.sh tries pip install torch)")

import ringfeed  # noqa: E402
from ringfeed.torch import RingfeedDataset, rank_and_world  # noqa: E402

from conftest import gen  # noqa: E402


@pytest.fixture(scope="module")
def shards4(tmp_path_factory):
    return gen(tmp_path_factory.mktemp("t4"), shards=4, shard_size="256KiB", sample_size="4KB")


def all_keys(shards):
    with ringfeed.Loader(shards, batch_size=64) as loader:
        return sorted(k for b in loader for k in b.keys)


def keys_of(items):
    return [k for item in items for k in item["__key__"]]


def test_default_items(shards4):
    ds = RingfeedDataset(shards4, batch_size=16)
    item = next(iter(ds))
    assert set(item) == {"__key__", "jpg", "cls"}
    values, offsets = item["jpg"]
    assert values.dtype == torch.uint8 and offsets.dtype == torch.int64
    assert len(offsets) == len(item["__key__"]) + 1 and offsets[-1] == len(values)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_split_the_shards(shards4, context):
    ds = RingfeedDataset(shards4, batch_size=16, workers=1)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    keys = keys_of(dl)
    assert sorted(keys) == all_keys(shards4)  # every sample once


def test_the_parent_may_hold_a_loader_when_workers_fork(shards4):
    with ringfeed.Loader(shards4, batch_size=8) as mine:
        held = next(mine)
        ds = RingfeedDataset(shards4, batch_size=16, workers=1)
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        assert sorted(keys_of(dl)) == all_keys(shards4)
        assert len(held.keys) == 8
        held.release()


def test_rank_and_world_from_the_environment(shards4, monkeypatch):
    parts = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert rank_and_world() == (rank, 2)
        ds = RingfeedDataset(shards4, batch_size=16)
        assert ds.my_shards() == shards4[rank::2]
        parts.append(keys_of(ds))
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == all_keys(shards4)


def test_ranks_and_workers_together(shards4, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = RingfeedDataset(shards4, batch_size=16)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    got = keys_of(dl)
    # rank 1 of 2 with 2 workers: consumers 2 and 3 of 4, i.e. shards 2 and 3
    assert sorted(got) == all_keys(shards4[2:])


def test_state_dict_resume(shards4):
    ds = RingfeedDataset(shards4, batch_size=10, workers=1)
    it = iter(ds)
    seen = keys_of([next(it) for _ in range(3)])
    state = ds.state_dict()
    assert state == {"epoch": 0, "samples_yielded": 30}
    del it
    ds2 = RingfeedDataset(shards4, batch_size=7, workers=1)
    ds2.load_state_dict(state)
    rest = keys_of(ds2)
    assert sorted(seen + rest) == all_keys(shards4)
    assert ds2.state_dict() == {"epoch": 1, "samples_yielded": 0}


def test_stateful_dataloader(shards4):
    sdl = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")
    ds = RingfeedDataset(shards4, batch_size=10, workers=1)
    dl = sdl.StatefulDataLoader(ds, batch_size=None, num_workers=0)
    it = iter(dl)
    seen = keys_of([next(it) for _ in range(4)])
    state = dl.state_dict()
    del it
    dl2 = sdl.StatefulDataLoader(RingfeedDataset(shards4, batch_size=10, workers=1), batch_size=None, num_workers=0)
    dl2.load_state_dict(state)
    rest = keys_of(dl2)
    assert sorted(seen + rest) == all_keys(shards4)


def test_epochs_keyword_is_refused(shards4):
    with pytest.raises(TypeError, match="epochs"):
        RingfeedDataset(shards4, epochs=2)


def test_stateful_dataloader_with_workers(shards4):
    sdl = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")

    def make():
        ds = RingfeedDataset(shards4, batch_size=10, workers=1)
        return sdl.StatefulDataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")

    dl = make()
    it = iter(dl)
    seen = keys_of([next(it) for _ in range(5)])
    state = dl.state_dict()
    del it
    dl2 = make()
    dl2.load_state_dict(state)
    rest = keys_of(dl2)
    assert sorted(seen + rest) == all_keys(shards4)


def test_rank_from_torch_distributed_when_initialised(shards4, monkeypatch):
    dist = torch.distributed
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this torch build")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RANK", "5")  # ignored: the initialised group wins
    monkeypatch.setenv("WORLD_SIZE", "9")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        assert rank_and_world() == (0, 1)
        assert RingfeedDataset(shards4).my_shards() == shards4
    finally:
        dist.destroy_process_group()
