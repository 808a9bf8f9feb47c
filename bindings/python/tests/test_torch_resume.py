"""Resumes through the usual epoch loop

    ds.load_state_dict(ckpt)            # or dl.load_state_dict(ckpt)
    for epoch in range(start, n):
        ds.set_epoch(epoch)
        for item in dl: ...

deliver exactly the samples (keys and bytes, in order) of the run that was
not interrupted: with a plain DataLoader (num_workers=0) and with a
StatefulDataLoader over 2 workers, `set_epoch` called every epoch. Each has
its control: the interrupted epoch from its start delivers other samples
than the resumed one (what a `set_epoch` that drops the state gave), and a
state loaded for another epoch is dropped, saying so. In the main process
of a plain DataLoader with workers `state_dict()` raises, naming
StatefulDataLoader, where it answered "the start of the epoch": the control
shows that answer replays samples already delivered."""

import gc
import logging

import pytest

from conftest import gen, require, synth_content

torch = require("torch", "the ringfeed.torch resume tests")

from ringfeed.torch import RingfeedDataset, StateUnknownError  # noqa: E402

# Shuffled shards and buffer, two engine threads: an order only the plan fixes.
SHUFFLED = dict(workers=2, seed=11, shuffle=True, shuffle_buffer=32)
EPOCHS = 3


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return gen(tmp_path_factory.mktemp("resume"), shards=4, shard_size="256KiB", sample_size="4KB")


def samples(item):
    """[(key, jpg bytes, cls bytes)] of a default item, read through its views."""
    keys = [k.decode() for k in item["__key__"].tolist()]
    return list(zip(keys, item["jpg"].tolist(), item["cls"].tolist()))


def dataset(shards, **kw):
    return RingfeedDataset(shards, batch_size=10, **SHUFFLED, **kw)


def run(dl, ds, epochs, stop=None):
    """{epoch: [samples]} of the usual loop over `epochs`; with `stop =
    (epoch, n)` it stops after n items of that epoch and returns the
    DataLoader's state (a StatefulDataLoader's) or the dataset's taken
    there too."""
    out = {}
    for epoch in epochs:
        ds.set_epoch(epoch)
        out[epoch] = []
        for i, item in enumerate(dl):
            out[epoch] += samples(item)
            if stop == (epoch, i + 1):
                state = dl.state_dict() if hasattr(dl, "state_dict") else ds.state_dict()
                return out, state
    return out, None


def assert_generator_bytes(delivered):
    for key, jpg, cls in delivered:
        assert jpg == synth_content(0, key, "jpg", len(jpg)) and jpg, key
        assert cls == synth_content(0, key, "cls", len(cls)), key


def plain(ds):
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)


@pytest.mark.parametrize("stop", [1, 4, 9])
def test_a_plain_dataloader_resumes_mid_epoch_with_set_epoch_every_epoch(shards, stop):
    whole, _ = run(*(lambda ds: (plain(ds), ds))(dataset(shards)), range(EPOCHS))
    assert all(len(whole[e]) > 10 * stop for e in whole)
    assert_generator_bytes(s for e in whole for s in whole[e])

    ds = dataset(shards)
    head, ckpt = run(plain(ds), ds, range(EPOCHS), stop=(1, stop))
    assert ckpt["epoch"] == 1 and isinstance(ckpt["state"], str)
    del ds

    resumed = dataset(shards)
    resumed.load_state_dict(ckpt)
    tail, _ = run(plain(resumed), resumed, range(1, EPOCHS))
    assert head[0] == whole[0]
    assert head[1] + tail[1] == whole[1], f"epoch 1, cut after {stop} items"
    assert tail[2] == whole[2], "the next epoch is untouched"

    # Control: epoch 1 from its start, what a set_epoch that drops the
    # state delivers, repeats what was delivered before the cut.
    assert tail[1] != whole[1] and whole[1][: len(head[1])] == head[1]


def test_a_state_of_another_epoch_is_dropped_saying_so(shards, caplog):
    whole, _ = run(*(lambda ds: (plain(ds), ds))(dataset(shards)), range(EPOCHS))
    ds = dataset(shards)
    _, ckpt = run(plain(ds), ds, range(EPOCHS), stop=(1, 3))
    resumed = dataset(shards)
    resumed.load_state_dict(ckpt)
    with caplog.at_level(logging.WARNING, logger="ringfeed"):
        tail, _ = run(plain(resumed), resumed, [2])
    assert tail[2] == whole[2], "epoch 2 from its start"
    assert any("dropping the resume state loaded for epoch 1" in r.getMessage() for r in caplog.records), \
        caplog.text
    # The state is gone, not kept for later: epoch 1 now runs whole.
    again, _ = run(plain(resumed), resumed, [1])
    assert again[1] == whole[1]


@pytest.mark.parametrize("stop", [1, 5, 9])
def test_a_stateful_dataloader_with_workers_resumes_mid_epoch_with_set_epoch(shards, stop):
    sdl = require("torchdata.stateful_dataloader", "resume through StatefulDataLoader")

    def loader(ds):
        return sdl.StatefulDataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")

    ds = dataset(shards)
    whole, _ = run(loader(ds), ds, range(EPOCHS))
    assert_generator_bytes(s for e in whole for s in whole[e])
    ds = dataset(shards)
    head, ckpt = run(loader(ds), ds, range(EPOCHS), stop=(1, stop))
    del ds

    resumed = dataset(shards)
    dl = loader(resumed)
    dl.load_state_dict(ckpt)
    tail, _ = run(dl, resumed, range(1, EPOCHS))
    assert head[0] == whole[0]
    assert head[1] + tail[1] == whole[1], f"epoch 1, cut after {stop} items"
    assert tail[2] == whole[2], "the next epoch is untouched"
    # Control: the epoch from its start is not what the resume delivered.
    assert tail[1] != whole[1] and whole[1][: len(head[1])] == head[1]


def test_state_dict_beside_a_plain_dataloader_with_workers_raises(shards):
    ds = dataset(shards, node="off")
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    it = iter(dl)
    delivered = [s for _ in range(3) for s in samples(next(it))]
    with pytest.raises(StateUnknownError, match="StatefulDataLoader") as e:
        ds.state_dict()
    assert "torchdata.stateful_dataloader" in str(e.value) and "2 workers" in str(e.value)
    del it
    with pytest.raises(StateUnknownError):
        ds.state_dict()  # between epochs too: the workers' epoch is not this process's

    # Control: what state_dict() answered here, "the start of epoch 0",
    # resumes into the samples already delivered.
    old_answer = {"epoch": ds._epoch, "state": ds._resume}
    assert old_answer == {"epoch": 0, "state": None}
    replay = dataset(shards)
    replay.load_state_dict(old_answer)
    again = [s for item in plain(replay) for s in samples(item)]
    assert set(delivered) <= set(again), "the old answer replays what was delivered"

    # With no DataLoader of workers left, the dataset's own state stands.
    del dl, e
    gc.collect()
    assert ds.state_dict() == {"epoch": 0, "state": None}
    # And num_workers=0 keeps its position in this process.
    alone = dataset(shards)
    it = iter(plain(alone))
    next(it)
    assert isinstance(alone.state_dict()["state"], str)
