"""ringfeed: a data-loader engine streaming WebDataset shards into pinned
memory, with zero-copy batches for Python.

    import ringfeed
    with ringfeed.Loader("/data/shard-{000000..000127}.tar", batch_size=256, workers=2) as loader:
        for batch in loader:
            with batch:
                jpg = batch["jpg"]           # a FieldView: no bytes copied
                sizes = jpg.lengths          # int64 numpy array, one per sample
                first = jpg[0]               # memoryview of sample 0's bytes
                labels = batch["cls"].gather()  # (uint8 values, int64 offsets), copied
                # fixed-size fields: batch["emb"].fixed(numpy.float32) -> (batch, n) view

See `Loader`, `Batch`, `FieldView`, `ringfeed.decode` for WebDataset-style
decoding, and `ringfeed.torch` for PyTorch. Whole objects (checkpoints,
weights) are read and written with `ringfeed.objects`: `read_object`,
`write_object`, `open_object`, `load_safetensors`, and
`ringfeed.torch.checkpoint` for torch.distributed.checkpoint.
"""

from __future__ import annotations

from . import _ffi
from ._log import set_log_level
from ._batch import Batch, FieldView
from ._loader import Loader, config_keys, plan
from .errors import (
    BufferTooSmallError,
    ClosedError,
    ConfigError,
    DatasetError,
    Error,
    ForkedError,
    FormatError,
    InvalidArgumentError,
    InvalidHandleError,
    IoError,
    IoUringError,
    MemorySetupError,
    NetworkError,
    NodeError,
    ObjectExistsError,
    PanicError,
    ReleasedError,
    SafetensorsError,
    StateError,
)
from .decode import DecodeError
from .objects import (
    ObjectBuffer,
    ObjectReader,
    ObjectWriter,
    list_objects,
    object_exists,
    open_object,
    read_object,
    read_object_into,
    read_objects,
    write_object,
)
from ._safetensors import load_safetensors
from . import image
from .urls import expand_braces, expand_urls

from ._version import VERSION as __version__

LIBRARY_PATH: str = _ffi.LIBRARY_PATH


def library_version() -> str:
    """The version of the loaded native library: `__version__`, since the
    package refuses to load a library of another release."""
    return _ffi.lib.ringfeed_version().decode()


__all__ = [
    "Batch",
    "image",
    "BufferTooSmallError",
    "ClosedError",
    "ConfigError",
    "DatasetError",
    "DecodeError",
    "Error",
    "FieldView",
    "ForkedError",
    "FormatError",
    "InvalidArgumentError",
    "InvalidHandleError",
    "IoError",
    "IoUringError",
    "Loader",
    "MemorySetupError",
    "NetworkError",
    "NodeError",
    "ObjectBuffer",
    "ObjectExistsError",
    "ObjectReader",
    "ObjectWriter",
    "PanicError",
    "ReleasedError",
    "SafetensorsError",
    "StateError",
    "config_keys",
    "expand_braces",
    "expand_urls",
    "library_version",
    "list_objects",
    "load_safetensors",
    "object_exists",
    "plan",
    "open_object",
    "read_object",
    "read_object_into",
    "read_objects",
    "set_log_level",
    "write_object",
    "LIBRARY_PATH",
    "__version__",
]
