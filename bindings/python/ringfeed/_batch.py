"""Batches and field views.

A `Batch` wraps one C `ringfeed_batch`. Its descriptor arrays (samples and
fields) are read with numpy once per batch, so the Python cost is per batch,
not per sample: field lengths and addresses come out as numpy arrays, and the
bytes are exposed without copying as numpy arrays or memoryviews.

Lifetime rule (see `_lease.py`): `release()` ends the batch for ringfeed's
own objects (`Batch`, `FieldView` raise `ReleasedError`; per-sample
memoryviews raise `ValueError`), while numpy arrays and DLPack tensors
exported from it keep its memory alive: the engine gets the memory back when
the last of them is gone. Hold exported arrays only as long as needed: the
engine's memory budget is shared with the batches still in flight.
"""

from __future__ import annotations

import ctypes
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator, SupportsIndex, cast

import numpy as np

from . import _ffi
from ._lease import _Exported, fork_generation, memoryview_at
from .errors import ForkedError, ReleasedError, from_status

if TYPE_CHECKING:
    from numpy.typing import DTypeLike, NDArray
    from typing_extensions import CapsuleType, Self

    from ._lease import _Lease

_U64 = ctypes.c_uint64
_FIELD_WORDS = ctypes.sizeof(_ffi.RawField) // 8
_SAMPLE_WORDS = ctypes.sizeof(_ffi.RawSample) // 8
assert ctypes.sizeof(_ffi.RawField) == 3 * 8 and ctypes.sizeof(_ffi.RawSample) == 3 * 8, (
    "ringfeed's Python binding needs a 64-bit platform"
)


def _words(address, count):
    """An owned copy of `count` uint64 words at `address`."""
    if count == 0:
        return np.empty(0, np.uint64)
    return np.frombuffer((_U64 * count).from_address(address), np.uint64).copy()


def _export(lease, address, shape, strides, dtype):
    return np.asarray(_Exported(lease, address, shape, strides, np.dtype(dtype).str))


def _name_at(address):
    return ctypes.string_at(address).decode("utf-8", "surrogateescape")


def gather(src_address, src_len, starts, lengths, dst_address, dst_len):
    """Copies ranges of the `src_len` bytes at `src_address` one after the
    other to `dst_address` (``ringfeed_gather``: the library's memcpy loop,
    with every range checked inside the source and the destination)."""
    starts = np.ascontiguousarray(starts, np.int64)
    lengths = np.ascontiguousarray(lengths, np.int64)
    st = _ffi.lib.ringfeed_gather(
        src_address, src_len, starts.ctypes.data, lengths.ctypes.data, len(starts), dst_address, dst_len
    )
    if st != _ffi.RINGFEED_OK:
        raise from_status(st)


def text_out(call: Callable[[Any, int, Any], int], size: int = 256) -> bytes:
    """The text a C entry point writes into a buffer (the `*_state` /
    `*_json` convention): ``call(buf, len, needed_ptr)``, grown until it fits."""
    needed = ctypes.c_size_t(0)
    while True:
        buf = ctypes.create_string_buffer(size)
        st = call(buf, size, ctypes.byref(needed))
        if st == _ffi.RINGFEED_OK:
            return buf.value
        if st != _ffi.RINGFEED_ERR_BUFFER_TOO_SMALL:
            raise from_status(st)
        size = needed.value + 1


def span(addresses, lengths, present):
    """Where a field's samples lie: ``(lo, nbytes, starts)``, the range from
    the first byte of any present sample to the last, and each sample's start
    in it (0 where absent). `addresses` int64, `present` bool."""
    if not present.any():
        return 0, 0, np.zeros(len(addresses), np.int64)
    lo = int(addresses[present].min())
    hi = int((addresses + lengths)[present].max())
    return lo, hi - lo, np.where(present, addresses - lo, 0)


class _Layout:
    """Owned metadata of a batch: where each field of each sample is.

    Built with array operations only, from two rules of the C layout
    (``ringfeed.h``, ``ringfeed_batch``): fields of one name share one name
    pointer, and the keys lie one after the other in sample order."""

    __slots__ = ("names", "index", "addresses", "lengths", "partial", "key_addresses")

    def __init__(self, raw):
        b = raw.sample_count
        f = raw.field_count
        fields = _words(raw.fields, 3 * f).reshape(f, 3) if f else np.empty((0, 3), np.uint64)
        samples = _words(raw.samples, 3 * b).reshape(b, 3) if b else np.empty((0, 3), np.uint64)
        self.addresses = fields[:, 1]
        self.lengths = fields[:, 2].astype(np.int64)
        self.key_addresses = samples[:, 0]
        counts = samples[:, 2].astype(np.int64)
        # name -> int64 index of that field per sample into the field arrays (-1: absent)
        self.index = {}
        self.partial = set()  # names of fields some samples lack
        pointers = fields[:, 0]
        k = int(counts[0]) if b else 0
        if b and k and f == b * k and bool((counts == k).all()):
            # Fast path: every sample has the same fields in the same order.
            grid = pointers.reshape(b, k)
            first = grid[0]
            if bool((grid == first).all()) and len(set(first.tolist())) == k:
                for j, p in enumerate(first.tolist()):
                    self.index[_name_at(p)] = np.arange(j, f, k, dtype=np.int64)
                self.names = tuple(self.index)
                return
        if f:
            # General case: samples with different field sets or orders.
            sample_of = np.repeat(np.arange(b, dtype=np.int64), counts)
            unique, first_at, inverse = np.unique(pointers, return_index=True, return_inverse=True)
            for u in np.argsort(first_at, kind="stable").tolist():
                at = np.flatnonzero(inverse == u)
                idx = np.full(b, -1, np.int64)
                idx[sample_of[at]] = at
                name = _name_at(int(unique[u]))
                self.index[name] = idx
                if len(at) < b:
                    self.partial.add(name)
        self.names = tuple(self.index)

    def key_array(self):
        """The keys as a numpy bytes array (``dtype S<n>``), a copy."""
        kp = self.key_addresses
        n = len(kp)
        if n == 0:
            return np.empty(0, "S1")
        last = len(ctypes.string_at(int(kp[-1])))
        lengths = np.empty(n, np.int64)
        lengths[:-1] = np.diff(kp.astype(np.int64)) - 1
        lengths[-1] = last
        total = int(kp[-1] - kp[0]) + last + 1
        table = np.frombuffer((ctypes.c_ubyte * total).from_address(int(kp[0])), np.uint8)
        width = int(lengths.max())
        if width == 0:
            return np.zeros(n, "S1")
        if bool((lengths == width).all()):
            # Equal keys (the usual "000003-0000012"): the table is an (n, width + 1) array.
            return table.reshape(n, width + 1)[:, :width].copy().view(f"S{width}").reshape(n)
        out = np.zeros((n, width), np.uint8)
        starts = np.zeros(n, np.int64)
        np.cumsum(lengths[:-1] + 1, out=starts[1:])
        row = np.repeat(np.arange(n), lengths)
        col = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        out[row, col] = table[np.repeat(starts, lengths) + col]
        return out.view(f"S{width}").reshape(n)


class Batch:
    """A batch of samples, handed out by `Loader`; its bytes live in the engine.

    - ``len(batch)``: samples; ``batch.keys``: their keys (``"000003-0000012"``);
      ``batch.fields``: field names (``("jpg", "cls")``);
      ``batch["jpg"]`` or ``batch.field("jpg")``: a `FieldView`;
      ``batch.sample(i)``: ``{field: memoryview}`` of sample ``i``.
    - ``batch.release()`` (or ``with batch:``, or garbage collection) ends it.
      Afterwards the batch and its `FieldView`\\ s raise `ReleasedError` and its
      per-sample memoryviews raise ``ValueError``; numpy arrays and DLPack
      tensors exported before keep the memory alive until they are gone.
    """

    __slots__ = ("_lease", "_layout", "_views", "_spans", "_keys", "epoch", "index", "nbytes", "_len", "__weakref__")

    # The epoch it belongs to, its index in the epoch, and its bytes in the engine.
    epoch: int
    index: int
    nbytes: int
    _lease: _Lease | None
    _layout: _Layout | None
    _views: list[memoryview]
    # Per field: the start address and one memoryview over the bytes of all
    # its samples, which each sample's view is a slice of (see FieldView).
    _spans: dict[str, tuple[int, memoryview]]
    _keys: list[str] | None
    _len: int

    def __init__(self, lease: _Lease) -> None:
        raw = lease.raw
        self._lease = lease
        self._layout = None
        self._views = []
        self._spans = {}
        self._keys = None
        self.epoch = raw.epoch
        self.index = raw.index
        self.nbytes = raw.bytes
        self._len = raw.sample_count

    # -- lifetime --------------------------------------------------------

    def _live(self):
        lease = self._lease
        if lease is None:
            raise ReleasedError(f"batch {self.index} was released; views of it cannot be used")
        if lease.generation != fork_generation():
            raise ForkedError("this batch belongs to the parent process (fork); open a new Loader here")
        return lease

    @property
    def released(self) -> bool:
        return self._lease is None

    def release(self) -> bool:
        """Ends the batch. Returns True when its memory went back to the engine
        now, False when exported numpy arrays or tensors still hold it (it goes
        back when they are gone). Idempotent."""
        lease = self._lease
        if lease is None:
            return False
        self._lease = None
        self._layout = None
        self._spans = {}
        views, self._views = self._views, []
        for mv in views:
            try:
                mv.release()
            except BufferError:  # something reads through it: it keeps the lease
                pass
        del views
        now = sys.getrefcount(lease) <= 2  # this frame and getrefcount's argument
        del lease
        return now

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass

    # -- contents --------------------------------------------------------

    def _get_layout(self):
        lease = self._live()
        layout = self._layout
        if layout is None:
            layout = self._layout = _Layout(lease.raw)
        return lease, layout

    def __len__(self) -> int:
        return self._len

    @property
    def keys(self) -> list[str]:
        """The samples' keys, as str (undecodable bytes kept by ``surrogateescape``)."""
        lease = self._live()
        if self._keys is None:
            raw = lease.raw
            n = raw.sample_count
            ks = (ctypes.c_char_p * (3 * n)).from_address(raw.samples)[0::3] if n else []
            self._keys = [k.decode("utf-8", "surrogateescape") for k in ks]
        return list(self._keys)

    def key_array(self) -> NDArray[np.bytes_]:
        """The samples' keys as one numpy bytes array (``dtype S<longest>``,
        ``[b"000003-0000012", ...]``), built without a Python object per key;
        a copy that does not depend on the batch."""
        return self._get_layout()[1].key_array()

    def source(self, i: int) -> str:
        """The shard (path or URL as configured) that sample `i` came from."""
        lease = self._live()
        if not 0 <= i < self._len:
            raise IndexError(f"sample {i} of a batch of {self._len}")
        raw = ctypes.byref(lease.raw)
        text = text_out(lambda buf, size, needed: _ffi.lib.ringfeed_batch_sample_source(raw, i, buf, size, needed))
        return text.decode("utf-8", "surrogateescape")

    @property
    def fields(self) -> tuple[str, ...]:
        """Field names present in the batch, in order of first appearance."""
        return self._get_layout()[1].names

    def field(self, name: str) -> FieldView:
        """The `FieldView` of field `name` (KeyError if no sample has it)."""
        _, layout = self._get_layout()
        if name not in layout.index:
            raise KeyError(f"no field {name!r} in this batch (fields: {', '.join(layout.names)})")
        return FieldView(self, name)

    __getitem__ = field

    def __contains__(self, name: object) -> bool:
        return name in self._get_layout()[1].index

    def sample(self, i: int) -> dict[str, memoryview]:
        """``{field: memoryview}`` of sample `i` (zero-copy, released with the batch)."""
        return {name: cast(memoryview, self.field(name)[i]) for name in self.fields if self.field(name).present[i]}

    def __repr__(self) -> str:
        state = "released" if self._lease is None else f"{self._len} samples, {self.nbytes} bytes"
        return f"<ringfeed.Batch index={self.index} epoch={self.epoch} {state}>"


class FieldView:
    """One field across a batch, without copying its bytes.

    - ``lengths`` (int64) and ``addresses`` (uint64): per sample; ``present``:
      bool mask of the samples that have the field.
    - ``view[i]``: sample i's bytes as a read-only memoryview (None if absent);
      ``iter(view)``, ``len(view)``.
    - ``contiguous``: True when the samples' bytes follow each other in
      memory; then ``values`` (a uint8 numpy array over all of them) and
      ``offsets`` (int64, ``len + 1`` entries) are a zero-copy ragged array.
      Tar shards put headers between members, so this mostly holds only for
      batches the engine collated; otherwise use ``view[i]`` (zero-copy) or
      ``gather()`` (one copy into new arrays).
    - ``fixed(dtype, copy=None)``: a ``(batch, n)`` numpy array when every
      sample's field has the same size; zero-copy when the fields lie at a
      constant stride in memory (``fixed_zero_copy``), else copied (or, with
      ``copy=False``, ValueError).
    - ``__dlpack__``: ``torch.from_dlpack(view)``, ``numpy.from_dlpack(view)``
      give the same ``(batch, n)`` uint8 data without copying; the batch's
      memory stays alive until the tensor is gone.

    Exported numpy arrays are read-only views of the engine's memory and keep
    it alive (see `Batch`); the view itself raises `ReleasedError` once the
    batch is released.
    """

    __slots__ = ("_batch", "name")

    def __init__(self, batch: Batch, name: str) -> None:
        self._batch = batch
        self.name = name

    def _get(self):
        lease, layout = self._batch._get_layout()
        return lease, layout, layout.index[self.name]

    def __len__(self) -> int:
        return len(self._batch)

    @property
    def present(self) -> NDArray[np.bool_]:
        return self._get()[2] >= 0

    @property
    def lengths(self) -> NDArray[np.int64]:
        _, layout, idx = self._get()
        out = layout.lengths[idx]
        if self.name in layout.partial:
            out[idx < 0] = 0
        return out

    @property
    def addresses(self) -> NDArray[np.uint64]:
        _, layout, idx = self._get()
        out = layout.addresses[idx]
        if self.name in layout.partial:
            out[idx < 0] = 0
        return out

    @property
    def nbytes(self) -> int:
        return int(self.lengths.sum())

    @property
    def contiguous(self) -> bool:
        _, layout, idx = self._get()
        return self._contiguous(layout, idx)

    @staticmethod
    def _contiguous(layout, idx):
        if (idx < 0).any():
            return False
        a = layout.addresses[idx]
        n = layout.lengths[idx].astype(np.uint64)
        return bool((a[1:] == a[:-1] + n[:-1]).all())

    @property
    def offsets(self) -> NDArray[np.int64]:
        """int64 start of each sample in ``values`` plus the end (``len + 1`` entries)."""
        lengths = self.lengths
        out = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=out[1:])
        return out

    @property
    def values(self) -> NDArray[np.uint8]:
        """The field's bytes of every sample as one uint8 array, without copying.
        Only when ``contiguous``; ValueError otherwise (use ``view[i]`` or ``gather()``)."""
        lease, layout, idx = self._get()
        if not self._contiguous(layout, idx):
            raise ValueError(
                f"field {self.name!r}: the samples' bytes are not contiguous in memory "
                "(tar headers lie between members); use view[i] (zero-copy) or gather() (a copy)"
            )
        total = int(layout.lengths[idx].sum())
        addr = int(layout.addresses[idx[0]]) if len(idx) else 0
        if total == 0:
            return np.empty(0, np.uint8)
        return _export(lease, addr, (total,), None, np.uint8)

    def _span(self, lease, layout, idx) -> tuple[int, memoryview]:
        """The start address and a memoryview of the bytes from the field's
        first sample to the end of its last, made once per batch: a sample's
        view is a slice of it. One ctypes array for the field instead of one
        per sample, whose array type (one per distinct length) cost ~10 us
        a sample to make. Released with the batch like every view."""
        batch = self._batch
        got = batch._spans.get(self.name)
        if got is None:
            present = idx[idx >= 0]
            lengths = layout.lengths[present]
            present = present[lengths > 0]
            if len(present):
                a = layout.addresses[present]
                lo = int(a.min())
                hi = int((a + layout.lengths[present].astype(np.uint64)).max())
                mv = memoryview_at(lease, lo, hi - lo)
                batch._views.append(mv)
            else:
                lo, mv = 0, memoryview(b"")
            got = batch._spans[self.name] = (lo, mv)
        return got

    def __getitem__(self, i: SupportsIndex) -> memoryview | None:
        lease, layout, idx = self._get()
        j = int(idx[i])
        if j < 0:
            return None
        lo, span = self._span(lease, layout, idx)
        at = int(layout.addresses[j]) - lo
        n = int(layout.lengths[j])
        mv = span[at : at + n] if n else span[0:0]
        self._batch._views.append(mv)
        return mv

    def __iter__(self) -> Iterator[memoryview | None]:
        return iter(self.memoryviews())

    def memoryviews(self) -> list[memoryview | None]:
        """Every sample's bytes as read-only memoryviews (None where absent)."""
        lease, layout, idx = self._get()
        lo, span = self._span(lease, layout, idx)
        starts = (layout.addresses[idx].astype(np.int64) - lo).tolist()
        lengths = layout.lengths[idx].tolist()
        out: list[memoryview | None] = [
            None if j < 0 else span[a : a + n] if n else span[0:0]
            for j, a, n in zip(idx.tolist(), starts, lengths)
        ]
        self._batch._views.extend(v for v in out if v is not None)
        return out

    def gather(self) -> tuple[NDArray[np.uint8], NDArray[np.int64]]:
        """Copies the field of every sample into new arrays: ``(values, offsets)``,
        uint8 and int64. The copies do not depend on the batch."""
        lease, layout, idx = self._get()
        lengths = self.lengths
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        out = np.empty(int(offsets[-1]), np.uint8)
        if len(out):
            lo, nbytes, starts = span(layout.addresses[idx].astype(np.int64), lengths, idx >= 0)
            gather(lo, nbytes, starts, lengths, out.ctypes.data, len(out))
        del lease
        return out, offsets

    # -- fixed-size fields -------------------------------------------------

    def _fixed_layout(self, dtype):
        """(lease, address, shape, strides or None when not at a constant stride)."""
        lease, layout, idx = self._get()
        dtype = np.dtype(dtype)
        if (idx < 0).any():
            raise ValueError(f"field {self.name!r} is missing from some samples; it is not fixed-size")
        lengths = layout.lengths[idx]
        b = len(idx)
        n = int(lengths[0]) if b else 0
        if b and not bool((lengths == n).all()):
            raise ValueError(
                f"field {self.name!r} is not fixed-size: lengths from {int(lengths.min())} "
                f"to {int(lengths.max())} bytes"
            )
        if n % dtype.itemsize:
            raise ValueError(f"field {self.name!r}: {n} bytes is not a whole number of {dtype} items")
        addrs = layout.addresses[idx]
        shape = (b, n // dtype.itemsize)
        if b <= 1:
            return lease, int(addrs[0]) if b else 0, shape, (max(n, dtype.itemsize), dtype.itemsize)
        d = np.diff(addrs.astype(np.int64))
        if bool((d == d[0]).all()) and d[0] >= n:
            return lease, int(addrs[0]), shape, (int(d[0]), dtype.itemsize)
        return lease, int(addrs[0]), shape, None

    @property
    def fixed_zero_copy(self) -> bool:
        """True when ``fixed()`` can return a view: equal sizes at a constant stride."""
        try:
            return self._fixed_layout(np.uint8)[3] is not None
        except ValueError:
            return False

    def fixed(self, dtype: DTypeLike = np.uint8, copy: bool | None = None) -> NDArray[Any]:
        """The field as a ``(batch, n)`` array of `dtype` (n = bytes / itemsize).

        Every sample's field must have the same size (ValueError otherwise).
        ``copy=None``: a zero-copy read-only view when the fields lie at a
        constant stride (one chunk of the same tar layout), else a copy;
        ``copy=False``: the view or ValueError; ``copy=True``: always a copy.
        A view keeps the batch's memory alive until it is gone.
        """
        lease, addr, shape, strides = self._fixed_layout(dtype)
        dtype = np.dtype(dtype)
        if strides is not None and copy is not True:
            if shape[0] == 0 or shape[1] == 0:
                return np.empty(shape, dtype)
            return _export(lease, addr, shape, strides, dtype)
        if copy is False:
            raise ValueError(
                f"field {self.name!r} is fixed-size but not at a constant stride in memory "
                "(the batch spans chunks, or other members lie between); use copy=None or True"
            )
        out = np.empty(shape, dtype)
        _, layout, idx = self._get()
        row = shape[1] * dtype.itemsize
        if out.size:
            addrs = layout.addresses[idx].astype(np.int64)
            lo, hi = int(addrs.min()), int(addrs.max()) + row
            gather(lo, hi - lo, addrs - lo, np.full(len(addrs), row, np.int64), out.ctypes.data, out.nbytes)
        del lease
        return out

    # -- DLPack ------------------------------------------------------------

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> CapsuleType:
        from . import _dlpack

        if dl_device is not None and tuple(dl_device)[0] != _dlpack.KDL_CPU:
            raise BufferError("ringfeed batches are in host memory; dl_device must be CPU")
        lease, addr, shape, strides = self._fixed_layout(np.uint8)
        if strides is None or copy is True:
            if copy is False:
                raise BufferError(f"field {self.name!r} is not at a constant stride; cannot export without a copy")
            return self.fixed(copy=True).__dlpack__()
        return _dlpack.capsule(lease, addr, shape, strides)

    def __dlpack_device__(self) -> tuple[int, int]:
        from . import _dlpack

        return (_dlpack.KDL_CPU, 0)

    def __repr__(self) -> str:
        return f"<ringfeed.FieldView {self.name!r} of {self._batch!r}>"
