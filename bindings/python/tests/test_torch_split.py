"""Several consumers over remote shards with no preparation step, as
PyTorch users run them: a `torchrun` DDP job of 2 ranks × 2 DataLoader
workers over `s3://` shards without a manifest trains, every rank the same
number of batches and no sample twice; with a `shardindex.json` beside the
shards the split is exact. And the PyTorch surface: `len()` of a dataset
and its DataLoader, and the `batch_size=None` a DataLoader must be given."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import gen, require

require("torch", "the PyTorch tests")

import torch  # noqa: E402

import ringfeed  # noqa: E402
from ringfeed.torch import RingfeedDataset  # noqa: E402

HERE = Path(__file__).parent
SEED = 17


def shards(s3_server, folder, n=8, index=False):
    """`n` shards of ~10 KB samples in the bucket's `folder`, with a
    WebDataset shard index beside them when `index`; their URL pattern and
    each shard's sample count."""
    dest = s3_server.root / s3_server.bucket / folder
    paths = gen(dest, shards=n, shard_size="200KB", sample_size="10KB", seed=SEED)
    counts = []
    for p in paths:
        with ringfeed.Loader(p, batch_size=1) as loader:
            counts.append(sum(len(b) for b in loader))
    if index:
        (dest / "shardindex.json").write_text(json.dumps({
            "wids_version": 1,
            "shardlist": [{"url": Path(p).name, "nsamples": c} for p, c in zip(paths, counts)],
        }))
    return f"s3://{s3_server.bucket}/{folder}/shard-{{000000..{n - 1:06d}}}.tar", counts


def s3_env(s3_server):
    return {
        **os.environ,
        "AWS_ENDPOINT_URL": s3_server.endpoint,
        "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
        "AWS_REGION": "us-east-1",
        "OMP_NUM_THREADS": "1",
    }


def run_ddp(s3_server, urls, out, epochs=2):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    r = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", str(HERE / "ddp_split_rank.py"),
         urls, str(out), str(epochs), str(SEED)],
        cwd=HERE, capture_output=True, text=True, timeout=300, env=s3_env(s3_server),
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-8000:]
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(2)]


def test_torchrun_two_ranks_two_workers_without_a_manifest_train_equal_and_at_most_once(s3_server, tmp_path):
    urls, counts = shards(s3_server, "ddp-no-manifest")
    ranks = run_ddp(s3_server, urls, tmp_path)
    for epoch in range(2):
        lengths = {len(r[epoch]["batches"]) for r in ranks}
        # A DDP job must not hang: every rank the same batches, and the
        # length the DataLoader reported.
        assert len(lengths) == 1, lengths
        assert {r[epoch]["len"] for r in ranks} == lengths
        keys = [k for r in ranks for b in r[epoch]["batches"] for k in b]
        assert all(len(b) == 8 for r in ranks for b in r[epoch]["batches"])
        assert len(set(keys)) == len(keys), "a sample went to two consumers"
        # 8 shards among the 2 ranks (one DataLoader worker of each reads):
        # 4 each, and the nominal epoch is 90% of the poorest part's
        # estimate, in whole batches.
        assert 0.6 * sum(counts) <= len(keys) <= sum(counts)


def test_torchrun_with_a_shardindex_beside_the_shards_reads_every_sample_exactly_once(s3_server, tmp_path):
    urls, counts = shards(s3_server, "ddp-index", index=True)
    total = sum(counts)
    ranks = run_ddp(s3_server, urls, tmp_path, epochs=1)
    keys = [k for r in ranks for b in r[0]["batches"] for k in b]
    assert len({len(r[0]["batches"]) for r in ranks}) == 1
    # remainder "pad" (the default): all samples, and repeats only to even
    # out the 2 consumers.
    assert len(set(keys)) == total
    assert len(keys) - total < 4
    assert ranks[0][0]["len"] == len(ranks[0][0]["batches"])


def test_len_is_the_batches_a_rank_yields_and_a_type_error_where_unknown(s3_server):
    urls, counts = shards(s3_server, "len", n=4)
    cfg = s3_server.config()
    # One consumer over remote shards without counts: no length.
    ds = RingfeedDataset(urls, batch_size=8, **cfg)
    with pytest.raises(TypeError, match="shardindex.json"):
        len(ds)
    # Two DataLoader workers with the default items: one reads, as one
    # consumer would, so no length either.
    with pytest.raises(TypeError, match="shardindex.json"):
        len(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    # Two DataLoader workers that each read: two consumers, a nominal epoch,
    # a length; iterating gives exactly that many items.
    ds = RingfeedDataset(urls, batch_size=8, split_workers=True, **cfg)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    n = len(dl)
    items = list(dl)
    assert len(items) == n and n > 0
    p = ringfeed.plan(urls, batch_size=8, loader_workers=2, **cfg)
    assert (p["split"], p["consumers"], p["batches"] * 2) == ("shards", 2, n)
    assert p["samples"] == 8 * p["batches"] and "per consumer" in p["nominal"]
    with pytest.raises(TypeError, match="bogus"):
        ringfeed.plan(urls, bogus=1)
    with pytest.raises(ringfeed.ConfigError, match="batch_size"):
        ringfeed.plan(urls, batch_size=0, **cfg)
    with pytest.raises(ringfeed.DatasetError, match="absent"):
        ringfeed.plan(f"s3://{s3_server.bucket}/len/absent-{{0..3}}.tar", **cfg)
    # With the counts known, the length is exact: ceil(share / batch) a worker.
    index_urls, index_counts = shards(s3_server, "len-index", n=4, index=True)
    total = sum(index_counts)
    ds = RingfeedDataset(index_urls, batch_size=8, **cfg)
    assert len(ds) == math.ceil(total / 8)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    assert len(dl) == math.ceil(total / 8) == len(list(dl)), "one worker reads"
    ds = RingfeedDataset(index_urls, batch_size=8, split_workers=True, **cfg)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    per_worker = math.ceil(total / 2)  # remainder "pad": every consumer the same
    assert len(dl) == 2 * math.ceil(per_worker / 8) == len(list(dl))


def test_a_dataloader_that_batches_the_items_again_is_told_batch_size_none(small_shards):
    ds = RingfeedDataset(small_shards, batch_size=4)
    for workers in (0, 2):
        # DataLoader's default batch_size=1 would add a dimension.
        with pytest.raises(TypeError, match=r"batch_size=None"):
            next(iter(torch.utils.data.DataLoader(ds, num_workers=workers)))
        with pytest.raises(TypeError, match=r"batch_size=None"):
            len(torch.utils.data.DataLoader(ds, batch_size=2, num_workers=workers))
        # Control: batch_size=None gives the engine's batches as they are.
        item = next(iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)))
        assert len(item["__key__"]) == 4
        # A collate_fn of one's own combines batches on purpose.
        pairs = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=workers, collate_fn=list)
        assert [len(b["__key__"]) for b in next(iter(pairs))] == [4, 4]
