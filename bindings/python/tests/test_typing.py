"""Type hints: the package ships them (``py.typed``, PEP 561) and they hold.

mypy checks the package itself, with the settings in pyproject.toml; then,
with ``--strict``, code that uses the package the way a user's code does,
from a folder outside it, so that mypy reads the package as an installed
one: only through its ``py.typed``. The usage asserts the types it gets
(``assert_type``), and a control with wrong arguments must be refused,
naming them: a pass means that mypy saw the hints, not that everything it
saw was ``Any``.
"""

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import ringfeed
from ringfeed import _ffi

from conftest import require

require("mypy", "the checks of the package's type hints")

# bindings/python: where pyproject.toml holds the package's mypy settings.
PROJECT = Path(__file__).resolve().parents[1]

# Code written against the package as a user writes it. It is type-checked,
# never run.
USAGE = """
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from numpy.typing import NDArray
from typing_extensions import assert_type

import ringfeed
import ringfeed.image
from ringfeed.torch import RingfeedDataset


def stream(urls: list[str]) -> int:
    ringfeed.set_log_level(logging.DEBUG)
    total = 0
    with ringfeed.Loader(urls, batch_size=32, workers=2, memory_budget="512MiB", epochs=1) as loader:
        for batch in loader:
            with batch:
                jpg = batch["jpg"]
                assert_type(jpg, ringfeed.FieldView)
                assert_type(jpg.lengths, NDArray[np.int64])
                total += int(jpg.lengths.sum()) + len(batch)
                assert_type(jpg[0], Optional[memoryview])
                assert_type(batch.keys, list[str])
                values, offsets = batch["cls"].gather()
                assert_type(values, NDArray[np.uint8])
                assert_type(batch["emb"].fixed(np.float32), NDArray[Any])
        assert_type(loader.stats(), dict[str, Any])
        assert_type(loader.next_batch(timeout=0.5), Optional[ringfeed.Batch])
        state = loader.state()
        assert_type(state, bytes)
    resumed = ringfeed.Loader(Path("/data/shards"), resume=state)
    for batch in resumed.iter_epoch():
        batch.release()
    resumed.close()
    assert_type(ringfeed.config_keys(), tuple[str, ...])
    assert_type(ringfeed.expand_urls("/data/shard-{000..009}.tar"), list[str])
    return total


def images(data: bytes) -> tuple[int, int]:
    spec = {"jpg": {"resize": 256, "center_crop": 224, "dtype": "float32"}}
    image, info = ringfeed.image.transform(data, spec, seed=1, epoch=0, position=3)
    assert_type(image, NDArray[Any])
    top, left, height, width = info["crop"]
    assert_type(top, float)
    assert_type(info["flipped"], bool)
    shape, dtype = ringfeed.image.output_shape(spec, "jpg")
    assert_type(shape, tuple[int, int, int])
    return info["source"]


def objects(url: str) -> int:
    with ringfeed.read_object(url, s3_endpoint="http://127.0.0.1:9000", parts_in_flight=8) as buf:
        assert_type(buf, ringfeed.ObjectBuffer)
        assert_type(buf.numpy(), NDArray[np.uint8])
        assert_type(buf.memoryview(), memoryview)
        data = bytes(buf)
    size = ringfeed.read_object_into(Path(url), np.empty(1 << 20, np.uint8))
    assert_type(size, int)
    ringfeed.read_object_into(url, bytearray(16))
    ringfeed.write_object(url + ".copy", data, overwrite=True)
    assert_type(ringfeed.read_objects([url, url + ".copy"]), dict[str, ringfeed.ObjectBuffer])
    assert_type(ringfeed.read_objects([Path(url)]), dict[Path, ringfeed.ObjectBuffer])
    assert_type(ringfeed.read_objects("s3://bucket/prefix/"), dict[str, ringfeed.ObjectBuffer])
    assert_type(ringfeed.list_objects("s3://bucket/prefix/"), list[tuple[str, int]])
    assert_type(ringfeed.object_exists(url), bool)
    with ringfeed.open_object(url, "wb") as f:
        assert_type(f, ringfeed.ObjectWriter)
        f.write(data)
    with ringfeed.open_object(url) as r:
        assert_type(r, ringfeed.ObjectReader)
        assert_type(r.readall(), bytes)
        assert_type(r.seek(0), int)
    assert_type(ringfeed.load_safetensors(url), dict[str, torch.Tensor])
    arrays, metadata = ringfeed.load_safetensors(url, framework="numpy", metadata=True)
    assert_type(arrays, dict[str, NDArray[Any]])
    assert_type(metadata, Optional[dict[str, str]])
    try:
        ringfeed.read_object_into(url, bytearray(1))
    except ringfeed.BufferTooSmallError as e:
        return e.size
    return len(data)


def datasets(urls: list[str]) -> dict[str, Any]:
    ds = RingfeedDataset(urls, batch_size=8, transform={"jpg": {"random_resized_crop": 224, "flip": 0.5}, "cls": "int64"})
    ds.set_epoch(1)
    for item in ds:
        images, labels = item
    state = ds.state_dict()
    ds.load_state_dict(state)
    ds.close()
    decoded = RingfeedDataset(urls, shuffle=True).decode("torchrgb8").to_tuple("jpg", "cls").map_tuple(None, int)
    assert_type(decoded, RingfeedDataset)
    assert_type(decoded.consumer(), dict[str, int])
    return state
"""

# The same calls with wrong arguments: each must be refused by name.
CONTROL = """
import ringfeed


def wrong(loader: ringfeed.Loader) -> None:
    loader.next_batch(timeout="soon")
    ringfeed.read_object(123)
"""


def mypy(args, cwd, **env):
    """Runs mypy in this Python; returns (exit status, output)."""
    r = subprocess.run([sys.executable, "-m", "mypy", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                       env=dict(os.environ, **env))
    return r.returncode, r.stdout + r.stderr


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """Runs mypy ``--strict`` on a user's file, in a folder of its own with
    no settings but its own, the package importable as this test imports it
    (installed, or the source tree on PYTHONPATH). Returns (status, output)."""
    folder = tmp_path_factory.mktemp("user")
    config = folder / "mypy.ini"
    config.write_text("[mypy]\n")
    cache = folder / ".mypy_cache"
    # The folder that holds the `ringfeed` this test imports: mypy, seeing it
    # on its search path, reads the package only if it has a py.typed.
    site = Path(ringfeed.__file__).resolve().parents[1]
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)

    def check(name, text):
        source = folder / name
        source.write_text(textwrap.dedent(text))
        return mypy(["--strict", "--config-file", config, "--cache-dir", cache, source], folder, PYTHONPATH=path)

    return check


def test_the_package_ships_py_typed():
    assert (Path(ringfeed.__file__).parent / "py.typed").is_file()


def test_the_package_passes_mypy(tmp_path):
    status, out = mypy(["ringfeed", "--cache-dir", tmp_path / ".mypy_cache"], PROJECT)
    assert status == 0, out
    assert out.startswith("Success: no issues found"), out


def test_code_using_the_package_type_checks_strictly(user):
    status, out = user("usage.py", USAGE)
    assert status == 0, out
    assert out.startswith("Success: no issues found in 1 source file"), out


def test_wrong_arguments_are_refused_by_name(user):
    status, out = user("control.py", CONTROL)
    assert status == 1, out
    assert 'Argument "timeout" to "next_batch" of "Loader" has incompatible type "str"' in out, out
    assert 'Argument 1 to "read_object" has incompatible type "int"' in out, out
    # Only these two: the package itself was found and read.
    assert "Found 2 errors in 1 file" in out, out


def test_the_checkers_constants_are_the_ffis():
    """_ffi.py declares its #define constants for type checkers by hand
    (under TYPE_CHECKING: the dict that defines them at run time is opaque
    to a checker); the names must be CONSTANTS' own."""
    tree = ast.parse(Path(_ffi.__file__).read_text())
    declared = set()
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            declared |= {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)}
    assert declared == set(_ffi.CONSTANTS)
