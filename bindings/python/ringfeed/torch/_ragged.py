"""`Ragged`: one field of every sample of a batch, as tensors over the batch's memory.

A tar shard puts a header before every member, so the samples' bytes of one
field are not contiguous; copying them together (what a ``(values,
offsets)`` pair needs) was a third of the PyTorch path's time. A `Ragged`
instead views the span of memory from the field's first byte to its last,
with each sample's start and length in it: nothing is copied until a
consumer asks for contiguous bytes (`pack`), pinned memory (`pin_memory`,
which DataLoader calls with ``pin_memory=True``) or another device (`to`).

Where the bytes live (a `Span`):

- in this process's engine (`LocalSpan`, holding the batch's lease);
- in a DataLoader worker's engine or its node engine, mapped here
  (`MappedSpan`, holding the `_transport.RemoteBatch` or
  `_transport.NodeHeld`): a `Ragged` pickled in a worker whose loader has a
  shared arena travels as a ticket, not as bytes;
- in memory of its own (`OwnedSpan`): packed copies, or the copy a `Ragged`
  travels as when its engine's memory cannot be shared.

The views hold the batch: the engine gets its memory back when the last
`Ragged`, tensor or array made from it is gone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, SupportsIndex, Union, cast

import numpy as np
import torch

from .._batch import gather, span as field_span
from .._lease import _Exported
from .._transport import Ticket

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from typing_extensions import Buffer, Self

    from .._batch import Batch

    # Per-sample arrays: numpy where they were computed, tensors once packed or moved.
    _Column = Union[NDArray[Any], torch.Tensor]


class _View:
    """`nbytes` at `address`, kept alive by `keeper` (numpy arrays made from
    it hold the keeper)."""

    __slots__ = ("keeper", "address", "nbytes")

    def __init__(self, keeper, address, nbytes):
        self.keeper = keeper
        self.address = address
        self.nbytes = nbytes

    def array(self):
        return np.asarray(_Exported(self.keeper, self.address, (self.nbytes,), None, "|u1", writable=True))

    def shippable(self):
        return False


class LocalSpan(_View):
    """Bytes in this process's engine, kept by the batch's lease."""

    __slots__ = ()

    @property
    def lease(self):
        return self.keeper

    def shippable(self):
        return self.lease.arena is not None

    def ship(self):
        lease = self.lease
        if lease.ticket is None:
            lease.ticket = Ticket(lease)
        return (lease.ticket, self.address - lease.arena.base, self.nbytes)


class MappedSpan(_View):
    """Bytes of a worker's batch, through this process's mapping of its
    arena (or of its node engine's), kept by the `_transport.RemoteBatch`
    (or `_transport.NodeHeld`)."""

    __slots__ = ()

    def __init__(self, batch, offset, nbytes):
        super().__init__(batch, batch.address + offset, nbytes)

    @property
    def batch(self):
        return self.keeper


class OwnedSpan:
    """Bytes in a tensor of their own."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor

    @property
    def address(self):
        return self.tensor.data_ptr()

    @property
    def nbytes(self):
        return self.tensor.numel()

    def shippable(self):
        return False


def _from_numpy(a):
    return torch.from_numpy(a)


class Ragged:
    """One field of the samples of a batch: sample ``i``'s bytes are
    ``values[starts[i] : starts[i] + lengths[i]]``.

    - ``values``: a uint8 tensor viewing the batch's memory from the field's
      first byte to its last. Between the samples lie bytes that are not
      theirs (tar headers, other fields): read through ``starts`` and
      ``lengths``, ``r[i]`` or ``pack()``. Do not write into it: it is the
      engine's memory.
    - ``starts``, ``lengths``: int64 tensors, one entry per sample;
      ``present``: bool tensor, False where a sample lacks the field (its
      length is then 0).
    - ``r[i]``: sample i's bytes as a uint8 tensor view; ``len(r)``,
      ``iter(r)``, ``r.tolist()`` (``bytes`` per sample, copied),
      ``r.nbytes``.
    - ``r.pack()``: ``(values, offsets)`` with the bytes contiguous, one
      copy (``offsets`` has ``len + 1`` entries); ``r.pin_memory()`` the same
      into pinned memory, as a `Ragged` (what ``DataLoader(pin_memory=True)``
      calls); ``r.to(device)``.
    - ``r.numpy()``: ``(values, starts, lengths)`` as numpy arrays.

    The tensors hold the batch: its memory goes back to the engine when the
    `Ragged` and every tensor made from it are gone.
    """

    __slots__ = ("_span", "_starts", "_lengths", "_present", "_values", "_packed")

    _span: _View | OwnedSpan
    _starts: _Column
    _lengths: _Column
    _present: _Column | None
    _values: torch.Tensor | None
    _packed: bool

    def __init__(
        self,
        span: _View | OwnedSpan,
        starts: _Column,
        lengths: _Column,
        present: _Column | None = None,
        packed: bool = False,
    ) -> None:
        self._span = span
        self._starts = starts
        self._lengths = lengths
        self._present = present
        self._values = None
        self._packed = packed

    @classmethod
    def of(cls, batch: Batch, name: str) -> Self:
        """Field `name` of a `ringfeed.Batch`, without copying its bytes."""
        lease, layout, idx = batch.field(name)._get()
        has = idx >= 0
        lengths = np.where(has, layout.lengths[idx], 0)
        lo, nbytes, starts = field_span(layout.addresses[idx].astype(np.int64), lengths, has)
        return cls(LocalSpan(lease, lo, nbytes), starts, lengths, None if has.all() else has)

    # -- tensors -----------------------------------------------------------

    @property
    def values(self) -> torch.Tensor:
        v = self._values
        if v is None:
            span = self._span
            if isinstance(span, OwnedSpan):
                v = span.tensor
            elif span.nbytes == 0:
                v = torch.empty(0, dtype=torch.uint8)
            else:
                v = _from_numpy(span.array())
            self._values = v
        return v

    @property
    def starts(self) -> torch.Tensor:
        return _from_numpy(self._starts) if isinstance(self._starts, np.ndarray) else self._starts

    @property
    def lengths(self) -> torch.Tensor:
        return _from_numpy(self._lengths) if isinstance(self._lengths, np.ndarray) else self._lengths

    @property
    def present(self) -> torch.Tensor:
        if self._present is None:
            return torch.ones(len(self), dtype=torch.bool)
        return _from_numpy(self._present) if isinstance(self._present, np.ndarray) else self._present

    @property
    def nbytes(self) -> int:
        return int(self._lengths.sum())

    def __len__(self) -> int:
        return len(self._lengths)

    def __getitem__(self, i: SupportsIndex) -> torch.Tensor:
        s = int(self._starts[i])
        return self.values[s : s + int(self._lengths[i])]

    def __iter__(self) -> Iterator[torch.Tensor]:
        values = self.values
        for s, n in zip(self._np(self._starts).tolist(), self._np(self._lengths).tolist()):
            yield values[s : s + n]

    @staticmethod
    def _np(a):
        return a if isinstance(a, np.ndarray) else a.cpu().numpy()

    def numpy(self) -> tuple[NDArray[np.uint8], NDArray[np.int64], NDArray[np.int64]]:
        """``(values, starts, lengths)`` as numpy arrays (views, no copy)."""
        return self.values.numpy(), self._np(self._starts), self._np(self._lengths)

    def tolist(self) -> list[bytes]:
        """Every sample's bytes as ``bytes`` (copied)."""
        values, starts, lengths = self.numpy()
        # An array has the buffer protocol; numpy's stubs say so from Python 3.12 on.
        mv = memoryview(cast("Buffer", values))
        return [bytes(mv[s : s + n]) for s, n in zip(starts.tolist(), lengths.tolist())]

    # -- copies ------------------------------------------------------------

    def pack(self, pin_memory: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values, offsets)``: the samples' bytes one after the other in a
        new uint8 tensor (pinned with `pin_memory`) and int64 offsets
        (``len + 1`` entries). One copy, by the library's gather loop."""
        lengths = self._np(self._lengths)
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if self._packed and not pin_memory:
            return self.values, torch.from_numpy(offsets).to(self.values.device)
        if self.values.device.type != "cpu":
            raise ValueError(f"a Ragged on {self.values.device} cannot be pinned: it is not in host memory")
        total = int(offsets[-1])
        out = torch.empty(total, dtype=torch.uint8, pin_memory=pin_memory)
        if total:
            span = self._span
            values = self.values  # keeps the memory alive during the copy
            gather(span.address, span.nbytes, self._np(self._starts), lengths, out.data_ptr(), total)
            del values
        return out, torch.from_numpy(offsets)

    def _packed_ragged(self, pin_memory):
        values, offsets = self.pack(pin_memory=pin_memory)
        starts = offsets[:-1]
        lengths = self.lengths
        present = None if self._present is None else self.present
        if pin_memory:
            starts, lengths = starts.pin_memory(), lengths.pin_memory()
            present = None if present is None else present.pin_memory()
        return Ragged(OwnedSpan(values), starts, lengths, present, packed=True)

    def pin_memory(self, device: torch.device | str | int | None = None) -> Ragged:
        """A packed copy in pinned memory (DataLoader's ``pin_memory=True``)."""
        return self._packed_ragged(pin_memory=True)

    def to(self, device: torch.device | str | int, non_blocking: bool = False) -> Ragged:
        """The field on `device` (packed first; pinned when `non_blocking`)."""
        device = torch.device(device)
        if device.type == "cpu" and self.values.device.type == "cpu":
            return self
        r = self._packed_ragged(pin_memory=non_blocking and not self._packed)

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=non_blocking)

        present = None if r._present is None else move(r.present)
        return Ragged(OwnedSpan(move(r.values)), move(r.starts), move(r.lengths), present, packed=True)

    # -- pickling (DataLoader workers) ---------------------------------------

    def __reduce__(self):
        span = self._span
        if isinstance(span, LocalSpan) and span.shippable():
            ticket, offset, nbytes = span.ship()
            return (_received, (ticket, offset, nbytes, self._np(self._starts), self._np(self._lengths), self._present))
        values, offsets = self.pack()
        present = None if self._present is None else self._np(self._present)
        return (_copied, (values.numpy(), offsets.numpy(), present))

    def __repr__(self) -> str:
        return f"<ringfeed.torch.Ragged {len(self)} samples, {self.nbytes} bytes>"


def _received(batch, offset, nbytes, starts, lengths, present):
    return Ragged(MappedSpan(batch, offset, nbytes), starts, lengths, present)


def _copied(values, offsets, present):
    values = torch.from_numpy(values)
    offsets = torch.from_numpy(offsets)
    present = None if present is None else torch.from_numpy(present)
    return Ragged(OwnedSpan(values), offsets[:-1], offsets[1:] - offsets[:-1], present, packed=True)
