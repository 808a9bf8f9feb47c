"""The node engine from Python: a Loader with ``node="auto"`` attaches to this
user's engine for the dataset (started on first use) and gets exactly the
batches an engine of its own gives; a consumer whose dataset keys differ is
refused with NodeError naming the key; ringfeed.torch's DataLoader workers
attach to one engine by default and read the same items as with an engine
each; a process of another user (uid 65534, as root only) cannot attach:
refused at connect by the socket's modes, and by the engine when the modes
let it through."""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import ringfeed

from conftest import cli, gen, require, skip_for_environment, synth_content, tar_keys


@pytest.fixture()
def runtime(runtime_dir, monkeypatch):
    """A private directory for node sockets, and a short linger."""
    monkeypatch.setenv("RINGFEED_NODE_LINGER_MS", "300")
    return runtime_dir / "ringfeed"


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return gen(tmp_path_factory.mktemp("node"), shards=3, shard_size="512KiB", sample_size="6KB")


JOB = dict(batch_size=5, seed=9, shuffle=True, shuffle_buffer=20, world_size=2, workers=2)


def batches(loader):
    out = []
    for b in loader:
        out.append([(k, bytes(b.field("jpg")[i])) for i, k in enumerate(b.keys)])
    return out


def test_a_node_consumer_gets_what_its_own_engine_gives(shards, runtime):
    for rank in (0, 1):
        with ringfeed.Loader(shards, rank=rank, **JOB) as own:
            want = batches(own)
        with ringfeed.Loader(shards, rank=rank, node="auto", **JOB) as attached:
            assert attached.stats()["node"]["pid"] != os.getpid()
            got = batches(attached)
        assert got == want and len(want) > 3
    assert len(glob.glob(str(runtime / "node-*.sock"))) <= 1


def test_a_consumer_with_other_dataset_keys_is_refused_by_name(shards, runtime):
    with ringfeed.Loader(shards, rank=0, node="auto", **JOB) as first:
        socket = first.stats()["node"]["socket"]
        other = dict(JOB, seed=10)
        with pytest.raises(ringfeed.NodeError, match="`seed`"):
            ringfeed.Loader(shards, rank=1, node=socket, **other)


def item_samples(item):
    """[(key, jpg bytes, cls bytes)] of a default item, in order, read
    through its views (through the node engine's mapping when it came from
    one)."""
    keys = [k.decode() for k in item["__key__"].tolist()]
    return list(zip(keys, item["jpg"].tolist(), item["cls"].tolist()))


def test_dataloader_workers_that_each_read_share_one_engine_by_default(shards, runtime):
    torch = require("torch", "this torch test")
    from ringfeed.torch import RingfeedDataset

    def samples(**kw):
        ds = RingfeedDataset(shards, batch_size=8, seed=2, shuffle=True, shuffle_buffer=16, split_workers=True, **kw)
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        return [s for item in dl for s in item_samples(item)]

    alone = samples(node="off")
    assert not glob.glob(str(runtime / "node-*.log")), "node=\"off\" started a node engine"
    shared = samples()
    logs = glob.glob(str(runtime / "node-*.log"))
    assert logs, "no node engine was started"
    assert "listening on" in open(logs[0]).read()
    # Every sample once, each field the generator's bytes, in the same
    # order through one engine as through an engine each.
    with ringfeed.Loader(shards, batch_size=64) as loader:
        every_key = sorted(k for b in loader for k in b.keys)
    assert sorted(k for k, _, _ in shared) == every_key
    for key, jpg, cls in shared:
        assert jpg == synth_content(0, key, "jpg", len(jpg)) and len(jpg) > 0, key
        assert cls == synth_content(0, key, "cls", len(cls)), key
    assert shared == alone


def item_bytes(item):
    """Every sample's bytes of an item of views, read through the mapping."""
    return [item[name].tolist() for name in ("jpg", "cls")]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_batches_held_when_their_workers_shut_down_are_not_read_into(shards, runtime, monkeypatch, context):
    """The main process holds the last items of an epoch when the DataLoader
    shuts its workers down; the next epoch's workers read through the same
    engine's small arena. The held items keep their bytes (the workers had
    the engine keep them), and once released the engine has nothing kept."""
    torch = require("torch", "this torch test")
    from ringfeed.torch import RingfeedDataset

    monkeypatch.setenv("RINGFEED_NODE_LINGER_MS", "60000")  # one engine for both epochs
    ds = RingfeedDataset(shards, batch_size=8, memory_budget="1MiB", chunk_size="64KiB", remainder="drop",
                         split_workers=True)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    held = []
    for item in dl:
        held = [*held[-3:], item]  # the last few only: the engine's budget is small
    before = [item_bytes(item) for item in held]
    assert len(held) == 4
    for epoch in (1, 2):
        ds.set_epoch(epoch)
        n = sum(1 for _ in dl)
        assert n > 4 * len(held)
    assert [item_bytes(item) for item in held] == before, "a held batch was read into"
    logs = glob.glob(str(runtime / "node-*.log"))
    assert len(logs) == 1 and open(logs[0]).read().count("listening on") == 1, "the engine restarted"
    socket = glob.glob(str(runtime / "node-*.sock"))[0]
    del held, item
    import gc

    gc.collect()
    with ringfeed.Loader(shards, batch_size=8, node=socket, loader_workers=2,
                         workers=2, memory_budget="1MiB", chunk_size="64KiB", remainder="drop") as watcher:
        deadline = time.monotonic() + 60
        while watcher.stats()["node"]["batches_kept"] != 0:
            assert time.monotonic() < deadline, watcher.stats()["node"]
            time.sleep(0.05)


OTHER_UID = OTHER_GID = 65534  # nobody/nogroup on Debian and Ubuntu

# Run as the other user: attach to the engine at argv[1] for the shards
# argv[2:], print what happened as JSON.
ATTACH = """
import json, sys
import ringfeed
try:
    ringfeed.Loader(sys.argv[2:], node=sys.argv[1]).close()
    print(json.dumps({"type": None, "message": ""}))
except ringfeed.Error as e:
    print(json.dumps({"type": type(e).__name__, "message": str(e)}))
"""


# Run as the other user: a raw client of the protocol (not the library,
# which would not speak to another user's socket): connect to argv[1], send
# a hello, print the engine's answer as JSON.
RAW_HELLO = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
s.send(json.dumps({"type": "hello", "protocol": 2, "library": sys.argv[2],
                   "role": {"kind": "holder"}}).encode())
print(s.recv(1 << 20).decode())
"""


def world_readable(root):
    """Makes everything under `root` readable (and its folders searchable) by all."""
    for d, _, files in os.walk(root):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644 | (os.stat(os.path.join(d, f)).st_mode & 0o111))


def as_other_user(base, code, args=()):
    """Runs Python `code` as OTHER_UID (no supplementary groups) in `base`."""
    python, extra = other_user_python(base)
    return subprocess.run(
        [python, "-c", code, *args], user=OTHER_UID, group=OTHER_GID, extra_groups=[],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(base), **extra}, cwd=base,
        capture_output=True, text=True, timeout=120,
    )


def other_user_python(base):
    """An interpreter and environment in which OTHER_UID imports this ringfeed.

    This environment's own when the other user can read it; otherwise (a venv
    under a private home, as pyenv's) the same Python version from the
    system, with copies of the ringfeed and numpy packages under `base`,
    made world-readable, on PYTHONPATH."""

    def imports(python, extra):
        try:
            out = subprocess.run(
                [python, "-c", "import ringfeed; print(ringfeed.__file__)"], user=OTHER_UID,
                group=OTHER_GID, extra_groups=[], env={"PATH": "/usr/bin:/bin", **extra}, cwd=base,
                capture_output=True, text=True, timeout=60,
            )
        except PermissionError:
            return False
        return out.returncode == 0

    if imports(sys.executable, {}):
        return sys.executable, {}
    import numpy

    site = base / "site"
    if not site.exists():
        shutil.copytree(os.path.dirname(ringfeed.__file__), site / "ringfeed",
                        ignore=shutil.ignore_patterns("__pycache__"))
        if not (site / "ringfeed" / "libringfeed.so").is_file():
            shutil.copy(ringfeed.LIBRARY_PATH, site / "ringfeed" / "libringfeed.so")
        numpy_dir = os.path.dirname(numpy.__file__)
        shutil.copytree(numpy_dir, site / "numpy", ignore=shutil.ignore_patterns("__pycache__"))
        if os.path.isdir(numpy_dir + ".libs"):
            shutil.copytree(numpy_dir + ".libs", site / "numpy.libs")
        world_readable(site)
    version = "python{}.{}".format(*sys.version_info[:2])
    for d in ("/usr/local/bin", "/usr/bin", "/bin"):
        python = os.path.join(d, version)
        if os.path.isfile(python) and imports(python, {"PYTHONPATH": str(site)}):
            return python, {"PYTHONPATH": str(site)}
    pytest.fail(f"uid {OTHER_UID} can run neither {sys.executable} nor a system {version} that "
                f"imports ringfeed from {site}: nothing to run the other user's consumer with")


def attach_as_other_user(base, socket, shards):
    """What OTHER_UID's attach to `socket` gave: {"type": the ringfeed error's
    class name (None: attached), "message": its text}."""
    out = as_other_user(base, ATTACH, [str(socket), *shards])
    assert out.returncode == 0, f"as uid {OTHER_UID}: {out.stdout}{out.stderr}"
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def other_user_attaches():
    """An engine (`ringfeed node`) on a socket of this user, and what a
    process of OTHER_UID got trying to attach to it: with the socket as made
    (mode 0600 in a 0700 directory), and with both opened to everyone so
    that only the engine's check of the peer's credentials stands. Returns
    (the first, the second, consumers this user attached afterwards saw
    attached in all)."""
    if os.geteuid() != 0:
        skip_for_environment(f"runs a process as uid {OTHER_UID}, which needs root (CI runs as root)")
    # Not under pytest's tmp_path: its parents are private to this user, and
    # the other user must reach the socket's directory once it is opened.
    base = Path(tempfile.mkdtemp(prefix="ringfeed-other-user-"))
    engine = None
    try:
        os.chmod(base, 0o755)
        shards = gen(base / "data", shards=2, shard_size="256KiB", sample_size="6KB")
        world_readable(base / "data")
        run_dir = base / "run"
        run_dir.mkdir(mode=0o700)
        socket = run_dir / "node.sock"
        # A linger (longer than the gaps between this fixture's consumers),
        # so an engine a failed run leaves behind exits on its own.
        engine = subprocess.Popen(
            [str(cli()), "node", *shards, "--socket", str(socket), "--linger-ms", "60000"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while not socket.exists():
            assert engine.poll() is None, engine.stderr.read().decode()
            assert time.monotonic() < deadline, "the engine never listened"
            time.sleep(0.02)
        assert oct(socket.stat().st_mode & 0o777) == oct(0o600)
        # This user attaches.
        with ringfeed.Loader(shards, node=str(socket)) as mine:
            assert mine.stats()["node"]["pid"] == engine.pid
            assert sum(len(b) for b in mine) == len(tar_keys(shards))
        closed = attach_as_other_user(base, socket, shards)
        os.chmod(run_dir, 0o755)
        os.chmod(socket, 0o666)
        # The library of the other user will not speak to this user's
        # socket; a raw client does, and the engine refuses it.
        lib_opened = attach_as_other_user(base, socket, shards)
        out = as_other_user(base, RAW_HELLO, [str(socket), ringfeed.__version__])
        assert out.returncode == 0, f"as uid {OTHER_UID}: {out.stdout}{out.stderr}"
        opened = json.loads(out.stdout.strip().splitlines()[-1])
        assert engine.poll() is None, "the engine exited after refusing a consumer"
        # This user's consumers do not speak to a socket others may open.
        with pytest.raises(ringfeed.NodeError, match="may be opened by other users"):
            ringfeed.Loader(shards, node=str(socket))
        os.chmod(run_dir, 0o700)
        os.chmod(socket, 0o600)
        with ringfeed.Loader(shards, node=str(socket)) as again:
            attached = again.stats()["node"]["consumers_attached"]
        yield closed, (lib_opened, opened), attached
    finally:
        if engine is not None:
            engine.kill()
            engine.wait()
        shutil.rmtree(base, ignore_errors=True)


def test_a_process_of_another_user_cannot_attach(other_user_attaches):
    closed, (lib_opened, opened), attached = other_user_attaches
    # As made: the other user cannot even reach the socket.
    assert closed["type"] == "NodeError", closed
    assert "Permission denied" in closed["message"], closed
    # Let through to the socket: the other user's library will not speak to
    # a socket of another user, and the engine refuses a raw client.
    assert lib_opened["type"] == "NodeError", lib_opened
    assert f"belongs to user {os.geteuid()}" in lib_opened["message"], lib_opened
    assert opened["type"] == "refused", opened
    # This user's two consumers, and no other.
    assert attached == 2


def test_the_engine_tells_another_user_why_it_is_refused(other_user_attaches):
    _, (_, opened), _ = other_user_attaches
    want = f"of user {OTHER_UID} may not attach to the engine of user {os.geteuid()}"
    assert want in opened["message"], opened
