"""Batches from a DataLoader worker process to the main process, without a copy.

A PyTorch DataLoader worker runs its own engine; what it yields is pickled
and sent to the main process. Sent as tensors, every batch would be copied
into a new shared-memory segment and its descriptor passed over a socket:
at the engine's speed that copy costs more than everything else. Instead the
worker's engine keeps its arena in a memory file (``shared_arena``), and a
batch travels as a small ticket: which arena, which bytes, which batch.

Worker side (`Outbox`, one per process): shipping a batch keeps its lease
in ``sent`` and gives it a serial number; the receiver writes serials back
into a pipe, and the worker drains it (`Outbox.drain`, without blocking)
before each batch it asks its engine for and while it waits for one, which
drops those leases and releases the batches to the engine. No thread: a
release costs the receiver one small write and the worker one read per
batch, and wakes no one.

Main side: the first ticket of an arena opens the worker's memory file
through ``/proc/<pid>/fd/<fd>`` (the same user's process) and maps it once
(`Mapping`); views of a batch are numpy arrays over that mapping holding a
`RemoteBatch`, whose end writes the batch's serial into the worker's pipe
(opened the same way). The batch's memory stays the worker's until then, so
the engine's memory budget still bounds what the main process holds, and a
view never sees its bytes reused. The mapping outlives the worker: views
still held when a worker exits stay valid.

Tickets carry a random token per worker process and the identity (device
and inode) of the arena's file and of the pipe: what the receiver opens
through ``/proc`` is checked against them, so a reused process id or
descriptor number never maps another process's memory or releases its
batches. The receiver's mappings are not inherited by the processes it
forks (``MADV_DONTFORK``): new DataLoader workers do not keep old arenas
alive.
"""

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

from ._lease import fork_generation

_SERIAL = struct.Struct("<Q")


class Arena:
    """A loader's shared arena, as its process knows it."""

    __slots__ = ("serial", "fd", "base", "length", "inode")

    _serials = itertools.count(1)

    def __init__(self, fd, base, length):
        self.serial = next(Arena._serials)
        self.fd = fd
        self.base = base
        self.length = length
        st = os.fstat(fd)
        self.inode = (st.st_dev, st.st_ino)


class Outbox:
    """The worker side: batches shipped and not yet released by the receiver."""

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
        self._sent = {}  # serial -> [lease, count]
        self._serials = itertools.count(1)
        self._rest = b""
        st = os.fstat(self._write)
        self._pipe_inode = (st.st_dev, st.st_ino)

    def ship(self, ticket):
        """Counts one more receiver of `ticket`'s batch; returns its serial."""
        with self._lock:
            if ticket.serial is None or ticket.box is not self:
                ticket.serial = next(self._serials)
                ticket.box = self
            entry = self._sent.get(ticket.serial)
            if entry is None:
                self._sent[ticket.serial] = [ticket.lease(), 1]
            else:
                entry[1] += 1
            return ticket.serial

    def pending(self):
        """Batches shipped and not released yet (for tests)."""
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
        return (
            self.token, self.pid, self._write, self._pipe_inode,
            arena.serial, arena.fd, arena.length, arena.inode,
        )


_outbox = None
_outbox_lock = threading.Lock()


def outbox():
    """This process's outbox (a new one after fork)."""
    global _outbox
    with _outbox_lock:
        if _outbox is None or _outbox.generation != fork_generation() or _outbox.pid != os.getpid():
            _outbox = Outbox()
        return _outbox


class Ticket:
    """A batch on its way to another process, pickled with the views of it:
    one per batch (the lease keeps it), so the views of one batch in one
    message arrive holding one `RemoteBatch`. It refers to the lease weakly:
    a cycle would leave the batch to the garbage collector, holding the
    engine's memory meanwhile."""

    __slots__ = ("lease", "serial", "box")

    def __init__(self, lease):
        self.lease = weakref.ref(lease)
        self.serial = None
        self.box = None

    def __reduce__(self):
        lease = self.lease()
        if lease is None:  # cannot happen: the views being pickled hold it
            raise TransportError(errno.EINVAL, "ringfeed: a batch was released while being sent")
        box = outbox()
        serial = box.ship(self)
        return (_receive_batch, (box.address(lease.arena), serial))


# -- the receiving side --------------------------------------------------


class TransportError(OSError):
    """A batch from a DataLoader worker could not be mapped in this process."""


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
            try:
                self.mm = mmap.mmap(f, length, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
                writable = True
            except PermissionError:
                # A node engine's arena is sealed against writable mappings.
                self.mm = mmap.mmap(f, length, flags=flags, prot=mmap.PROT_READ)
                writable = False
        finally:
            os.close(f)
        if hasattr(mmap, "MADV_DONTFORK"):
            self.mm.madvise(mmap.MADV_DONTFORK)
        if writable:
            self._anchor = ctypes.c_char.from_buffer(self.mm)
            self.address = ctypes.addressof(self._anchor)
        else:
            # ctypes takes writable buffers only; numpy's view of the
            # read-only mapping gives its address and keeps it exported.
            import numpy

            self._anchor = numpy.frombuffer(self.mm, dtype=numpy.uint8)
            self.address = self._anchor.ctypes.data
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
_MAPPINGS = collections.OrderedDict()
_RELEASERS = collections.OrderedDict()
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


class RemoteBatch:
    """A worker's batch held in this process; its end releases it there."""

    __slots__ = ("mapping", "releaser", "serial", "generation", "__weakref__")

    def __init__(self, mapping, releaser, serial):
        self.mapping = mapping
        self.releaser = releaser
        self.serial = serial
        self.generation = fork_generation()

    def __del__(self):
        if self.generation != fork_generation():
            return  # a forked child's copy: the batch is its parent's to release
        try:
            self.releaser.release(self.serial)
        except Exception:  # interpreter shutdown
            pass


def _receive_batch(address, serial):
    token, pid, pipe_fd, pipe_inode, arena_serial, arena_fd, length, arena_inode = address
    mapping = _mapping(token, pid, arena_serial, arena_fd, length, arena_inode)
    return RemoteBatch(mapping, _releaser(token, pid, pipe_fd, pipe_inode), serial)
