"""One rank of tests/test_multinode.py, started by torchrun in a node's
network namespace: joins the job's gloo group across the namespaces, reads
one epoch through `RingfeedDataset` attached to its node's engine (the
socket in argv), and writes what it read, the engine it was served by and
the job-wide count the group's all_reduce gives.

    multinode_rank.py SOCKET OUT_DIR URL CONFIG_JSON
"""

import json
import sys

import torch
import torch.distributed as dist

from ringfeed.torch import RingfeedDataset


def main():
    socket, out, url, config = sys.argv[1:5]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = RingfeedDataset(url, node=socket, keep_open=False, **json.loads(config))
    keys, engine = [], None
    for item in ds:
        keys += [k.decode() for k in item["__key__"].tolist()]
        if engine is None:
            engine = ds._loader.stats()["node"]
    total = torch.tensor([len(keys)])
    dist.all_reduce(total)
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"rank": rank, "world": world, "keys": keys, "engine": engine, "total": int(total)}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
