"""`Loader`: one engine, opened from Python keyword arguments."""

from __future__ import annotations

import ctypes
import json
import os
import threading
import warnings
from typing import TYPE_CHECKING, Any, Iterator

from . import _ffi, _transport
from ._batch import Batch, text_out
from ._lease import _Lease, fork_generation, live_batches
from .errors import ClosedError, ConfigError, ForkedError, from_status

if TYPE_CHECKING:
    from typing_extensions import Self

    from ._typing import Urls

_lib = _ffi.lib
# Slice of a blocking wait: short enough for Ctrl-C to be seen between calls.
_WAIT_SLICE_MS = 200
# The slice while batches shipped to another process are out: their release
# comes back through a pipe this thread drains between slices.
_SHIPPED_SLICE_MS = 2
# A wait this long while batches are held unreleased is worth a warning: the
# engine may be stopped because they hold its whole memory budget.
_STALL_WARN_MS = 10_000

_known_keys: tuple[str, ...] | None = None


def json_value(key: str, value: Any) -> Any:
    """A configuration value as JSON takes it: paths as strings; a value
    JSON cannot hold raises TypeError naming the key."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        raise TypeError(f"{key}: {type(value).__name__} is not a JSON value") from None
    return value


def config_keys() -> tuple[str, ...]:
    """The configuration keys the engine accepts (its own list, asked once)."""
    global _known_keys
    if _known_keys is None:
        _known_keys = tuple(_lib.ringfeed_config_keys().decode("ascii").split(","))
    return _known_keys


def _state_text(value):
    """A state as JSON: bytes from `Loader.state()` become str; any other value
    goes to the engine as it is, which names what is wrong with it."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("ascii")
        except UnicodeDecodeError:
            raise ConfigError(
                "`resume`: not a ringfeed resume state (not ASCII; give the bytes Loader.state() returned)",
                _ffi.RINGFEED_ERR_CONFIG,
            ) from None
    return value


def _resume_value(value):
    """`resume=`: one state, or a list/tuple of them (an elastic resume)."""
    if isinstance(value, (list, tuple)):
        return [_state_text(v) for v in value]
    return _state_text(value)


def _url_value(urls):
    if isinstance(urls, (str, os.PathLike)):
        return os.fspath(urls)
    try:
        items = list(urls)
    except TypeError:
        raise TypeError(
            f"urls must be a str, a path, or a list of them, not {type(urls).__name__}"
        ) from None
    for u in items:
        if not isinstance(u, (str, os.PathLike)):
            raise TypeError(f"urls must hold str or paths, not {type(u).__name__}")
    return [os.fspath(u) for u in items]


def _config(urls: Urls, batch_size: int, config: dict[str, Any], who: str) -> dict[str, Any]:
    """The engine's configuration from Python's arguments, every key checked."""
    known = config_keys()
    for key in config:
        if key not in known or key in ("urls", "batch_size"):
            raise TypeError(
                f"{who} got an unexpected keyword argument {key!r}; "
                f"configuration keys: {', '.join(k for k in known if k not in ('urls', 'batch_size'))}"
            )
    cfg = {"urls": _url_value(urls), "batch_size": batch_size}
    for key, value in config.items():
        if key == "resume":
            value = _resume_value(value)
        cfg[key] = json_value(key, value)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size must be an int, not {type(batch_size).__name__}")
    return cfg


def plan(urls: Urls, batch_size: int = 32, **config: Any) -> dict[str, Any]:
    """What one consumer's epoch holds, asked without opening a loader
    (``ringfeed_plan_json``): ``{"split": "samples" | "shards" | "none",
    "consumers": C, "samples": N or None, "batches": B or None, "shards": S,
    "nominal": text or None}``. The keywords are `Loader`'s (``rank``,
    ``world_size``, ``loader_worker``, ``loader_workers`` and ``epoch`` say
    which consumer and epoch). ``"shards"`` is a nominal epoch: no sample
    counts are known, the shards split whole and every consumer yields the
    same ``batches``. It resolves the dataset as opening does (listing,
    ``HEAD``s, a few shards' first bytes when it estimates) and reads no
    more."""
    cfg = _config(urls, batch_size, config, "plan()")
    text = text_out(lambda buf, size, needed: _lib.ringfeed_plan_json(json.dumps(cfg).encode(), buf, size, needed), 4096)
    return json.loads(text.decode())


class Loader:
    """A ringfeed engine streaming batches from WebDataset shards.

    ``Loader(urls, batch_size=32, **config)``: `urls` is a path, URL or brace
    pattern (``"/data/shard-{000000..000127}.tar"``) or a list of them; the
    keywords are the C configuration's JSON keys (docs/configuration.md): ``workers=2, memory_budget="512MiB", epochs=2, ...``. An
    unknown keyword raises TypeError naming it; a bad value raises
    `ringfeed.ConfigError` (a ValueError) with the engine's message naming
    the key; other failures raise the `ringfeed.Error` subclass of the status.

    Resuming: `state()` gives the position after the batches handed out so
    far (opaque ASCII bytes); ``Loader(..., resume=state)`` with the same
    dataset and epoch settings continues the epoch exactly where it stopped,
    in the order the uninterrupted run would have used. ``resume=[s0, s1,
    ...]``, the states of every consumer of an old layout (``rank``,
    ``world_size``, ``loader_worker(s)``, ``workers``), resumes elastically
    in a new one: nothing is lost, and nothing delivered repeats but the
    engine's pads (``remainder="pad"``). A malformed
    state raises `ConfigError`; one of another dataset, other settings, or
    an incomplete set raises `StateError`.

    Iterating yields `Batch` objects of every epoch until the last;
    `iter_epoch()` yields those of the current epoch only. ``with Loader(...)
    as loader:`` closes it at the end; `close()` is idempotent and may come
    from another thread, whose iteration then raises `ClosedError`. Batches
    still held stay valid after close until released.

    A loader belongs to the process that opened it: after fork() the child
    must open its own (using the parent's raises `ForkedError`).
    """

    def __init__(self, urls: Urls, batch_size: int = 32, **config: Any) -> None:
        self._handle = None
        self._closed = True
        self._lock = threading.Lock()
        self._generation = fork_generation()
        cfg = _config(urls, batch_size, config, "Loader()")
        handle = ctypes.c_void_p()
        st = _lib.ringfeed_loader_open(json.dumps(cfg).encode(), ctypes.byref(handle))
        if st != _ffi.RINGFEED_OK:
            raise from_status(st)
        self._handle = handle.value
        self._closed = False
        self._finished = False
        self._warned = False
        self._arena = None
        if cfg.get("shared_arena") is True:
            fd, base, length = ctypes.c_int32(-1), ctypes.c_void_p(), ctypes.c_uint64(0)
            st = _lib.ringfeed_loader_arena(self._handle, ctypes.byref(fd), ctypes.byref(base), ctypes.byref(length))
            if st != _ffi.RINGFEED_OK:
                self.close()
                raise from_status(st)
            self._arena = _transport.Arena(fd.value, base.value, length.value)
            # The outbox its batches leave through, made now: its releases
            # are drained from the first wait on, and a failure to make it
            # (no descriptors left) is raised here, not in a queue's thread.
            _transport.outbox()

    # -- lifetime --------------------------------------------------------

    def _check(self):
        if self._generation != fork_generation():
            raise ForkedError("this Loader was opened in the parent process (fork); open a new one here")
        handle = self._handle
        if self._closed:
            raise ClosedError("the loader is closed")
        return handle

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stops the engine. Idempotent; threads blocked in iteration raise `ClosedError`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            handle = self._handle
        if self._generation != fork_generation():
            return  # the child must not touch the parent's engine
        _lib.ringfeed_loader_close(handle)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __reduce__(self):
        raise TypeError("a ringfeed.Loader cannot be pickled or sent to another process; open one there")

    # -- batches ---------------------------------------------------------

    def next_batch(self, timeout: float | None = None) -> Batch | None:
        """The next batch; None at the end of an epoch (or when `timeout`
        seconds passed); StopIteration when every epoch is over."""
        deadline_ms = None if timeout is None else max(0, int(timeout * 1000))
        waited_ms = 0
        # Batches of its own arena shipped to another process come back
        # through this process's outbox: drain it before asking, and wait in
        # short slices while some are out. (A node engine's batches shipped
        # are the engine's to keep: nothing comes back here.)
        shipping = self._arena is not None and self._arena.node is not True
        while True:
            handle = self._check()
            raw = _ffi.RawBatch()
            wait = _WAIT_SLICE_MS if deadline_ms is None else min(_WAIT_SLICE_MS, deadline_ms)
            if shipping:
                _transport.drain()
                if _transport.pending():
                    wait = min(wait, _SHIPPED_SLICE_MS)
            st = _lib.ringfeed_loader_next(handle, wait, ctypes.byref(raw))
            if st == _ffi.RINGFEED_OK:
                return Batch(_Lease(raw, self._arena))
            if st == _ffi.RINGFEED_TIMEOUT:
                waited_ms += wait
                if waited_ms >= _STALL_WARN_MS and not self._warned and live_batches():
                    self._warned = True
                    warnings.warn(
                        f"ringfeed: no batch for {waited_ms / 1000:.0f} s while {live_batches()} batches "
                        "are not released; the engine waits for memory they hold (release batches, or "
                        "drop the arrays exported from them)",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                if deadline_ms is not None:
                    deadline_ms -= wait
                    if deadline_ms <= 0:
                        return None
                continue
            if st == _ffi.RINGFEED_END_OF_EPOCH:
                return None
            if st == _ffi.RINGFEED_FINISHED:
                self._finished = True
                raise StopIteration
            if self._closed:
                raise ClosedError("the loader was closed while waiting for a batch")
            raise from_status(st)

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Batch:
        while True:
            b = self.next_batch()
            if b is not None:
                return b

    def iter_epoch(self) -> Iterator[Batch]:
        """Yields the batches of the current epoch, then stops."""
        while True:
            try:
                b = self.next_batch()
            except StopIteration:
                return
            if b is None:
                return
            yield b

    # -- stats -----------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The engine's counters and setup as a dict (``ringfeed_loader_stats_json``):
        bytes/samples/batches delivered, reads, copies, chunk use, wait times,
        memory kind, I/O backend, and the setup notes."""
        handle = self._check()
        text = text_out(lambda buf, size, needed: _lib.ringfeed_loader_stats_json(handle, buf, size, needed), 4096)
        return json.loads(text.decode())

    def metrics(self) -> str:
        """The stats as metrics in the Prometheus text format
        (``ringfeed_loader_metrics``): counters ``ringfeed_*_total``, gauges,
        retries by kind and ``ringfeed_info``, for a scrape endpoint."""
        handle = self._check()
        text = text_out(lambda buf, size, needed: _lib.ringfeed_loader_metrics(handle, buf, size, needed), 8192)
        return text.decode()

    def state(self) -> bytes:
        """The resume state (``ringfeed_loader_state``): opaque ASCII bytes naming
        the position after the batches handed out so far. Pass it back as
        ``resume=`` to continue from there."""
        handle = self._check()
        # ~150 bytes, more after elastic resumes (ringfeed.h); grown on demand.
        return text_out(lambda buf, size, needed: _lib.ringfeed_loader_state(handle, buf, size, needed), 512)

    def __repr__(self) -> str:
        return f"<ringfeed.Loader {'closed' if self._closed else 'open'}>"
