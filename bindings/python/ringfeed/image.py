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

The spec is the ``transform`` JSON (a dict or its text): see the README,
"Images". A bad spec raises `ConfigError`; an image that cannot be decoded
raises `FormatError`, naming the field.
"""

import ctypes
import json

import numpy as np

from . import _ffi
from .errors import from_status

_lib = _ffi.lib

_DTYPES = {1: np.uint8, 2: np.float16, 4: np.float32}


def _spec_text(spec):
    return spec if isinstance(spec, str) else json.dumps(spec)


def transform(data, spec, field=None, *, seed=0, epoch=0, position=0):
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
    view = memoryview(data).cast("B")
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
