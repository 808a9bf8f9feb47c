"""ringfeed.torch.checkpoint: torch.distributed.checkpoint saved to and
loaded from the S3 test server by a real process group (2 ranks, gloo);
a save that fails, or is killed after its parts were uploaded and before
their completion, leaves no object and no `.metadata`, and loading it is
refused; a checkpoint the server refuses to show (AccessDenied,
ExpiredToken) raises that error, never "no checkpoint"; an existing
checkpoint is not overwritten unless asked."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager

import pytest
import ringfeed

from conftest import require, run_s3_server, skip_for_environment

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
        # Both ranks here before the group goes: gloo's threads free a
        # collective's tensors after it returns, and an exit under them aborts.
        torch.distributed.barrier()
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


# A rank's save, in a process the test kills: one data object of 12 MiB in
# parts of 5 MiB (S3's smallest), so its upload has parts before its
# completion, which the server holds.
KILLED_SAVE = textwrap.dedent("""
    import sys, json, torch
    import torch.distributed.checkpoint as dcp
    from ringfeed.torch.checkpoint import StorageWriter

    config = json.loads(sys.argv[2])
    dcp.save({"w": torch.ones(3 << 20)}, storage_writer=StorageWriter(sys.argv[1], **config))
""")


def wait_for(what, condition, proc, seconds=120):
    deadline = time.monotonic() + seconds
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the save exited ({proc.returncode}) before {what}: "
                                 f"{proc.stderr.read().decode()}")
        assert time.monotonic() < deadline, f"no {what} in {seconds} s"
        time.sleep(0.05)


def test_a_save_killed_after_its_parts_and_before_their_completion_leaves_no_object(tmp_path):
    """The kill lands after every part of the data object is uploaded and
    while its completion is held by the server: no object, no `.metadata`,
    the upload left open for the bucket's lifecycle rule (a killed process
    cannot abort it), and loading refuses the checkpoint."""
    import json

    with run_s3_server(tmp_path, "--hold-complete") as server:
        config = dict(server.config(), part_size=5 << 20)
        url = f"s3://{server.bucket}/ckpt-killed"
        saver = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, url, json.dumps(config)],
                                 env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            held = f"holding CompleteMultipartUpload of {server.bucket}/ckpt-killed/__0_0.distcp"
            wait_for("held completion", lambda: held in server.log.read_text(), saver)
            # Every part is on the server: 5 + 5 MiB, and the rest of the
            # tensor's 12 MiB with torch's framing.
            sizes = [p.stat().st_size for p in sorted(server.root.glob(".upload_id-*.part-*"))]
            assert sizes[:2] == [5 << 20, 5 << 20] and len(sizes) == 3 and sizes[2] >= 2 << 20, sizes
            saver.send_signal(signal.SIGKILL)
        finally:
            saver.kill()
            saver.wait()
        assert saver.returncode == -signal.SIGKILL
        with pytest.raises(ringfeed.DatasetError, match="holds no objects"):
            ringfeed.list_objects(url + "/", **config)
        assert not ringfeed.object_exists(url + "/__0_0.distcp", **config)
        assert not ringfeed.object_exists(url + "/.metadata", **config)
        # The upload is left open with its parts (the lifecycle rule's to
        # remove): its record and parts are still on the server.
        assert len(list(server.root.glob(".upload-*.json"))) == 1
        assert len(list(server.root.glob(".upload_id-*.part-*"))) == 3
        with pytest.raises(CheckpointException, match="did not finish"):
            dcp.load({"w": torch.zeros(3 << 20)}, storage_reader=StorageReader(url, **config))


def _old_exists(path, config):
    """What ObjectFileSystem.exists did: a listing, any error taken for "absent"."""
    try:
        return any(u == path for u, _ in ringfeed.list_objects(path, **config))
    except ringfeed.DatasetError:
        return False


def test_a_checkpoint_the_credentials_may_not_read_is_not_taken_for_a_missing_one(tmp_path):
    bucket = "ringfeed-test"
    denials = ["--deny", f"{bucket}/ckpt-denied/:AccessDenied", "--deny", f"{bucket}/ckpt-expired/:ExpiredToken"]
    state = {"w": torch.arange(100, dtype=torch.float32)}
    saved = tmp_path / "saved"
    dcp.save(state, storage_writer=StorageWriter(str(saved)))
    with run_s3_server(tmp_path, *denials) as server:
        config = server.config()
        # The same checkpoint under three prefixes (s3s-fs keeps objects as
        # files): one readable, two the server refuses.
        for prefix in ("ckpt-open", "ckpt-denied", "ckpt-expired"):
            shutil.copytree(saved, server.root / bucket / prefix)
        back = {"w": torch.zeros(100)}
        dcp.load(back, storage_reader=StorageReader(f"s3://{bucket}/ckpt-open", **config))
        assert torch.equal(back["w"], state["w"])

        for prefix, code in (("ckpt-denied", "AccessDenied"), ("ckpt-expired", "ExpiredToken")):
            url = f"s3://{bucket}/{prefix}"
            with pytest.raises(ringfeed.DatasetError, match=code) as e:
                ObjectFileSystem(config).exists(url + "/.metadata")
            assert not isinstance(e.value, FileNotFoundError)
            with pytest.raises(ringfeed.DatasetError, match=code) as e:
                StorageReader(url, **config).read_metadata()
            assert not isinstance(e.value, FileNotFoundError)
            # dcp.load (torch 2.15 puts the reader's errors in the text of
            # its own) names the refusal, not a save that did not finish.
            with pytest.raises(CheckpointException) as e:
                dcp.load({"w": torch.zeros(100)}, storage_reader=StorageReader(url, **config))
            (failure, _), = e.value.failures.values()
            assert not isinstance(failure, FileNotFoundError), failure
            assert code in str(failure) and "did not finish" not in str(failure), failure
            # Control: the old check took the refusal for "no checkpoint".
            assert _old_exists(url + "/.metadata", config) is False

        # A checkpoint that is not there is still "did not finish".
        missing = f"s3://{bucket}/ckpt-missing"
        assert ObjectFileSystem(config).exists(missing + "/.metadata") is False
        with pytest.raises(IncompleteCheckpointError, match="did not finish"):
            StorageReader(missing, **config).read_metadata()
        with pytest.raises(CheckpointException, match="did not finish"):
            dcp.load({"w": torch.zeros(100)}, storage_reader=StorageReader(missing, **config))


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
