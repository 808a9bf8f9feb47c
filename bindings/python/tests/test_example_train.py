"""examples/train.py under torchrun: two ranks (gloo, CPU), decoding in the
engine's image pipeline (no DataLoader worker) or in two DataLoader workers
a rank; rank 0 is killed mid-epoch, the job is started again, resumes from
its checkpoints, and every rank trains on exactly the samples, in exactly
the order, of a run that never stopped."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require

torch = require("torch", "the training example")
require("torchdata.stateful_dataloader", "the training example")
require("PIL", "the training example")

import ringfeed  # noqa: E402

from conftest import REPO  # noqa: E402

EXAMPLE = REPO / "examples" / "train.py"
RANKS, WORKERS, EPOCHS = 2, 2, 2


def torchrun(*args, cwd, prefix=()):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    return subprocess.run(
        [*prefix, torchrun, "--standalone", "--nproc_per_node", str(RANKS), str(EXAMPLE), *args],
        cwd=cwd, capture_output=True, text=True, timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def example_module():
    spec = importlib.util.spec_from_file_location("train_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def expected_order(urls, epoch, rank, pipeline):
    """What rank `rank` trains on in `epoch` without a stop: its two workers'
    batches (each a consumer of the engine's split) taken in turn, as the
    DataLoader does; with the engine's pipeline, the rank's own batches."""
    from ringfeed.torch import _ENGINE_THREADS

    ds = example_module().dataset(urls, 16, 7, pipeline)
    if pipeline == "engine":
        with ringfeed.Loader(
            urls, batch_size=ds.batch_size, workers=_ENGINE_THREADS, epoch=epoch, epochs=epoch + 1,
            rank=rank, world_size=RANKS, loader_worker=0, loader_workers=1, **ds.config,
        ) as loader:
            return [k for b in loader for k in b.keys]
    per_worker = []
    for w in range(WORKERS):
        with ringfeed.Loader(
            urls, batch_size=ds.batch_size, workers=4 // WORKERS, epoch=epoch, epochs=epoch + 1,
            rank=rank, world_size=RANKS, loader_worker=w, loader_workers=WORKERS, **ds.config,
        ) as loader:
            per_worker.append([b.keys for b in loader])
    assert len({len(b) for b in per_worker}) == 1, "equal lengths"
    return [k for batches in zip(*per_worker) for batch in batches for k in batch]


def logged(out, rank):
    """{epoch: [keys in order]} from the rank's log; the steps must run 1, 2, ..."""
    by_epoch, steps = {}, []
    for line in (out / f"keys-rank{rank}.log").read_text().splitlines():
        step, epoch, key = line.split()
        by_epoch.setdefault(int(epoch), []).append(key)
        if not steps or steps[-1] != int(step):
            steps.append(int(step))
    assert steps == list(range(1, len(steps) + 1)), f"rank {rank}: steps {steps}"
    return by_epoch


@pytest.mark.parametrize("pipeline", ["engine", "workers"])
def test_killed_mid_epoch_and_resumed_trains_on_exactly_the_uninterrupted_samples(tmp_path, pipeline):
    data, out = tmp_path / "data", tmp_path / "run"
    made = subprocess.run(
        [sys.executable, str(EXAMPLE), "make-data", str(data), "--shards", "4", "--per-shard", "48"],
        capture_output=True, text=True, timeout=120,
    )
    assert made.returncode == 0, made.stderr
    urls = sorted(str(p) for p in data.glob("train-*.tar"))

    # 192 samples, 96 a rank: 6 steps of 16 an epoch (with workers, 4
    # consumers of 48, 3 batches of 16 each, taken in turn).
    first = torchrun("train", str(data), str(out), "--pipeline", pipeline, "--epochs", str(EPOCHS),
                     "--ckpt-every", "4", "--kill-at-step", "5", cwd=tmp_path)
    assert first.returncode != 0, "rank 0 killed itself"
    assert "killing myself after step 5" in first.stdout + first.stderr
    assert not (out / "done-rank0").exists()
    assert all((out / f"ckpt-rank{r}.pt").exists() for r in range(RANKS))

    second = torchrun("train", str(data), str(out), "--pipeline", pipeline, "--epochs", str(EPOCHS),
                      "--ckpt-every", "4", cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    text = second.stdout + second.stderr
    assert "rank 0: resumed at epoch 0, step 4" in text and "rank 1: resumed at epoch 0, step 4" in text

    exactly_the_uninterrupted_samples(out, urls, pipeline)


def exactly_the_uninterrupted_samples(out, urls, pipeline):
    """Every rank's log is, epoch by epoch, what it trains on without a
    stop, and the ranks together train on every sample once an epoch."""
    everything = []
    for rank in range(RANKS):
        got = logged(out, rank)
        assert sorted(got) == list(range(EPOCHS))
        for epoch in range(EPOCHS):
            assert got[epoch] == expected_order(urls, epoch, rank, pipeline), f"rank {rank}, epoch {epoch}"
            everything += [(epoch, k) for k in got[epoch]]
        assert (out / f"done-rank{rank}").read_text().strip() == str(EPOCHS * 6)
    with ringfeed.Loader(urls, batch_size=64) as loader:
        keys = sorted(k for b in loader for k in b.keys)
    for epoch in range(EPOCHS):
        trained = sorted(k for e, k in everything if e == epoch)
        assert trained == keys, f"epoch {epoch}: every sample once across the ranks"


def test_checkpoints_written_once_through_a_mount_of_the_store_resume_exactly(tmp_path):
    """The Kubernetes layout (deploy/training-job.yaml): checkpoints go to a
    write-once mount of the object store (the CSI driver's volume is a
    `ringfeed mount`) running in a pid namespace of its own (the driver's
    pod), the ranks in another (the trainer's), so that only an fsync
    completes a file; one file a step and rank, each one object; rank 0 is
    killed mid-epoch and the job, started again, resumes from the latest
    step every rank saved."""
    from conftest import run_s3_server
    from test_mount import s3_env
    # Skips where namespaces or FUSE mounts cannot be made.
    from test_mount_writers import OWN_PIDNS, private_mounts
    from test_mount_writers import mount as mount_in

    data, out = tmp_path / "data", tmp_path / "run"
    made = subprocess.run(
        [sys.executable, str(EXAMPLE), "make-data", str(data), "--shards", "4", "--per-shard", "48"],
        capture_output=True, text=True, timeout=120,
    )
    assert made.returncode == 0, made.stderr
    urls = sorted(str(p) for p in data.glob("train-*.tar"))
    (tmp_path / "s3").mkdir()
    with run_s3_server(tmp_path / "s3") as server:
        bucket = server.root / server.bucket

        def objects():
            return sorted(p.name for p in (bucket / "ckpt").glob("*")) if (bucket / "ckpt").exists() else []

        with private_mounts(tmp_path) as ns, \
                mount_in(ns, OWN_PIDNS, f"s3://{server.bucket}/ckpt/", tmp_path, "--endpoint-url",
                         server.endpoint, env=s3_env(server)) as m:
            args = ["train", str(data), str(out), "--epochs", str(EPOCHS), "--ckpt-every", "4",
                    "--ckpt-dir", str(m.path)]
            first = torchrun(*args, "--kill-at-step", "5", cwd=tmp_path, prefix=ns.cmd())
            assert first.returncode != 0, "rank 0 killed itself"
            assert "killing myself after step 5" in first.stdout + first.stderr
            assert objects() == [f"ckpt-rank{r}-step00000004.pt" for r in range(RANKS)]

            second = torchrun(*args, cwd=tmp_path, prefix=ns.cmd())
            assert second.returncode == 0, second.stdout + second.stderr
            text = second.stdout + second.stderr
            assert "rank 0: resumed at epoch 0, step 4" in text and "rank 1: resumed at epoch 0, step 4" in text
            assert "was closed before an fsync" not in m.log_text()
        # 12 steps, a checkpoint every 4: three a rank, each an object whole.
        assert objects() == [f"ckpt-rank{r}-step{s:08d}.pt" for r in range(RANKS) for s in (4, 8, 12)]
        for name in objects():
            state = torch.load(bucket / "ckpt" / name, weights_only=False)
            assert f"step{state['step']:08d}" in name, name
    exactly_the_uninterrupted_samples(out, urls, "engine")
