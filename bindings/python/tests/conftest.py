"""Shared fixtures: shards from the CLI (`ringfeed gen`) and from tarfile;
the S3-compatible server of examples/s3_server.rs; and what a skip means
under RINGFEED_EXPECT_INSTALLED=1."""

import importlib
import io
import json
import os
import select
import shutil
import subprocess
import tarfile
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
HEADER = REPO / "include" / "ringfeed.h"

MASK = (1 << 64) - 1

# scripts/test.sh sets RINGFEED_EXPECT_INSTALLED=1 after installing every
# optional dependency (torch, torchdata, torchvision, Pillow, webdataset, a C
# compiler). There a test that skips because one is missing would hide that
# the thing it checks never ran, so such a skip is reported as a failure (the
# hooks below). Only skips for what no install can change (not running as
# root, a torch build without torch.distributed) stay skips: they go through
# `skip_for_environment`, and `-rs` lists them.
EXPECT_INSTALLED = os.environ.get("RINGFEED_EXPECT_INSTALLED") == "1"
ENVIRONMENT = "environment: "


def require(module, what):
    """Imports `module` (dotted names too) and returns it. Where it is
    missing the test skips, saying `what` did not run; under
    RINGFEED_EXPECT_INSTALLED=1 that is a failure instead."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        error = e
    if EXPECT_INSTALLED:
        pytest.fail(f"{module} cannot be imported ({error}), yet scripts/test.sh installed it "
                    f"(RINGFEED_EXPECT_INSTALLED=1): {what} did NOT run", pytrace=False)
    pytest.skip(f"{module} is not installed: {what} did NOT run", allow_module_level=True)


def skip_for_environment(reason):
    """Skips for a reason no install can change; a skip even under
    RINGFEED_EXPECT_INSTALLED=1."""
    pytest.skip(ENVIRONMENT + reason)


def _fail_required_skip(report):
    """Under RINGFEED_EXPECT_INSTALLED=1, turns a skip that did not come
    from `skip_for_environment` (an `importorskip`, a `skipif`, a plain
    `pytest.skip`) into a failure naming its reason."""
    if not (EXPECT_INSTALLED and report.skipped) or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    if reason.startswith("Skipped: " + ENVIRONMENT):
        return
    report.outcome = "failed"
    report.longrepr = (f"{report.nodeid} skipped under RINGFEED_EXPECT_INSTALLED=1, where everything it "
                       f"needs was installed: {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_required_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_required_skip(outcome.get_result())


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


def tar_keys(paths):
    """The sample keys the shards at `paths` hold, read from the tar files
    themselves with Python's tarfile: a key is a member's path up to the
    first dot of its base name (docs/webdataset-compat.md)."""
    keys = set()
    for p in paths:
        with tarfile.open(p) as t:
            for m in t.getmembers():
                if m.isfile():
                    d, _, base = m.name.rpartition("/")
                    keys.add((d + "/" if d else "") + base.split(".", 1)[0])
    return keys


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


def make_image(i, size=(32, 24)):
    """A picture that decodes to a known colour: sample i's (r, g, b) fill
    with a gradient, so JPEG stays close to it."""
    import numpy as np

    w, h = size
    r, g, b = (37 * i) % 256, (91 * i + 40) % 256, (13 * i + 200) % 256
    a = np.empty((h, w, 3), np.uint8)
    a[..., 0], a[..., 1], a[..., 2] = r, g, b
    a[..., 0] = (a[..., 0].astype(int) + np.arange(w)[None, :] // 4) % 256
    return a


def encode_image(a, fmt):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buf.getvalue()


def image_shards(dest, shards=2, per_shard=20, size=(32, 24), corrupt=None):
    """Shards of real images: sample i has ``jpg`` (``png`` for every third
    one), ``cls`` (i % 10), ``json`` ({"i": i}), ``npy`` (arange(i % 5)) and
    ``txt``. `corrupt`: the index of a sample whose image is cut short.
    Returns (paths, {key: i})."""
    import numpy as np

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    paths, index = [], {}
    i = 0
    for s in range(shards):
        members = []
        for _ in range(per_shard):
            key = f"img{s:02d}/{i:05d}"
            index[key] = i
            ext, fmt = ("png", "PNG") if i % 3 == 0 else ("jpg", "JPEG")
            data = encode_image(make_image(i, size), fmt)
            if i == corrupt:
                data = data[: len(data) // 3]
            npy = io.BytesIO()
            np.save(npy, np.arange(i % 5, dtype=np.int16))
            members += [
                (f"{key}.{ext}", data),
                (f"{key}.cls", str(i % 10).encode()),
                (f"{key}.json", json.dumps({"i": i}).encode()),
                (f"{key}.npy", npy.getvalue()),
                (f"{key}.txt", f"sample {i}".encode()),
            ]
            i += 1
        paths.append(write_tar(dest / f"images-{s:03d}.tar", members))
    return paths, index


S3_SERVER_BUILD = "cargo build --example s3_server"


def s3_server_binary():
    """Path of the S3-compatible test server (examples/s3_server.rs):
    $RINGFEED_S3_SERVER, else the release build, else the debug one. Not
    built here (scripts/test.sh builds it): missing, the test fails saying
    how to build it."""
    given = os.environ.get("RINGFEED_S3_SERVER")
    candidates = [Path(given)] if given else [
        REPO / "target" / profile / "examples" / "s3_server" for profile in ("release", "debug")
    ]
    for path in candidates:
        if path.is_file():
            return path
    pytest.fail(f"the S3 test server is not built (looked for {', '.join(map(str, candidates))}): "
                f"run `{S3_SERVER_BUILD}` in {REPO}", pytrace=False)


@dataclass
class S3Server:
    """A running examples/s3_server.rs: its endpoint, the folder it serves
    (each subfolder a bucket, `bucket` among them) and its credentials."""

    endpoint: str
    root: Path
    bucket: str
    # Where its stderr goes.
    log: Path = None
    # ACCESS_KEY and SECRET_KEY of tests/support/s3/mod.rs.
    access_key: str = "AKIARINGFEEDTEST"
    secret_key: str = "ringfeed-test-secret-0123456789abcdef"

    def config(self):
        """The loader's configuration keys for this server (src/config/keys.rs)."""
        return {
            "s3_endpoint": self.endpoint,
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
            "s3_region": "us-east-1",
        }


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """The S3-compatible server on a fresh root with bucket `ringfeed-test`,
    for the session. It stops when its stdin closes: at the end of the
    session, or when this process dies."""
    with run_s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server


@contextmanager
def run_s3_server(tmp, *args):
    """The S3-compatible server on a fresh root under `tmp` with bucket
    `ringfeed-test` and the options `args` (examples/s3_server.rs: `--deny`,
    `--hold-complete`, ...), until the block ends; its stderr goes to
    `tmp / "s3_server.log"` (the `log` of what it yields)."""
    binary = s3_server_binary()
    root, bucket, log_path = tmp / "root", "ringfeed-test", tmp / "s3_server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(binary), str(root), "--bucket", bucket, *args],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
    try:
        # It prints its endpoint once it listens; 60 s covers a loaded machine.
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline().decode().strip() if ready else ""
        if not line.startswith("http://127.0.0.1:"):
            proc.kill()
            proc.wait()
            pytest.fail(f"{binary} did not start (first line {line!r}): {log_path.read_text()}",
                        pytrace=False)
        yield S3Server(endpoint=line, root=root, bucket=bucket, log=log_path)
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture()
def runtime_dir(monkeypatch):
    """A private XDG_RUNTIME_DIR for node sockets, short whatever pytest's
    own temporary paths are: a socket's path holds at most 107 bytes, and
    `tmp_path` grows with the test's name and with pytest's run counter
    (`/tmp/pytest-of-root/pytest-104/...` on a machine that ran it often)."""
    d = Path(tempfile.mkdtemp(prefix="rf-", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(d))
    yield d
    shutil.rmtree(d, ignore_errors=True)
