"""PyTorch: `RingfeedDataset`, an IterableDataset over ringfeed.

Items. Each item is one engine batch. By default (`to_tensors`) it is
``{"__key__": keys, field: Ragged, ...}``: the keys as one numpy bytes array,
each field a `Ragged` of tensors viewing the batch's memory (no copy, no
Python object per sample), so a DataLoader passes it on without walking it.
With per-sample stages, WebDataset style —
``.decode("torchrgb8").to_tuple("jpg", "cls").map(fn)`` — each sample is
decoded and transformed, and the batch collated (``default_collate``, or
`collate`); ``map_batch(fn)`` applies to the finished item either way.

The engine splits the data, not Python: each DataLoader worker of each rank
opens its own engine with ``rank`` / ``world_size`` (from
``torch.distributed`` when it is initialised, else the ``RANK`` /
``WORLD_SIZE`` environment variables, else 0 / 1) and ``loader_worker`` /
``loader_workers`` (from ``torch.utils.data.get_worker_info()``). The engine
plans the epoch once and splits it by sample over the ``world_size *
loader_workers`` consumers: every sample goes to exactly one consumer, and
every consumer gets the same number of batches. With ``remainder="pad"`` (the
default) short consumers repeat a few samples (``stats()["samples_padded"]``);
``remainder="drop"`` leaves the extra few out. The order is fixed by the
dataset, ``seed``, ``shuffle``/``shuffle_buffer`` and the layout (consumers and
the engine's ``workers``), never by timing.

Workers. Where the items need no Python of the user's — the default items
and the engine's image pipeline, with no `map_batch` — one DataLoader worker
of a rank reads the rank's whole part with the engine's threads and the
others yield nothing (`one_reader`): ``num_workers=N`` costs no more than
the hand-over of batches from one process, and yields what
``num_workers=0`` yields, in its order, with its `len()` and states. Where
they need Python per sample or per batch (`decode`, `map`, a `transform`
function, `map_batch`), every worker reads its own part, as below;
``split_workers=True`` / ``False`` chooses either way. When a rank has several
reading DataLoader workers, or several ranks of
the job run on this node (``LOCAL_WORLD_SIZE`` > 1 as torchrun sets it), they
attach to one node engine (``node="auto"``: the first starts ``ringfeed
node``, which stops a few seconds after the last leaves) instead of opening
one engine each; pass ``node="off"`` for an engine each. A batch the main
process holds stays intact whatever happens to the worker it came through
(shut down, SIGTERM, SIGKILL, out of descriptors): the main process keeps
it with the engine when it unpickles it, until it lets go of it, and what
it keeps is charged to it, not to the workers (see ``ringfeed._transport``).
Each consumer still gets exactly the batches its own engine would give it,
and its resume states are the same.
Each consumer's stream count is ``4 // num_workers`` (at least 1; 4 for
`one_reader`) unless
``workers`` is given: it is part of the layout that fixes the order. A
worker's batches reach the main process without a copy: they live in an arena
in shared memory (the node engine's, read-only, or the worker's own with
``shared_arena``), and a `Ragged` crosses as a ticket that the main process
maps (see ``ringfeed._transport``); decoded items cross as PyTorch sends
tensors.

Epochs. The engine is opened inside ``__iter__``, in the process that
iterates (a DataLoader worker, fork or spawn), never inherited across a fork.
One ``iter()`` is one epoch; the engine stays open at the end of an epoch and
goes on with the next (its first batches already read), unless
``keep_open=False``. DataLoader workers that are not persistent start from the
main process's copy of the dataset: call ``set_epoch(e)`` before each epoch,
as with ``DistributedSampler``. Use ``DataLoader(ds, batch_size=None)``.

State (``state_dict()`` / ``load_state_dict()``, as torchdata's
StatefulDataLoader calls them in each worker): ``{"epoch": e, "state": s}``,
where ``s`` is the engine's resume state after the last batch this consumer
yielded, asked of the engine only when ``state_dict()`` is called, or None at
the start of epoch ``e``. Loading it makes the next ``iter()`` continue the
epoch exactly, in the order the uninterrupted run would have used, provided
the dataset, the epoch settings and the layout are the same. To resume in
another layout (elastic), give each new consumer the states of *all* the old
consumers: ``load_state_dict({"epoch": e, "state": [s0, s1, ...]})``.

A loaded state belongs to its epoch: ``set_epoch(e)`` keeps it when ``e`` is
that epoch, so the usual loop ``load_state_dict(ckpt); for epoch in
range(start, n): ds.set_epoch(epoch); ...`` continues the interrupted epoch,
and drops it (saying so on the ``"ringfeed"`` logger) for any other epoch.
Where the position is not in this process — the main process of a
DataLoader with workers, which iterate copies of the dataset —
``state_dict()`` raises `StateUnknownError` rather than answer "the start of
the epoch": take the state of a torchdata StatefulDataLoader there
(``dl.state_dict()``), which asks its workers.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import numpy as np

import torch
import torch.utils.data

from .._lease import fork_generation
from .._loader import Loader, _resume_value, plan
from .._log import logger
from ..decode import DecodeError, Decoder
from ._ragged import Ragged
from ..image import from_torchvision

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from typing_extensions import Self

    from .._batch import Batch
    from .._typing import Handler, Spec, Urls

__all__ = ["DecodeError", "Ragged", "RingfeedDataset", "from_torchvision", "StateUnknownError", "rank_and_world", "to_tensors"]


class StateUnknownError(RuntimeError):
    """`RingfeedDataset.state_dict()` was asked where the position is not
    known: in the main process of a DataLoader whose workers iterate copies
    of the dataset. A StatefulDataLoader's ``state_dict()`` asks them."""

# I/O threads a loader opens by default (the engine's own auto value),
# shared out among a rank's DataLoader workers.
_ENGINE_THREADS = 4


def _shares_a_node(consumer):
    """Whether this consumer takes the node engine by default: one of
    several DataLoader workers, or a rank while other local ranks run
    (``LOCAL_WORLD_SIZE``, as torchrun sets)."""
    try:
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError:
        local_ranks = 1
    return consumer["loader_workers"] > 1 or local_ranks > 1


def to_tensors(batch: Batch) -> dict[str, NDArray[np.bytes_] | Ragged]:
    """Default transform: ``{"__key__": keys, field: Ragged}`` — the keys as a
    numpy bytes array (``keys.astype(str)`` for str), each field a `Ragged`
    of tensors viewing the batch's memory. Nothing is copied."""
    out: dict[str, NDArray[np.bytes_] | Ragged] = {"__key__": batch.key_array()}
    for name in batch.fields:
        out[name] = Ragged.of(batch, name)
    return out


class _EngineImages:
    """A batch the engine's image pipeline made, as a tuple of tensors:
    each image field's ``(batch, *shape)``, then each label field's
    ``(batch,)``, viewing the batch's memory."""

    _LABELS = {"int64": np.int64, "int32": np.int32, "float32": np.float32}

    def __init__(self, spec, keys=False):
        from ..image import output_shape

        self.keys = keys
        self.images = []
        self.labels = []
        for field, v in spec.items():
            if isinstance(v, str) or (isinstance(v, dict) and "label" in v):
                ty = v if isinstance(v, str) else v.get("label")
                self.labels.append((field, self._LABELS.get(ty, np.int64)))
            else:
                shape, dtype = output_shape(spec, field)
                self.images.append((field, shape, dtype))

    def __call__(self, batch):
        import warnings

        n = len(batch)
        out = []
        with warnings.catch_warnings():
            # The views are read-only (the engine's memory); torch warns.
            warnings.simplefilter("ignore", UserWarning)
            for field, shape, dtype in self.images:
                a = batch.field(field).fixed(dtype, copy=False).reshape((n, *shape))
                out.append(torch.from_numpy(a))
            for field, dtype in self.labels:
                a = batch.field(field).fixed(dtype, copy=False).reshape(n)
                out.append(torch.from_numpy(a))
        if self.keys:
            out.append(batch.keys)
        return tuple(out)


def rank_and_world() -> tuple[int, int]:
    """(rank, world_size): torch.distributed when initialised, else RANK/WORLD_SIZE, else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _field_names(sample):
    return [k for k in sample if not k.startswith("__")]


class _ToTuple:
    def __init__(self, keys):
        if not keys:
            raise ValueError("to_tuple needs at least one field name")
        self.keys = [k.split(";") for k in keys]

    def __call__(self, sample):
        out = []
        for alternatives in self.keys:
            for k in alternatives:
                if k in sample:
                    out.append(sample[k])
                    break
            else:
                raise KeyError(
                    f"no field {' or '.join(map(repr, alternatives))} (fields: {', '.join(_field_names(sample))})"
                )
        return tuple(out)


class _MapTuple:
    def __init__(self, fns):
        self.fns = fns

    def __call__(self, sample):
        if not isinstance(sample, tuple) or len(sample) != len(self.fns):
            raise TypeError(f"map_tuple with {len(self.fns)} functions got {type(sample).__name__} {sample!r:.80}")
        return tuple(v if f is None else f(v) for f, v in zip(self.fns, sample))


_BATCHED_AGAIN = (
    "RingfeedDataset yields whole batches (each item is one engine batch of `batch_size` "
    "samples), and this DataLoader batches them again (batch_size={}): create it with "
    "batch_size=None, as in DataLoader(ds, batch_size=None, num_workers=...). Its default "
    "batch_size=1 would add a dimension of 1 to every tensor; to combine several engine "
    "batches on purpose, pass your own collate_fn"
)


def _collates_by_default(fn) -> bool:
    return fn in (torch.utils.data.default_collate, torch.utils.data._utils.collate.default_collate)


def _refuse_batching_again(frame) -> None:
    """Raises `TypeError` when the code asking for this dataset's items is a
    DataLoader's fetcher that batches them again with the default collate
    (``DataLoader(ds)`` without ``batch_size=None``). `frame` is the one
    that asked for the first item; the fetcher is found among its callers, in
    the DataLoader's main process and in its workers alike."""
    base = getattr(getattr(torch.utils.data._utils, "fetch", None), "_BaseDatasetFetcher", None)
    if base is None:
        return
    for _ in range(6):
        if frame is None:
            return
        owner = frame.f_locals.get("self")
        if isinstance(owner, base):
            if owner.auto_collation and _collates_by_default(owner.collate_fn):
                raise TypeError(_BATCHED_AGAIN.format(len(frame.f_locals.get("possibly_batched_index") or ()) or "N"))
            return
        frame = frame.f_back


class RingfeedDataset(torch.utils.data.IterableDataset):
    """``RingfeedDataset(urls, batch_size=32, transform=None, **config)``.

    `config` keys are those of `ringfeed.Loader`, except the ones this class
    sets itself: ``epochs`` and ``epoch`` (one ``iter()`` is one epoch; see
    `set_epoch`), ``rank``, ``world_size``, ``loader_worker`` and
    ``loader_workers`` (from torch). ``resume=`` gives the state (or, for an
    elastic resume, the list of states) the first ``iter()`` starts from;
    ``keep_open=False`` closes the engine at the end of each epoch.
    ``split_workers`` (default None: auto, see `one_reader`) chooses whether
    every DataLoader worker reads its part (True) or the first reads the
    rank's whole part and the others yield nothing (False).

    `transform` (default `to_tensors`) gets each `ringfeed.Batch` and returns
    the item; the batch is released after it returns (tensors and arrays it
    exported stay valid and hold the engine's memory while they live). The
    per-sample stages (`decode`, `map`, `to_tuple`, `map_tuple`) replace it.

    `transform` may instead be the engine's image pipeline: a ``transform``
    spec (a dict, or its JSON text; see docs/images.md, and
    `ringfeed.torch.from_torchvision`). The engine then decodes, crops,
    resizes and flips on its own threads, and each item is a tuple of
    tensors viewing the batch's memory (no copy): the image fields'
    ``(batch, *shape)`` tensors, then the label fields' ``(batch,)`` ones,
    in the spec's order — ``(images, labels)`` for one of each — and, with
    ``keys=True``, the samples' keys (a list of str) last. The decoding is
    the engine's, not the DataLoader's: with workers, one reads.
    """

    # Keys this class passes to the engine itself.
    _OWN_KEYS = ("epochs", "epoch", "rank", "world_size", "loader_worker", "loader_workers")

    def __init__(
        self,
        urls: Urls,
        batch_size: int = 32,
        transform: Callable[[Batch], Any] | Spec | None = None,
        keep_open: bool = True,
        keys: bool = False,
        split_workers: bool | None = None,
        **config: Any,
    ) -> None:
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
        if isinstance(transform, (dict, str)):
            spec = json.loads(transform) if isinstance(transform, str) else dict(transform)
            config["transform"] = spec
            transform = _EngineImages(spec, keys=keys)
        elif keys:
            raise TypeError("RingfeedDataset: `keys=True` goes with an engine `transform` spec")
        self.transform = transform
        self.keep_open = keep_open
        if split_workers not in (None, True, False):
            raise TypeError(f"RingfeedDataset: split_workers is None (auto), True or False, not {split_workers!r:.40}")
        self.split_workers = split_workers
        self._resume = _resume_value(config.pop("resume", None))
        # The epoch the loaded state belongs to (`resume=` is the first one's).
        self._resume_epoch = 0
        self.config = config
        self._stages: list[tuple[str, Callable[[Any], Any]]] = []
        self._collate: Callable[[list[Any]], Any] | None = None
        self._batch_maps: list[Callable[[Any], Any]] = []
        self._epoch = 0
        self._reset_engine()

    def _reset_engine(self):
        self._len_known = None
        self._loader = None
        self._loader_key = None
        self._loader_epoch = None  # the epoch whose start the open engine is at
        self._in_epoch = False

    # -- the WebDataset-style pipeline ---------------------------------------

    def _with(self, stage=None, collate=None, batch_map=None):
        ds = copy.copy(self)
        ds._reset_engine()
        ds._stages = list(self._stages)
        ds._batch_maps = list(self._batch_maps)
        if stage is not None:
            if self.transform is not None:
                raise ValueError(
                    "a batch `transform` and per-sample stages do not mix: the stages replace the "
                    "transform; use map_batch(fn) for a function of the collated batch"
                )
            ds._stages.append(stage)
        if collate is not None:
            ds._collate = collate
        if batch_map is not None:
            ds._batch_maps.append(batch_map)
        return ds

    def decode(self, *specs: str | Handler, only: str | Iterable[str] | None = None) -> Self:
        """Decodes each sample's fields by extension (`ringfeed.decode.Decoder`):
        ``decode("torchrgb8")``, ``decode("pil")``, ``decode(my_handler)``."""
        return self._with(stage=("decode", Decoder(*specs, only=only)))

    def map(self, fn: Callable[[Any], Any]) -> Self:
        """Applies `fn` to each sample (a dict, or what the stage before made)."""
        return self._with(stage=("map", fn))

    def to_tuple(self, *keys: str) -> Self:
        """Each sample as a tuple of these fields (``"jpg;png"``: the first present)."""
        return self._with(stage=("map", _ToTuple(keys)))

    def map_tuple(self, *fns: Callable[[Any], Any] | None) -> Self:
        """Applies ``fns[i]`` to element i of each tuple sample (None: unchanged)."""
        return self._with(stage=("map", _MapTuple(fns)))

    def collate(self, fn: Callable[[list[Any]], Any]) -> Self:
        """Makes the item from the list of a batch's samples (default ``default_collate``)."""
        return self._with(collate=fn)

    def map_batch(self, fn: Callable[[Any], Any]) -> Self:
        """Applies `fn` to every finished item (after `transform` or `collate`)."""
        return self._with(batch_map=fn)

    # -- layout and engine ---------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter()`` runs: from where a loaded state of
        that epoch left it, else from its start (a loaded state of another
        epoch is dropped, with a warning on the ``"ringfeed"`` logger)."""
        epoch = int(epoch)
        if self._resume is not None and self._resume_epoch != epoch:
            logger.warning(
                "RingfeedDataset.set_epoch(%d): dropping the resume state loaded for epoch %d; "
                "epoch %d starts from its beginning",
                epoch,
                self._resume_epoch,
                epoch,
            )
            self._resume = None
        self._epoch = epoch

    def one_reader(self) -> bool:
        """Whether one DataLoader worker of a rank reads the rank's whole
        part while the others yield nothing (`split_workers`; by default
        where the items need no Python of the user's: the default items and
        the engine's image pipeline, with no `map_batch`)."""
        if self.split_workers is not None:
            return not self.split_workers
        default_items = self.transform is None or self.transform is to_tensors or isinstance(self.transform, _EngineImages)
        return default_items and not self._stages and not self._batch_maps

    def consumer(self) -> dict[str, int]:
        """This consumer's layout keys: rank, world_size, loader_worker,
        loader_workers (with `one_reader`, those of the rank alone: 0, 1)."""
        rank, world = rank_and_world()
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.one_reader():
            wid, nw = 0, 1
        return {"rank": rank, "world_size": world, "loader_worker": wid, "loader_workers": nw}

    def _idle_worker(self) -> bool:
        """A DataLoader worker that yields nothing: not the first, with `one_reader`."""
        info = torch.utils.data.get_worker_info()
        return info is not None and info.id != 0 and self.one_reader()

    def __len__(self) -> int:
        """Batches this rank yields in an epoch: what a DataLoader
        (``len(loader)``), a progress bar or a learning-rate schedule asks.
        Every consumer (rank × DataLoader worker) yields the same number of
        batches, so it is that number times the workers of the DataLoader
        that reads this dataset (found by its reference to it; none: this
        process alone), or, with `one_reader`, the one worker's. The engine
        works it out without reading the data
        (`ringfeed.plan`): from the counts where they are known, else from
        the nominal epoch of a split by shard. Raises `TypeError` (which
        ``len()``'s callers take as "no length") where it is not defined: one
        consumer reading shards whose counts are unknown."""
        caller = sys._getframe(1).f_locals.get("self")
        if isinstance(caller, torch.utils.data.DataLoader) and caller.dataset is self:
            # `len(loader)`: that DataLoader asks.
            if caller.batch_size is not None and _collates_by_default(caller.collate_fn):
                raise TypeError(_BATCHED_AGAIN.format(caller.batch_size))
            workers = max(1, caller.num_workers)
        else:
            reader = self._reading_loader()
            workers = max(1, reader[1]) if reader is not None else 1
        if self.one_reader():
            workers = 1
        rank, world = rank_and_world()
        consumer = {"rank": rank, "world_size": world, "loader_worker": 0, "loader_workers": workers}
        key = (self._epoch, rank, world, workers)
        if self._len_known is None or self._len_known[0] != key:
            cfg = self._engine_config(self._epoch, consumer, None)
            cfg.pop("epochs", None)
            p = plan(self.urls, batch_size=self.batch_size, **cfg)
            self._len_known = (key, p)
        p = self._len_known[1]
        if p["batches"] is None:
            raise TypeError(
                "len() of this RingfeedDataset is not known: its shards' sample counts are "
                f"unknown and one consumer reads them all ({p['shards']} shards). Give the counts "
                "(`ringfeed index URLS... -o shardindex.json`, put beside the shards) or "
                "`samples_per_epoch`"
            )
        return p["batches"] * workers

    def _reading_loader(self):
        """(a DataLoader or one of its iterators that reads this dataset, its
        worker count), or None: found by the objects that refer to this
        one, as `_worker_reader` does; a DataLoader that batches the items
        again is refused here too."""
        for ref in gc.get_referrers(self):
            owners = gc.get_referrers(ref) if isinstance(ref, dict) else [ref]
            for owner in owners:
                if isinstance(owner, torch.utils.data.DataLoader) and owner.dataset is self:
                    if owner.batch_size is not None and _collates_by_default(owner.collate_fn):
                        raise TypeError(_BATCHED_AGAIN.format(owner.batch_size))
                    return owner, owner.num_workers
                if isinstance(owner, torch.utils.data.dataloader._BaseDataLoaderIter) and owner._dataset is self:
                    if owner._auto_collation and _collates_by_default(owner._collate_fn):
                        raise TypeError(_BATCHED_AGAIN.format("N"))
                    return owner, owner._num_workers
        return None

    def _engine_config(self, epoch, consumer, resume):
        cfg = dict(self.config)
        cfg.setdefault("workers", max(1, _ENGINE_THREADS // consumer["loader_workers"]))
        if "node" not in cfg and "transform" not in cfg and _shares_a_node(consumer):
            # Several consumers on this node: one engine serves them all
            # (a node engine does not run the image pipeline yet: with one,
            # each consumer keeps its own engine).
            cfg["node"] = "auto"
        if "shared_arena" not in cfg and torch.utils.data.get_worker_info() is not None:
            # Batches of views cross to the main process as tickets into a
            # shared arena; decoded items do not need one.
            cfg["shared_arena"] = not self._stages
        if "cuda_register" not in cfg and torch.utils.data.get_worker_info() is not None:
            # The main process copies to the GPU, from its own mapping: a
            # worker's registration would pin nothing it uses, and would
            # start a CUDA context in every worker.
            cfg["cuda_register"] = "off"
        cfg.update(consumer, epoch=epoch, epochs=0 if self.keep_open else epoch + 1)
        if resume is not None:
            cfg["resume"] = resume
        return cfg

    def _open_loader(self):
        loader = self._loader
        if loader is not None and (loader._generation != fork_generation() or loader.closed):
            loader = self._loader = None  # a parent's engine (fork), or closed
        return loader

    def close(self) -> None:
        """Closes the engine kept open between epochs (a new ``iter()`` opens one)."""
        loader = self._open_loader()
        if loader is not None:
            loader.close()
        self._reset_engine()

    def __iter__(self) -> Iterator[Any]:
        _refuse_batching_again(sys._getframe(1))
        epoch = self._epoch
        resume, self._resume = self._resume, None
        if self._idle_worker():
            # The first worker reads this rank's part; this one opens no
            # engine and ends its epoch at once (the DataLoader then asks
            # only the first).
            self._epoch = epoch + 1
            return
        consumer = self.consumer()
        loader = self._open_loader()
        reusable = (
            loader is not None
            and resume is None
            and self._loader_key == consumer
            and self._loader_epoch == epoch
            and not self._in_epoch
        )
        if not reusable:
            self.close()
            loader = Loader(self.urls, batch_size=self.batch_size, **self._engine_config(epoch, consumer, resume))
            self._loader, self._loader_key = loader, consumer
        self._loader_epoch = epoch
        self._in_epoch = True
        for batch in loader.iter_epoch():
            if len(batch) == 0:
                # Every sample of it left out (`image_errors="skip"`): a
                # step on nothing is no step.
                batch.release()
                continue
            # Not a local: a suspended generator's locals stay alive, and the
            # item holds the batch's memory until the consumer drops it.
            yield self._released_after(batch)
        self._epoch = epoch + 1
        self._in_epoch = False
        if self.keep_open:
            self._loader_epoch = epoch + 1
        else:
            self.close()

    # -- items ---------------------------------------------------------------

    def _samples(self, batch):
        keys = batch.key_array().tolist()
        views = [(name, batch[name]) for name in batch.fields]
        present = [v.present for _, v in views]
        raw = not (self._stages and self._stages[0][0] == "decode")
        for i, key in enumerate(keys):
            s = {"__key__": key.decode("utf-8", "surrogateescape"), "__url__": batch.source(i)}
            for (name, view), has in zip(views, present):
                if has[i]:
                    s[name] = bytes(view[i]) if raw else view[i]
            yield s

    def _run(self, sample):
        value = sample
        for kind, fn in self._stages:
            if kind == "decode":
                value = fn(value)  # names shard, key and field itself
                continue
            try:
                value = fn(value)
            except DecodeError:
                raise
            except Exception as e:
                raise DecodeError(
                    f"{sample['__url__']}: sample {sample['__key__']!r}: {getattr(fn, '__name__', fn)!s:.60} "
                    f"failed: {type(e).__name__}: {e}",
                    shard=sample["__url__"],
                    key=sample["__key__"],
                ) from e
        return value

    def _released_after(self, batch):
        with batch:
            return self._item(batch)

    def _item(self, batch):
        if self._stages:
            samples = [self._run(s) for s in self._samples(batch)]
            item = (self._collate or torch.utils.data.default_collate)(samples)
        else:
            item = (self.transform or to_tensors)(batch)
        for fn in self._batch_maps:
            item = fn(item)
        return item

    # -- state ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch": e, "state": s}``: where this consumer is (see the
        module's doc). Raises `StateUnknownError` in the main process of a
        DataLoader with workers: they iterate copies, and the position is
        theirs."""
        loader = self._open_loader()
        if self._in_epoch and loader is not None:
            return {"epoch": self._epoch, "state": loader.state().decode("ascii")}
        if torch.utils.data.get_worker_info() is None:
            reader = self._worker_reader()
            if reader is not None:
                owner, workers = reader
                raise StateUnknownError(
                    f"RingfeedDataset.state_dict(): this dataset is read by the {workers} "
                    f"workers of a {type(owner).__name__}, which iterate their own copies; this "
                    "process does not know their position. Use torchdata's StatefulDataLoader "
                    "(torchdata.stateful_dataloader) and take its state_dict(), which asks the "
                    "workers, or num_workers=0"
                )
        return {"epoch": self._epoch, "state": self._resume}

    def _worker_reader(self):
        """(a DataLoader or one of its iterators, its worker count) when
        one that reads this dataset in worker processes refers to it, else
        None. A walk over the objects that refer to this one (and to the
        attribute dicts that do), so it runs only when a state is taken
        outside an epoch of this process."""
        loaders = (torch.utils.data.DataLoader, torch.utils.data.dataloader._BaseDataLoaderIter)
        referrers = gc.get_referrers(self)
        for ref in referrers:
            owners = gc.get_referrers(ref) if isinstance(ref, dict) else [ref]
            for owner in owners:
                if not isinstance(owner, loaders):
                    continue
                if isinstance(owner, torch.utils.data.DataLoader):
                    dataset, workers = owner.dataset, owner.num_workers
                else:
                    dataset, workers = owner._dataset, owner._num_workers
                if dataset is self and workers > 0:
                    return owner, workers
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or set(state) != {"epoch", "state"}:
            raise ValueError(
                'RingfeedDataset.load_state_dict: expected {"epoch": e, "state": str, list of str, or None} '
                f"(from state_dict()), got {state!r:.200}"
            )
        self._epoch = self._resume_epoch = int(state["epoch"])
        self._resume = _resume_value(state["state"])
        self._in_epoch = False

    def __getstate__(self):
        d = dict(self.__dict__)
        d.update(_loader=None, _loader_key=None, _loader_epoch=None, _in_epoch=False)
        return d
