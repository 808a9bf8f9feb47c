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
"""

import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

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
