"""`ObjectBuffer`: one whole object read into the library's memory.

It wraps a C `ringfeed_object` handle (``ringfeed_object_read``). The handle
is held by an `_ObjectLease`, which calls ``ringfeed_object_release`` exactly
once, when the last Python reference to it goes. Who holds it: the
`ObjectBuffer` until `close()`, and every view exported from it (memoryview,
numpy array, DLPack capsule or tensor, and the tensors `load_safetensors`
makes), so closing a buffer never frees bytes a view can still read, the
same rule as for batches (`_lease.py`). After `close()` the buffer's own
methods raise `ReleasedError`.

Also here: the configuration JSON of every object call, built from keyword
arguments the way `Loader` builds its own.
"""

from __future__ import annotations

import builtins
import ctypes
import json
import os
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from . import _ffi
from ._lease import _Exported, fork_generation
from ._loader import json_value
from .errors import ReleasedError, from_status, redact

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from typing_extensions import CapsuleType, Self

    from ._typing import StrPath

_lib = _ffi.lib


def config_json(config: dict[str, Any]) -> bytes:
    """The JSON text of an object call's keyword arguments: the loader's
    configuration keys without ``urls`` (the engine names a key it does not
    know, or a bad value, in a `ConfigError`)."""
    cfg = {}
    for key, value in config.items():
        if key == "urls":
            raise TypeError("`urls` is not a keyword of object calls: the URL is their first argument")
        cfg[key] = json_value(key, value)
    return json.dumps(cfg).encode()


def url_arg(url: StrPath) -> bytes:
    """`url` (a str or path) as the C string an entry point takes."""
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str):
        raise TypeError(f"url must be a str or a path, not {type(url).__name__}")
    return url.encode()


class _ObjectLease:
    """Owns one `ringfeed_object` handle; releases it when the last holder goes."""

    __slots__ = ("handle", "address", "length", "generation", "__weakref__")

    address: int
    length: int

    def __init__(self, handle: int | None) -> None:
        self.handle = handle
        self.generation = fork_generation()
        data, length = ctypes.c_void_p(), ctypes.c_uint64(0)
        st = _lib.ringfeed_object_data(handle, ctypes.byref(data), ctypes.byref(length))
        if st != _ffi.RINGFEED_OK:
            _lib.ringfeed_object_release(handle)
            raise from_status(st)
        self.address = cast(int, data.value)  # never NULL, even when empty (ringfeed.h)
        self.length = length.value

    def __del__(self):
        try:
            # An object's bytes are the process's own memory (ringfeed.h):
            # a child of fork() releases its copy like the parent.
            _lib.ringfeed_object_release(self.handle)
        except Exception:  # interpreter shutdown: the library may be gone
            pass


def read_handle(url: StrPath, config: dict[str, Any]) -> _ObjectLease:
    """An `_ObjectLease` over the object at `url`, read whole."""
    handle = ctypes.c_void_p()
    st = _lib.ringfeed_object_read(url_arg(url), config_json(config), ctypes.byref(handle))
    if st != _ffi.RINGFEED_OK:
        raise from_status(st)
    return _ObjectLease(handle.value)


class ObjectBuffer:
    """The bytes of one object, read whole into the library's memory (made by
    `ringfeed.read_object`). Nothing is copied until asked for:

    - ``len(buf)``, ``buf.url``;
    - ``buf.memoryview()`` (and ``memoryview(buf)`` on Python 3.12+): a
      read-only memoryview of the bytes;
    - ``buf.numpy()``: a read-only uint8 numpy array over them;
    - ``torch.from_dlpack(buf)`` / ``numpy.from_dlpack(buf)``: a 1-D uint8
      tensor over them (DLPack has no read-only flag: do not write it);
    - ``bytes(buf)``: a copy.

    ``with read_object(url) as buf:`` closes it at the end; `close()` is
    idempotent and `__del__` calls it. Views made before `close()` keep the
    memory until they are gone; the buffer itself raises `ReleasedError`
    after it.
    """

    def __init__(self, url: StrPath, lease: _ObjectLease) -> None:
        self.url = url
        self._lease: _ObjectLease | None = lease

    def _live(self) -> _ObjectLease:
        lease = self._lease
        if lease is None:
            raise ReleasedError(f"this ObjectBuffer ({redact(self.url)}) was closed")
        return lease

    @property
    def closed(self) -> bool:
        return self._lease is None

    def close(self) -> None:
        """Gives the memory back (once the views made from it are gone too). Idempotent."""
        self._lease = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self):
        self._lease = None

    def __reduce__(self):
        raise TypeError("a ringfeed.ObjectBuffer cannot be pickled; send bytes(buf) or its URL")

    def __len__(self) -> int:
        return self._live().length

    @property
    def nbytes(self) -> int:
        return len(self)

    @property
    def address(self) -> int:
        """Address of the first byte (valid while the buffer or a view is alive)."""
        return self._live().address

    def memoryview(self) -> builtins.memoryview:
        """A read-only memoryview of the bytes, no copy; it keeps them alive."""
        lease = self._live()
        arr = (ctypes.c_ubyte * lease.length).from_address(lease.address)
        setattr(arr, "_lease", lease)  # the view's buffer keeps the bytes alive
        return memoryview(arr).cast("B").toreadonly()

    # PEP 688: `memoryview(buf)`, `np.frombuffer(buf)`, `torch.frombuffer(buf)`
    # on Python 3.12+ (3.11 has no buffer protocol for classes written in
    # Python: call `memoryview()` there).
    def __buffer__(self, flags: int) -> builtins.memoryview:
        return self.memoryview()

    def __release_buffer__(self, view: builtins.memoryview) -> None:
        view.release()

    def numpy(self) -> NDArray[np.uint8]:
        """A read-only 1-D uint8 numpy array over the bytes, no copy; it keeps them alive."""
        lease = self._live()
        return np.asarray(_Exported(lease, lease.address, (lease.length,), None, "|u1"))

    def __bytes__(self) -> bytes:
        return bytes(self.memoryview())

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> CapsuleType:
        from . import _dlpack

        lease = self._live()
        if dl_device is not None and tuple(dl_device)[0] != _dlpack.KDL_CPU:
            raise BufferError("an ObjectBuffer lives in CPU memory: export it to the CPU and copy from there")
        if copy:
            return np.array(self.numpy()).__dlpack__()
        return _dlpack.capsule(lease, lease.address, (lease.length,), (1,))

    def __dlpack_device__(self) -> tuple[int, int]:
        from . import _dlpack

        return (_dlpack.KDL_CPU, 0)

    def __repr__(self) -> str:
        if self._lease is None:
            return f"<ringfeed.ObjectBuffer {redact(self.url)!r} closed>"
        return f"<ringfeed.ObjectBuffer {redact(self.url)!r} {self._lease.length} bytes>"
