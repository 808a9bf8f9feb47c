"""`ringfeed mount` keeps serving while it writes, and shows one version of
a file or an error.

- A checkpoint written through the mount over a store that holds its
  parts (the tests' S3 server, `--hold-parts`): while the upload waits,
  `stat` of the file being written, `stat`, `open` and `read` of other
  files and a directory's listing are all answered. Each is counted as it
  is answered; the count is checked before the parts are let go, so a
  mount whose writes hold up its other requests fails by the count, not
  by a clock. The same requests with no upload are the control, and the
  ratio of the two runs' times is printed (never checked).
- Over a server with no ETags (Python's `http.server`, which sends
  `Last-Modified` only): a file rewritten with the same size and read
  again after its directory is listed again is the new file, whole; the
  control over the tests' S3 server (strong ETags) keeps its blocks and
  the kernel's pages for a file left alone.
- The mount's lows: --memory bounds the read-ahead of many streams; a
  large directory is listed in pages of one pass; paths gone and
  forgotten by the kernel are not remembered; a killed mount's temporary
  file is hidden and removed by the next mount; --uid/--gid and the modes
  hold for other users with --allow-other. Each with its control.
"""

import errno
import http.server
import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import run_s3_server
from test_mount import MiB, _Quiet, mount, put, random_bytes, s3_env, stored, wait_for

# The probe: runs in a process of its own so that a request the mount
# never answers holds up that process only; prints one line per answered
# request. Each round stats and reads one file not read before (the
# kernel's caches answer nothing twice: --metadata-ttl 0 and fresh files),
# stats the file being written (if any) and lists the directory.
PROBE = r"""
import os, sys
mnt, prefix, rounds, writing = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
for i in range(rounds):
    p = os.path.join(mnt, f"{prefix}{i:03d}.bin")
    print("stat", os.stat(p).st_size, flush=True)
    with open(p, "rb") as f:
        print("read", len(f.read()), flush=True)
    if writing:
        print("stat-writing", os.stat(os.path.join(mnt, writing)).st_size, flush=True)
    print("list", len(os.listdir(mnt)), flush=True)
"""

ROUNDS = 12
SMALL = 100_000


def probe(mnt, prefix, writing=""):
    """Runs the probe over `prefix` files; returns (lines answered, seconds).
    A probe stuck on a request is killed after 60 s: what it answered by
    then is what counts."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", PROBE, str(mnt), prefix, str(ROUNDS), writing],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return out.splitlines(), time.monotonic() - t0


def test_reads_and_stat_answer_while_an_upload_is_held(tmp_path):
    hold = tmp_path / "hold-parts"
    with run_s3_server(tmp_path, "--hold-parts", str(hold)) as server:
        for i in range(ROUNDS):
            put(server, f"ds/calm{i:03d}.bin", random_bytes(SMALL, i))
            put(server, f"ds/busy{i:03d}.bin", random_bytes(SMALL, 100 + i))
        data = random_bytes(40 * MiB, 7)
        src = tmp_path / "ckpt.src"
        src.write_bytes(data)
        with mount(f"s3://{server.bucket}/ds/", tmp_path, "--endpoint-url", server.endpoint,
                   "--part-size", "5MiB", "--parts-in-flight", "1", "--metadata-ttl", "0",
                   "--metrics-port", "0", env=s3_env(server)) as m:
            # Every request answered, each of the 4 kinds once a round.
            want = 4 * ROUNDS - ROUNDS  # no file being written: no stat of it
            calm, calm_s = probe(m.path, "calm")
            assert len(calm) == want, calm
            assert calm.count(f"read {SMALL}") == ROUNDS

            hold.touch()
            writer = subprocess.Popen(["dd", f"if={src}", f"of={m.path}/ckpt.bin", "bs=1M",
                                       "conv=fsync", "status=none"], stderr=subprocess.PIPE)
            try:
                # The first part is held by the store; the writer fills
                # what the upload queues behind it (part 2 queued, part 3
                # filling) and then waits in a write.
                assert wait_for(lambda: "holding UploadPart 1 of" in server.log.read_text(), 60), \
                    server.log.read_text()
                assert wait_for(lambda: m.metrics()["ringfeed_mount_bytes_written_total"] >= 10 * MiB, 60)
                last = -1
                while (now := m.metrics()["ringfeed_mount_bytes_written_total"]) != last:
                    last = now
                    time.sleep(0.3)
                assert last < len(data), "the writer must be waiting on the held part"

                busy, busy_s = probe(m.path, "busy", "ckpt.bin")
                # Still held: nothing of the upload went through meanwhile.
                assert writer.poll() is None
                assert "holding UploadPart 2 of" not in server.log.read_text()
                assert stored(server, "ds/ckpt.bin") is None
                assert len(busy) == 4 * ROUNDS, (len(busy), busy)
                assert busy.count(f"read {SMALL}") == ROUNDS
                sizes = [int(x.split()[1]) for x in busy if x.startswith("stat-writing")]
                assert sizes == [last] * ROUNDS
                print(f"probe: {len(calm)} requests in {calm_s:.3f} s without an upload, "
                      f"{len(busy)} in {busy_s:.3f} s with one held: "
                      f"time ratio {busy_s / calm_s:.2f}")
            finally:
                hold.unlink(missing_ok=True)
            assert writer.wait(timeout=120) == 0, writer.stderr.read()
            assert stored(server, "ds/ckpt.bin") == data
            assert os.stat(m.path / "ckpt.bin").st_size == len(data)


class _RangedNoETag(http.server.SimpleHTTPRequestHandler):
    """Python's `http.server` (listing pages, `Last-Modified`, no ETag)
    answering `Range: bytes=A-B` with 206, as servers without ETags
    (nginx with `etag off`, a plain file server) do."""

    def log_message(self, *args):
        pass

    def send_head(self):
        rng = self.headers.get("Range")
        path = self.translate_path(self.path)
        if not rng or not os.path.isfile(path):
            return super().send_head()
        a, b = rng.removeprefix("bytes=").split("-")
        f = open(path, "rb")
        st = os.fstat(f.fileno())
        a, b = int(a), min(int(b) if b else st.st_size - 1, st.st_size - 1)
        f.seek(a)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {a}-{b}/{st.st_size}")
        self.send_header("Content-Length", str(b - a + 1))
        self.send_header("Last-Modified", self.date_time_string(st.st_mtime))
        self.end_headers()
        return io.BytesIO(f.read(b - a + 1))


def serve(root, handler):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def rewrite(path, data, later):
    """`path` rewritten with `data` (the same size), its time `later`
    seconds on (0: the same Last-Modified as before)."""
    st = os.stat(path)
    path.write_bytes(data)
    os.utime(path, (st.st_atime + later, st.st_mtime + later))


def test_without_etags_a_file_listed_again_is_read_anew_and_never_mixed(tmp_path):
    """Over a server without ETags, a file rewritten with the same size is
    read whole anew once its directory is listed again: no block or page
    of the earlier open is kept (before, the first MiB, read before the
    rewrite, came back old in front of the new rest). Within one open, a
    block asked for after the rewrite is EIO (Last-Modified pinned), never
    the new bytes in the old file; its control reads the old bytes."""
    root = tmp_path / "site"
    root.mkdir()
    old, new = random_bytes(6 * MiB, 41), random_bytes(6 * MiB, 42)
    (root / "w.bin").write_bytes(old)
    (root / "pinned.bin").write_bytes(old)
    (root / "calm.bin").write_bytes(old)
    server = serve(root, _RangedNoETag)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        with mount(url, tmp_path, "--part-size", "1MiB", "--metadata-ttl", "0",
                   "--metrics-port", "0") as m:
            # Rewritten keeping its time (a copy that keeps times, or
            # within the same second): nothing but the listing tells.
            with open(m.path / "w.bin", "rb") as f:
                assert f.read(MiB) == old[:MiB]
            rewrite(root / "w.bin", new, 0)
            assert (m.path / "w.bin").read_bytes() == new
            # And with a new time.
            with open(m.path / "w.bin", "rb") as f:
                assert f.read(MiB) == new[:MiB]
            rewrite(root / "w.bin", old, 10)
            assert (m.path / "w.bin").read_bytes() == old
            # Listed again with nothing changed: still read anew (a server
            # without a strong validator cannot say it is the same), each
            # block once.
            gets = m.metrics()["ringfeed_mount_gets_total"]
            assert (m.path / "w.bin").read_bytes() == old
            assert m.metrics()["ringfeed_mount_gets_total"] - gets == 6

            # One open: the rewrite is seen by Last-Modified; the control
            # (no rewrite) reads the old bytes.
            for name, changed in (("calm.bin", False), ("pinned.bin", True)):
                fd = os.open(m.path / name, os.O_RDONLY)
                try:
                    assert os.pread(fd, 4096, 0) == old[:4096]
                    if changed:
                        rewrite(root / name, new, 10)
                        with pytest.raises(OSError) as e:
                            os.pread(fd, 4096, 5 * MiB)
                        assert e.value.errno == errno.EIO
                    else:
                        assert os.pread(fd, 4096, 5 * MiB) == old[5 * MiB:5 * MiB + 4096]
                finally:
                    os.close(fd)
            assert "Last-Modified" in m.log_text(), m.log_text()
    finally:
        server.shutdown()


def test_with_strong_etags_a_file_listed_again_keeps_its_blocks(tmp_path):
    """The control over the S3 server (strong ETags): a file listed again
    and unchanged is the same version, its blocks kept (no new GET); a
    rewrite of the same size is a new ETag, read whole anew."""
    with run_s3_server(tmp_path) as server:
        old, new = random_bytes(6 * MiB, 51), random_bytes(6 * MiB, 52)
        put(server, "v/w.bin", old)
        with mount(f"s3://{server.bucket}/v/", tmp_path, "--endpoint-url", server.endpoint,
                   "--part-size", "1MiB", "--metadata-ttl", "0", "--metrics-port", "0",
                   env=s3_env(server)) as m:
            assert (m.path / "w.bin").read_bytes() == old
            gets = m.metrics()["ringfeed_mount_gets_total"]
            assert (m.path / "w.bin").read_bytes() == old
            assert m.metrics()["ringfeed_mount_gets_total"] == gets
            put(server, "v/w.bin", new)
            assert (m.path / "w.bin").read_bytes() == new
            assert m.metrics()["ringfeed_mount_gets_total"] - gets == 6


def test_memory_bounds_the_read_ahead_of_many_streams(tmp_path):
    """Four files read as streams at once, each reader's read-ahead up to
    64 MiB: under --memory 16MiB the blocks held stay within the budget
    and the blocks the four reads cover (sampled all along); the control,
    the same reads under the default 1 GiB, holds far more than that
    bound, so the sampling sees read-ahead where it is allowed."""
    readers, size, part = 4, 24 * MiB, MiB
    bound = 16 * MiB + readers * 2 * part
    with run_s3_server(tmp_path) as server:
        files = [random_bytes(size, 60 + i) for i in range(readers)]
        for i, d in enumerate(files):
            put(server, f"m/f{i}.bin", d)
        peaks = {}
        for label, memory in (("bounded", "16MiB"), ("control", "1GiB")):
            with mount(f"s3://{server.bucket}/m/", tmp_path, "--endpoint-url", server.endpoint,
                       "--part-size", "1MiB", "--read-ahead", "64MiB", "--memory", memory,
                       "--kernel-read-ahead", "0", "--metrics-port", "0",
                       env=s3_env(server), name=label) as m:
                got, peak, done = [None] * readers, [0], threading.Event()

                def read(i):
                    with open(m.path / f"f{i}.bin", "rb") as f:
                        got[i] = f.read()

                def sample():
                    while not done.is_set():
                        peak[0] = max(peak[0], m.metrics()["ringfeed_mount_block_bytes"])

                threads = [threading.Thread(target=read, args=(i,)) for i in range(readers)]
                sampler = threading.Thread(target=sample)
                sampler.start()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                done.set()
                sampler.join()
                assert got == files
                peaks[label] = peak[0]
        print(f"blocks held at most: {peaks['bounded'] / MiB:.0f} MiB under --memory 16MiB, "
              f"{peaks['control'] / MiB:.0f} MiB under 1GiB (bound {bound / MiB:.0f} MiB)")
        assert peaks["bounded"] <= bound, peaks
        assert peaks["control"] > bound, peaks


def test_a_large_directory_is_listed_whole_in_pages_of_one_pass(tmp_path):
    """A directory of 20,000 entries read in the kernel's pages (a few
    hundred entries each): every name once, in name order, and a second
    pass (a new open) the same; each page is cut from its pass's entries,
    not made from the whole directory again."""
    src = tmp_path / "src"
    src.mkdir()
    names = sorted(f"n{i:05d}.bin" for i in range(20000))
    for n in names:
        (src / n).touch()
    with mount(src, tmp_path) as m:
        t0 = time.monotonic()
        assert sorted(os.listdir(m.path)) == names
        first = time.monotonic() - t0
        assert [e.name for e in os.scandir(m.path)] == names
        print(f"20,000 entries listed in {first:.2f} s")


def test_paths_gone_and_forgotten_are_not_remembered(tmp_path):
    """2,000 files looked up, then removed from the source: once the
    directory is listed again and the kernel forgets them (its caches
    dropped), the mount remembers the root and the directory only. The
    control, before the removal: the same drop leaves every listed path
    remembered (a listing still shows them)."""
    if os.geteuid() != 0:
        from conftest import skip_for_environment
        skip_for_environment("dropping the kernel's caches needs root")
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    names = [f"f{i:04d}" for i in range(2000)]
    for n in names:
        (src / "sub" / n).write_bytes(b"x")
    with mount(src, tmp_path, "--metadata-ttl", "1", "--metrics-port", "0") as m:
        inodes = lambda: m.metrics()["ringfeed_mount_inodes"]
        for n in names:
            os.stat(m.path / "sub" / n)
        assert inodes() == 2 + len(names)  # the root, sub, its files
        Path("/proc/sys/vm/drop_caches").write_text("2\n")
        assert inodes() == 2 + len(names), "still listed: kept"
        for n in names:
            (src / "sub" / n).unlink()
        # Listed again once the listing is a second old.
        assert wait_for(lambda: os.listdir(m.path / "sub") == [])
        Path("/proc/sys/vm/drop_caches").write_text("2\n")
        assert wait_for(lambda: inodes() == 2), inodes()


def test_a_killed_mounts_temporary_file_is_hidden_and_removed_by_the_next(tmp_path):
    """A local directory's mount killed (SIGKILL) while a file is written
    through it leaves the writer's temporary file beside the files (the
    control: it is there after the kill); the next mount shows none of
    it and removes it."""
    from test_mount import cli, mounted_paths
    src = tmp_path / "src"
    src.mkdir()
    (src / "kept.bin").write_bytes(b"kept")
    mnt, log = tmp_path / "killed", tmp_path / "killed.log"
    mnt.mkdir()
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(cli()), "mount", str(src), str(mnt)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        assert wait_for(lambda: str(mnt) in mounted_paths() and " mounted on " in log.read_text(), 60)
        fd = os.open(mnt / "ckpt.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"half" * 1000)
        proc.kill()
        proc.wait()
        try:
            os.close(fd)
        except OSError:
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)])
    left = [n for n in os.listdir(src) if n.endswith(".tmp")]
    assert len(left) == 1 and left[0].startswith(".ckpt.bin.ringfeed-"), os.listdir(src)
    with mount(src, tmp_path, name="next") as m:
        assert sorted(os.listdir(m.path)) == ["kept.bin"]
        assert sorted(os.listdir(src)) == ["kept.bin"]
        assert "left by writer" in m.log_text()


def test_owner_and_modes_hold_for_other_users_with_allow_other(tmp_path):
    """--allow-other with --uid/--gid/--file-mode/--dir-mode: other users
    reach the mount, and the kernel checks the owner and bits shown: the
    owner reads, another user is refused. The control, without
    --allow-other: even the owner shown is refused (FUSE lets only the
    mounting user in)."""
    if os.geteuid() != 0:
        from conftest import skip_for_environment
        skip_for_environment("acting as other users needs root")
    import shutil
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="rf-owner-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        src = base / "src"
        (src / "sub").mkdir(parents=True)
        (src / "a.bin").write_bytes(b"secret")

        def as_user(uid, *cmd):
            return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                                   *map(str, cmd)], capture_output=True)

        owner = ("--uid", "1234", "--gid", "1234", "--file-mode", "0640", "--dir-mode", "0750")
        with mount(src, base, "--allow-other", *owner, name="shared") as m:
            st = os.stat(m.path / "a.bin")
            assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (1234, 1234, 0o640)
            assert os.stat(m.path / "sub").st_mode & 0o7777 == 0o750
            r = as_user(1234, "cat", m.path / "a.bin")
            assert (r.returncode, r.stdout) == (0, b"secret"), r.stderr
            r = as_user(4321, "cat", m.path / "a.bin")
            assert r.returncode != 0 and b"Permission denied" in r.stderr, r
            r = as_user(4321, "ls", m.path / "sub")
            assert r.returncode != 0 and b"Permission denied" in r.stderr, r
        with mount(src, base, *owner, name="private") as m:
            r = as_user(1234, "cat", m.path / "a.bin")
            assert r.returncode != 0 and b"Permission denied" in r.stderr, r
    finally:
        shutil.rmtree(base, ignore_errors=True)
