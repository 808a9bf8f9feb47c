"""Batch leases and the memory they keep alive.

A `_Lease` owns one C `ringfeed_batch`. It calls `ringfeed_batch_release`
exactly once, when the last Python reference to it goes. Who holds it:

- the `Batch` itself, until `Batch.release()` (or its garbage collection);
- every numpy array exported from the batch (through `_Exported`, the array's
  `.base`), every per-sample memoryview (through the ctypes array under it),
  and every DLPack capsule or tensor (through the deleter's table).

So releasing a batch never frees memory that an exported object can still
read: the C release is deferred until those are gone. ringfeed's own view
objects (`Batch`, `FieldView`) check the batch and raise `ReleasedError`
after `release()`, and per-sample memoryviews are released (they raise
`ValueError` on use) unless something holds a buffer export on them.

After fork(), the child never calls into the engine for a lease made in the
parent (the engine's threads and locks are not in the child).
"""

import ctypes
import os

from . import _ffi

_fork_generation = 0


def _after_fork_in_child():
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


def fork_generation():
    return _fork_generation


_live = [0]  # batches not yet given back to the engine (GIL-protected counter)


def live_batches():
    """Batches whose memory the engine has not got back yet (held, or kept by exports)."""
    return _live[0]


class _Lease:
    __slots__ = ("raw", "generation", "arena", "ticket", "__weakref__")

    def __init__(self, raw, arena=None):
        self.raw = raw
        self.generation = _fork_generation
        # The loader's shared arena (`_transport.Arena`) when it has one:
        # then the batch can be shipped to another process without a copy.
        self.arena = arena
        self.ticket = None  # its `_transport.Ticket`, once shipped
        _live[0] += 1

    def __del__(self):
        raw = self.raw
        try:
            _live[0] -= 1
            if raw.handle and self.generation == _fork_generation:
                _ffi.lib.ringfeed_batch_release(ctypes.byref(raw))
        except Exception:  # interpreter shutdown: the library may be gone
            pass


class _Exported:
    """The `.base` of an exported numpy array: its memory and the lease behind it."""

    __slots__ = ("__array_interface__", "_lease")

    def __init__(self, lease, address, shape, strides, typestr, writable=False):
        self._lease = lease
        self.__array_interface__ = {
            "version": 3,
            # Read-only for numpy: the engine's bytes are `const`. torch has no
            # read-only tensors (it warns on each one made from such an
            # array), so its views are writable by contract only.
            "data": (address, not writable),
            "shape": shape,
            "strides": strides,
            "typestr": typestr,
        }


def memoryview_at(lease, address, length):
    """A read-only memoryview of `length` bytes at `address` that keeps `lease` alive."""
    arr = (ctypes.c_ubyte * length).from_address(address)
    arr._lease = lease
    return memoryview(arr).cast("B").toreadonly()
