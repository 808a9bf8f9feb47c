"""Exceptions: one `ringfeed.Error` subclass per C status code.

Each carries the engine's message (``str(e)``, ``e.message``), the status
code (``e.status``) and its C name (``e.status_name``). Classes that match a
Python built-in family also inherit from it: a bad configuration value is a
``ValueError``, a NULL or bad argument a ``ValueError``.

The class for each status is declared once, by ``@_raised_for(status)`` on
the class: it sets the class's ``status`` and registers it in `BY_STATUS`,
which `from_status` reads. ``tests/test_errors.py`` checks the registry
against the statuses of the loaded library.
"""

from __future__ import annotations

import ctypes
from typing import Callable, TypeVar

from . import _ffi

_E = TypeVar("_E", bound="Error")

BY_STATUS: dict[int, type[Error]] = {}


def _raised_for(status: int) -> Callable[[type[_E]], type[_E]]:
    """Class decorator: the exception `from_status` raises for `status`."""

    def register(cls: type[_E]) -> type[_E]:
        if status in BY_STATUS:
            raise TypeError(f"status {status} already has {BY_STATUS[status].__name__}")
        cls.status = status
        BY_STATUS[status] = cls
        return cls

    return register


class Error(Exception):
    """An error reported by the ringfeed engine."""

    status: int | None = None

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status

    @property
    def status_name(self) -> str:
        return _ffi.lib.ringfeed_status_name(self.status).decode()


@_raised_for(_ffi.RINGFEED_ERR_INVALID_ARGUMENT)
class InvalidArgumentError(Error, ValueError):
    """A pointer argument is NULL or misaligned, or a string is not UTF-8."""


@_raised_for(_ffi.RINGFEED_ERR_INVALID_HANDLE)
class InvalidHandleError(Error):
    """The loader handle is unknown or closed, or the batch was already released."""


@_raised_for(_ffi.RINGFEED_ERR_CONFIG)
class ConfigError(Error, ValueError):
    """The configuration is malformed, or a key has a bad value."""


@_raised_for(_ffi.RINGFEED_ERR_DATASET)
class DatasetError(Error):
    """A dataset URL is malformed, unsupported, or names nothing (a missing file),
    or an object changed while it was read (no bytes of two versions are returned:
    read it again for the new version)."""


@_raised_for(_ffi.RINGFEED_ERR_IO)
class IoError(Error):
    """Reading a shard failed."""


@_raised_for(_ffi.RINGFEED_ERR_FORMAT)
class FormatError(Error):
    """A shard is not a valid WebDataset tar (corrupt, truncated, duplicate field)."""


@_raised_for(_ffi.RINGFEED_ERR_MEMORY)
class MemorySetupError(Error):
    """Memory could not be set up as configured, or the budget is too small."""


@_raised_for(_ffi.RINGFEED_ERR_BUFFER_TOO_SMALL)
class BufferTooSmallError(Error):
    """The caller's buffer is too small."""

    # Set by `read_object_into`: the size of the object that did not fit.
    size: int


@_raised_for(_ffi.RINGFEED_ERR_CLOSED)
class ClosedError(Error):
    """The loader was closed (possibly by another thread while this one waited)."""


@_raised_for(_ffi.RINGFEED_ERR_PANIC)
class PanicError(Error):
    """An internal error of the engine was caught at the C boundary."""


@_raised_for(_ffi.RINGFEED_ERR_IO_URING)
class IoUringError(Error):
    """io_uring was required by the configuration but is not available."""


@_raised_for(_ffi.RINGFEED_ERR_NETWORK)
class NetworkError(Error):
    """A network read failed after its retries."""


@_raised_for(_ffi.RINGFEED_ERR_STATE)
class StateError(Error, ValueError):
    """A resume state (well formed: a malformed one is `ConfigError`) does not
    fit this dataset, its epoch settings or its layout, or an elastic resume
    lacks an old consumer's state; or a shard's samples do not match the plan
    (a manifest's sample count is wrong)."""


@_raised_for(_ffi.RINGFEED_ERR_NODE)
class NodeError(Error):
    """The node engine (``node="auto"`` or a socket) could not be reached or
    started, refused this consumer (another user, or a dataset, epoch or
    layout key that differs from the engine's, named in the message), exited,
    or broke the transport."""


@_raised_for(_ffi.RINGFEED_ERR_EXISTS)
class ObjectExistsError(Error, FileExistsError):
    """A whole-object write found its target there already (S3 answered
    ``PreconditionFailed`` to ``If-None-Match: *``, or the local file exists)
    and ``overwrite`` is false. Nothing was written."""


# Raised by the package itself, for Python objects used too late or in the
# wrong process: they carry the status of the same fault in C, but the engine
# never reports them, so `from_status` does not raise them.


class ReleasedError(Error, ValueError):
    """A batch, or a view of it, was used after `release()`."""

    status = _ffi.RINGFEED_ERR_INVALID_HANDLE


class SafetensorsError(FormatError, ValueError):
    """A safetensors file whose header is malformed: a length past the end,
    JSON that is not a header, an unknown dtype, a tensor whose offsets lie
    outside the data or disagree with its shape."""

    status = _ffi.RINGFEED_ERR_FORMAT


class ForkedError(Error):
    """A loader or batch was used in a child process after fork(); open a new loader there."""

    status = _ffi.RINGFEED_ERR_INVALID_HANDLE


def last_error_message() -> str:
    n = _ffi.lib.ringfeed_last_error(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    _ffi.lib.ringfeed_last_error(buf, n + 1)
    return buf.value.decode("utf-8", "replace")


def redact(text: object) -> str:
    """`text` with the credentials of any URL in it (a presigned URL's
    signature, key id and token; a SAS `sig`; a password before the host)
    replaced by ``REDACTED``, as the library's own messages are."""
    raw = str(text).encode("utf-8", "replace")
    n = _ffi.lib.ringfeed_redact(raw, None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    _ffi.lib.ringfeed_redact(raw, buf, n + 1)
    return buf.value.decode("utf-8", "replace")


def from_status(status: int, context: str | None = None) -> Error:
    """The exception for a negative status, with this thread's last message
    (the library redacts it; `context`, which may quote a URL the caller
    gave, is redacted here)."""
    msg = last_error_message()
    if context:
        msg = f"{redact(context)}: {msg}"
    cls = BY_STATUS.get(status, Error)
    return cls(msg, status)
