"""Shared fixtures: shards from the CLI (`ringfeed gen`) and from tarfile."""

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
HEADER = REPO / "include" / "ringfeed.h"

MASK = (1 << 64) - 1


def cli():
    """Path of the `ringfeed` CLI, built with cargo when missing."""
    path = Path(os.environ.get("RINGFEED_CLI", REPO / "target" / "release" / "ringfeed"))
    if not path.is_file():
        subprocess.run(["cargo", "build", "--release", "--bin", "ringfeed", "--locked"], cwd=REPO, check=True)
    return path


def gen(dest, shards=2, shard_size="1MiB", sample_size="10KB", fields="jpg,cls", seed=0, spread="0.5"):
    subprocess.run(
        [str(cli()), "gen", str(dest), "--shards", str(shards), "--shard-size", shard_size,
         "--sample-size", sample_size, "--fields", fields, "--seed", str(seed), "--spread", spread],
        check=True, capture_output=True,
    )
    return sorted(str(p) for p in Path(dest).glob("shard-*.tar"))


def synth_content(seed, key, field, n):
    """The bytes `ringfeed gen` writes for (key, field) of length n (src/synth.rs)."""
    h = (0xCBF29CE484222325 ^ seed) & MASK
    for b in key.encode() + b"\0" + field.encode() + n.to_bytes(8, "little"):
        h ^= b
        h = (h * 0x100000001B3) & MASK
    s = h | 1
    out = bytearray()
    while len(out) < n:
        s ^= s >> 12
        s ^= (s << 25) & MASK
        s ^= s >> 27
        out += ((s * 0x2545F4914F6CDD1D) & MASK).to_bytes(8, "little")
    return bytes(out[:n])


def write_tar(path, members, fmt=tarfile.USTAR_FORMAT):
    """Writes `members` [(name, bytes)] as a tar with Python's tarfile."""
    with tarfile.open(path, "w", format=fmt) as t:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    return str(path)


def sample_bytes(key, field, n):
    base = f"{key}/{field}/".encode()
    return (base * (n // len(base) + 1))[:n]


@pytest.fixture(scope="session")
def small_shards(tmp_path_factory):
    """Two shards of ~10 KB samples (jpg, cls) from the CLI."""
    return gen(tmp_path_factory.mktemp("small"), shards=2, shard_size="1MiB", sample_size="10KB")


@pytest.fixture(scope="session")
def fixed_shards(tmp_path_factory):
    """Two shards whose samples hold one 1000-byte field `vec` (constant stride)."""
    d = tmp_path_factory.mktemp("fixed")
    paths = []
    for s in range(2):
        members = [(f"{s:02d}-{i:05d}.vec", sample_bytes(f"{s:02d}-{i:05d}", "vec", 1000)) for i in range(300)]
        paths.append(write_tar(d / f"fixed-{s}.tar", members))
    return paths


def all_samples(loader):
    """{key: {field: bytes}} of everything a loader yields, releasing each batch."""
    out = {}
    for b in loader:
        with b:
            keys = b.keys
            for name in b.fields:
                v = b[name]
                for i, k in enumerate(keys):
                    mv = v[i]
                    if mv is not None:
                        out.setdefault(k, {})[name] = bytes(mv)
    return out
