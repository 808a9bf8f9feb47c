"""Decoding sample fields by extension, the way WebDataset users expect.

A sample is a dict ``{"__key__": str, "__url__": str, field: bytes-like}``.
`Decoder` turns each field into a value by its extension (the part of the
field name after the last dot: ``jpg``, ``seg.png`` -> ``png``), trying its
handlers in order; the first that returns something other than None wins:

- images (``jpg jpeg png ppm pgm pbm pnm bmp gif tif tiff webp``) with an
  image spec: ``"pil"`` (a PIL image), ``"pilrgb"``, ``"pilrgba"``, ``"pill"``;
  numpy ``"rgb8"``, ``"rgba8"``, ``"l8"`` (uint8, HWC) and ``"rgb"``,
  ``"rgba"``, ``"l"`` (float32 in [0, 1]); torch ``"torchrgb8"``,
  ``"torchrgba8"``, ``"torchl8"`` (uint8, CHW) and ``"torchrgb"``,
  ``"torchrgba"``, ``"torchl"``, ``"torch"`` (float32, CHW); Pillow decodes.
  ``"torchvision"`` decodes JPEG/PNG with ``torchvision.io.decode_image``
  into a uint8 CHW tensor (needs torchvision);
- ``json jsn`` -> ``json.loads``; ``txt text transcript`` -> str (UTF-8);
  ``cls cls2 class count index inx id`` -> int; ``npy`` -> numpy array
  (no pickles); ``npz`` -> dict of arrays; ``pth pt`` -> ``torch.load`` with
  ``weights_only=True``;
- anything else -> ``bytes``.

Custom handlers are callables ``handler(field_name, data)`` returning the
value or None (pass); they come before the built-in ones. Pickled fields
(``pyd``, ``pickle``) are left as bytes: unpickling data is running its
code, so a handler must ask for it.

A failure names where the sample lives: `DecodeError` carries the shard,
the key and the field.
"""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

if TYPE_CHECKING:
    from ._typing import FieldData, Handler

IMAGE_EXTENSIONS = frozenset("jpg jpeg png ppm pgm pbm pnm bmp gif tif tiff webp".split())

# spec -> (library, dtype, mode)
IMAGE_SPECS = {
    "pil": ("pil", None, None),
    "pilrgb": ("pil", None, "RGB"),
    "pilrgba": ("pil", None, "RGBA"),
    "pill": ("pil", None, "L"),
    "l8": ("numpy", "uint8", "L"),
    "rgb8": ("numpy", "uint8", "RGB"),
    "rgba8": ("numpy", "uint8", "RGBA"),
    "l": ("numpy", "float", "L"),
    "rgb": ("numpy", "float", "RGB"),
    "rgba": ("numpy", "float", "RGBA"),
    "torchl8": ("torch", "uint8", "L"),
    "torchrgb8": ("torch", "uint8", "RGB"),
    "torchrgba8": ("torch", "uint8", "RGBA"),
    "torchl": ("torch", "float", "L"),
    "torchrgb": ("torch", "float", "RGB"),
    "torchrgba": ("torch", "float", "RGBA"),
    "torch": ("torch", "float", "RGB"),
}


class DecodeError(ValueError):
    """A sample's field (or a per-sample function) failed; ``shard``, ``key``
    and ``field`` say where (``field`` is None for a failing ``map``)."""

    def __init__(
        self, message: str, shard: str | None = None, key: str | None = None, field: str | None = None
    ) -> None:
        super().__init__(message)
        self.shard = shard
        self.key = key
        self.field = field


def extension(name: str) -> str:
    """The decoding extension of a field name: after the last dot, lower case."""
    return name.rsplit(".", 1)[-1].lower()


class ImageHandler:
    """Decodes image fields to `spec` (see `IMAGE_SPECS`) with Pillow."""

    def __init__(self, spec: str, extensions: Iterable[str] = IMAGE_EXTENSIONS) -> None:
        if spec not in IMAGE_SPECS:
            raise ValueError(f"unknown image spec {spec!r}; choose from {', '.join(sorted(IMAGE_SPECS))}")
        self.spec = spec
        self.library, self.dtype, self.mode = IMAGE_SPECS[spec]
        self.extensions = frozenset(extensions)
        try:
            import PIL.Image  # noqa: F401
        except ImportError:
            raise ImportError(f"decode({spec!r}) needs Pillow: pip install pillow") from None
        if self.library == "torch":
            import torch  # noqa: F401

    def __call__(self, name: str, data: FieldData) -> Any:
        if extension(name) not in self.extensions:
            return None
        import PIL.Image

        # Not `with`: a closed image decodes its file again when read.
        img: PIL.Image.Image = PIL.Image.open(io.BytesIO(data))
        img.load()
        if self.mode is not None and img.mode != self.mode:
            img = img.convert(self.mode)
        if self.library == "pil":
            return img
        import numpy as np

        # A read-only view of Pillow's bytes (no copy yet).
        a = np.asarray(img)
        if self.library == "numpy":
            return a.astype(np.float32) / np.float32(255) if self.dtype == "float" else a
        import torch

        # One copy, into the contiguous CHW layout (a permuted view would
        # make every later batch stack a strided gather).
        chw = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
        out = np.empty(chw.shape, np.float32 if self.dtype == "float" else np.uint8)
        if self.dtype == "float":
            np.multiply(chw, np.float32(1 / 255), out=out)
        else:
            out[...] = chw
        return torch.from_numpy(out)

    def __repr__(self) -> str:
        return f"ImageHandler({self.spec!r})"


class TorchvisionHandler:
    """Decodes JPEG and PNG fields with ``torchvision.io.decode_image`` (uint8 CHW)."""

    extensions = frozenset({"jpg", "jpeg", "png"})

    def __init__(self) -> None:
        try:
            import torchvision.io  # noqa: F401
        except ImportError:
            raise ImportError('decode("torchvision") needs torchvision: pip install torchvision') from None

    def __call__(self, name: str, data: FieldData) -> Any:
        if extension(name) not in self.extensions:
            return None
        import numpy as np
        import torch
        import torchvision.io

        raw = torch.from_numpy(np.frombuffer(data, np.uint8).copy())
        return torchvision.io.decode_image(raw)


def _text(data):
    return bytes(data).decode("utf-8")


def _npy(data):
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def _npz(data):
    import numpy as np

    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _torch_load(data):
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


BASIC: dict[str, Callable[[FieldData], Any]] = {
    **{e: _text for e in ("txt", "text", "transcript")},
    **{e: (lambda d: int(_text(d))) for e in ("cls", "cls2", "class", "count", "index", "inx", "id")},
    "json": lambda d: json.loads(_text(d)),
    "jsn": lambda d: json.loads(_text(d)),
    "npy": _npy,
    "npz": _npz,
    "pth": _torch_load,
    "pt": _torch_load,
}


def basic(name: str, data: FieldData) -> Any:
    """The built-in decoders of non-image fields (see the module comment)."""
    f = BASIC.get(extension(name))
    return None if f is None else f(data)


def handler(spec: str | Handler) -> Handler:
    """A handler from a spec: an image spec name, ``"torchvision"``, or a callable."""
    if callable(spec):
        return spec
    if spec == "torchvision":
        return TorchvisionHandler()
    if isinstance(spec, str):
        return ImageHandler(spec)
    raise TypeError(f"a decoder is an image spec (str) or a callable(name, data), not {type(spec).__name__}")


class Decoder:
    """``Decoder(*specs, only=None)``: decodes a sample's fields.

    `specs` are image specs, ``"torchvision"`` or callables ``(name, data)``
    (tried first, in order); the built-in handlers come after them. `only`
    (names or extensions) limits decoding to those fields; the others stay
    as they are (``bytes``).
    """

    def __init__(self, *specs: str | Handler, only: str | Iterable[str] | None = None) -> None:
        self.handlers = [handler(s) for s in specs] + [basic]
        self.only = None if only is None else frozenset([only] if isinstance(only, str) else only)

    def decode_field(self, name: str, data: FieldData) -> Any:
        """The value of field `name`: the first handler's that is not None, else the bytes."""
        if self.only is not None and name not in self.only and extension(name) not in self.only:
            return bytes(data)
        for h in self.handlers:
            v = h(name, data)
            if v is not None:
                return v
        return bytes(data)

    def __call__(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        """The sample with its fields decoded (``__key__``, ``__url__`` as they are)."""
        out = {}
        for name, data in sample.items():
            if name.startswith("__"):
                out[name] = data
                continue
            try:
                out[name] = self.decode_field(name, data)
            except Exception as e:
                raise DecodeError(
                    f"{sample.get('__url__', '?')}: sample {sample.get('__key__', '?')!r}, field {name!r}: "
                    f"{type(e).__name__}: {e}",
                    shard=sample.get("__url__"),
                    key=sample.get("__key__"),
                    field=name,
                ) from e
        return out

    def __repr__(self) -> str:
        return f"Decoder({', '.join(map(repr, self.handlers[:-1]))})"
