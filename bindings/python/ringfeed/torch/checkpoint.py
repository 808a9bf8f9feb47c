"""torch.distributed.checkpoint over ringfeed objects (S3 or local).

    import torch.distributed.checkpoint as dcp
    from ringfeed.torch.checkpoint import StorageReader, StorageWriter

    dcp.save(state_dict, storage_writer=StorageWriter("s3://bucket/ckpt-1", **s3_config))
    dcp.load(state_dict, storage_reader=StorageReader("s3://bucket/ckpt-1", **s3_config))

`StorageWriter` and `StorageReader` are torch's `FileSystemWriter` and
`FileSystemReader` with their file system swapped for `ObjectFileSystem`:
torch keeps planning, serialisation and the collectives; each rank writes
its own objects (``__<rank>_<n>.distcp``) through an `ObjectWriter`, in
parallel with the others.

A checkpoint is finished when its ``.metadata`` object exists, and only
then. torch's coordinator writes the metadata in ``finish()``, after every
rank reported its data objects written; it writes ``.metadata.tmp`` and
renames it. Objects are visible only once whole, so here the ``.tmp``
stream stays in memory, and the rename writes those bytes to
``.metadata`` in one conditional PUT: never a copy of a partial object, and
never before the data. A save that stops anywhere before leaves no
``.metadata``, and `StorageReader` refuses a checkpoint without one
(`IncompleteCheckpointError`). "Without one" means S3 answered
``NoSuchKey``: a checkpoint the credentials may not read (AccessDenied,
ExpiredToken) or a store that keeps failing raises that error instead, so
a handler that starts training over on FileNotFoundError does not throw
away a checkpoint that exists.

A save killed after its parts were uploaded and before their completion
leaves no object; its multipart upload stays open, for the bucket's
lifecycle rule (``AbortIncompleteMultipartUpload``) to remove.

Checkpoint objects are written once: saving into a checkpoint id that
holds a checkpoint (its ``.metadata``, or data objects of an interrupted
save) fails unless ``overwrite=True``.
"""

from __future__ import annotations

import io
import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generator, Mapping

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystemBase

from ..objects import ObjectReader, ObjectWriter, object_exists, write_object

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata

__all__ = ["IncompleteCheckpointError", "ObjectFileSystem", "StorageReader", "StorageWriter"]

# The suffix torch gives the metadata before its rename (filesystem.py).
_STAGED_SUFFIX = ".tmp"


class IncompleteCheckpointError(FileNotFoundError):
    """A checkpoint has no ``.metadata``: it was never saved there, or its
    save did not finish."""


def _is_s3(path: str | os.PathLike[str]) -> bool:
    return str(path).startswith("s3://")


class ObjectFileSystem(FileSystemBase):
    """torch's file system interface over ringfeed objects. Paths are
    strings (``s3://bucket/prefix/name`` or local paths); `config` is the
    object calls' keywords (S3 endpoint and credentials, ``part_size``,
    ...), `overwrite` whether a write may replace an existing object."""

    def __init__(self, config: Mapping[str, Any] | None = None, overwrite: bool = False) -> None:
        self.config = dict(config or {})
        self.config.pop("overwrite", None)
        self.overwrite = overwrite
        # Metadata written to a `.tmp` stream, kept until its rename.
        self._staged: dict[str, bytes] = {}

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase, None, None]:
        path = os.fspath(path)
        if mode == "rb":
            with ObjectReader.open(path, **self.config) as reader:
                yield reader
        elif mode == "wb" and path.endswith(_STAGED_SUFFIX):
            staged = io.BytesIO()
            yield staged
            self._staged[path] = staged.getvalue()
        elif mode == "wb":
            with ObjectWriter(path, overwrite=self.overwrite, **self.config) as writer:
                yield writer
        else:
            raise ValueError(f"ObjectFileSystem: mode must be 'rb' or 'wb', not {mode!r}")

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str:
        return f"{os.fspath(path).rstrip('/')}/{suffix}"

    def init_path(self, path: str | os.PathLike[str]) -> str:
        path = os.fspath(path)
        return path.rstrip("/") or path

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        """Writes the bytes staged for `path` (a ``.tmp`` stream) as
        `new_path`. Objects cannot be renamed: anything else is refused."""
        path, new_path = os.fspath(path), os.fspath(new_path)
        try:
            data = self._staged.pop(path)
        except KeyError:
            raise NotImplementedError(
                f"ObjectFileSystem renames only staged metadata; {path} was not written as one"
            ) from None
        write_object(new_path, data, overwrite=self.overwrite, **self.config)

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        if not _is_s3(path):
            os.makedirs(os.fspath(path), exist_ok=True)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return _is_s3(os.fspath(checkpoint_id))

    def exists(self, path: str | os.PathLike[str]) -> bool:
        """Whether the object at `path` is there: False only when S3 says
        ``NoSuchKey`` (or the file is missing). Any other answer raises as
        itself — AccessDenied, ExpiredToken (`DatasetError`), a 5xx past
        its retries (`NetworkError`) — so that a checkpoint that cannot be
        read is never taken for one that was not saved."""
        return object_exists(os.fspath(path), **self.config)

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        """torch removes an old ``.metadata`` before its rename; with
        `overwrite` the rename's write replaces it whole, so nothing is
        removed here. Objects are not deleted otherwise."""
        if not self.overwrite:
            raise NotImplementedError(f"ObjectFileSystem does not delete objects ({os.fspath(path)})")


class StorageWriter(FileSystemWriter):
    """Saves a torch.distributed.checkpoint as ringfeed objects under
    `path` (``s3://bucket/prefix`` or a directory). `config`: the object
    calls' keywords (S3 endpoint and credentials, ``part_size``,
    ``parts_in_flight``, ``checksum``). A checkpoint id that already holds
    objects of a checkpoint raises (``RuntimeError`` from torch for an
    existing ``.metadata``, `ObjectExistsError` for a data object) unless
    ``overwrite=True``. `thread_count` objects are written at once per rank.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        overwrite: bool = False,
        thread_count: int = 1,
        single_file_per_rank: bool = True,
        **config: Any,
    ) -> None:
        # sync_files: there is nothing to fsync; an object is durable once
        # its writer's close() returns.
        super().__init__(
            path,
            single_file_per_rank=single_file_per_rank,
            sync_files=False,
            thread_count=thread_count,
            overwrite=overwrite,
        )
        # torch's writer declares `fs` as its own FileSystem; it calls only
        # the FileSystemBase interface, which ObjectFileSystem implements.
        self.fs = ObjectFileSystem(config, overwrite=overwrite)  # type: ignore[assignment]
        self.path = self.fs.init_path(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return ObjectFileSystem.validate_checkpoint_id(checkpoint_id)


class StorageReader(FileSystemReader):
    """Loads a torch.distributed.checkpoint saved by `StorageWriter`. Each
    data object is read whole once per rank that needs it. A checkpoint
    without ``.metadata`` (never saved, or its save did not finish) raises
    `IncompleteCheckpointError`."""

    def __init__(self, path: str | os.PathLike[str], **config: Any) -> None:
        super().__init__(path)
        self.fs = ObjectFileSystem(config)  # type: ignore[assignment]  # as in StorageWriter
        self.path = self.fs.init_path(path)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        if not self.fs.exists(path):
            raise IncompleteCheckpointError(
                f"{path} does not exist: no checkpoint was saved at {self.path}, or its save did not finish"
            )
        return super().read_metadata(*args, **kwargs)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return ObjectFileSystem.validate_checkpoint_id(checkpoint_id)
