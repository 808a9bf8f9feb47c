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

A worker's own arena goes when the last mapping does, so its batches stay
valid in the main process after the worker exits. A node engine's arena
does not: the engine takes back a departed consumer's batches and reads
into them again. So a worker of a node engine hands over what the main
process holds before it lets go (`Outbox.hand_over`, when its loader closes
or its process exits): the receiver writes a *received* mark (with its
process id) into the pipe when it takes a batch, the worker then raises a
flag in a small shared page (``closing``), drains the pipe, and asks the
engine to keep each batch received and not yet released for its receiver
(``ringfeed_node_keep``); the engine frees it when the receiver releases it
(``ringfeed_node_release``) or exits. A receiver checks the flag after each
of its writes: once it is raised (or the pipe is gone) the worker may not
read them, and the receiver asks the engine itself — to keep a batch it
takes (an error if the worker already let it go: its bytes may be reused),
to free one it releases (a second release of a batch is harmless). A batch
never received (left in a queue when the DataLoader shut its workers down)
is not kept: it comes back to the engine with the worker.

Tickets carry a random token per worker process and the identity (device
and inode) of the arena's file, of the pipe and of the flag's page: what
the receiver opens through ``/proc`` is checked against them, so a reused
process id or descriptor number never maps another process's memory or
releases its batches. The receiver's mappings are not inherited by the
processes it forks (``MADV_DONTFORK``): new DataLoader workers do not keep
old arenas alive.
"""

import collections
import ctypes
import errno
import fcntl
import itertools
import mmap
import multiprocessing.util
import os
import secrets
import struct
import threading
import weakref

from . import _ffi
from ._lease import fork_generation
from .errors import last_error_message

_SERIAL = struct.Struct("<Q")
# A record with this bit is a *received* mark: the receiver's process id in
# bits 32-62, the serial in bits 0-31 (serials stay below 2**32).
_RECEIVED = 1 << 63
_SERIAL_MASK = (1 << 32) - 1
_PAGE = 4096


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


def node_key(lease):
    """The node engine's key of a lease's batch, or None for a batch of an
    engine in this process (``ringfeed_batch_node_key``)."""
    arena = lease.arena
    if arena.node is False:
        return None
    needed = ctypes.c_size_t(0)
    buf = ctypes.create_string_buffer(256)
    st = _ffi.lib.ringfeed_batch_node_key(ctypes.byref(lease.raw), buf, len(buf), ctypes.byref(needed))
    if st == _ffi.RINGFEED_ERR_BUFFER_TOO_SMALL:
        buf = ctypes.create_string_buffer(needed.value + 1)
        st = _ffi.lib.ringfeed_batch_node_key(ctypes.byref(lease.raw), buf, len(buf), ctypes.byref(needed))
    if st == _ffi.RINGFEED_ERR_INVALID_ARGUMENT:
        arena.node = False
        return None
    if st != _ffi.RINGFEED_OK:
        raise TransportError(errno.EINVAL, f"ringfeed: a batch's key: {last_error_message()}")
    arena.node = True
    return buf.value


class Outbox:
    """The worker side: batches shipped and not yet released by the receiver."""

    def __init__(self):
        self.pid = os.getpid()
        self.generation = fork_generation()
        self.token = secrets.randbits(63)
        # The flag a receiver reads after each write (see the module's doc).
        self._flag_fd = os.memfd_create("ringfeed-outbox", os.MFD_CLOEXEC)
        os.ftruncate(self._flag_fd, _PAGE)
        self._flag = mmap.mmap(self._flag_fd, _PAGE)
        st = os.fstat(self._flag_fd)
        self._flag_inode = (st.st_dev, st.st_ino)
        self._read, self._write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            # Room for 128 Ki serials: more batches than an arena can hold
            # unless they are of a sample or two.
            fcntl.fcntl(self._write, fcntl.F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass  # /proc/sys/fs/pipe-max-size is lower: the default 64 KiB
        self._lock = threading.Lock()
        # serial -> [lease, receivers to come, node key or None, pids that took it]
        self._sent = {}
        # serial -> node key of the batches kept for a receiver by `hand_over`:
        # a release of one read afterwards goes to the engine.
        self._kept = {}
        self._serial = 0
        self._rest = b""
        st = os.fstat(self._write)
        self._pipe_inode = (st.st_dev, st.st_ino)

    def ship(self, ticket):
        """Counts one more receiver of `ticket`'s batch; returns its serial
        and its node key."""
        lease = ticket.lease()
        key = ticket.key if ticket.box is self else node_key(lease)
        with self._lock:
            if ticket.serial is None or ticket.box is not self:
                self._serial = self._serial % _SERIAL_MASK + 1
                ticket.serial = self._serial
                ticket.box = self
                ticket.key = key
            entry = self._sent.get(ticket.serial)
            if entry is None:
                self._sent[ticket.serial] = [lease, 1, key, set()]
            else:
                entry[1] += 1
            return ticket.serial, key

    def pending(self):
        """Batches shipped and not released yet, here or kept by the engine."""
        with self._lock:
            return len(self._sent) + len(self._kept)

    def drain(self):
        """Releases the batches the receiver gave back; never blocks. Returns
        how many batches went back to the engine."""
        if not self._sent and not self._kept:
            return 0
        gone, kept = [], []
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
                for (record,) in _SERIAL.iter_unpack(data[:cut]):
                    if record & _RECEIVED:
                        entry = self._sent.get(record & _SERIAL_MASK)
                        if entry is not None:
                            entry[3].add((record >> 32) & 0x7FFFFFFF)
                        continue
                    entry = self._sent.get(record)
                    if entry is None:
                        key = self._kept.pop(record, None)
                        if key is not None:
                            kept.append(key)
                        continue
                    entry[1] -= 1
                    if entry[1] == 0:
                        gone.append(self._sent.pop(record)[0])
        # The leases release their batches here, outside the lock; a kept
        # batch's release may have reached the engine before the keep did.
        for key in kept:
            _ffi.lib.ringfeed_node_release(key)
        n = len(gone) + len(kept)
        del gone
        return n

    def hand_over(self, arena=None):
        """Before this process lets go of a node engine's batches (the loader
        of `arena` closes; None: the process exits): raises the flag, drains
        the pipe, asks the engine to keep each batch a receiver took and did
        not release, and drops this process's hold on them and on those no
        receiver took. Returns how many were kept."""
        self._flag[0:8] = _SERIAL.pack(1)
        self.drain()
        kept, dropped = [], []
        with self._lock:
            for serial, (lease, _, key, pids) in list(self._sent.items()):
                if key is None or (arena is not None and lease.arena is not arena):
                    continue
                kept += [(serial, key, pid) for pid in pids]
                dropped.append(self._sent.pop(serial))
        n = 0
        for serial, key, pid in kept:
            # Refused when the engine or the receiver is gone: then no one
            # reads the batch again.
            if _ffi.lib.ringfeed_node_keep(key, pid) == _ffi.RINGFEED_OK:
                n += 1
                with self._lock:
                    self._kept[serial] = key
        del dropped  # the leases release their batches here
        # Releases written after the first drain: a receiver that saw the
        # flag sent its own to the engine, possibly before the keep.
        self.drain()
        return n

    def address(self, arena):
        """What a receiver needs to find `arena` and this outbox."""
        return (
            self.token, self.pid, self._write, self._pipe_inode, self._flag_fd, self._flag_inode,
            arena.serial, arena.fd, arena.length, arena.inode,
        )


_outbox = None
_retired = []  # outboxes that handed over, with batches still out
_at_exit = None  # the process whose exit hands over (see `_hand_over_at_exit`)
_outbox_lock = threading.Lock()


def _current(box):
    return box is not None and box.generation == fork_generation() and box.pid == os.getpid()


def outbox():
    """This process's outbox (a new one after fork, or after a hand-over)."""
    global _outbox, _retired, _at_exit
    with _outbox_lock:
        if not _current(_outbox):
            if _at_exit != (os.getpid(), fork_generation()):
                _at_exit = (os.getpid(), fork_generation())
                _retired = []  # a parent's (fork)
                multiprocessing.util.Finalize(None, _hand_over_at_exit, exitpriority=100)
            _outbox = Outbox()
        return _outbox


def drain():
    """Drains every outbox of this process; returns how many batches went back."""
    box = outbox()
    n = box.drain()
    for old in list(_retired):
        n += old.drain()
        if not old.pending():
            _retired.remove(old)
    return n


def pending():
    """Batches shipped from this process and not released yet."""
    return outbox().pending() + sum(old.pending() for old in _retired)


def hand_over(arena=None):
    """`Outbox.hand_over` on this process's outboxes; the current one is
    then retired: batches shipped afterwards leave through a new one, whose
    flag is down. Returns how many batches were kept."""
    global _outbox
    with _outbox_lock:
        box, _outbox = (_outbox, None) if _current(_outbox) else (None, _outbox)
        if box is not None:
            _retired.append(box)
        boxes = list(_retired) if _at_exit == (os.getpid(), fork_generation()) else []
    n = 0
    for old in boxes:
        n += old.hand_over(arena)
        if not old.pending():
            _retired.remove(old)
    return n


def _hand_over_at_exit():
    # A DataLoader worker ends through multiprocessing, which runs this
    # (exit handlers do not run there); its loaders are still open.
    if _at_exit == (os.getpid(), fork_generation()):
        hand_over()


class Ticket:
    """A batch on its way to another process, pickled with the views of it:
    one per batch (the lease keeps it), so the views of one batch in one
    message arrive holding one `RemoteBatch`. It refers to the lease weakly:
    a cycle would leave the batch to the garbage collector, holding the
    engine's memory meanwhile."""

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
        box = outbox()
        serial, key = box.ship(self)
        return (_receive_batch, (box.address(lease.arena), serial, key))


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
    """Writes released serials (and received marks) into a worker's pipe,
    and reads the worker's flag."""

    def __init__(self, pid, fd, inode, flag_fd, flag_inode):
        self.path = f"/proc/{pid}/fd/{fd}"
        self._lock = threading.Lock()
        self._queue = collections.deque()  # records to write
        self._pending = b""  # bytes of records a full pipe did not take yet
        self._flag = None
        try:
            f = os.open(f"/proc/{pid}/fd/{flag_fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise TransportError(
                e.errno, f"ringfeed: cannot open DataLoader worker {pid}'s flag at /proc/{pid}/fd/{flag_fd}"
            ) from None
        try:
            st = os.fstat(f)
            if (st.st_dev, st.st_ino) != tuple(flag_inode):
                raise TransportError(errno.ESTALE, f"ringfeed: /proc/{pid}/fd/{flag_fd} is not the worker's flag")
            self._flag = mmap.mmap(f, _PAGE, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(f)
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
        this thread is inside it, and then the holder writes it. True when
        the worker will read it: written now, and the worker's flag down."""
        return self._send(serial)

    def received(self, serial):
        """Marks `serial` taken by this process; as `release`."""
        return self._send(_RECEIVED | (os.getpid() << 32) | serial)

    def _send(self, record):
        self._queue.append(record)
        while self._queue and self._lock.acquire(blocking=False):
            try:
                self._write_queued()
            finally:
                self._lock.release()
        written = not self._queue and not self._pending and self._fd >= 0
        # Read after the write: a worker that raised its flag after this
        # read drains the pipe after, and sees the record.
        return written and _SERIAL.unpack_from(self._flag, 0)[0] == 0

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


def _releaser(token, pid, fd, inode, flag_fd, flag_inode):
    with _lock:
        r = _RELEASERS.get(token)
        if r is None:
            r = _RELEASERS[token] = Releaser(pid, fd, inode, flag_fd, flag_inode)
            while len(_RELEASERS) > _KEEP:
                _RELEASERS.popitem(last=False)
        else:
            _RELEASERS.move_to_end(token)
        return r


class RemoteBatch:
    """A worker's batch held in this process; its end releases it there (and
    at the node engine, for a batch of one, once the worker handed over)."""

    __slots__ = ("mapping", "releaser", "serial", "key", "generation", "__weakref__")

    def __init__(self, mapping, releaser, serial, key):
        self.mapping = mapping
        self.releaser = releaser
        self.serial = serial
        self.key = key
        self.generation = fork_generation()
        if key is not None and not releaser.received(serial):
            # The worker may not see the mark: the engine keeps the batch
            # for this process, or says its bytes may be gone.
            if _ffi.lib.ringfeed_node_keep(key, os.getpid()) != _ffi.RINGFEED_OK:
                self.key = None  # nothing to release
                raise TransportError(
                    errno.ESTALE,
                    "ringfeed: a batch arrived after its DataLoader worker let go of it (the worker's "
                    f"loader closed or its process exited): {last_error_message()}",
                )

    def __del__(self):
        if self.generation != fork_generation():
            return  # a forked child's copy: the batch is its parent's to release
        try:
            if not self.releaser.release(self.serial) and self.key is not None:
                _ffi.lib.ringfeed_node_release(self.key)
        except Exception:  # interpreter shutdown
            pass


def _receive_batch(address, serial, key=None):
    (token, pid, pipe_fd, pipe_inode, flag_fd, flag_inode,
     arena_serial, arena_fd, length, arena_inode) = address
    mapping = _mapping(token, pid, arena_serial, arena_fd, length, arena_inode)
    return RemoteBatch(mapping, _releaser(token, pid, pipe_fd, pipe_inode, flag_fd, flag_inode), serial, key)
