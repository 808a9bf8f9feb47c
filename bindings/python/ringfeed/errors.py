"""Exceptions: one `ringfeed.Error` subclass per C status code.

Each carries the engine's message (``str(e)``, ``e.message``), the status
code (``e.status``) and its C name (``e.status_name``). Classes that match a
Python built-in family also inherit from it: a bad configuration value is a
``ValueError``, a NULL or bad argument a ``ValueError``.
"""

import ctypes

from . import _ffi


class Error(Exception):
    """An error reported by the ringfeed engine."""

    status = None

    def __init__(self, message, status=None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status

    @property
    def status_name(self):
        return _ffi.lib.ringfeed_status_name(self.status).decode()


class InvalidArgumentError(Error, ValueError):
    status = _ffi.RINGFEED_ERR_INVALID_ARGUMENT


class InvalidHandleError(Error):
    status = _ffi.RINGFEED_ERR_INVALID_HANDLE


class ConfigError(Error, ValueError):
    """The configuration is malformed, or a key has a bad value."""

    status = _ffi.RINGFEED_ERR_CONFIG


class DatasetError(Error):
    """A dataset URL is malformed, unsupported, or names nothing (a missing file)."""

    status = _ffi.RINGFEED_ERR_DATASET


class IoError(Error):
    """Reading a shard failed."""

    status = _ffi.RINGFEED_ERR_IO


class FormatError(Error):
    """A shard is not a valid WebDataset tar (corrupt, truncated, duplicate field)."""

    status = _ffi.RINGFEED_ERR_FORMAT


class MemorySetupError(Error):
    """Memory could not be set up as configured, or the budget is too small."""

    status = _ffi.RINGFEED_ERR_MEMORY


class BufferTooSmallError(Error):
    status = _ffi.RINGFEED_ERR_BUFFER_TOO_SMALL


class ClosedError(Error):
    """The loader was closed (possibly by another thread while this one waited)."""

    status = _ffi.RINGFEED_ERR_CLOSED


class PanicError(Error):
    """An internal error of the engine was caught at the C boundary."""

    status = _ffi.RINGFEED_ERR_PANIC


class IoUringError(Error):
    """io_uring was required by the configuration but is not available."""

    status = _ffi.RINGFEED_ERR_IO_URING


class NetworkError(Error):
    """A network read failed after its retries."""

    status = _ffi.RINGFEED_ERR_NETWORK


class StateError(Error, ValueError):
    """A resume state (well formed: a malformed one is `ConfigError`) does not
    fit this dataset, its epoch settings or its layout, or an elastic resume
    lacks an old consumer's state; or a shard's samples do not match the plan
    (a manifest's sample count is wrong)."""

    status = _ffi.RINGFEED_ERR_STATE


class ReleasedError(Error, ValueError):
    """A batch, or a view of it, was used after `release()`."""

    status = _ffi.RINGFEED_ERR_INVALID_HANDLE


class ForkedError(Error):
    """A loader or batch was used in a child process after fork(); open a new loader there."""

    status = _ffi.RINGFEED_ERR_INVALID_HANDLE


BY_STATUS = {
    cls.status: cls
    for cls in (
        InvalidArgumentError,
        InvalidHandleError,
        ConfigError,
        DatasetError,
        IoError,
        FormatError,
        MemorySetupError,
        BufferTooSmallError,
        ClosedError,
        PanicError,
        IoUringError,
        NetworkError,
        StateError,
    )
}


def last_error_message():
    n = _ffi.lib.ringfeed_last_error(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    _ffi.lib.ringfeed_last_error(buf, n + 1)
    return buf.value.decode("utf-8", "replace")


def from_status(status, context=None):
    """The exception for a negative status, with this thread's last message."""
    msg = last_error_message()
    if context:
        msg = f"{context}: {msg}"
    cls = BY_STATUS.get(status, Error)
    return cls(msg, status)
