"""Type aliases of the package's annotations.

Only type checkers read this module: the others import it under
``typing.TYPE_CHECKING``, so it never runs with the package. It stays
valid Python 3.9 all the same (``Union``, not ``X | Y``).
"""

import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Union

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from typing_extensions import Buffer

# A local path or URL: a str, or a path object (``pathlib.Path``).
StrPath = Union[str, "os.PathLike[str]"]

# One or several of them: `Loader`'s and `RingfeedDataset`'s `urls`.
Urls = Union[StrPath, Iterable[StrPath]]

# A bytes-like object: bytes, bytearray, memoryview, a numpy array (which
# numpy's stubs give the buffer protocol only from Python 3.12 on), ...
BytesLike = Union["Buffer", "NDArray[Any]"]

# An image pipeline's ``transform`` spec: the JSON object as a dict, or its text.
Spec = Union[Dict[str, Any], str]

# A sample's field as a decoder gets it: bytes, or a memoryview of the batch.
FieldData = Union[bytes, memoryview]

# A decoding handler: ``handler(field_name, data)``, the value or None to pass.
Handler = Callable[[str, FieldData], Any]
