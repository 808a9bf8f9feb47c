"""Whole objects: read one into memory (or a buffer of the caller's), list
what a URL names, write one from bytes or through a file-like writer.

URLs are those of the loader: ``s3://bucket/key``, ``http(s)://...`` (read
only), a local path or ``file://`` URL. The keyword arguments are the
loader's configuration keys without ``urls`` (docs/configuration.md): S3 endpoint and credentials, ``part_size``,
``parts_in_flight``, ``checksum``, ``overwrite``, ``io_backend``,
``memory_kind``. A key the engine does not know, or a bad value, raises
`ConfigError` naming it.

Reads go ``parts_in_flight`` ranges of ``part_size`` at a time; writes are
visible only once whole (one conditional PUT, or a multipart upload; a
temporary file renamed into place locally) and never replace an existing
object unless ``overwrite=True`` (`ObjectExistsError`).
"""

from __future__ import annotations

import ctypes
import json
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Iterable, Literal, TypeVar, cast, overload

from . import _ffi
from ._batch import text_out
from ._object_buffer import ObjectBuffer, config_json, read_handle, url_arg
from ._object_files import ObjectReader, ObjectWriter, bytes_address
from .errors import BufferTooSmallError, from_status

if TYPE_CHECKING:
    from concurrent.futures import Future

    from typing_extensions import Buffer

    from ._typing import BytesLike, StrPath

_lib = _ffi.lib

_U = TypeVar("_U", bound="StrPath")

# Objects `read_objects` reads at once: each read already keeps
# `parts_in_flight` ranges in flight, so a few objects fill the link.
_OBJECTS_IN_FLIGHT = 4


def read_object(url: StrPath, **config: Any) -> ObjectBuffer:
    """Reads the object at `url` whole into the library's memory and returns
    it as an `ObjectBuffer` (memoryview, numpy and DLPack views without a
    copy). A URL naming several objects raises `DatasetError`: use
    `read_objects`."""
    return ObjectBuffer(url, read_handle(url, config))


def read_object_into(url: StrPath, buffer: BytesLike, **config: Any) -> int:
    """Reads the object at `url` into `buffer` (a writable, contiguous
    bytes-like object: bytearray, numpy array, memoryview) and returns its
    size. A buffer smaller than the object raises `BufferTooSmallError`
    before any byte is read; its ``size`` is the object's."""
    try:
        view = memoryview(cast("Buffer", buffer))
    except TypeError:
        raise TypeError(f"buffer must be a writable bytes-like object, not {type(buffer).__name__}") from None
    if view.readonly:
        raise TypeError(f"buffer must be writable ({type(buffer).__name__} is read-only)")
    if not view.c_contiguous:
        raise TypeError("buffer must be contiguous")
    nbytes = view.nbytes
    address = None
    if nbytes:
        address = ctypes.addressof(ctypes.c_char.from_buffer(view.cast("B")))
    size = ctypes.c_uint64(0)
    st = _lib.ringfeed_object_read_into(url_arg(url), config_json(config), address, nbytes, ctypes.byref(size))
    if st == _ffi.RINGFEED_ERR_BUFFER_TOO_SMALL:
        err = cast(BufferTooSmallError, from_status(st, f"read {url} into {nbytes} bytes"))
        err.size = size.value
        raise err
    if st != _ffi.RINGFEED_OK:
        raise from_status(st)
    return size.value


def list_objects(url: StrPath, **config: Any) -> list[tuple[str, int]]:
    """The objects `url` names, as ``[(url, size), ...]``: one object, or
    each file of a directory or object under ``s3://bucket/prefix/`` (one
    level), with brace expansion."""
    u, cfg = url_arg(url), config_json(config)
    text = text_out(lambda buf, size, needed: _lib.ringfeed_object_list(u, cfg, buf, size, needed), 4096)
    return [(o["url"], o["size"]) for o in json.loads(text.decode())]


def object_exists(url: StrPath, **config: Any) -> bool:
    """Whether the object at `url` (``s3://bucket/key`` or a local path)
    exists. False only when S3 answers 404 ``NoSuchKey`` (or the file is
    not there); any other answer raises its error naming S3's code:
    ``AccessDenied`` (S3's answer for a missing key without
    ``s3:ListBucket``) and ``ExpiredToken`` as `DatasetError`, a 5xx past
    its retries as `NetworkError`."""
    there = ctypes.c_int32(0)
    st = _lib.ringfeed_object_exists(url_arg(url), config_json(config), ctypes.byref(there))
    if st != _ffi.RINGFEED_OK:
        raise from_status(st, f"does {url} exist")
    return bool(there.value)


@overload
def read_objects(urls: StrPath, **config: Any) -> dict[str, ObjectBuffer]: ...
@overload
def read_objects(urls: Iterable[_U], **config: Any) -> dict[_U, ObjectBuffer]: ...
def read_objects(urls: StrPath | Iterable[StrPath], **config: Any) -> dict[Any, ObjectBuffer]:
    """Reads several objects whole: `urls` is a str (a directory, an
    ``s3://bucket/prefix/``, a brace pattern: each object `list_objects`
    names) or a list of URLs. Returns ``{url: ObjectBuffer}`` in that order.
    On an error the buffers already read are closed and the error raised."""
    names: list[StrPath]
    if isinstance(urls, (str, bytes)) or hasattr(urls, "__fspath__"):
        names = [u for u, _ in list_objects(cast("StrPath", urls), **config)]
    else:
        try:
            names = list(cast("Iterable[StrPath]", urls))
        except TypeError:
            raise TypeError(f"urls must be a str or a list of them, not {type(urls).__name__}") from None
    for u in names:
        url_arg(u)
    config_json(config)
    out: dict[Any, ObjectBuffer] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(_OBJECTS_IN_FLIGHT, len(names)))) as pool:
        futures: list[tuple[StrPath, Future[ObjectBuffer]]] = [
            (u, pool.submit(read_object, u, **config)) for u in names
        ]
        error: BaseException | None = None
        for u, f in futures:
            try:
                out[u] = f.result()
            except BaseException as e:
                error = error or e
    if error is not None:
        for b in out.values():
            b.close()
        raise error
    return out


def write_object(url: StrPath, data: BytesLike, **config: Any) -> int:
    """Writes `data` (any bytes-like object) as the object at `url`, visible
    only once whole; nothing is left on an error. An existing object raises
    `ObjectExistsError` unless ``overwrite=True``. Returns the bytes written."""
    address, nbytes, keep = bytes_address(data)
    st = _lib.ringfeed_object_write(url_arg(url), config_json(config), address, nbytes)
    del keep
    if st != _ffi.RINGFEED_OK:
        raise from_status(st, f"write {url}")
    return nbytes


@overload
def open_object(url: StrPath, mode: Literal["rb"] = "rb", **config: Any) -> ObjectReader: ...
@overload
def open_object(url: StrPath, mode: Literal["wb"], **config: Any) -> ObjectWriter: ...
@overload
def open_object(url: StrPath, mode: str = "rb", **config: Any) -> ObjectReader | ObjectWriter: ...
def open_object(url: StrPath, mode: str = "rb", **config: Any) -> ObjectReader | ObjectWriter:
    """A file object over the object at `url`. ``"rb"``: an `ObjectReader`
    (the object is read whole at open, then read, readinto, seek and tell
    serve it from memory); ``"wb"``: an `ObjectWriter`, committed at
    `close()`. ``torch.load(open_object(url))`` and ``torch.save(obj,
    open_object(url, "wb"))`` work with them."""
    if mode == "rb":
        return ObjectReader.open(url, **config)
    if mode == "wb":
        return ObjectWriter(url, **config)
    raise ValueError(f"open_object: mode must be 'rb' or 'wb', not {mode!r}")


__all__ = [
    "ObjectBuffer",
    "ObjectReader",
    "ObjectWriter",
    "list_objects",
    "object_exists",
    "open_object",
    "read_object",
    "read_object_into",
    "read_objects",
    "write_object",
]
