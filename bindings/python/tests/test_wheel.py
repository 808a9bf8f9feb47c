"""The wheel: `pip wheel ./bindings/python` gives one `py3-none-<platform>`
wheel bundling the library and the program; it installs into a fresh venv
where neither cargo nor rustc can be found, and streams shards there. A
library of another release is refused, naming both versions. Two builds
of the folder at once take turns."""

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy
import pytest
import ringfeed
from ringfeed._version import VERSION

from conftest import REPO, gen


def check_run(cmd, **kwargs):
    """Runs `cmd`; a failure shows its output."""
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    check_run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", REPO / "bindings" / "python", "-w", out])
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def glibc_needed(binary):
    """The newest glibc symbol version `binary` needs, from `objdump -T`."""
    dynamic = check_run(["objdump", "-T", binary]).stdout
    return max((int(a), int(b)) for a, b in re.findall(r"GLIBC_(\d+)\.(\d+)", dynamic))


def test_the_version_is_cargos():
    cargo = (REPO / "Cargo.toml").read_text()
    assert re.search(r'^version = "([^"]+)"$', cargo, re.M).group(1) == VERSION
    assert ringfeed.__version__ == ringfeed.library_version() == VERSION


def test_the_wheel_is_for_any_python_3_and_bundles_the_binaries(wheel, tmp_path):
    m = re.fullmatch(rf"ringfeed-{re.escape(VERSION)}-py3-none-(manylinux_(\d+)_(\d+)|linux)_x86_64\.whl", wheel.name)
    assert m, wheel.name
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f"ringfeed-{VERSION}.dist-info/WHEEL").decode()
        assert "Root-Is-Purelib: false" in meta
        assert f"Tag: {wheel.name.split('-', 2)[2][:-4]}" in meta
        z.getinfo("ringfeed/libringfeed.so")
        # PEP 561: type checkers read the package's hints only with this marker.
        z.getinfo("ringfeed/py.typed")
        # The program must stay executable: the library runs it for a node engine.
        assert (z.getinfo("ringfeed/ringfeed").external_attr >> 16) & 0o111, "the program is not executable"
        z.extractall(tmp_path)
    if m.group(2):
        # The manylinux claim: no binary needs a newer glibc than it names.
        claimed = (int(m.group(2)), int(m.group(3)))
        for name in ("libringfeed.so", "ringfeed"):
            assert glibc_needed(tmp_path / "ringfeed" / name) <= claimed, name


def without_rust(path):
    """`path` (a PATH value) without the directories holding cargo or rustc."""
    keep = [d for d in path.split(os.pathsep) if d and not any((Path(d) / t).exists() for t in ("cargo", "rustc"))]
    return os.pathsep.join(keep)


STREAM = """
import json, os, shutil, subprocess, sys
import ringfeed
assert shutil.which("cargo") is None and shutil.which("rustc") is None, os.environ["PATH"]
package = os.path.dirname(ringfeed.__file__)
program = os.path.join(package, "ringfeed")
version = subprocess.run([program, "--version"], capture_output=True, text=True, check=True).stdout
with ringfeed.Loader(sys.argv[1:], batch_size=16, workers=2) as loader:
    samples = sum(len(b) for b in loader)
print(json.dumps({"package": package, "library": ringfeed.LIBRARY_PATH, "prefix": sys.prefix,
                  "version": ringfeed.__version__, "program": version, "samples": samples}))
"""


def test_the_wheel_installs_and_streams_where_there_is_no_rust(wheel, tmp_path):
    shards = gen(tmp_path / "shards", shards=2)
    with ringfeed.Loader(shards, batch_size=16) as loader:
        expected = sum(len(b) for b in loader)

    venv = tmp_path / "venv"
    check_run([sys.executable, "-m", "venv", venv])
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CARGO", "RUSTUP", "RUSTC", "RINGFEED_", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), without_rust(os.environ["PATH"])])
    python = venv / "bin" / "python"
    # numpy at the version already installed here, so pip's cache serves it.
    check_run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel,
               f"numpy=={numpy.__version__}"], env=env, cwd=tmp_path)
    r = check_run([python, "-c", STREAM, *shards], env=env, cwd=tmp_path)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert Path(got["prefix"]) == venv
    assert Path(got["library"]) == Path(got["package"]) / "libringfeed.so"
    assert Path(got["package"]).is_relative_to(venv)
    assert got["version"] == VERSION and VERSION in got["program"]
    assert got["samples"] == expected > 0


def test_a_library_of_another_release_is_refused(tmp_path):
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler to build a library reporting another version")
    src = tmp_path / "other.c"
    src.write_text('const char *ringfeed_version(void) { return "9.8.7"; }\n')
    other = tmp_path / "libringfeed.so"
    check_run([cc, "-shared", "-fPIC", "-o", other, src])
    env = dict(os.environ, RINGFEED_LIB=str(other))
    r = subprocess.run([sys.executable, "-c", "import ringfeed"], capture_output=True, text=True, env=env, cwd="/")
    assert r.returncode != 0
    assert "ImportError" in r.stderr, r.stderr
    assert "version 9.8.7" in r.stderr and f"version {VERSION}" in r.stderr and str(other) in r.stderr, r.stderr


def flock_waiters(pid):
    """The flock(2) requests that process `pid` waits on, as /proc/locks
    lists them (a waiter's line has `->` after its number)."""
    return [line for line in Path("/proc/locks").read_text().splitlines()
            if "->" in line and " FLOCK " in line and f" {pid} " in line]


def test_a_build_of_the_folder_waits_while_another_runs():
    """pip builds bindings/python in place (build/, ringfeed.egg-info/), and
    the test command builds docker/build-images.sh's wheel while this file
    builds its own: each run of setup.py holds a lock on it until it exits.
    A run started while the lock is held waits in flock (seen in /proc/locks,
    not by timing), and finishes once it is let go; the run before it, with
    the lock not held here, finishes too (it may have waited for another
    build of the folder, never for this test)."""
    setup_py = REPO / "bindings" / "python" / "setup.py"
    cmd = [sys.executable, setup_py, "--version"]
    free = subprocess.run(cmd, capture_output=True, text=True, cwd=setup_py.parent, timeout=120)
    assert free.returncode == 0 and free.stdout.strip() == VERSION, free.stdout + free.stderr
    with open(setup_py, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 cwd=setup_py.parent)
        try:
            deadline = time.monotonic() + 120
            while not flock_waiters(child.pid):
                assert child.poll() is None, f"ran while the lock was held: {child.communicate()}"
                assert time.monotonic() < deadline, "the second build never waited on the lock"
                time.sleep(0.05)
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0 and out.strip() == VERSION, out + err
