"""Loader.state() / resume=, and the engine's split over rank × worker consumers."""

from collections import Counter

import pytest
import ringfeed

from conftest import gen

# Shuffled shards and a shuffle buffer, two engine threads: an order that
# only the plan fixes.
SHUFFLED = dict(batch_size=10, workers=2, seed=7, shuffle=True, shuffle_buffer=40)


@pytest.fixture(scope="module")
def shards5(tmp_path_factory):
    return gen(tmp_path_factory.mktemp("r5"), shards=5, shard_size="128KiB", sample_size="4KB")


def batches(loader, limit=None):
    """Key lists of the batches of the current epoch, at most `limit` of them."""
    out = []
    for b in loader.iter_epoch():
        with b:
            out.append(b.keys)
        if limit is not None and len(out) == limit:
            break
    return out


def every_key(shards):
    with ringfeed.Loader(shards, batch_size=64) as loader:
        return sorted(k for b in loader for k in b.keys)


def test_state_then_resume_continues_the_shuffled_order_exactly(shards5):
    with ringfeed.Loader(shards5, epochs=2, **SHUFFLED) as loader:
        full, second = batches(loader), batches(loader)
    keys = [k for b in full for k in b]
    assert sorted(keys) == every_key(shards5)
    assert keys != sorted(keys), "shuffle is on"
    for cut in (0, 1, len(full) // 2, len(full) - 1, len(full)):
        with ringfeed.Loader(shards5, epochs=2, **SHUFFLED) as loader:
            head = batches(loader, cut) if cut else []
            state = loader.state()
        assert isinstance(state, bytes) and state.isascii() and len(state) < 1024
        with ringfeed.Loader(shards5, epochs=2, resume=state, **SHUFFLED) as loader:
            rest, after = batches(loader), batches(loader)
            assert loader.stats()["batches_skipped"] == cut
        assert head + rest == full, f"cut after {cut} batches"
        assert after == second, "the next epoch is untouched"


def test_resume_takes_str_bytes_and_a_list_of_the_same_layout(shards5):
    with ringfeed.Loader(shards5, **SHUFFLED) as loader:
        full = batches(loader)
    with ringfeed.Loader(shards5, **SHUFFLED) as loader:
        head = batches(loader, 3)
        state = loader.state()
    for given in (state.decode(), bytearray(state), [state], (state.decode(),)):
        with ringfeed.Loader(shards5, resume=given, **SHUFFLED) as loader:
            assert head + batches(loader) == full, type(given)
    # None: no state, the epoch from its start.
    with ringfeed.Loader(shards5, resume=None, **SHUFFLED) as loader:
        assert batches(loader) == full


def test_a_resumed_loader_can_be_cut_again(shards5):
    with ringfeed.Loader(shards5, **SHUFFLED) as loader:
        full = batches(loader)
    with ringfeed.Loader(shards5, **SHUFFLED) as loader:
        a = batches(loader, 2)
        s1 = loader.state()
    with ringfeed.Loader(shards5, resume=s1, **SHUFFLED) as loader:
        b = batches(loader, 3)
        s2 = loader.state()
    with ringfeed.Loader(shards5, resume=s2, **SHUFFLED) as loader:
        c = batches(loader)
    assert a + b + c == full


def test_bad_resume_values_are_named_errors(shards5):
    with pytest.raises(ringfeed.ConfigError, match=r"resume.*hex"):
        ringfeed.Loader(shards5, resume="zz")
    with pytest.raises(ringfeed.ConfigError, match="not a ringfeed resume state"):
        ringfeed.Loader(shards5, resume="00112233")
    with pytest.raises(ringfeed.ConfigError, match="resume"):
        ringfeed.Loader(shards5, resume=7)
    with pytest.raises(ringfeed.ConfigError, match="resume"):
        ringfeed.Loader(shards5, resume=["zz"])
    with pytest.raises(ringfeed.ConfigError, match="not ASCII") as e:
        ringfeed.Loader(shards5, resume=b"\xff\xfe")
    assert isinstance(e.value, ValueError)

    # A state of other epoch settings.
    with ringfeed.Loader(shards5, batch_size=10, seed=1) as loader:
        batches(loader, 1)
        state = loader.state()
    with pytest.raises(ringfeed.StateError, match="another dataset or other epoch settings") as e:
        ringfeed.Loader(shards5, batch_size=10, seed=2, resume=state)
    assert e.value.status == ringfeed.StateError.status
    assert e.value.status_name == "RINGFEED_ERR_STATE"
    assert isinstance(e.value, ringfeed.Error)

    # An elastic resume (2 consumers -> 3) given one old consumer's state only.
    with ringfeed.Loader(shards5, batch_size=10, world_size=2, rank=0) as loader:
        batches(loader, 1)
        state = loader.state()
    with pytest.raises(ringfeed.StateError, match="every old consumer; missing: 1"):
        ringfeed.Loader(shards5, batch_size=10, world_size=3, rank=0, resume=[state])


def split(shards, world_size, loader_workers=1, **cfg):
    """{consumer: (key batches, stats)} of every consumer of the layout."""
    out = {}
    for rank in range(world_size):
        for w in range(loader_workers):
            with ringfeed.Loader(
                shards, world_size=world_size, rank=rank, loader_worker=w, loader_workers=loader_workers, **cfg
            ) as loader:
                keys = batches(loader)
                out[rank * loader_workers + w] = (keys, loader.stats())
    return out


@pytest.mark.parametrize("world_size,loader_workers", [(2, 1), (3, 1), (2, 2)])
def test_world_size_split_gives_every_sample_once_with_equal_batch_counts(shards5, world_size, loader_workers):
    everything = every_key(shards5)
    parts = split(shards5, world_size, loader_workers, **SHUFFLED)
    assert sorted(parts) == list(range(world_size * loader_workers))
    assert len({len(keys) for keys, _ in parts.values()}) == 1, "equal batch counts"
    assert len({sum(map(len, keys)) for keys, _ in parts.values()}) == 1, "equal sample counts"
    for c, (_, stats) in parts.items():
        assert (stats["consumer"], stats["consumers"]) == (c, world_size * loader_workers)
    got = Counter(k for keys, _ in parts.values() for b in keys for k in b)
    assert sorted(got) == everything, "every sample"
    padded = sum(stats["samples_padded"] for _, stats in parts.values())
    assert sum(got.values()) - len(everything) == padded, "only pads repeat"


def test_remainder_drop_repeats_nothing(shards5):
    everything = set(every_key(shards5))
    parts = split(shards5, 3, **SHUFFLED, remainder="drop")
    got = Counter(k for keys, _ in parts.values() for b in keys for k in b)
    assert max(got.values()) == 1
    assert set(got) <= everything
    dropped = sum(stats["samples_dropped"] for _, stats in parts.values())
    assert len(everything) - len(got) == dropped < 3
    assert sum(stats["samples_padded"] for _, stats in parts.values()) == 0
