"""Batches from a DataLoader worker process to the main process, without a copy.

A PyTorch DataLoader worker runs a loader of its own; what it yields is
pickled and sent to the main process. Sent as tensors, every batch would be
copied into a new shared-memory segment and its descriptor passed over a
socket: at the engine's speed that copy costs more than everything else.
Instead the batch's memory is shared already, and a batch travels as a small
ticket. Two kinds:

**A node engine's batch** (the worker is a consumer of a node engine, the
default with DataLoader workers). The ticket is the batch's key
(``ringfeed_batch_ship``: the engine, the batch's number, its capability).
The worker lets go of the batch as soon as it is pickled; the engine keeps
it in transit. The main process, when it unpickles the ticket, keeps the
batch for itself (``ringfeed_node_claim``: a request the engine answers
before any byte is read) and maps the engine's arena through its own link
to the engine; the batch is then the main process's until it releases it
(`NodeHeld`, when the last view of it goes) or exits — whatever happens to
the worker (a clean exit, SIGTERM at the DataLoader's shutdown, SIGKILL, the
OOM killer) and however little it has left (no descriptor to spare). A
ticket that arrives after its worker exited without anyone keeping the
batch is refused by name (`TransportError`): its bytes are never read. What
the main process keeps is charged to it, not to the worker: the worker's
next reads do not wait for it.

**A batch of the worker's own arena** (``node="off"`` with
``shared_arena``): the worker's arena is a memory file; the ticket says
which arena, which bytes, which batch (`Outbox.ship` keeps the batch's lease
and gives it a serial number). The first ticket of an arena opens the
worker's memory file through ``/proc/<pid>/fd/<fd>`` (the same user's
process) and maps it once (`Mapping`); the end of the views (`RemoteBatch`)
writes the batch's serial into the worker's pipe, opened the same way, and
the worker drains the pipe (`Outbox.drain`, without blocking) before each
batch it asks its engine for and while it waits for one. The mapping
outlives the worker: an arena is never read into once its worker is gone.
Tickets carry a random token per worker process and the identity (device
and inode) of the arena's file and of the pipe: a reused process id or
descriptor number never maps another process's memory or releases its
batches.

The receiver's mappings are not inherited by the processes it forks
(``MADV_DONTFORK``): new DataLoader workers do not keep old arenas alive.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import fcntl
import itertools
import mmap
import os
import secrets
import struct
import threading
import weakref

from . import _ffi
from ._lease import _Keeper, fork_generation
from .errors import last_error_message

_SERIAL = struct.Struct("<Q")


class TransportError(OSError):
    """A batch from a DataLoader worker could not be mapped in this process."""


class Arena:
    """A loader's shared arena, as its process knows it."""

    __slots__ = ("serial", "fd", "base", "length", "inode", "node")

    _serials = itertools.count(1)

    def __init__(self, fd, base, length):
        self.serial = next(Arena._serials)
        self.fd = fd
        self.base = base
        self.length = length
        st = os.fstat(fd)
        self.inode = (st.st_dev, st.st_ino)
        self.node = None  # a node engine's arena? Known at the first batch shipped.


def ship_key(lease):
    """The key a node engine's batch is shipped with (``ringfeed_batch_ship``:
    the engine keeps it in transit once this process lets go), or None for a
    batch of an engine in this process."""
    arena = lease.arena
    if arena.node is False:
        return None
    needed = ctypes.c_size_t(0)
    buf = ctypes.create_string_buffer(256)
    st = _ffi.lib.ringfeed_batch_ship(ctypes.byref(lease.raw), buf, len(buf), ctypes.byref(needed))
    if st == _ffi.RINGFEED_ERR_BUFFER_TOO_SMALL:
        buf = ctypes.create_string_buffer(needed.value + 1)
        st = _ffi.lib.ringfeed_batch_ship(ctypes.byref(lease.raw), buf, len(buf), ctypes.byref(needed))
    if st == _ffi.RINGFEED_ERR_INVALID_ARGUMENT and arena.node is None:
        arena.node = False
        return None
    if st != _ffi.RINGFEED_OK:
        raise TransportError(errno.EINVAL, f"ringfeed: a batch's key: {last_error_message()}")
    arena.node = True
    return buf.value


class Outbox:
    """The worker side of a loader's own arena: batches shipped and not yet
    released by the receiver."""

    def __init__(self):
        self.pid = os.getpid()
        self.generation = fork_generation()
        self.token = secrets.randbits(63)
        self._read, self._write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            # Room for 128 Ki serials: more batches than an arena can hold
            # unless they are of a sample or two.
            fcntl.fcntl(self._write, fcntl.F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass  # /proc/sys/fs/pipe-max-size is lower: the default 64 KiB
        self._lock = threading.Lock()
        # serial -> [lease, receivers to come]
        self._sent = {}
        self._serial = 0
        self._rest = b""
        st = os.fstat(self._write)
        self._pipe_inode = (st.st_dev, st.st_ino)

    def ship(self, ticket):
        """Counts one more receiver of `ticket`'s batch; returns its serial."""
        lease = ticket.lease()
        with self._lock:
            if ticket.serial is None or ticket.box is not self:
                self._serial += 1
                ticket.serial = self._serial
                ticket.box = self
            entry = self._sent.get(ticket.serial)
            if entry is None:
                self._sent[ticket.serial] = [lease, 1]
            else:
                entry[1] += 1
            return ticket.serial

    def pending(self):
        """Batches shipped and not released yet."""
        with self._lock:
            return len(self._sent)

    def drain(self):
        """Releases the batches the receiver gave back; never blocks. Returns
        how many batches went back to the engine."""
        if not self._sent:
            return 0
        gone = []
        while True:
            try:
                data = os.read(self._read, 1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                break
            data = self._rest + data
            cut = len(data) - len(data) % _SERIAL.size
            self._rest = data[cut:]
            with self._lock:
                for (serial,) in _SERIAL.iter_unpack(data[:cut]):
                    entry = self._sent.get(serial)
                    if entry is None:
                        continue
                    entry[1] -= 1
                    if entry[1] == 0:
                        gone.append(self._sent.pop(serial)[0])
        # The leases release their batches here, outside the lock.
        n = len(gone)
        del gone
        return n

    def address(self, arena):
        """What a receiver needs to find `arena` and this outbox."""
        return (self.token, self.pid, self._write, self._pipe_inode, arena.serial, arena.fd, arena.length,
                arena.inode)


_outbox = None
_outbox_lock = threading.Lock()


def outbox():
    """This process's outbox (a new one after fork)."""
    global _outbox
    with _outbox_lock:
        box = _outbox
        if box is None or box.generation != fork_generation() or box.pid != os.getpid():
            box = _outbox = Outbox()
        return box


def drain():
    """Drains this process's outbox; returns how many batches went back."""
    return outbox().drain()


def pending():
    """Batches shipped from this process's own arenas and not released yet."""
    return outbox().pending()


class Ticket:
    """A batch on its way to another process, pickled with the views of it:
    one per batch (the lease keeps it), so the views of one batch in one
    message arrive holding one receiver object. It refers to the lease
    weakly: a cycle would leave the batch to the garbage collector, holding
    the engine's memory meanwhile."""

    __slots__ = ("lease", "serial", "box", "key")

    def __init__(self, lease):
        self.lease = weakref.ref(lease)
        self.serial = None
        self.box = None
        self.key = None

    def __reduce__(self):
        lease = self.lease()
        if lease is None:  # cannot happen: the views being pickled hold it
            raise TransportError(errno.EINVAL, "ringfeed: a batch was released while being sent")
        if self.key is None:
            self.key = ship_key(lease)
        if self.key is not None:
            return (_receive_node, (self.key,))
        box = outbox()
        serial = box.ship(self)
        return (_receive_batch, (box.address(lease.arena), serial))


# -- the receiving side --------------------------------------------------


def _claim(key):
    """Keeps a node engine's batch for this process; returns the address of
    this process's mapping of the engine's arena (``ringfeed_node_claim``)."""
    base, length = ctypes.c_void_p(), ctypes.c_uint64(0)
    st = _ffi.lib.ringfeed_node_claim(key, ctypes.byref(base), ctypes.byref(length))
    if st != _ffi.RINGFEED_OK:
        raise TransportError(
            errno.ESTALE,
            f"ringfeed: a batch from a DataLoader worker could not be kept: {last_error_message()}",
        )
    return base.value


class NodeHeld(_Keeper):
    """A node engine's batch this process keeps; its end releases it. The
    views' bytes lie at `address` plus their offset in the arena."""

    __slots__ = ("key", "address")

    def __init__(self, key):
        super().__init__()
        self.key = None
        self.address = _claim(key)
        self.key = key

    def _give_back(self):
        if self.key is not None:  # None: the claim failed, nothing is kept
            _ffi.lib.ringfeed_node_release(self.key)


def _receive_node(key):
    return NodeHeld(key)


class Mapping:
    """A worker's arena mapped in this process."""

    __slots__ = ("mm", "address", "length", "path", "inode", "_anchor", "__weakref__")

    def __init__(self, pid, fd, length, inode):
        self.path = f"/proc/{pid}/fd/{fd}"
        try:
            f = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise TransportError(
                e.errno,
                f"ringfeed: cannot open DataLoader worker {pid}'s arena at {self.path} ({e.strerror}); "
                "batches cross from workers through /proc: give the workers the same user and /proc, "
                "or pass shared_arena=False to RingfeedDataset to copy batches instead",
            ) from None
        try:
            st = os.fstat(f)
            self.inode = (st.st_dev, st.st_ino)
            if self.inode != tuple(inode) or st.st_size != length:
                raise TransportError(
                    errno.ESTALE,
                    f"ringfeed: {self.path} is not the arena the batch was sent from (its worker exited and "
                    "the process id or descriptor was reused)",
                )
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self.mm = mmap.mmap(f, length, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(f)
        if hasattr(mmap, "MADV_DONTFORK"):
            self.mm.madvise(mmap.MADV_DONTFORK)
        # Batch memory stays out of this process's core dumps, as the
        # worker's own mapping of it does (the arena may hold private data).
        if hasattr(mmap, "MADV_DONTDUMP"):
            self.mm.madvise(mmap.MADV_DONTDUMP)
        self._anchor = ctypes.c_char.from_buffer(self.mm)
        self.address = ctypes.addressof(self._anchor)
        self.length = length

    def current(self):
        """True while the worker still has this arena open (same file)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.inode


class Releaser:
    """Writes released serials into a worker's pipe."""

    def __init__(self, pid, fd, inode):
        self.path = f"/proc/{pid}/fd/{fd}"
        self._lock = threading.Lock()
        self._queue = collections.deque()  # serials to write
        self._pending = b""  # bytes of serials a full pipe did not take yet
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise TransportError(
                e.errno, f"ringfeed: cannot open DataLoader worker {pid}'s release pipe at {self.path}"
            ) from None
        st = os.fstat(self._fd)
        if (st.st_dev, st.st_ino) != tuple(inode):
            fd, self._fd = self._fd, -1  # closed once, here: not again in __del__
            os.close(fd)
            raise TransportError(errno.ESTALE, f"ringfeed: {self.path} is not the pipe the batch was sent with")

    def release(self, serial):
        """Queues `serial` for the worker. Never blocks and never waits on a
        lock: the garbage collector may call it from a `RemoteBatch` while
        this thread is inside it, and then the holder writes it."""
        self._queue.append(serial)
        while self._queue and self._lock.acquire(blocking=False):
            try:
                self._write_queued()
            finally:
                self._lock.release()

    def _write_queued(self):
        data = self._pending
        while self._queue:
            data += _SERIAL.pack(self._queue.popleft())
        if self._fd < 0:
            return
        try:
            n = os.write(self._fd, data)
        except BlockingIOError:
            n = 0
        except OSError:  # the worker is gone: its memory went with it
            os.close(self._fd)
            self._fd = -1
            self._pending = b""
            return
        # A pipe write of at most PIPE_BUF is whole or nothing; a longer one
        # may be cut: the rest goes with the next one, the worker reassembles.
        self._pending = data[n:]

    def __del__(self):
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)


# Arenas and pipes of the workers seen lately, most recent last. A mapping
# holds a worker's arena in memory; views hold their own reference, so an
# evicted mapping only goes when they do.
_MAPPINGS: collections.OrderedDict[tuple[int, int], Mapping] = collections.OrderedDict()
_RELEASERS: collections.OrderedDict[int, Releaser] = collections.OrderedDict()
_KEEP = 64
_lock = threading.Lock()


def _mapping(token, pid, serial, fd, length, inode):
    key = (token, serial)
    with _lock:
        m = _MAPPINGS.get(key)
        if m is not None:
            _MAPPINGS.move_to_end(key)
            return m
        # A new arena: drop the ones their workers closed (or that exited).
        for k in [k for k, v in _MAPPINGS.items() if not v.current()]:
            del _MAPPINGS[k]
        m = _MAPPINGS[key] = Mapping(pid, fd, length, inode)
        while len(_MAPPINGS) > _KEEP:
            _MAPPINGS.popitem(last=False)
        return m


def _releaser(token, pid, fd, inode):
    with _lock:
        r = _RELEASERS.get(token)
        if r is None:
            r = _RELEASERS[token] = Releaser(pid, fd, inode)
            while len(_RELEASERS) > _KEEP:
                _RELEASERS.popitem(last=False)
        else:
            _RELEASERS.move_to_end(token)
        return r


class RemoteBatch(_Keeper):
    """A batch of a worker's own arena held in this process; its end
    releases it there."""

    __slots__ = ("mapping", "releaser", "serial")

    def __init__(self, mapping, releaser, serial):
        super().__init__()
        self.mapping = mapping
        self.releaser = releaser
        self.serial = serial

    @property
    def address(self):
        return self.mapping.address

    def _give_back(self):
        self.releaser.release(self.serial)


def _receive_batch(address, serial):
    token, pid, pipe_fd, pipe_inode, arena_serial, arena_fd, length, arena_inode = address
    mapping = _mapping(token, pid, arena_serial, arena_fd, length, arena_inode)
    return RemoteBatch(mapping, _releaser(token, pid, pipe_fd, pipe_inode), serial)
