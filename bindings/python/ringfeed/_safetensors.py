"""safetensors files read whole, their tensors viewing the `ObjectBuffer`.

The format (https://github.com/huggingface/safetensors): 8 bytes, the
header's length N as a little-endian u64; N bytes of JSON,
``{name: {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
..., "__metadata__": {str: str}}``; then the data, where each tensor's
bytes lie at ``[begin, end)`` counted from the data's start, row-major.

`parse_header` is the pure part: it checks everything a tensor view relies
on (offsets inside the data, sizes that match shapes, known dtypes) and
raises `SafetensorsError` otherwise, so a garbage file never reaches
``torch.frombuffer`` with a bad range.
"""

from __future__ import annotations

import json
import warnings
from typing import TYPE_CHECKING, Any, Literal, Union, overload

import numpy as np

from ._object_buffer import ObjectBuffer, read_handle
from .errors import SafetensorsError

if TYPE_CHECKING:
    import torch
    from numpy.typing import NDArray

    from ._typing import StrPath

    # What `load_safetensors` returns without `metadata`: name -> tensor.
    Tensors = Union[dict[str, torch.Tensor], dict[str, NDArray[Any]]]

# The reference implementation refuses headers over 100 MB (its
# MAX_HEADER_SIZE): a larger length is a corrupt file, not a big model.
MAX_HEADER_SIZE = 100_000_000

# dtype -> (bytes per element, numpy dtype or None where numpy has none).
DTYPES = {
    "BOOL": (1, np.bool_),
    "U8": (1, np.uint8),
    "I8": (1, np.int8),
    "U16": (2, np.uint16),
    "I16": (2, np.int16),
    "F16": (2, np.float16),
    "BF16": (2, None),
    "U32": (4, np.uint32),
    "I32": (4, np.int32),
    "F32": (4, np.float32),
    "U64": (8, np.uint64),
    "I64": (8, np.int64),
    "F64": (8, np.float64),
    "F8_E4M3": (1, None),
    "F8_E5M2": (1, None),
}


def _torch_dtype(torch, name):
    return {
        "BOOL": torch.bool,
        "U8": torch.uint8,
        "I8": torch.int8,
        "U16": torch.uint16,
        "I16": torch.int16,
        "F16": torch.float16,
        "BF16": torch.bfloat16,
        "U32": torch.uint32,
        "I32": torch.int32,
        "F32": torch.float32,
        "U64": torch.uint64,
        "I64": torch.int64,
        "F64": torch.float64,
        "F8_E4M3": torch.float8_e4m3fn,
        "F8_E5M2": torch.float8_e5m2,
    }[name]


def parse_header(data):
    """``(tensors, metadata, data_start)`` of a safetensors file's bytes
    (any bytes-like object): `tensors` maps each name to ``(dtype, shape,
    begin, end)``, absolute byte offsets into `data`; `metadata` is the
    ``__metadata__`` dict (or None)."""
    view = memoryview(data).cast("B")
    if len(view) < 8:
        raise SafetensorsError(f"not a safetensors file: {len(view)} bytes, fewer than its 8-byte header length")
    n = int.from_bytes(view[:8], "little")
    if n > MAX_HEADER_SIZE:
        raise SafetensorsError(f"not a safetensors file: header length {n} is over {MAX_HEADER_SIZE}")
    if 8 + n > len(view):
        raise SafetensorsError(f"not a safetensors file: header length {n} runs past its {len(view)} bytes")
    try:
        header = json.loads(bytes(view[8 : 8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SafetensorsError(f"safetensors header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"safetensors header is a JSON {type(header).__name__}, not an object")
    start = 8 + n
    data_len = len(view) - start
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise SafetensorsError("safetensors `__metadata__` must map str to str")
    tensors = {}
    for name, info in header.items():
        tensors[name] = _entry(name, info, data_len, start)
    return tensors, metadata, start


def _entry(name, info, data_len, start):
    if not isinstance(info, dict):
        raise SafetensorsError(f"safetensors tensor {name!r}: not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPES:
        raise SafetensorsError(f"safetensors tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise SafetensorsError(f"safetensors tensor {name!r}: shape {shape!r} is not a list of sizes")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_len
    ):
        raise SafetensorsError(
            f"safetensors tensor {name!r}: data_offsets {offsets!r} outside the {data_len} bytes of data"
        )
    count = 1
    for d in shape:
        count *= d
    begin, end = offsets
    if end - begin != count * DTYPES[dtype][0]:
        raise SafetensorsError(
            f"safetensors tensor {name!r}: {end - begin} bytes for {dtype} of shape {shape}"
            f" ({count * DTYPES[dtype][0]} expected)"
        )
    return dtype, tuple(shape), start + begin, start + end


def _numpy_tensor(view, dtype, shape, begin, end):
    np_dtype = DTYPES[dtype][1]
    if np_dtype is None:
        raise SafetensorsError(f"numpy has no {dtype}: load with framework='pt'")
    return np.frombuffer(view[begin:end], np_dtype).reshape(shape)


def _torch_tensor(torch, view, dtype, shape, begin, end):
    t_dtype = _torch_dtype(torch, dtype)
    if begin == end:
        return torch.empty(shape, dtype=t_dtype)
    with warnings.catch_warnings():
        # The library's bytes are read-only; torch has no read-only tensors
        # and warns for each one made over such a buffer.
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(view[begin:end], dtype=t_dtype).reshape(shape)


def tensors_of(
    buffer: ObjectBuffer, framework: str = "pt", metadata: bool = False
) -> Tensors | tuple[Tensors, dict[str, str] | None]:
    """The tensors of a safetensors file already in an `ObjectBuffer`,
    viewing its bytes (see `load_safetensors`)."""
    if framework not in ("pt", "torch", "np", "numpy"):
        raise ValueError(f"framework must be 'pt' or 'numpy', not {framework!r}")
    view = buffer.memoryview()
    tensors, meta, _ = parse_header(view)
    if framework in ("pt", "torch"):
        import torch

        out = {name: _torch_tensor(torch, view, *info) for name, info in tensors.items()}
    else:
        out = {name: _numpy_tensor(view, *info) for name, info in tensors.items()}
    return (out, meta) if metadata else out


@overload
def load_safetensors(
    url: StrPath | ObjectBuffer,
    framework: Literal["pt", "torch"] = "pt",
    metadata: Literal[False] = False,
    **config: Any,
) -> dict[str, torch.Tensor]: ...
@overload
def load_safetensors(
    url: StrPath | ObjectBuffer,
    framework: Literal["np", "numpy"],
    metadata: Literal[False] = False,
    **config: Any,
) -> dict[str, NDArray[Any]]: ...
@overload
def load_safetensors(
    url: StrPath | ObjectBuffer,
    framework: Literal["pt", "torch"] = "pt",
    *,
    metadata: Literal[True],
    **config: Any,
) -> tuple[dict[str, torch.Tensor], dict[str, str] | None]: ...
@overload
def load_safetensors(
    url: StrPath | ObjectBuffer,
    framework: Literal["np", "numpy"],
    metadata: Literal[True],
    **config: Any,
) -> tuple[dict[str, NDArray[Any]], dict[str, str] | None]: ...
@overload
def load_safetensors(
    url: StrPath | ObjectBuffer, framework: str = "pt", metadata: bool = False, **config: Any
) -> Tensors | tuple[Tensors, dict[str, str] | None]: ...
def load_safetensors(
    url: StrPath | ObjectBuffer, framework: str = "pt", metadata: bool = False, **config: Any
) -> Tensors | tuple[Tensors, dict[str, str] | None]:
    """Reads the safetensors file at `url` whole (or takes an `ObjectBuffer`
    already read) and returns ``{name: tensor}`` (torch tensors, or numpy arrays with ``framework="numpy"``)
    viewing the object's memory, no copy; the tensors keep it alive. With
    ``metadata=True`` returns ``(tensors, metadata)``, the header's
    ``__metadata__`` (None when absent). A malformed file raises
    `SafetensorsError` (a `FormatError` and a ValueError). numpy arrays are
    read-only; torch tensors are writable by contract only: do not write them.
    """
    if isinstance(url, ObjectBuffer):
        return tensors_of(url, framework, metadata)
    buffer = ObjectBuffer(url, read_handle(url, config))
    try:
        return tensors_of(buffer, framework, metadata)
    finally:
        buffer.close()
