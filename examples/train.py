#!/usr/bin/env python3
"""Train a small image classifier on WebDataset shards with ringfeed, under
torchrun, with the engine's image pipeline (or DataLoader workers),
checkpoints and exact resume.

    # shards of real JPEG images (classes by colour) made with Pillow
    python examples/train.py make-data /tmp/rf-data
    # two ranks on the CPU (gloo); the engine decodes, crops and flips
    torchrun --nproc_per_node=2 examples/train.py train /tmp/rf-data /tmp/rf-run --epochs 2
    # the same with two DataLoader workers a rank decoding with torchvision
    torchrun --nproc_per_node=2 examples/train.py train /tmp/rf-data /tmp/rf-run2 --pipeline workers

Every rank reads its own share of each epoch (the engine splits the samples
over ranks and DataLoader workers: nothing read twice, equal lengths) and
trains a DistributedDataParallel model. With ``--pipeline engine`` (the
default) the engine's own threads decode each JPEG, take a random crop,
flip it and normalize it (``TRANSFORM``, ported from torchvision's
``RandomResizedCrop``, ``RandomHorizontalFlip`` and ``Normalize``): each
item is a batch tensor over the engine's memory, and the DataLoader runs no
worker. With ``--pipeline workers`` two DataLoader workers a rank decode
with ``.decode("torchrgb8")``. Every ``--ckpt-every`` steps each rank saves the model, the optimizer
and its loader's state (torchdata's StatefulDataLoader, which asks each
worker's `RingfeedDataset.state_dict()`) to ``OUT/ckpt-rank<r>.pt``, written
to a temporary file and renamed, so a crash never leaves half a checkpoint.
With ``--ckpt-dir DIR`` (a write-once mount of the object store: ``ringfeed
mount`` or a volume of the CSI driver, where a file is one object once
closed and nothing is renamed) each checkpoint is a file of its own,
``DIR/ckpt-rank<r>-step<step>.pt``, written once; a restart loads the
latest step every rank saved.

Started again on the same OUT after a crash, it loads the checkpoints and
continues the epoch exactly where the checkpoint was taken: the same samples
in the same order as a run that never stopped. Each rank logs the keys it
trained on, step by step, in ``OUT/keys-rank<r>.log``; on resume the steps
after the checkpoint (trained, but lost with the crash) are cut from the log,
so the log is what the model learned from. ``--kill-at-step N`` makes rank 0
kill itself with SIGKILL after step N, to show it.
"""

import argparse
import io
import json
import os
import signal
import sys
from pathlib import Path

CLASSES = 4
SIZE = 16


def make_data(out, shards, per_shard, seed):
    """Shards of JPEG images whose class is the colour channel that
    dominates, with noise; each sample: jpg, cls, json."""
    import tarfile

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    i = 0
    for s in range(shards):
        with tarfile.open(out / f"train-{s:04d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for _ in range(per_shard):
                label = int(rng.integers(CLASSES))
                a = rng.integers(0, 90, size=(SIZE, SIZE, 3))
                if label < 3:
                    a[..., label] += 150
                else:
                    a += 100  # grey
                img = Image.fromarray(a.clip(0, 255).astype(np.uint8))
                ext = "jpg"
                buf = io.BytesIO()
                img.save(buf, format="JPEG", quality=95)
                key = f"{s:04d}/{i:06d}"
                for name, data in (
                    (f"{key}.{ext}", buf.getvalue()),
                    (f"{key}.cls", str(label).encode()),
                    (f"{key}.json", json.dumps({"index": i}).encode()),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                i += 1
    print(f"wrote {shards} shards, {i} samples: {out}/train-{{0000..{shards - 1:04d}}}.tar")


# The engine's image pipeline: torchvision's RandomResizedCrop(SIZE,
# scale=(0.5, 1)), RandomHorizontalFlip() and Normalize() on [0, 1] floats,
# as a `transform` spec (`ringfeed.torch.from_torchvision` makes one from a
# torchvision Compose), and the labels as int64.
TRANSFORM = {
    "jpg": {
        "random_resized_crop": {"size": SIZE, "scale": [0.5, 1.0]},
        "flip": 0.5,
        "dtype": "float32",
        "normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
    },
    "cls": "int64",
}


def dataset(urls, batch_size, seed, pipeline="engine", node=None):
    """The data pipeline: what the test suite also builds to know the order.
    `node`: a node engine's socket to attach to (with ``--pipeline
    workers``: a node engine does not run the image pipeline)."""
    from ringfeed.torch import RingfeedDataset

    attach = {"node": node} if node else {}
    if pipeline == "engine":
        # Items: (images float32 (B, 3, SIZE, SIZE), labels int64 (B,), keys).
        return RingfeedDataset(
            urls, batch_size=batch_size, seed=seed, shuffle=True, shuffle_buffer=64,
            memory_budget="32MiB", chunk_size="1MiB", transform=TRANSFORM, keys=True, **attach,
        )
    return (
        RingfeedDataset(
            urls,
            batch_size=batch_size,
            seed=seed,
            shuffle=True,
            shuffle_buffer=64,
            # Small shards: a small arena opens fast and holds plenty.
            memory_budget="32MiB",
            chunk_size="1MiB",
            **attach,
        )
        .decode("torchrgb8")
        .to_tuple("jpg", "cls", "__key__")
        .map_tuple(lambda x: (x.float() / 255 - 0.5) / 0.25, None, None)
    )


def save_atomically(obj, path):
    import torch

    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_once(obj, path):
    """Writes a new file, never replacing one, and fsyncs it before its
    close: on a write-once mount the file becomes one object then, and a
    writer killed before leaves none. (Through a CSI volume the mount runs
    in another pod's pid namespace and cannot tell a close from a death:
    there only the fsync completes a file.)"""
    import torch

    with open(path, "xb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def latest_common_step(ckpt_dir, rank):
    """The latest step whose checkpoint every rank saved in `ckpt_dir` (0:
    none): a rank killed while saving leaves the others a step ahead."""
    import torch
    import torch.distributed as dist

    steps = [int(p.name.rsplit("step", 1)[1].removesuffix(".pt"))
             for p in ckpt_dir.glob(f"ckpt-rank{rank}-step*.pt")]
    t = torch.tensor([max(steps, default=0)])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t)


def train(a):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torchdata.stateful_dataloader import StatefulDataLoader

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    # A directory of shards (make-data's), or the dataset's URLs as a
    # pattern: 's3://bucket/train/shard-{000000..001023}.tar'.
    data = Path(a.data)
    urls = sorted(str(p) for p in data.glob("train-*.tar")) if data.is_dir() else a.data

    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(16, CLASSES),
        )
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # Persistent workers keep their dataset, and with it their engine, from
    # one epoch to the next: each iter() is the next epoch (workers made
    # afresh each epoch would need dataset.set_epoch(e) first).
    # The engine's pipeline needs no DataLoader worker: its threads decode.
    workers = a.workers if a.pipeline == "workers" else 0
    loader = StatefulDataLoader(
        dataset(urls, a.batch_size, a.seed, a.pipeline, a.node), batch_size=None, num_workers=workers,
        persistent_workers=workers > 0, multiprocessing_context="fork" if workers else None,
        timeout=120 if workers else 0,
    )

    ckpt_dir = Path(a.ckpt_dir) if a.ckpt_dir else None
    if ckpt_dir is None:
        ckpt = out / f"ckpt-rank{rank}.pt"
    else:
        common = latest_common_step(ckpt_dir, rank)
        ckpt = ckpt_dir / f"ckpt-rank{rank}-step{common:08d}.pt"
    log_path = out / f"keys-rank{rank}.log"
    step = epoch = 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        loader.load_state_dict(state["loader"])
        step, epoch = state["step"], state["epoch"]
        # Steps after the checkpoint were lost with the crash: cut them.
        logged = log_path.read_text().splitlines() if log_path.exists() else []
        kept = [ln for ln in logged if int(ln.split()[0]) <= step]
        log_path.write_text("".join(ln + "\n" for ln in kept))
        print(f"rank {rank}: resumed at epoch {epoch}, step {step}", flush=True)
    log = open(log_path, "a")

    loss_fn = nn.CrossEntropyLoss()
    while epoch < a.epochs:
        seen = correct = 0
        for images, labels, keys in loader:
            logits = model(images)
            loss = loss_fn(logits, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            seen += len(labels)
            correct += int((logits.argmax(1) == labels).sum())
            log.write("".join(f"{step} {epoch} {k}\n" for k in keys))
            log.flush()
            if step % a.ckpt_every == 0:
                # The loader's state now says: after this step's batch.
                state = {"model": model.module.state_dict(), "optim": opt.state_dict(),
                         "loader": loader.state_dict(), "step": step, "epoch": epoch}
                if ckpt_dir is None:
                    save_atomically(state, ckpt)
                else:
                    save_once(state, ckpt_dir / f"ckpt-rank{rank}-step{step:08d}.pt")
            if rank == 0 and step == a.kill_at_step:
                print(f"rank 0: killing myself after step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        epoch += 1
        print(f"rank {rank} of {world}: epoch {epoch - 1} done, step {step}, "
              f"train accuracy {correct / max(seen, 1):.2f} on {seen} samples", flush=True)
    log.close()
    (out / f"done-rank{rank}").write_text(f"{step}\n")
    dist.barrier()  # every rank done before the group goes (gloo frees tensors late)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-data", help="write shards of generated images")
    m.add_argument("out")
    m.add_argument("--shards", type=int, default=4)
    m.add_argument("--per-shard", type=int, default=96)
    m.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("train", help="train (run under torchrun)")
    t.add_argument("data", help="a directory of shards (make-data's), or the dataset's URLs")
    t.add_argument("out")
    t.add_argument("--epochs", type=int, default=2)
    t.add_argument("--batch-size", type=int, default=16)
    t.add_argument("--pipeline", choices=["engine", "workers"], default="engine",
                   help="decode in the engine's threads, or in DataLoader workers")
    t.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank (--pipeline workers)")
    t.add_argument("--node", help="a node engine's socket to attach to (with --pipeline workers)")
    t.add_argument("--seed", type=int, default=7)
    t.add_argument("--ckpt-every", type=int, default=4)
    t.add_argument("--ckpt-dir", help="checkpoints as files written once, one a step and rank "
                   "(a write-once mount of the object store); default: OUT, one a rank, replaced")
    t.add_argument("--kill-at-step", type=int, default=-1)
    a = ap.parse_args()
    if a.cmd == "make-data":
        make_data(a.out, a.shards, a.per_shard, a.seed)
    else:
        train(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
