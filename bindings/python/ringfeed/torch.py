"""PyTorch: `RingfeedDataset`, an IterableDataset over ringfeed.

Work is split by shard: the shard list (`ringfeed.expand_urls`) is dealt
round-robin over ``world_size * num_workers`` consumers, consumer
``rank * num_workers + worker_id`` taking every such shard. The rank and
world size come from ``torch.distributed`` when it is initialised, else from
the ``RANK`` / ``WORLD_SIZE`` environment variables, else 0 / 1; the worker
from ``torch.utils.data.get_worker_info()``. A consumer with no shard yields
nothing (give at least ``world_size * num_workers`` shards).

The engine is opened inside ``__iter__``, so in the DataLoader worker that
iterates (fork or spawn), never inherited across a fork; it is closed when
the iteration ends. Each item is one engine batch passed through
``transform`` (default `to_tensors`); use ``DataLoader(ds, batch_size=None)``.

State (``state_dict()`` / ``load_state_dict()``, as torchdata's
StatefulDataLoader calls them in each worker): ``{"epoch": e,
"samples_yielded": n}`` — this consumer has completed ``e`` passes and
yielded ``n`` samples of the current one. Resuming skips ``n`` samples of
this consumer's stream. The stream's order is deterministic only with the
engine's ``workers=1``; with more engine threads, the skipped samples are
``n`` samples, not necessarily the same ones (exact resume is a later issue).
When the resume point falls inside an engine batch, `transform` gets that
batch's remaining samples as a copied stand-in that offers ``keys``,
``fields``, ``len()`` and ``[name].gather()`` / ``.lengths`` only (what
`to_tensors` uses).
"""

import os

import numpy as np
import torch
import torch.utils.data

from ._loader import Loader
from .urls import expand_urls


def to_tensors(batch):
    """Default transform: ``{"__key__": [str], field: (values, offsets)}``, per
    field the bytes of every sample gathered into one uint8 tensor (a copy)
    and int64 offsets (``batch + 1`` entries)."""
    out = {"__key__": batch.keys}
    for name in batch.fields:
        values, offsets = batch[name].gather()
        out[name] = (torch.from_numpy(values), torch.from_numpy(offsets))
    return out


def rank_and_world():
    """(rank, world_size): torch.distributed when initialised, else RANK/WORLD_SIZE, else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class RingfeedDataset(torch.utils.data.IterableDataset):
    """``RingfeedDataset(urls, batch_size=32, transform=to_tensors, **config)``.

    `config` keys are those of `ringfeed.Loader` (``epochs`` is fixed to 1:
    one ``iter()`` is one epoch). `transform` gets each `ringfeed.Batch` and
    returns the item; the batch is released after it returns (arrays it
    exported stay valid and hold the engine's memory while they live).
    """

    def __init__(self, urls, batch_size=32, transform=to_tensors, **config):
        super().__init__()
        if "epochs" in config:
            raise TypeError("RingfeedDataset: `epochs` is not a keyword here; each iter() is one epoch")
        self.shards = expand_urls(urls)
        self.batch_size = batch_size
        self.transform = transform
        self.config = config
        self._epoch = 0
        self._samples_yielded = 0
        self._skip = 0

    def my_shards(self):
        """The shards of this consumer (rank, DataLoader worker)."""
        rank, world = rank_and_world()
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.shards[rank * nw + wid :: world * nw]

    def __iter__(self):
        shards = self.my_shards()
        skip, self._skip = self._skip, 0
        self._samples_yielded = skip
        if shards:
            with Loader(shards, batch_size=self.batch_size, epochs=1, **self.config) as loader:
                for batch in loader:
                    with batch:
                        n = len(batch)
                        if skip >= n:
                            skip -= n
                            continue
                        if skip:
                            item = self.transform(_Skipped(batch, skip))
                            n -= skip
                            skip = 0
                        else:
                            item = self.transform(batch)
                    self._samples_yielded += n
                    yield item
        self._epoch += 1
        self._samples_yielded = 0

    def state_dict(self):
        return {"epoch": self._epoch, "samples_yielded": self._samples_yielded}

    def load_state_dict(self, state):
        self._epoch = int(state["epoch"])
        self._skip = int(state["samples_yielded"])
        self._samples_yielded = self._skip

    def __getstate__(self):
        return dict(self.__dict__)


class _Skipped:
    """A batch without its first `skip` samples (for resuming mid-batch), copied."""

    def __init__(self, batch, skip):
        self.keys = batch.keys[skip:]
        self.fields = batch.fields
        self.epoch, self.index = batch.epoch, batch.index
        self._cols = {}
        for name in self.fields:
            values, offsets = batch[name].gather()
            self._cols[name] = _Gathered(values[offsets[skip] :], offsets[skip:] - offsets[skip])

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, name):
        return self._cols[name]


class _Gathered:
    def __init__(self, values, offsets):
        self._v, self._o = values, offsets

    def gather(self):
        return self._v, self._o

    @property
    def lengths(self):
        return np.diff(self._o)
