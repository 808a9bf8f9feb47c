"""The node engine from Python: a Loader with ``node="auto"`` attaches to this
user's engine for the dataset (started on first use) and gets exactly the
batches an engine of its own gives; a consumer whose dataset keys differ is
refused with NodeError naming the key; ringfeed.torch's DataLoader workers
attach to one engine by default and read the same items as with an engine
each."""

import glob
import os

import pytest

import ringfeed

from conftest import gen


@pytest.fixture()
def runtime(tmp_path, monkeypatch):
    """A private directory for node sockets, and a short linger."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("RINGFEED_NODE_LINGER_MS", "300")
    return tmp_path / "ringfeed"


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return gen(tmp_path_factory.mktemp("node"), shards=3, shard_size="512KiB", sample_size="6KB")


JOB = dict(batch_size=5, seed=9, shuffle=True, shuffle_buffer=20, world_size=2, workers=2)


def batches(loader):
    out = []
    for b in loader:
        out.append([(k, bytes(b.field("jpg")[i])) for i, k in enumerate(b.keys)])
    return out


def test_a_node_consumer_gets_what_its_own_engine_gives(shards, runtime):
    for rank in (0, 1):
        with ringfeed.Loader(shards, rank=rank, **JOB) as own:
            want = batches(own)
        with ringfeed.Loader(shards, rank=rank, node="auto", **JOB) as attached:
            assert attached.stats()["node"]["pid"] != os.getpid()
            got = batches(attached)
        assert got == want and len(want) > 3
    assert len(glob.glob(str(runtime / "node-*.sock"))) <= 1


def test_a_consumer_with_other_dataset_keys_is_refused_by_name(shards, runtime):
    with ringfeed.Loader(shards, rank=0, node="auto", **JOB) as first:
        socket = first.stats()["node"]["socket"]
        other = dict(JOB, seed=10)
        with pytest.raises(ringfeed.NodeError, match="`seed`"):
            ringfeed.Loader(shards, rank=1, node=socket, **other)


def test_dataloader_workers_share_one_engine_by_default(shards, runtime):
    torch = pytest.importorskip("torch", reason="torch is not installed (scripts/test.sh tries pip install torch)")
    from ringfeed.torch import RingfeedDataset

    def keys(**kw):
        ds = RingfeedDataset(shards, batch_size=8, seed=2, shuffle=True, shuffle_buffer=16, **kw)
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        return [k for item in dl for k in item["__key__"].tolist()]

    shared = keys()
    logs = glob.glob(str(runtime / "node-*.log"))
    assert logs, "no node engine was started"
    assert "listening on" in open(logs[0]).read()
    assert shared == keys(node="off")
