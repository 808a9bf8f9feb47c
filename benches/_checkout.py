"""The benchmarks that import ringfeed measure this checkout.

`use_checkout()` puts the checkout's package (``bindings/python``) first on
``sys.path`` and on ``PYTHONPATH`` (which the contenders' processes
inherit), and points ``RINGFEED_LIB`` at the release library
(``target/release/libringfeed.so``) unless it is set; a run that loads
it finds it missing by name (``cargo build --release``). Without it a
benchmark run with the repository's ``.venv`` imports whatever ``ringfeed``
was last installed there, with the library bundled in that wheel: the
package of another commit, measured under this one's name.
"""

import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent


def use_checkout():
    """Returns the library path the contenders will load."""
    package = str(REPO / "bindings" / "python")
    if sys.path[:1] != [package]:
        sys.path.insert(0, package)
    rest = os.environ.get("PYTHONPATH")
    if not rest:
        os.environ["PYTHONPATH"] = package
    elif rest.split(os.pathsep)[0] != package:
        os.environ["PYTHONPATH"] = package + os.pathsep + rest
    lib = os.environ.get("RINGFEED_LIB") or str(REPO / "target" / "release" / "libringfeed.so")
    os.environ["RINGFEED_LIB"] = lib
    return lib
