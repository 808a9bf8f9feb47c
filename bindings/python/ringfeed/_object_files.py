"""File-like objects over whole objects: `ObjectReader` reads an
`ObjectBuffer` (read whole first, then served from memory) and
`ObjectWriter` streams into a C `ringfeed_writer`, whose object becomes
visible only at `close()`. Both are `io.RawIOBase`, so ``torch.save`` /
``torch.load``, ``pickle`` and ``io.BufferedReader`` take them.
"""

from __future__ import annotations

import ctypes
import io
from typing import TYPE_CHECKING, Any, Callable, cast

import numpy as np

from . import _ffi
from ._lease import fork_generation
from ._object_buffer import ObjectBuffer, config_json, read_handle, url_arg
from .errors import ClosedError, ForkedError, from_status

if TYPE_CHECKING:
    from types import TracebackType

    from typing_extensions import Buffer, Self

    from ._typing import BytesLike, StrPath

_lib = _ffi.lib


def bytes_address(data: BytesLike) -> tuple[int | None, int, object]:
    """``(address, nbytes, keepalive)`` of a bytes-like object's bytes; a
    non-contiguous one is copied first. Address None when empty."""
    try:
        view = memoryview(cast("Buffer", data))
    except TypeError:
        raise TypeError(f"a bytes-like object is required, not {type(data).__name__}") from None
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    if view.nbytes == 0:
        return None, 0, view
    arr = np.frombuffer(view, np.uint8)
    return arr.ctypes.data, arr.nbytes, arr


class ObjectReader(io.RawIOBase):
    """A read-only, seekable file over one object, read whole at open
    (``ringfeed.open_object(url)``). `buffer` is its `ObjectBuffer`;
    closing the reader closes it."""

    def __init__(self, buffer: ObjectBuffer) -> None:
        super().__init__()
        if not isinstance(buffer, ObjectBuffer):
            raise TypeError(f"ObjectReader needs an ObjectBuffer, not {type(buffer).__name__}")
        self.buffer = buffer
        self.name = buffer.url
        self._view = buffer.memoryview()
        self._pos = 0

    @classmethod
    def open(cls, url: StrPath, **config: Any) -> Self:
        """The object at `url`, read whole, as a reader."""
        return cls(ObjectBuffer(url, read_handle(url, config)))

    def readable(self) -> bool:
        self._checkClosed()
        return True

    def seekable(self) -> bool:
        self._checkClosed()
        return True

    def tell(self) -> int:
        self._checkClosed()
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._checkClosed()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = len(self._view) + offset
        else:
            raise ValueError(f"invalid whence ({whence}; 0, 1 or 2 expected)")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def readinto(self, b: BytesLike) -> int:
        self._checkClosed()
        out = memoryview(cast("Buffer", b)).cast("B")
        chunk = self._view[self._pos : self._pos + len(out)]
        out[: len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)

    def readall(self) -> bytes:
        self._checkClosed()
        data = bytes(self._view[self._pos :])
        self._pos = max(self._pos, len(self._view))
        return data

    def close(self) -> None:
        if not self.closed:
            self._view.release()
            self.buffer.close()
        super().close()

    def __reduce__(self):
        raise TypeError("a ringfeed.ObjectReader cannot be pickled; send its URL")


class ObjectWriter(io.RawIOBase):
    """A write-only file that becomes the object at `url` when closed
    (``ringfeed.ObjectWriter(url, **config)`` or ``ringfeed.open_object(url,
    "wb", ...)``). Parts are uploaded while the caller goes on writing
    (``part_size``, ``parts_in_flight``); nothing is visible at `url` until
    `close()` commits it, whole.

    An existing object raises `ObjectExistsError` at open (and at close, if
    another writer got there first) unless ``overwrite=True``. ``with
    ObjectWriter(url) as f:`` commits at a normal exit and `abort()`s when
    the block raises; a writer dropped before `close()` is aborted, never
    committed. After an error nothing is kept, and later calls raise it again.
    """

    def __init__(self, url: StrPath, **config: Any) -> None:
        super().__init__()
        self._handle: int | None = None
        self.name = url
        self._pos = 0
        self._generation = fork_generation()
        handle = ctypes.c_void_p()
        st = _lib.ringfeed_writer_open(url_arg(url), config_json(config), ctypes.byref(handle))
        if st != _ffi.RINGFEED_OK:
            super().close()
            raise from_status(st, f"write {url}")
        self._handle = handle.value

    def _live(self) -> int:
        if self._generation != fork_generation():
            raise ForkedError("this ObjectWriter was opened in the parent process (fork); open a new one here")
        if self._handle is None:
            raise ClosedError(f"this ObjectWriter ({self.name}) was closed or aborted")
        return self._handle

    def writable(self) -> bool:
        self._checkClosed()
        return True

    def tell(self) -> int:
        self._checkClosed()
        return self._pos

    def write(self, b: BytesLike) -> int:
        handle = self._live()
        address, nbytes, keep = bytes_address(b)
        st = _lib.ringfeed_writer_write(handle, address, nbytes)
        del keep
        if st != _ffi.RINGFEED_OK:
            raise from_status(st, f"write {self.name}")
        self._pos += nbytes
        return nbytes

    def flush(self) -> None:
        # Parts leave as they fill; nothing is visible before close().
        if self.closed:
            return
        super().flush()

    def _end(self, entry: Callable[[int], int]) -> None:
        handle, self._handle = self._handle, None
        if handle is None:
            return
        if self._generation != fork_generation():
            return  # the parent's upload threads are not in this process
        st = entry(handle)
        if st != _ffi.RINGFEED_OK:
            raise from_status(st, f"write {self.name}")

    def close(self) -> None:
        """Commits the object: it becomes visible at the URL, whole. Idempotent."""
        try:
            self._end(_lib.ringfeed_writer_finish)
        finally:
            super().close()

    def abort(self) -> None:
        """Drops everything written; nothing appears at the URL. Idempotent."""
        try:
            self._end(_lib.ringfeed_writer_abort)
        finally:
            super().close()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self):
        try:
            self.abort()
        except Exception:
            pass

    def __reduce__(self):
        raise TypeError("a ringfeed.ObjectWriter cannot be pickled or sent to another process")
