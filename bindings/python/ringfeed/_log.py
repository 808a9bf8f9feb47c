"""The library's log in Python's `logging`: the engine's messages (each
fallback once: io_uring refused, memory not locked, direct reads refused, a
cache that stopped writing; network retries) go to the logger
``"ringfeed"`` through ``ringfeed_set_log_callback``.

The callback is installed at import with the library sending warnings and
information (``set_log_level`` changes that, e.g. to ``logging.DEBUG`` for
every retry); the logger's own level and handlers decide what is shown.
It is removed at interpreter exit, before Python can no longer take calls.
"""

from __future__ import annotations

import atexit
import logging

from ._ffi import LOG_CALLBACK, lib

logger = logging.getLogger("ringfeed")

_TO_PYTHON = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG}


def _forward(_user, level, message):
    # Called on engine threads (ctypes takes the GIL); never raises into C.
    try:
        logger.log(_TO_PYTHON.get(level, logging.WARNING), message.decode("utf-8", "replace"))
    except Exception:  # noqa: BLE001 - a log call must not fail the engine's thread
        pass


# Kept for the process's life: the library holds only its address.
_CALLBACK = LOG_CALLBACK(_forward)


def _library_level(level):
    """The most detailed library level that a Python level lets through."""
    if level <= logging.DEBUG:
        return 4
    if level <= logging.INFO:
        return 3
    if level <= logging.WARNING:
        return 2
    return 1


def set_log_level(level: int) -> None:
    """Has the library send its messages at `level` (a `logging` level) and
    above to the ``"ringfeed"`` logger."""
    lib.ringfeed_set_log_callback(_CALLBACK, None, _library_level(level))


def _stop():
    lib.ringfeed_set_log_callback(LOG_CALLBACK(), None, 0)


set_log_level(logging.INFO)
atexit.register(_stop)
