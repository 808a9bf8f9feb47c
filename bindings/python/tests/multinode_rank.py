"""One rank of tests/test_multinode.py, started by torchrun in a node's
network namespace: joins the job's gloo group across the namespaces and
reads through `RingfeedDataset` attached to its node's engine (the socket
in argv), then writes what it read, the engine it was served by and the
job-wide count the group's all_reduce gives, to OUT_DIR/<mode>-rank<r>.json.

    multinode_rank.py MODE SOCKET OUT_DIR URL CONFIG_JSON [STATES_JSON]

MODE `epoch`: one whole epoch. `cut`: STOP batches, then the rank writes
its keys and its state (`state_dict()`, a checkpoint) and waits to be
killed, as a job whose node dies mid-epoch. `resume`: the epoch's rest,
from every old rank's state (an elastic resume: `load_state_dict` with
the list of states).
"""

import json
import sys
import time

import torch
import torch.distributed as dist

from ringfeed.torch import RingfeedDataset

STOP = 2


def main():
    mode, socket, out, url, config = sys.argv[1:6]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = RingfeedDataset(url, node=socket, keep_open=False, **json.loads(config))
    if mode == "resume":
        ds.load_state_dict({"epoch": 0, "state": json.loads(sys.argv[6])})
    keys, engine, state = [], None, None
    for n, item in enumerate(ds, 1):
        keys += [k.decode() for k in item["__key__"].tolist()]
        if engine is None:
            engine = ds._loader.stats()["node"]
        if mode == "cut" and n == STOP:
            state = ds.state_dict()["state"]
            break
    total = torch.tensor([len(keys)])
    dist.all_reduce(total)
    with open(f"{out}/{mode}-rank{rank}.json", "w") as f:
        json.dump({"rank": rank, "world": world, "keys": keys, "engine": engine, "total": int(total),
                   "state": state}, f)
    if mode == "cut":
        while True:  # killed here, with its node
            time.sleep(1)
    dist.barrier()  # every rank here before the group goes (gloo frees tensors late)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
