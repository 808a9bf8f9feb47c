"""ringfeed.torch.checkpoint: torch.distributed.checkpoint saved to and
loaded from the S3 test server by a real process group (2 ranks, gloo);
a save that fails or is killed part way leaves no `.metadata`, and loading
it is refused; an existing checkpoint is not overwritten unless asked."""

import os
import subprocess
import sys
import textwrap
from contextlib import contextmanager

import pytest
import ringfeed

from conftest import require, skip_for_environment

torch = require("torch", "torch.distributed.checkpoint over ringfeed objects")
if not torch.distributed.is_available():
    skip_for_environment("this torch build has no torch.distributed")
dcp = require("torch.distributed.checkpoint", "torch.distributed.checkpoint over ringfeed objects")
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from ringfeed.torch.checkpoint import (  # noqa: E402
    IncompleteCheckpointError,
    ObjectFileSystem,
    StorageReader,
    StorageWriter,
)

WORLD = 2


def state_of(rank):
    """Each rank's own tensors, and one every rank shares."""
    g = torch.Generator().manual_seed(rank)
    return {
        "shared": torch.arange(1000, dtype=torch.float32),
        f"rank{rank}.weight": torch.randn(64, 64, generator=g),
        f"rank{rank}.bias": torch.full((3,), float(rank)),
        "step": torch.tensor(rank * 0 + 5),
    }


def zeros_like(state):
    return {k: torch.zeros_like(v) for k, v in state.items()}


class _FailingFileSystem(ObjectFileSystem):
    """Fails each data object in its first write, after the bytes went to
    the writer (torch closes, so commits, each stream itself once written)."""

    @contextmanager
    def create_stream(self, path, mode):
        with super().create_stream(path, mode) as stream:
            if mode == "wb" and str(path).endswith(".distcp"):
                write = stream.write

                def failing_write(b):
                    write(b)
                    raise RuntimeError("injected failure before the commit")

                stream.write = failing_write
            yield stream


def _rank_main(rank, init_file, config, good_url, failed_url):
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        state = state_of(rank)
        dcp.save(state, storage_writer=StorageWriter(good_url, **config))
        back = zeros_like(state)
        dcp.load(back, storage_reader=StorageReader(good_url, **config))
        for k in state:
            assert torch.equal(back[k], state[k]), (rank, k)

        writer = StorageWriter(failed_url, **config)
        if rank == 1:
            writer.fs = _FailingFileSystem(config)
        with pytest.raises(CheckpointException) as e:
            dcp.save(state, storage_writer=writer)
        assert list(e.value.failures) == [1] and "injected failure" in str(e.value.failures[1])
    finally:
        torch.distributed.destroy_process_group()


def _names(url, config):
    return {u.rsplit("/", 1)[1] for u, _ in ringfeed.list_objects(url + "/", **config)}


def test_two_ranks_save_and_load_a_sharded_state_dict(s3_server, tmp_path):
    config = s3_server.config()
    good = f"s3://{s3_server.bucket}/ckpt-1"
    failed = f"s3://{s3_server.bucket}/ckpt-failed"
    torch.multiprocessing.spawn(
        _rank_main, args=(str(tmp_path / "init"), config, good, failed), nprocs=WORLD, join=True
    )
    assert _names(good, config) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    # Rank 1's object failed before its commit: nothing of it, and no metadata.
    assert ".metadata" not in _names(failed, config)
    assert "__1_0.distcp" not in _names(failed, config)
    # dcp.load wraps the reader's IncompleteCheckpointError.
    with pytest.raises(CheckpointException, match="did not finish"):
        dcp.load(zeros_like(state_of(0)), storage_reader=StorageReader(failed, **config))
    # One process (no group) loads the shards of both ranks.
    both = {**state_of(0), **state_of(1)}
    back = zeros_like(both)
    dcp.load(back, storage_reader=StorageReader(good, **config))
    assert all(torch.equal(back[k], both[k]) for k in both)


KILLED_SAVE = textwrap.dedent("""
    import os, sys, json, torch
    import torch.distributed.checkpoint as dcp
    from ringfeed.objects import ObjectWriter
    from ringfeed.torch.checkpoint import StorageWriter

    def die(self, b):
        os._exit(17)  # killed mid-write: no commit, no metadata

    ObjectWriter.write = die
    config = json.loads(sys.argv[2])
    dcp.save({"w": torch.ones(1000)}, storage_writer=StorageWriter(sys.argv[1], **config))
""")


def test_a_killed_save_leaves_no_metadata_and_load_refuses(s3_server):
    import json

    config = s3_server.config()
    url = f"s3://{s3_server.bucket}/ckpt-killed"
    run = subprocess.run([sys.executable, "-c", KILLED_SAVE, url, json.dumps(config)],
                         env=dict(os.environ), capture_output=True, timeout=120)
    assert run.returncode == 17, run.stderr.decode()
    with pytest.raises(ringfeed.DatasetError):
        ringfeed.list_objects(url + "/.metadata", **config)
    with pytest.raises(CheckpointException, match="did not finish"):
        dcp.load({"w": torch.zeros(1000)}, storage_reader=StorageReader(url, **config))


def test_an_existing_checkpoint_is_kept_unless_overwrite(s3_server):
    config = s3_server.config()
    url = f"s3://{s3_server.bucket}/ckpt-twice"
    dcp.save({"w": torch.ones(10)}, storage_writer=StorageWriter(url, **config))
    with pytest.raises(CheckpointException, match="already exists"):
        dcp.save({"w": torch.zeros(10)}, storage_writer=StorageWriter(url, **config))
    back = {"w": torch.zeros(10)}
    dcp.load(back, storage_reader=StorageReader(url, **config))
    assert torch.equal(back["w"], torch.ones(10))
    with pytest.warns(UserWarning, match="overwriting"):
        dcp.save({"w": torch.full((10,), 2.0)}, storage_writer=StorageWriter(url, overwrite=True, **config))
    dcp.load(back, storage_reader=StorageReader(url, **config))
    assert torch.equal(back["w"], torch.full((10,), 2.0))


def test_local_directories_work_too(tmp_path):
    path = tmp_path / "ckpt"
    state = {"a": torch.randn(5, 5), "b": torch.arange(3)}
    dcp.save(state, storage_writer=StorageWriter(str(path)))
    assert (path / ".metadata").is_file() and not (path / ".metadata.tmp").exists()
    back = zeros_like(state)
    dcp.load(back, storage_reader=StorageReader(str(path)))
    assert all(torch.equal(back[k], state[k]) for k in state)
    with pytest.raises(CheckpointException, match="did not finish"):
        dcp.load(back, storage_reader=StorageReader(str(tmp_path / "nothing")))
    with pytest.raises(IncompleteCheckpointError, match="did not finish"):
        StorageReader(str(tmp_path / "nothing")).read_metadata()


def test_object_file_system_refuses_what_objects_cannot_do(tmp_path):
    fs = ObjectFileSystem()
    with pytest.raises(NotImplementedError, match="staged"):
        fs.rename(str(tmp_path / "a"), str(tmp_path / "b"))
    with pytest.raises(NotImplementedError, match="delete"):
        fs.rm_file(str(tmp_path / "a"))
    with pytest.raises(ValueError, match="mode"):
        with fs.create_stream(str(tmp_path / "a"), "ab"):
            pass
    assert fs.concat_path("s3://b/ck/", ".metadata") == "s3://b/ck/.metadata"
    assert StorageWriter.validate_checkpoint_id("s3://b/ck") and not StorageReader.validate_checkpoint_id("/x")
