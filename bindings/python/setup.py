"""Build step: compile the engine and the `ringfeed` program (which runs node
engines started on demand) with `cargo build --release -p ringfeed -p
ringfeed-cli` at the repository root, two levels up, and bundle `libringfeed.so` and `ringfeed` inside
the package, so `pip install ./bindings/python` gives a self-contained
`import ringfeed`.

RINGFEED_BUILD_LIB=0 skips the cargo build and bundles nothing; the package
then finds the library at run time through RINGFEED_LIB or next to itself.

The wheel is `py3-none-<platform>`: the Python code is plain ctypes, so any
CPython 3 can use it, and only the bundled binaries tie it to a platform.
The platform tag is `manylinux_2_<N>_<arch>` when `objdump` shows what the
binaries need (glibc symbols no newer than 2.<N>, and only the libraries
the manylinux policies allow), and plain `linux_<arch>` otherwise.
docs/decisions.md ("Packaging") says why setuptools and not maturin.
"""

import fcntl
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:  # setuptools 70.1 and later carry bdist_wheel; before, the wheel package
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# pip builds this folder in place (build/, ringfeed.egg-info/), so two
# builds of it at once (the test command builds docker/build-images.sh's
# wheel while bindings/python/tests/test_wheel.py builds its own) would
# write the same files. Each of pip's steps, a run of this file, holds a
# lock on this file until it exits: the other build's steps wait. Where the
# file system takes no locks (NFS without them, some FUSE mounts), the
# build goes on without.
_BUILD_LOCK = open(__file__, "rb")
try:
    fcntl.flock(_BUILD_LOCK, fcntl.LOCK_EX)
except OSError:
    pass


def package_version():
    """ringfeed/_version.py's VERSION, which must be Cargo.toml's version
    when the repository is here: the package loads only a library of its
    own release."""
    text = (HERE / "ringfeed" / "_version.py").read_text()
    version = re.search(r'^VERSION = "([^"]+)"$', text, re.M).group(1)
    cargo = REPO / "Cargo.toml"
    if cargo.is_file():
        engine = re.search(r'^version\s*=\s*"([^"]+)"', cargo.read_text(), re.M).group(1)
        if engine != version:
            raise SystemExit(
                f"ringfeed: Cargo.toml says version {engine}, but ringfeed/_version.py says {version}; "
                "set the same version in both"
            )
    return version


# Libraries a manylinux wheel may need from the system (PEP 599's list, the
# ones a Rust binary can use), and the dynamic loader the program names.
MANYLINUX_LIBS = {
    "libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0",
    "libutil.so.1", "libgcc_s.so.1", "libresolv.so.2", "libnsl.so.1",
    "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1",
}


def platform_tag(binaries):
    """The wheel's platform tag for `binaries`, as the module docstring says."""
    arch = platform.machine()
    plain = f"linux_{arch}"
    glibc = (2, 17)  # the oldest glibc Rust's standard library supports
    for binary in binaries:
        try:
            dynamic = subprocess.run(["objdump", "-p", "-T", str(binary)], capture_output=True,
                                     text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return plain  # cannot check, so claim nothing
        if "GLIBC_PRIVATE" in dynamic:
            return plain
        needed = set(re.findall(r"^\s+NEEDED\s+(\S+)$", dynamic, re.M))
        if not needed <= MANYLINUX_LIBS:
            return plain
        for major, minor in re.findall(r"GLIBC_(\d+)\.(\d+)", dynamic):
            glibc = max(glibc, (int(major), int(minor)))
    return f"manylinux_{glibc[0]}_{glibc[1]}_{arch}"


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
        # One command for both, the same packages as `cargo build --release`:
        # built apart, the library alone and the CLI resolve the shared
        # dependencies' features differently, and each build recompiles the
        # library the other just built.
        subprocess.run(
            [cargo, "build", "--release", "-p", "ringfeed", "-p", "ringfeed-cli", "--locked"], cwd=REPO, check=True
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
    """The wheel carries a native library: not pure, so it is installed to
    platlib and tagged for a platform."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """Tags the wheel `py3-none-<platform>`: no CPython ABI is used."""

    def get_tag(self):
        build = self.get_finalized_command("build_py")
        binaries = [Path(build.build_lib) / "ringfeed" / name for name in ("libringfeed.so", "ringfeed")]
        if not all(b.is_file() for b in binaries):
            return "py3", "none", "any"  # RINGFEED_BUILD_LIB=0: nothing bundled
        return "py3", "none", platform_tag(binaries)


setup(
    version=package_version(),
    cmdclass={"build_py": BuildWithEngine, "bdist_wheel": PlatformWheel},
    distclass=BinaryDistribution,
)
