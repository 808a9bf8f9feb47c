"""Build step: compile the engine (`cargo build --release --lib -p ringfeed` at the
repository root, two levels up) and the `ringfeed` program (which runs node
engines started on demand), and bundle `libringfeed.so` and `ringfeed` inside
the package, so `pip install ./bindings/python` gives a self-contained
`import ringfeed`.

RINGFEED_BUILD_LIB=0 skips the cargo build and bundles nothing; the package
then finds the library at run time through RINGFEED_LIB or next to itself.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def engine_version():
    cargo = REPO / "Cargo.toml"
    if cargo.is_file():
        m = re.search(r'^version\s*=\s*"([^"]+)"', cargo.read_text(), re.M)
        if m:
            return m.group(1)
    return "0.0.0"


class BuildWithEngine(build_py):
    def run(self):
        super().run()
        if os.environ.get("RINGFEED_BUILD_LIB", "1") == "0":
            return
        if not (REPO / "Cargo.toml").is_file():
            raise SystemExit(
                f"ringfeed: no Cargo.toml at {REPO}; build from the repository "
                "(pip install ./bindings/python) or set RINGFEED_BUILD_LIB=0 and RINGFEED_LIB"
            )
        cargo = os.environ.get("CARGO", "cargo")
        subprocess.run([cargo, "build", "--release", "--lib", "-p", "ringfeed", "--locked"], cwd=REPO, check=True)
        subprocess.run(
            [cargo, "build", "--release", "--bin", "ringfeed", "-p", "ringfeed-cli", "--locked"], cwd=REPO, check=True
        )
        target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
        if not target.is_absolute():
            target = REPO / target
        lib = target / "release" / "libringfeed.so"
        if not lib.is_file():
            raise SystemExit(f"ringfeed: cargo built, but {lib} is missing")
        dest = Path(self.build_lib) / "ringfeed" / "libringfeed.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lib, dest)
        # Next to the library: where it looks for the program that runs a
        # node engine (`"node": "auto"`).
        program = target / "release" / "ringfeed"
        if not program.is_file():
            raise SystemExit(f"ringfeed: cargo built, but {program} is missing")
        shutil.copy2(program, dest.parent / "ringfeed")


class BinaryDistribution(Distribution):
    """The wheel carries a native library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(
    version=engine_version(),
    cmdclass={"build_py": BuildWithEngine},
    distclass=BinaryDistribution,
)
