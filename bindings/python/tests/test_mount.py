"""`ringfeed mount`: the FUSE file system over S3, HTTP listings and local
directories, used the way path-based training code uses files.

Each test mounts with the real CLI (`ringfeed mount`, through
fusermount3) over the tests' S3-compatible server (examples/s3_server.rs,
SigV4), Python's own `http.server` or a local directory, and reads or
writes through the kernel with the calls such code makes: `os.scandir`,
`os.stat`, `open`/`read`, `os.pread`, `os.lseek`, `mmap`, `numpy.memmap`,
`torch.load`, `safetensors`, WebDataset — every byte compared with what
the store holds. Writes: a new file is an object only once closed whole;
a writer killed mid-file leaves no object and no open upload (the control:
the same writer exiting without a signal leaves its object); an upload's
error reaches the writer's close; what objects cannot do is refused with
the errno Mountpoint for Amazon S3 answers and a log line naming it.
Every mount is unmounted by SIGTERM at the end of its test, and the test
checks that it went.
"""

import errno
import fcntl
import hashlib
import http.server
import io
import mmap
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from conftest import all_samples, cli, require, run_s3_server, skip_for_environment

if not Path("/dev/fuse").exists():
    skip_for_environment("no /dev/fuse on this machine: FUSE mounts cannot be made")
if subprocess.run(["sh", "-c", "command -v fusermount3"], capture_output=True).returncode != 0:
    # Installable (scripts/test.sh installs it): a failure where all is installed.
    pytest.skip("fusermount3 is not installed (Debian: fuse3)", allow_module_level=True)

MiB = 1 << 20


def mounted_paths():
    """The mount points of this machine now."""
    with open("/proc/self/mountinfo") as f:
        return {line.split(" ")[4].replace("\\040", " ") for line in f}


@dataclass
class Mount:
    path: Path
    log: Path
    proc: subprocess.Popen

    def log_text(self):
        return self.log.read_text(errors="replace")

    def metrics(self):
        """The mount's counters from its /metrics endpoint (mounted with
        --metrics-port 0)."""
        m = re.search(r"metrics at (http://\S+)", self.log_text())
        assert m, self.log_text()
        text = urllib.request.urlopen(m.group(1), timeout=10).read().decode()
        return {k: float(v) for k, v in re.findall(r"^(ringfeed_mount_\w+) (\S+)$", text, re.M)}


def s3_env(server):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=server.access_key, AWS_SECRET_ACCESS_KEY=server.secret_key,
               AWS_REGION="us-east-1", AWS_CONFIG_FILE="/nonexistent",
               AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
    return env


@contextmanager
def mount(source, tmp_path, *args, env=None, name="mnt"):
    """`ringfeed mount SOURCE DIR ARGS...` until the block ends; then SIGTERM,
    and the mount must be gone and the process exited 0."""
    mnt, log = tmp_path / name, tmp_path / f"{name}.log"
    mnt.mkdir()
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(cli()), "mount", str(source), str(mnt), *map(str, args)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
    m = Mount(mnt, log, proc)
    try:
        deadline = time.monotonic() + 60
        # Mounted and said so (the line comes once the mount is set up,
        # its kernel read-ahead included).
        while str(mnt) not in mounted_paths() or " mounted on " not in m.log_text():
            if proc.poll() is not None:
                pytest.fail(f"ringfeed mount exited {proc.returncode}: {m.log_text()}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"ringfeed mount did not mount in 60 s: {m.log_text()}", pytrace=False)
            time.sleep(0.02)
        yield m
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)])
            proc.kill()
            proc.wait()
            raise
        still = str(mnt) in mounted_paths()
        if still:
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)])
        assert not still, f"still mounted after SIGTERM: {m.log_text()}"
        assert code == 0, f"ringfeed mount exited {code}: {m.log_text()}"


def random_bytes(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def put(server, key, data):
    """An object written into the server's store directly (s3s-fs keeps
    objects as files)."""
    path = server.root / server.bucket / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def stored(server, key):
    path = server.root / server.bucket / key
    return path.read_bytes() if path.exists() else None


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The S3 server with a dataset: a 20 MiB file, a directory of small
    files, a torch checkpoint, a safetensors file and WebDataset shards."""
    with run_s3_server(tmp_path_factory.mktemp("s3mount")) as server:
        put(server, "data/big.bin", random_bytes(20 * MiB + 12345, 1))
        for i in range(40):
            put(server, f"data/small/f{i:03d}.bin", random_bytes(1000 + 997 * i, 100 + i))
        put(server, "data/small/nested/deep.txt", b"deep\n")
        for s in range(3):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
                for k in range(20):
                    for ext, body in (("txt", f"sample {s}/{k}".encode()),
                                      ("bin", random_bytes(3000 + k, s * 100 + k))):
                        info = tarfile.TarInfo(f"s{s:02d}_{k:04d}.{ext}")
                        info.size = len(body)
                        t.addfile(info, io.BytesIO(body))
            put(server, f"data/shards/shard-{s:03d}.tar", buf.getvalue())
        yield server


def test_listing_stat_and_reads_are_the_stored_bytes(store, tmp_path):
    with mount(f"s3://{store.bucket}/data/", tmp_path, "--endpoint-url", store.endpoint,
               env=s3_env(store)) as m:
        names = {e.name: e.is_dir() for e in os.scandir(m.path)}
        assert names == {"big.bin": False, "small": True, "shards": True}
        small = sorted(e.name for e in os.scandir(m.path / "small"))
        assert small == sorted([f"f{i:03d}.bin" for i in range(40)] + ["nested"])
        assert (m.path / "small/nested/deep.txt").read_bytes() == b"deep\n"
        want = stored(store, "data/big.bin")
        st = os.stat(m.path / "big.bin")
        assert st.st_size == len(want) and (st.st_mode & 0o170000) == 0o100000
        # Whole, then in pieces of a stream, then random preads.
        assert (m.path / "big.bin").read_bytes() == want
        with open(m.path / "big.bin", "rb", buffering=0) as f:
            got = b"".join(iter(lambda: f.read(MiB - 7), b""))
        assert got == want
        rng = np.random.default_rng(7)
        fd = os.open(m.path / "big.bin", os.O_RDONLY)
        try:
            for _ in range(60):
                off = int(rng.integers(0, len(want) + 100))
                n = int(rng.integers(1, 3 * MiB))
                assert os.pread(fd, n, off) == want[off:off + n], (off, n)
            assert os.lseek(fd, 0, os.SEEK_END) == len(want)
            assert os.read(fd, 10) == b""
            assert os.lseek(fd, 1000, os.SEEK_SET) == 1000
            assert os.read(fd, 24) == want[1000:1024]
            os.fsync(fd)  # a read-only file's fsync is a no-op, not an error
        finally:
            os.close(fd)
        for i in (0, 17, 39):
            assert (m.path / f"small/f{i:03d}.bin").read_bytes() == stored(store, f"data/small/f{i:03d}.bin")
        # Read-only mappings.
        with open(m.path / "big.bin", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
            assert mm[:4096] == want[:4096] and mm[-5000:] == want[-5000:]
            assert hashlib.sha256(mm).digest() == hashlib.sha256(want).digest()
        arr = np.memmap(m.path / "big.bin", dtype=np.uint8, mode="r")
        assert arr.shape == (len(want),) and np.array_equal(arr[::4099], np.frombuffer(want, np.uint8)[::4099])
        del arr
        vfs = os.statvfs(m.path)
        assert vfs.f_bavail > 0 and vfs.f_bsize > 0
        with pytest.raises(FileNotFoundError):
            os.stat(m.path / "no-such-file")


def test_the_kernel_asks_in_large_reads_once_the_mount_sets_its_read_ahead(store, tmp_path):
    """The mount sets the kernel's read-ahead on itself (16 MiB by default):
    a stream is then asked in requests of up to 1 MiB, not 128 KiB. The
    control, --kernel-read-ahead 0, leaves the kernel's 128 KiB."""
    want = stored(store, "data/big.bin")
    seen = {}
    for label, args in (("default", ()), ("control", ("--kernel-read-ahead", "0"))):
        with mount(f"s3://{store.bucket}/data/", tmp_path, "--endpoint-url", store.endpoint,
                   "--metrics-port", "0", *args, env=s3_env(store), name=label) as m:
            dev = os.stat(m.path).st_dev
            bdi = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
            with open(m.path / "big.bin", "rb", buffering=0) as f:
                got = b"".join(iter(lambda: f.read(8 * MiB), b""))
            assert got == want
            c = m.metrics()
            assert c["ringfeed_mount_bytes_read_total"] == len(want), c
            seen[label] = (int(bdi.read_text()), c["ringfeed_mount_bytes_read_total"] / c["ringfeed_mount_reads_total"])
            log = m.log_text()
    if os.geteuid() != 0:
        # Only root may write the read-ahead: the mount says it could not,
        # and the kernel keeps asking 128 KiB at a time.
        assert "the kernel's read-ahead stays at its default" in log, log
        assert seen["default"][0] == 128 and seen["default"][1] <= 128 * 1024, seen
        return
    assert seen["default"][0] == 16 * 1024, seen
    assert seen["default"][1] > 512 * 1024, seen
    assert seen["control"][0] == 128, seen
    assert seen["control"][1] <= 128 * 1024, seen


def test_torch_safetensors_and_webdataset_read_through_the_mount(store, tmp_path):
    torch = require("torch", "torch.load through the mount")
    st = require("safetensors.torch", "safetensors through the mount")
    wds = require("webdataset", "WebDataset through the mount")
    g = torch.Generator().manual_seed(3)
    state = {"layer.weight": torch.randn(512, 1024, generator=g),
             "layer.bias": torch.randn(1024, generator=g),
             "step": torch.tensor(12)}
    buf = io.BytesIO()
    torch.save(state, buf)
    put(store, "models/ckpt.pt", buf.getvalue())
    tensors = {"embed": torch.randn(1000, 256, generator=g), "head": torch.arange(77, dtype=torch.int64)}
    put(store, "models/model.safetensors", st.save(tensors))
    with mount(f"s3://{store.bucket}/", tmp_path, "--endpoint-url", store.endpoint,
               env=s3_env(store)) as m:
        back = torch.load(m.path / "models/ckpt.pt", weights_only=True)
        assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
        loaded = st.load_file(str(m.path / "models/model.safetensors"))
        assert all(torch.equal(loaded[k], tensors[k]) for k in tensors)
        # safe_open reads the header, then only the tensor asked for.
        from safetensors import safe_open
        with safe_open(str(m.path / "models/model.safetensors"), framework="pt") as f:
            assert torch.equal(f.get_tensor("head"), tensors["head"])
        shards = sorted(str(p) for p in (m.path / "data/shards").iterdir())
        assert len(shards) == 3
        seen = []
        for sample in wds.WebDataset(shards, shardshuffle=False):
            s, k = sample["__key__"][1:3], sample["__key__"][4:]
            assert sample["txt"] == f"sample {int(s)}/{int(k)}".encode()
            assert sample["bin"] == random_bytes(3000 + int(k), int(s) * 100 + int(k))
            seen.append(sample["__key__"])
        assert len(seen) == 60 and len(set(seen)) == 60
        # safetensors maps the file: the tensors hold the mapping open.
        del loaded


def test_one_tensor_of_a_large_safetensors_file_reads_a_few_blocks_not_the_file(store, tmp_path):
    torch = require("torch", "safetensors through the mount")
    st = require("safetensors.torch", "safetensors through the mount")
    from safetensors import safe_open
    # 48 tensors of 8 MiB (every int32 in the file a different value).
    n = 8 * MiB // 4
    tensors = {f"layer{i}": torch.arange(i * n, (i + 1) * n, dtype=torch.int32) for i in range(48)}
    tensors["tail"] = torch.arange(1000, dtype=torch.int32)
    data = st.save(tensors)
    put(store, "big/model.safetensors", data)
    with mount(f"s3://{store.bucket}/big/", tmp_path, "--endpoint-url", store.endpoint,
               "--part-size", "8MiB", "--metrics-port", "0", env=s3_env(store)) as m:
        with safe_open(str(m.path / "model.safetensors"), framework="pt") as f:
            assert torch.equal(f.get_tensor("tail"), tensors["tail"])
            assert torch.equal(f.get_tensor("layer7"), tensors["layer7"])
        fetched = m.metrics()["ringfeed_mount_bytes_fetched_total"]
        # The header's block and the one read ahead of it; for each tensor
        # the kernel's read-around of its page fault (16 MiB by default,
        # asked as one run) and the window the run earns (twice the run):
        # ten or so of the file's 49 blocks, not the file.
        assert fetched <= len(data) / 3, (fetched, len(data))


def test_new_files_are_objects_once_closed_whole(store, tmp_path):
    data = random_bytes(13 * MiB + 5, 11)
    with mount(f"s3://{store.bucket}/out/", tmp_path, "--endpoint-url", store.endpoint,
               "--part-size", "5MiB", env=s3_env(store)) as m:
        with open(m.path / "ckpt.bin", "wb") as f:
            for i in range(0, len(data), 3 * MiB):
                f.write(data[i:i + 3 * MiB])
                f.flush()
            # While it is written, the store has nothing of it.
            assert stored(store, "out/ckpt.bin") is None
        assert stored(store, "out/ckpt.bin") == data
        assert os.stat(m.path / "ckpt.bin").st_size == len(data)
        assert (m.path / "ckpt.bin").read_bytes() == data
        # A directory made here, a file in it: the object is the path.
        os.makedirs(m.path / "run1/epoch0", exist_ok=True)
        (m.path / "run1/epoch0/state.txt").write_text("done")
        assert stored(store, "out/run1/epoch0/state.txt") == b"done"
        # An empty file, and a shell's redirection (the descriptor
        # duplicated, the original closed before the first write): a close
        # before any write completes nothing; the release of the last
        # descriptor, which the kernel sends just after, completes it.
        (m.path / "empty").write_bytes(b"")
        assert wait_for(lambda: stored(store, "out/empty") == b"")
        subprocess.run(["sh", "-c", f"echo hello > '{m.path}/echoed.txt'"], check=True)
        assert stored(store, "out/echoed.txt") == b"hello\n"
        # fsync completes the object; a write after it is refused.
        fd = os.open(m.path / "synced.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, b"abc")
            os.fsync(fd)
            assert stored(store, "out/synced.bin") == b"abc"
            with pytest.raises(OSError) as e:
                os.write(fd, b"more")
            assert e.value.errno == errno.EBADF
        finally:
            os.close(fd)
    assert not list(store.root.glob(".upload-*.json"))


def wait_for(cond, seconds=30):
    """Waits for `cond` (what the kernel sends after a call returned, as a
    release), at most `seconds`."""
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def refused(call, err):
    with pytest.raises(OSError) as e:
        call()
    assert e.value.errno == err, (e.value, errno.errorcode.get(err))


def test_what_objects_cannot_do_is_refused_by_name(store, tmp_path):
    put(store, "ro/existing.bin", b"old bytes")
    with mount(f"s3://{store.bucket}/ro/", tmp_path, "--endpoint-url", store.endpoint,
               env=s3_env(store)) as m:
        p = m.path / "existing.bin"
        refused(lambda: open(p, "wb"), errno.EPERM)
        refused(lambda: open(p, "r+b"), errno.EPERM)
        refused(lambda: os.truncate(p, 1), errno.EPERM)
        refused(lambda: os.remove(p), errno.EPERM)
        refused(lambda: os.rename(p, m.path / "moved.bin"), errno.ENOSYS)
        refused(lambda: os.link(p, m.path / "hard"), errno.EPERM)
        refused(lambda: os.symlink("existing.bin", m.path / "soft"), errno.ENOSYS)
        refused(lambda: os.chmod(p, 0o600), errno.EPERM)
        with open(p, "rb") as f:
            refused(lambda: fcntl.flock(f, fcntl.LOCK_EX), errno.ENOLCK)
            refused(lambda: fcntl.lockf(f, fcntl.LOCK_SH), errno.ENOLCK)
        # Writes only at the end.
        fd = os.open(m.path / "seq.bin", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"0123")
            refused(lambda: os.pwrite(fd, b"x", 1), errno.EINVAL)
            refused(lambda: os.pwrite(fd, b"x", 100), errno.EINVAL)
            os.write(fd, b"4567")
        finally:
            os.close(fd)
        assert stored(store, "ro/seq.bin") == b"01234567"
        assert stored(store, "ro/existing.bin") == b"old bytes"
        log = m.log_text()
        for what in ["overwriting an object is refused (EPERM)", "truncate of `existing.bin` refused (EPERM)",
                     "unlink of", "rename of", "link of", "symlink of", "lock of `existing.bin` refused (ENOLCK)",
                     "objects are written in order only (EINVAL)", "chmod/chown of"]:
            assert what in log, (what, log)
    # The overwrite the option allows: a whole new object, opened O_TRUNC.
    with mount(f"s3://{store.bucket}/ro/", tmp_path, "--endpoint-url", store.endpoint,
               "--allow-overwrite", env=s3_env(store), name="mnt2") as m:
        (m.path / "existing.bin").write_bytes(b"new bytes, longer")
        assert stored(store, "ro/existing.bin") == b"new bytes, longer"
        refused(lambda: open(m.path / "existing.bin", "r+b"), errno.EPERM)


WRITER = r"""
import os, signal, sys
path, how = sys.argv[1], sys.argv[2]
f = open(path, "wb")
block = bytes(range(256)) * 4096
for _ in range(12):
    f.write(block)
f.flush()
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
os._exit(0)
"""


def test_a_writer_killed_mid_file_leaves_no_object_and_no_upload(store, tmp_path):
    block = bytes(range(256)) * 4096
    with mount(f"s3://{store.bucket}/kill/", tmp_path, "--endpoint-url", store.endpoint,
               "--part-size", "5MiB", env=s3_env(store)) as m:
        p = subprocess.run([sys.executable, "-c", WRITER, str(m.path / "half.bin"), "kill"])
        assert p.returncode == -signal.SIGKILL
        # The flush of the dying process is answered before it is reaped.
        assert stored(store, "kill/half.bin") is None
        assert not list(store.root.glob(".upload-*.json")), list(store.root.iterdir())
        assert not (m.path / "half.bin").exists()
        assert "was killed before closing it: upload aborted, no object written" in m.log_text()
        # The control: the same writer leaving without closing, but not by a
        # signal (exit), completes its object with what it wrote.
        p = subprocess.run([sys.executable, "-c", WRITER, str(m.path / "exited.bin"), "exit"])
        assert p.returncode == 0
        assert stored(store, "kill/exited.bin") == block * 12


def test_an_upload_error_reaches_the_writer(tmp_path):
    (tmp_path / "s3").mkdir()
    with run_s3_server(tmp_path / "s3", "--fail-part", "2:AccessDenied") as server:
        with mount(f"s3://{server.bucket}/", tmp_path, "--endpoint-url", server.endpoint,
                   "--part-size", "5MiB", env=s3_env(server)) as m:
            with pytest.raises(OSError) as e:
                with open(m.path / "doomed.bin", "wb") as f:
                    for _ in range(4):
                        f.write(b"\0" * (4 * MiB))
            assert e.value.errno == errno.EIO
            assert stored(server, "doomed.bin") is None
            assert not list(server.root.glob(".upload-*.json"))
            assert "AccessDenied" in m.log_text(), m.log_text()
            assert not (m.path / "doomed.bin").exists()


def test_one_read_from_the_store_for_many_readers_and_the_loaders_cache(store, tmp_path):
    ringfeed = require("ringfeed", "the loader sharing the mount's cache")
    data = random_bytes(24 * MiB, 5)
    put(store, "shared/blob.bin", data)
    cache = tmp_path / "cache"
    # No floor of free space: the cache's default keeps 10% of the file
    # system free, which a full disk of the machine running the tests
    # would turn into no fill at all (what is tested is one read of each
    # byte, not the floor, which tests/cache.rs tests).
    no_floor = ("--config", '{"cache_min_free": 0}')
    with mount(f"s3://{store.bucket}/shared/", tmp_path, "--endpoint-url", store.endpoint,
               "--cache-dir", cache, *no_floor, "--metrics-port", "0", env=s3_env(store)) as m:
        readers = [subprocess.Popen([sys.executable, "-c",
                                     "import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())",
                                     str(m.path / "blob.bin")], stdout=subprocess.PIPE) for _ in range(4)]
        digests = {r.communicate()[0].decode().strip() for r in readers}
        assert digests == {hashlib.sha256(data).hexdigest()}
        c = m.metrics()
        # Four processes, one read of each byte from the store.
        assert c["ringfeed_mount_bytes_fetched_total"] == len(data), c
        assert c["ringfeed_mount_bytes_read_total"] >= len(data)
        assert c["ringfeed_mount_cache_filled_total"] == 1, c
    listed = subprocess.run([str(cli()), "cache", "ls", str(cache)], capture_output=True, text=True, check=True)
    assert f"s3://{store.bucket}/shared/blob.bin\t{len(data)}" in listed.stdout, listed.stdout
    # A new mount reads it from the node's cache, not the store.
    with mount(f"s3://{store.bucket}/shared/", tmp_path, "--endpoint-url", store.endpoint,
               "--cache-dir", cache, *no_floor, "--metrics-port", "0", env=s3_env(store), name="again") as m:
        assert (m.path / "blob.bin").read_bytes() == data
        c = m.metrics()
        assert c["ringfeed_mount_cache_hit_bytes_total"] >= len(data) - 16 * MiB, c
    # The loaders' entries are the same: a shard the mount filled is a
    # loader's cache hit.
    shard = stored(store, "data/shards/shard-000.tar")
    put(store, "wds/shard-000.tar", shard)
    with mount(f"s3://{store.bucket}/wds/", tmp_path, "--endpoint-url", store.endpoint,
               "--cache-dir", cache, *no_floor, env=s3_env(store), name="wds") as m:
        assert (m.path / "shard-000.tar").read_bytes() == shard
    with ringfeed.Loader(f"s3://{store.bucket}/wds/shard-000.tar", batch_size=4, cache_dir=str(cache),
                         cache_min_free=0, **store.config()) as loader:
        n = len(all_samples(loader))
        stats = loader.stats()
    assert n == 20
    assert stats["cache_hits"] == 1 and stats["cache_misses"] == 0, stats


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_an_http_listing_is_a_read_only_tree(tmp_path):
    root = tmp_path / "site"
    (root / "sub dir").mkdir(parents=True)
    (root / "a.bin").write_bytes(random_bytes(3 * MiB + 1, 2))
    (root / "sub dir" / "b&c.txt").write_bytes(b"bee")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: _Quiet(*a, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        with mount(url, tmp_path, "--metrics-port", "0") as m:
            assert sorted(os.listdir(m.path)) == ["a.bin", "sub dir"]
            assert (m.path / "a.bin").read_bytes() == (root / "a.bin").read_bytes()
            assert (m.path / "sub dir" / "b&c.txt").read_bytes() == b"bee"
            refused(lambda: open(m.path / "new.txt", "wb"), errno.EROFS)
            assert "an http(s):// source takes no writes (EROFS)" in m.log_text()
    finally:
        server.shutdown()


def test_an_object_rewritten_while_read_is_an_error_never_a_mix(store, tmp_path):
    """Blocks are pinned to the version the listing showed: a block asked
    for after the object was rewritten (same size, other bytes) is EIO
    and a log line, never the new bytes inside the old file. Control: the
    same reads with the object left alone give the stored bytes."""
    old = random_bytes(24 * MiB, 31)
    new = random_bytes(24 * MiB, 32)
    for label, rewrite in (("control", False), ("rewritten", True)):
        key = f"pin/{label}.bin"
        put(store, key, old)
        with mount(f"s3://{store.bucket}/pin/", tmp_path, "--endpoint-url", store.endpoint,
                   "--part-size", "1MiB", "--metrics-port", "0", env=s3_env(store), name=label) as m:
            fd = os.open(m.path / f"{label}.bin", os.O_RDONLY)
            try:
                # A read at the start (its block and a window after it),
                # then one far from it: a block not fetched yet.
                assert os.pread(fd, 4096, 0) == old[:4096]
                if rewrite:
                    put(store, key, new)
                far = 20 * MiB + 777
                if rewrite:
                    refused(lambda: os.pread(fd, 4096, far), errno.EIO)
                    assert f"{label}.bin" in m.log_text(), m.log_text()
                else:
                    assert os.pread(fd, 4096, far) == old[far:far + 4096]
            finally:
                os.close(fd)
    # The new version is read whole by a new mount.
    with mount(f"s3://{store.bucket}/pin/", tmp_path, "--endpoint-url", store.endpoint,
               env=s3_env(store), name="after") as m:
        assert (m.path / "rewritten.bin").read_bytes() == new


class _BadSite(http.server.BaseHTTPRequestHandler):
    """A listing server gone wrong: `/` lists a file and two directories;
    `/broken/` answers 500; `/noise/` answers bytes that are no page at
    all."""
    body = random_bytes(70000, 41)

    def log_message(self, *args):
        pass

    def _send(self, code, body=b"", head=False):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def do_GET(self, head=False):
        if self.path == "/":
            page = b'<html><a href="ok.bin">ok</a> <a href="broken/">b</a> <a href="noise/">n</a></html>'
            return self._send(200, page, head)
        if self.path == "/ok.bin":
            return self._send(200, self.body, head)
        if self.path == "/noise/":
            return self._send(200, random_bytes(5000, 42) + b'<a href="', head)
        return self._send(500, b"internal error", head)

    def do_HEAD(self):
        self.do_GET(head=True)


def test_an_http_source_answering_errors_or_garbage_gives_named_errors(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BadSite)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        with mount(url, tmp_path, "--config", '{"max_attempts": 2}') as m:
            assert sorted(os.listdir(m.path)) == ["broken", "noise", "ok.bin"]
            # A listing page that answers 500: the directory is EIO and the
            # log names the page and the status; the mount goes on.
            refused(lambda: os.listdir(m.path / "broken"), errno.EIO)
            assert "HTTP 500" in m.log_text() and "/broken/" in m.log_text(), m.log_text()
            # Bytes that are no page: no entries, nothing invented.
            assert os.listdir(m.path / "noise") == []
            assert (m.path / "ok.bin").read_bytes() == _BadSite.body
    finally:
        server.shutdown()


def test_local_directories_and_the_listing_time_to_live(tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "x.bin").write_bytes(random_bytes(MiB, 9))
    with mount(src, tmp_path, "--metadata-ttl", "3600", name="cached") as m:
        assert os.listdir(m.path / "d") == ["x.bin"]
        assert (m.path / "d" / "x.bin").read_bytes() == (src / "d" / "x.bin").read_bytes()
        (src / "d" / "later.bin").write_bytes(b"later")
        # Within the time-to-live the listing is the one taken.
        assert os.listdir(m.path / "d") == ["x.bin"]
        (m.path / "d" / "new.bin").write_bytes(b"written")
        assert (src / "d" / "new.bin").read_bytes() == b"written"
    with mount(src, tmp_path, "--metadata-ttl", "0", name="fresh") as m:
        assert sorted(os.listdir(m.path / "d")) == ["later.bin", "new.bin", "x.bin"]
        (src / "d" / "latest.bin").write_bytes(b"x")
        assert "latest.bin" in os.listdir(m.path / "d")


def test_bad_arguments_and_sources_fail_with_named_errors(tmp_path, store):
    def fails(args, want, env=None):
        p = subprocess.run([str(cli()), "mount", *map(str, args)], capture_output=True, text=True,
                           env=env, timeout=120)
        assert p.returncode != 0 and want in p.stderr, (args, p.stderr)

    (tmp_path / "m").mkdir()
    (tmp_path / "file").write_text("x")
    fails([tmp_path / "nope", tmp_path / "m"], "nope")
    fails([tmp_path, tmp_path / "missing-mountpoint"], "missing-mountpoint")
    fails([tmp_path, tmp_path / "file"], "is not a directory")
    fails(["s3://", tmp_path / "m"], "no bucket")
    fails(["s3://Bad Bucket!/", tmp_path / "m"], "not a valid bucket name")
    fails([tmp_path, tmp_path / "m", "--metadata-ttl=-1"], "--metadata-ttl")
    fails([tmp_path, tmp_path / "m", "--read-ahead", "lots"], "lots")
    fails([tmp_path, tmp_path / "m", "--kernel-read-ahead", "16 furlongs"], "16 furlongs")
    # A bucket the server does not have: the listing's error is logged and
    # the directory cannot be read; the mount stays up.
    with mount(f"s3://no-such-bucket/", tmp_path, "--endpoint-url", store.endpoint,
               env=s3_env(store), name="nobucket") as m:
        refused(lambda: os.listdir(m.path), errno.EIO)
        assert "NoSuchBucket" in m.log_text(), m.log_text()
    with mount(tmp_path / "m", tmp_path, name="twice") as m:
        fails([tmp_path, m.path], "already a mount point")


def test_daemon_mode_returns_once_mounted_and_sigterm_unmounts(tmp_path):
    src, mnt, log = tmp_path / "src", tmp_path / "mnt", tmp_path / "daemon.log"
    src.mkdir()
    mnt.mkdir()
    (src / "f").write_bytes(b"daemon")
    p = subprocess.run([str(cli()), "mount", str(src), str(mnt), "--daemon", "--log-file", str(log)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    try:
        assert str(mnt) in mounted_paths()
        assert (mnt / "f").read_bytes() == b"daemon"
        pid = int(re.search(r"\(pid (\d+),", p.stderr).group(1))
    finally:
        if str(mnt) in mounted_paths():
            m = re.search(r"\(pid (\d+),", p.stderr)
            os.kill(int(m.group(1)), signal.SIGTERM)
    deadline = time.monotonic() + 60
    while str(mnt) in mounted_paths() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert str(mnt) not in mounted_paths(), log.read_text()
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    assert "unmounting" in log.read_text()
