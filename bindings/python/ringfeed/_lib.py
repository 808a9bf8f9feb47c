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
"""

import ctypes
import os
from pathlib import Path

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
            return ctypes.CDLL(str(path)), str(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
    hint = (
        "set RINGFEED_LIB to the path of libringfeed.so, or reinstall with "
        "`pip install ./bindings/python` from the repository (it runs cargo build)"
    )
    raise ImportError("ringfeed: cannot load the native library; tried: " + "; ".join(tried) + f". {hint}")
