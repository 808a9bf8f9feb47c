"""One rank of test_torch_split.py, started by torchrun: a DDP job (gloo,
CPU) over `s3://` shards that have no manifest, as a user writes it: a
RingfeedDataset, a DataLoader with two workers and ``batch_size=None``, a
model trained on every batch. The S3 endpoint and credentials come from the
environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...), as for any S3 tool.

Writes ``{"len": len(loader), "batches": [[key, ...], ...]}`` per epoch to
``OUT/rank-R.json``; every byte of every sample is checked against what
`ringfeed gen` wrote (conftest's `synth_content`) first.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ringfeed.torch import RingfeedDataset

from conftest import synth_content


def main(urls, out, epochs, seed):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = RingfeedDataset(urls, batch_size=8, shuffle=True, seed=3)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    result = []
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        keys = []
        for item in loader:
            jpg = item["jpg"]
            # A feature per sample from its bytes: the consumer reads
            # every byte, as a trainer decoding them would.
            x = torch.stack([
                torch.tensor([float(jpg[i].sum()), float(len(jpg[i])), 1.0, float(i)])
                for i in range(len(jpg))
            ]) / 1e6
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()  # a DDP all-reduce: a rank with fewer batches would hang here
            opt.step()
            names = [k.decode() for k in item["__key__"].tolist()]
            for i, key in enumerate(names):
                data = bytes(jpg[i].numpy())
                if data != synth_content(seed, key, "jpg", len(data)):
                    raise AssertionError(f"rank {rank}: sample {key}: wrong bytes")
            keys.append(names)
        result.append({"len": len(loader), "batches": keys})
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
