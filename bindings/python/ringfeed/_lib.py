"""Finding the native library.

Tried in order, and every attempt is named in the ImportError when all fail:

1. ``RINGFEED_LIB``: an explicit path to ``libringfeed.so``. When set, it is
   the only candidate: a wrong path fails loudly instead of silently loading
   another copy.
2. Bundled: ``libringfeed.so`` inside the installed package (``pip install
   ./bindings/python`` builds and copies it there).
3. Next to the package: the directory that holds the ``ringfeed`` package.
4. A source checkout: ``target/release`` then ``target/debug`` of the
   repository the package sits in (``bindings/python/ringfeed`` → repo root).

The first library that loads must report the package's own release
(``ringfeed_version()``, `_version.VERSION`): the package declares the C ABI
of that release only, and no ABI is promised across 0.x releases, so another
one is refused with an ImportError naming both versions, not tried further.
"""

import ctypes
import os
from pathlib import Path

from ._version import VERSION

LIB_NAME = "libringfeed.so"


def candidates():
    explicit = os.environ.get("RINGFEED_LIB")
    if explicit:
        return [Path(explicit)]
    pkg = Path(__file__).resolve().parent
    out = [pkg / LIB_NAME, pkg.parent / LIB_NAME]
    repo = pkg.parent.parent.parent
    if (repo / "Cargo.toml").is_file():
        out += [repo / "target" / "release" / LIB_NAME, repo / "target" / "debug" / LIB_NAME]
    return out


def load_library():
    tried = []
    for path in candidates():
        if not path.is_file():
            tried.append(f"{path} (no such file)")
            continue
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        check_version(lib, path)
        return lib, str(path)
    hint = (
        "set RINGFEED_LIB to the path of libringfeed.so, or reinstall with "
        "`pip install ./bindings/python` from the repository (it runs cargo build)"
    )
    raise ImportError("ringfeed: cannot load the native library; tried: " + "; ".join(tried) + f". {hint}")


def check_version(lib, path, expected=VERSION):
    """Raises ImportError unless `lib` (loaded from `path`) reports the
    release `expected`."""
    try:
        version_fn = lib.ringfeed_version
    except AttributeError:
        raise ImportError(
            f"ringfeed: {path} has no ringfeed_version(): it is not a ringfeed library, "
            f"or one older than this package (version {expected})"
        ) from None
    version_fn.restype = ctypes.c_char_p
    version_fn.argtypes = []
    found = (version_fn() or b"?").decode("utf-8", "replace")
    if found != expected:
        raise ImportError(
            f"ringfeed: the native library {path} is version {found}, but this Python package "
            f"is version {expected}; the two must come from the same release. Install the "
            f"package's own wheel (it bundles its library), or point RINGFEED_LIB at a "
            f"libringfeed.so of version {expected}"
        )
