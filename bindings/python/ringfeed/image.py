"""One image through the engine's image pipeline.

`transform(data, spec)` runs what a loader's ``transform`` spec does to one
sample's image field (decode, crop, resize, flip, layout, type), with the
same random choices the loader makes for the sample at `position` of
`epoch` under `seed`. It is there to check a spec, and a pipeline's pixels
against Pillow's or torchvision's, before a long run:

    >>> img, info = ringfeed.image.transform(open("cat.jpg", "rb").read(),
    ...     {"jpg": {"random_resized_crop": 224, "flip": 0.5}})
    >>> img.shape, img.dtype
    ((3, 224, 224), dtype('uint8'))
    >>> top, left, height, width = info["crop"]  # in the source's pixels

The spec is the ``transform`` JSON (a dict or its text): see
docs/images.md. A bad spec raises `ConfigError`; an image that cannot be decoded
raises `FormatError`, naming the field.
"""

from __future__ import annotations

import ctypes
import json
from typing import TYPE_CHECKING, Any, TypedDict, cast

import numpy as np

from . import _ffi
from .errors import from_status

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from typing_extensions import Buffer

    from ._typing import BytesLike, Spec

_lib = _ffi.lib

_DTYPES = {1: np.uint8, 2: np.float16, 4: np.float32}


class ImageInfo(TypedDict):
    """What `transform` says of the image it made, besides the pixels."""

    # (width, height) of the image as decoded.
    source: tuple[int, int]
    # (top, left, height, width) of the region it took, in source pixels.
    crop: tuple[float, float, float, float]
    # Whether it was flipped horizontally.
    flipped: bool
    # 1, or the reduced size a JPEG was decoded at.
    decode_scale: float


def _spec_text(spec):
    return spec if isinstance(spec, str) else json.dumps(spec)


def output_shape(spec: Spec, field: str) -> tuple[tuple[int, int, int], np.dtype[Any]]:
    """``(shape, dtype)`` of one image of `field` under `spec` (its layout's
    order: ``(C, H, W)`` or ``(H, W, C)``), as the engine writes it."""
    info = _ffi.STRUCT_TYPES["ringfeed_image_info"]()
    st = _lib.ringfeed_image_transform(
        _spec_text(spec).encode(), field.encode(), None, 0, 0, 0, 0, None, 0, ctypes.byref(info)
    )
    if st != _ffi.RINGFEED_ERR_BUFFER_TOO_SMALL:
        raise from_status(st)
    return (info.dim0, info.dim1, info.dim2), np.dtype(_DTYPES[info.elem_bytes])


def from_torchvision(
    pipeline: Any, field: str = "jpg", label: str | None = None, label_type: str = "int64"
) -> dict[str, Any]:
    """The engine's spec for a torchvision transform pipeline, so a
    pipeline ports as it is: ``Compose`` (or a list) of `RandomResizedCrop`,
    `Resize`, `CenterCrop`, `RandomHorizontalFlip`, `ToTensor`,
    `PILToTensor`, `ToImage`, `ToDtype` and `Normalize` (v1 or v2).
    Anything else raises ValueError naming it. `label` adds a label field.

    For example ``from_torchvision(T.Compose([T.RandomResizedCrop(224),
    T.RandomHorizontalFlip()]), "jpg", "cls")`` gives a spec whose ``jpg``
    has ``random_resized_crop`` (size ``[224, 224]`` and torchvision's
    scale and ratio) and ``flip`` 0.5, and whose ``cls`` is ``"int64"``.
    """
    steps = list(getattr(pipeline, "transforms", pipeline))
    out: dict[str, Any] = {}

    def size_of(s: Any) -> list[int]:
        if isinstance(s, int):
            return [s, s]
        s = [int(v) for v in s]
        return [s[0], s[0]] if len(s) == 1 else s

    floats = False
    for t in steps:
        name = type(t).__name__
        interp = getattr(t, "interpolation", None)
        if interp is not None and "BILINEAR" not in str(interp).upper():
            raise ValueError(f"{name}: only bilinear interpolation runs in the engine, not {interp}")
        if name == "RandomResizedCrop":
            out["random_resized_crop"] = {
                "size": size_of(t.size),
                "scale": [float(v) for v in t.scale],
                "ratio": [float(v) for v in t.ratio],
            }
        elif name == "Resize":
            s = t.size
            if isinstance(s, (list, tuple)) and len(s) == 1:
                s = s[0]
            if getattr(t, "max_size", None):
                raise ValueError("Resize(max_size=...) does not run in the engine")
            out["resize"] = int(s) if isinstance(s, int) else [int(v) for v in s]
        elif name == "CenterCrop":
            out["center_crop"] = size_of(t.size)
        elif name == "RandomHorizontalFlip":
            out["flip"] = float(t.p)
        elif name in ("ToTensor",):
            floats = True
        elif name in ("PILToTensor", "ToImage"):
            pass
        elif name == "ToDtype":
            dt = getattr(t, "dtype", None)
            dt = dt.get(next(iter(dt))) if isinstance(dt, dict) else dt
            kinds = {"torch.uint8": "uint8", "torch.float16": "float16", "torch.float32": "float32"}
            if str(dt) not in kinds:
                raise ValueError(f"ToDtype({dt}): the engine writes uint8, float16 or float32")
            if kinds[str(dt)] != "uint8" and not getattr(t, "scale", False):
                raise ValueError("ToDtype to a float needs scale=True in the engine (values in [0, 1])")
            out["dtype"] = kinds[str(dt)]
        elif name == "Normalize":
            out["normalize"] = {"mean": [float(v) for v in t.mean], "std": [float(v) for v in t.std]}
            floats = True
        else:
            raise ValueError(f"{name} does not run in the engine: port it by hand or keep torchvision for it")
    if floats and "dtype" not in out:
        out["dtype"] = "float32"
    spec: dict[str, Any] = {field: out}
    if label is not None:
        spec[label] = label_type
    return spec


def transform(
    data: BytesLike, spec: Spec, field: str | None = None, *, seed: int = 0, epoch: int = 0, position: int = 0
) -> tuple[NDArray[Any], ImageInfo]:
    """`data` (bytes-like) as the image field `field` of `spec` makes it.

    `field` may be left out when the spec has one image field. Returns
    ``(array, info)``: a numpy array of the spec's shape and type, and a
    dict with ``source`` (width, height), ``crop`` (top, left, height,
    width in source pixels), ``flipped`` and ``decode_scale`` (1, or the
    reduced size a JPEG was decoded at).
    """
    text = _spec_text(spec)
    if field is None:
        parsed = json.loads(text) if isinstance(text, str) else None
        images = [k for k, v in (parsed or {}).items() if isinstance(v, dict) and "label" not in v]
        if len(images) != 1:
            raise ValueError(f"the spec has {len(images)} image fields ({', '.join(images)}): name one as `field`")
        field = images[0]
    view = memoryview(cast("Buffer", data)).cast("B")
    src = (ctypes.c_char * len(view)).from_buffer_copy(view) if len(view) else None
    info = _ffi.STRUCT_TYPES["ringfeed_image_info"]()
    args = (text.encode(), field.encode(), src and ctypes.addressof(src), len(view), seed, epoch, position)
    st = _lib.ringfeed_image_transform(*args, None, 0, ctypes.byref(info))
    if st not in (_ffi.RINGFEED_OK, _ffi.RINGFEED_ERR_BUFFER_TOO_SMALL) or info.out_bytes == 0:
        raise from_status(st)
    out = np.empty((info.dim0, info.dim1, info.dim2), dtype=_DTYPES[info.elem_bytes])
    st = _lib.ringfeed_image_transform(*args, out.ctypes.data, out.nbytes, ctypes.byref(info))
    if st != _ffi.RINGFEED_OK:
        raise from_status(st)
    return out, {
        "source": (info.source_width, info.source_height),
        "crop": (info.crop_top, info.crop_left, info.crop_height, info.crop_width),
        "flipped": bool(info.flipped),
        "decode_scale": info.decode_scale,
    }
