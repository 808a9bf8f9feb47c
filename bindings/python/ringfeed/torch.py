"""PyTorch: `RingfeedDataset`, an IterableDataset over ringfeed.

The engine splits the data, not Python: each DataLoader worker of each rank
opens its own engine with ``rank`` / ``world_size`` (from ``torch.distributed``
when it is initialised, else the ``RANK`` / ``WORLD_SIZE`` environment
variables, else 0 / 1) and ``loader_worker`` / ``loader_workers`` (from
``torch.utils.data.get_worker_info()``). The engine plans the epoch once and
splits it by sample over the ``world_size * loader_workers`` consumers
(consumer ``rank * loader_workers + loader_worker``): every sample goes to
exactly one consumer, and every consumer gets the same number of batches, so
no rank waits for another at the end of an epoch. With ``remainder="pad"``
(the default) the short consumers repeat a few samples to even the lengths
out (``stats()["samples_padded"]``); ``remainder="drop"`` leaves the few
extra samples out instead. The order is fixed by the dataset, ``seed``,
``shuffle``/``shuffle_buffer`` and the layout (consumers and the engine's
``workers``), never by timing.

The engine is opened inside ``__iter__``, so in the DataLoader worker that
iterates (fork or spawn), never inherited across a fork; it is closed when
the iteration ends. One ``iter()`` is one epoch: the engine is opened with
``epoch=e, epochs=e + 1``, and the next ``iter()`` goes on with epoch
``e + 1`` (each epoch has its own shuffle). DataLoader workers that are not
persistent start from the main process's copy of the dataset: call
``set_epoch(e)`` before each epoch, as with ``DistributedSampler``. Each item
is one engine batch passed through ``transform`` (default `to_tensors`); use
``DataLoader(ds, batch_size=None)``.

State (``state_dict()`` / ``load_state_dict()``, as torchdata's
StatefulDataLoader calls them in each worker): ``{"epoch": e, "state": s}``,
where ``s`` is the engine's resume state (`ringfeed.Loader.state()`, as str)
after the last batch this consumer yielded, or None at the start of epoch
``e`` (after a whole epoch: ``{"epoch": e + 1, "state": None}``). Loading it
makes the next ``iter()`` open the engine with ``resume=s``: the epoch
continues exactly, the rest of it in the order the uninterrupted run would
have used, provided the dataset, the epoch settings and the layout (ranks,
DataLoader workers, ``workers``) are the same. To resume in another layout
(elastic), give each new consumer the states of *all* the old consumers:
``load_state_dict({"epoch": e, "state": [s0, s1, ...]})`` or
``RingfeedDataset(..., resume=[s0, s1, ...])``; the engine leaves out what
they delivered and splits the rest of the epoch over the new layout.
"""

import os

import torch
import torch.utils.data

from ._loader import Loader, _resume_value


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

    `config` keys are those of `ringfeed.Loader`, except the ones this class
    sets itself: ``epochs`` and ``epoch`` (one ``iter()`` is one epoch; see
    `set_epoch`), ``rank``, ``world_size``, ``loader_worker`` and
    ``loader_workers`` (from torch). ``resume=`` gives the state (or, for an
    elastic resume, the list of states) the first ``iter()`` starts from.
    `transform` gets each `ringfeed.Batch` and returns the item; the batch is
    released after it returns (arrays it exported stay valid and hold the
    engine's memory while they live).
    """

    # Keys this class passes to the engine itself.
    _OWN_KEYS = ("epochs", "epoch", "rank", "world_size", "loader_worker", "loader_workers")

    def __init__(self, urls, batch_size=32, transform=to_tensors, **config):
        super().__init__()
        for key in self._OWN_KEYS:
            if key in config:
                raise TypeError(
                    f"RingfeedDataset: `{key}` is not a keyword here: each iter() is one epoch "
                    "(set_epoch() chooses it), the rank and world size come from torch.distributed "
                    "or RANK/WORLD_SIZE, the DataLoader worker from get_worker_info()"
                )
        if not isinstance(urls, (str, os.PathLike)):
            urls = list(urls)
        self.urls = urls
        self.batch_size = batch_size
        self.transform = transform
        self._resume = _resume_value(config.pop("resume", None))
        self.config = config
        self._epoch = 0
        self._state = None

    def set_epoch(self, epoch):
        """The epoch the next ``iter()`` runs, from its start."""
        self._epoch = int(epoch)
        self._state = None
        self._resume = None

    def consumer(self):
        """This consumer's layout keys: rank, world_size, loader_worker, loader_workers."""
        rank, world = rank_and_world()
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        return {"rank": rank, "world_size": world, "loader_worker": wid, "loader_workers": nw}

    def __iter__(self):
        epoch = self._epoch
        resume, self._resume = self._resume, None
        self._state = resume
        cfg = dict(self.config, epoch=epoch, epochs=epoch + 1, **self.consumer())
        if resume is not None:
            cfg["resume"] = resume
        with Loader(self.urls, batch_size=self.batch_size, **cfg) as loader:
            for batch in loader:
                with batch:
                    # The position after this batch: what a checkpoint taken
                    # while the item is out must resume from.
                    state = loader.state().decode("ascii")
                    item = self.transform(batch)
                self._state = state
                yield item
        self._epoch = epoch + 1
        self._state = None

    def state_dict(self):
        return {"epoch": self._epoch, "state": self._state}

    def load_state_dict(self, state):
        if not isinstance(state, dict) or set(state) != {"epoch", "state"}:
            raise ValueError(
                'RingfeedDataset.load_state_dict: expected {"epoch": e, "state": str, list of str, or None} '
                f"(from state_dict()), got {state!r:.200}"
            )
        self._epoch = int(state["epoch"])
        self._resume = _resume_value(state["state"])
        self._state = self._resume

    def __getstate__(self):
        return dict(self.__dict__)
