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

`_Keeper` is the one way a batch's memory is given back from Python: a
`_Lease`, a node engine's batch kept by its key and a DataLoader worker's
batch held in the main process (`_transport.NodeHeld`, `RemoteBatch`) each
say only what giving back is.
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


class _Keeper:
    """What keeps a batch's memory alive in this process and gives it back,
    once, when the last reference to it goes (`_give_back`): a lease of a
    loader of this process (`_Lease`), a node engine's batch kept by its key
    (`_transport.NodeHeld`), a DataLoader worker's batch held in the main
    process (`_transport.RemoteBatch`). A forked child's copy gives nothing
    back: the batch is the parent's."""

    __slots__ = ("generation", "__weakref__")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "_give_back" not in cls.__dict__:
            raise TypeError(f"{cls.__name__} keeps a batch but does not say how it gives it back (_give_back)")

    def __init__(self):
        self.generation = _fork_generation

    def _forget(self):
        """What this process counts of it, undone (in a forked child too)."""

    def __del__(self):
        try:
            self._forget()
            if self.generation == _fork_generation:
                self._give_back()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


class _Lease(_Keeper):
    __slots__ = ("raw", "arena", "ticket")

    def __init__(self, raw, arena=None):
        super().__init__()
        self.raw = raw
        # The loader's shared arena (`_transport.Arena`) when it has one:
        # then the batch can be shipped to another process without a copy.
        self.arena = arena
        self.ticket = None  # its `_transport.Ticket`, once shipped
        _live[0] += 1

    def _forget(self):
        _live[0] -= 1

    def _give_back(self):
        if self.raw.handle:
            _ffi.lib.ringfeed_batch_release(ctypes.byref(self.raw))


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
