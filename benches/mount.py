#!/usr/bin/env python3
"""File systems over object storage: `ringfeed mount` against s3fs-fuse and
rclone mount, and against ringfeed's and webdataset's own readers, over the
project's object-store emulator, each reader a whole process.

A benchmark program, not a test (docs/design.md): every figure is a median
over ROUNDS interleaved rounds (each round in its own seeded order, so no
contender always runs after the same neighbour), after one warm-up run of
each contender (not counted; a contender failing it is left out, with its
error), and ringfeed is judged by ratios of medians measured in the same
run. MET / NOT MET marks the targets below; STRICT=1 turns a NOT MET into
exit status 1.

The store: examples/store_emulator (path-style S3 and plain HTTP over one
ROOT, on tmpfs) with S3's shape of performance: first-byte latency
lognormal, median 20 ms, p99 120 ms (--latency), 90 MB/s a connection,
1250 MB/s an object, 5,500 requests a second a prefix (its defaults):

  store_emulator ROOT --latency 20ms:120ms

ROOT's one folder, BUCKET (ringfeed-bench), holds the data, made here from
fixed seeds: big/object.bin (random bytes), ckpt/model.pt and
ckpt/model.safetensors (one state dict), small/f-NNNNN.bin (random bytes,
each file different) and shards/shard-NNNNNN.tar (`ringfeed gen --seed 0`).
The emulator's counters are zeroed before each reader starts and read when
it exits: the requests of each contender's read (mount start-up apart).

The mounts, each mounted afresh (on an empty folder) for every run of a
reader and unmounted after it (`fusermount3 -u`, then the daemon's exit
awaited), so no run is served from what an earlier one left in the
daemon's memory or in the kernel's page cache of the mount; each daemon
runs in the foreground as this program's child, so its CPU time over the
reader's run is read from /proc/PID/stat and shown beside the reader's,
with its peak resident memory (VmHWM) and the emulator's CPU time over
the same run (the three share the machine's CPUs).
Every one with its documented defaults, credentials x/y (the emulator
accepts any signature):

  ringfeed mount  AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=y AWS_REGION=us-east-1
                  ringfeed mount s3://BUCKET/ MNT --endpoint-url ENDPOINT
                  (read-ahead to 256 MiB, 1 GiB of blocks, 16 threads)
  s3fs            s3fs BUCKET MNT -f -o url=ENDPOINT -o use_path_request_style
                  -o passwd_file=FILE -o listobjectsv2 (FILE `x:y`, mode
                  600; -f: the same file system in the foreground; defaults:
                  no local cache (no use_cache), parallel_count 5,
                  multipart_size 10 MB, multireq_max 20, stat_cache_expire
                  off)
  rclone          RCLONE_CONFIG_EMU_TYPE=s3 RCLONE_CONFIG_EMU_PROVIDER=Other
                  RCLONE_CONFIG_EMU_ENDPOINT=ENDPOINT
                  RCLONE_CONFIG_EMU_ACCESS_KEY_ID=x
                  RCLONE_CONFIG_EMU_SECRET_ACCESS_KEY=y
                  RCLONE_CONFIG_EMU_LIST_VERSION=2
                  rclone mount emu:BUCKET MNT
                  (defaults: --vfs-cache-mode off, --vfs-read-chunk-size 128M
                  doubling without limit, --buffer-size 16M, --dir-cache-time
                  5m, --attr-timeout 1s; run without AWS_CA_BUNDLE in its
                  environment, which makes rclone 1.60's S3 client refuse to
                  start: "unable to load custom CA bundle")

The emulator answers ListObjectsV2 only: a V1 listing's `marker` is
ignored, so a V1 client past 1,000 keys gets the first page again for
ever (rclone did so, growing to 21 GB). s3fs and rclone list with V1 by
default against a store that is not AWS, hence `listobjectsv2` and
`list_version 2`, their documented switches (ringfeed lists with V2).

A mount is ready when its folder is in /proc/self/mountinfo (and, for
ringfeed, it printed "mounted on"): that time, spawn to ready, is the
mount's start-up, printed apart. The readers (benches/_mount_read.py, one
Python process each, timed from spawn to exit with the CPU time wait4
reports; interpreter start and imports included; killed past --timeout
[600 s], or when the machine's MemAvailable falls under --mem-guard [3GiB])
and the targets:

A. one SIZE file [1GiB], big/object.bin, read front to back:
     mounts       open(MNT/big/object.bin, buffering=0).readinto(8 MiB buffer)
                  until the end (the same reader for every mount)
     read_object  ringfeed.read_object("s3://BUCKET/big/object.bin",
                  s3_endpoint=ENDPOINT, credentials x/y, **RF_READ)
   Three 1 MiB windows compared with the emulator's file after the clock.
   Targets (GB/s, ratio of medians): ringfeed mount >= 0.8 x read_object,
   >= 2 x s3fs and >= 2 x rclone.
B. a checkpoint of CKPT_SIZE [256MiB] (d_model 1024 layers: float32
   attention, bfloat16 MLP weights), saved with torch.save and with
   safetensors.torch.save_file:
     torch        mounts: torch.load(MNT/ckpt/model.pt, weights_only=True)
                  native: torch.load(ringfeed.open_object("s3://BUCKET/ckpt/model.pt",
                  ...), weights_only=True)
     safetensors  mounts: safetensors.torch.load_file(MNT/ckpt/model.safetensors)
                  native: ringfeed.load_safetensors("s3://...", framework="pt")
   Then one byte of every 4 KiB page of every tensor is read, inside the
   clock, as load_state_dict or a copy to a device reads them all (load_file
   returns tensors over a mapping of the file: without this, the pages not
   yet faulted in would never be fetched, and a mount that fetches less
   would look faster). The tensors' count and three tensors' first MiB
   checked. Targets: ringfeed mount GB/s >= 0.8 x native, for each.
C. FILES [1500] files of FILE_SIZE [100KB] in one folder, small/: the
   reader lists it (sorted(os.listdir)) and THREADS [8] threads each read
   a contiguous share of the list, each file opened, read whole, closed;
   every 997th file compared with the source. Files/s from the whole
   process (listing included; the listing's own time is printed). Target:
   ringfeed mount >= 2 x the faster of s3fs and rclone. No warm-up run
   (--c-warmup for one): the reader imports nothing heavy, and s3fs and
   rclone read 30-45 files/s here (three or two requests a file, ~4 and ~2
   in flight), so 1,500 files already cost them 35-45 s a run; --files
   10000 is the size of a real folder (4-5 minutes a run for each peer).
D. one epoch of SHARDS [16] WebDataset shards of SHARD_SIZE [64MiB]
   (`ringfeed gen --seed 0`, ~100 KB samples), read by webdataset itself:
     mounts       webdataset.WebDataset("MNT/shards/shard-{000000..000015}.tar",
                  shardshuffle=False)
     pipe:curl    webdataset.WebDataset("pipe:curl -sf ENDPOINT/BUCKET/shards/shard-{000000..000015}.tar",
                  shardshuffle=False)
   each sample's fields' bytes counted (no decoding), the count checked.
   s3fs and rclone read D too with --d-peers. No target: the ratio
   ringfeed mount / pipe:curl is printed.

Usage:
  benches/mount.py [--size 1GiB] [--ckpt-size 256MiB] [--files 1500]
                   [--file-size 100KB] [--threads 8] [--shards 16]
                   [--shard-size 64MiB] [--rounds 3] [--latency 20ms:120ms]
                   [--only A,B,C,D] [--mounts ringfeed,s3fs,rclone]
                   [--d-peers] [--no-warmup] [--c-warmup] [--timeout 600]
                   [--mem-guard 3GiB]
Environment:
  PYTHON         interpreter of the readers (torch, safetensors, webdataset
                 and ringfeed importable) [this one]
  RINGFEED_BIN   the CLI [target/release/ringfeed]; RINGFEED_LIB the library
                 [target/release/libringfeed.so]: both copied to a scratch
                 folder first, so a rebuild during the run changes nothing
  EMULATOR       [target/release/examples/store_emulator]
  RF_MOUNT_ARGS, S3FS_ARGS, RCLONE_ARGS  more arguments for a mount (shell words)
  RF_READ        JSON object of read_object/open_object/load_safetensors keys [{}]
  DATA_ROOT      the emulator's ROOT [/dev/shm/ringfeed-mount-PID], removed
                 at the end unless KEEP_DATA=1 (made again when missing)
  OUT_DIR        JSON per run, commands, summary [benches/out/mount/<time>]
  STRICT         1: exit 1 when a target is not met [0]
Needs: apt-get install s3fs rclone fuse3 (fusermount3); root or
/dev/fuse access; pip install torch safetensors webdataset; curl.
Builds first: cargo build --release && cargo build --release --example store_emulator
"""

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import select
import tarfile
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import _timing

BUCKET = "ringfeed-bench"
MiB = 1 << 20
KEY_ID, SECRET = "x", "y"
UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30,
         "KB": 10**3, "MB": 10**6, "GB": 10**9}
MOUNTS = ("ringfeed", "s3fs", "rclone")
LABEL = {"ringfeed": "ringfeed mount", "s3fs": "s3fs", "rclone": "rclone"}


def size(text):
    t = str(text).strip().upper().replace(" ", "")
    num = t.rstrip("KMGIB")
    return int(float(num) * UNITS[t[len(num):]])


def _q(s):
    return shlex.quote(str(s))


def med(xs):
    return statistics.median(xs)


def _meminfo(field):
    """A /proc/meminfo field, in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _rss(pid, field="VmRSS"):
    """A process's resident memory (VmRSS, or its peak VmHWM), in bytes; 0 when gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def mounted(path):
    """Whether ``path`` is a mount point now (/proc/self/mountinfo's fifth field)."""
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


class Mount:
    """One file system daemon on one folder: started, timed to ready,
    stopped (unmounted, its exit awaited)."""

    def __init__(self, bench, kind, path):
        self.b, self.kind, self.path = bench, kind, path
        self.proc = None

    def argv_env(self):
        b, env = self.b, dict(self.b.env)
        if self.kind == "ringfeed":
            env.update(AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION="us-east-1")
            argv = [b.rf_bin, "mount", f"s3://{BUCKET}/", self.path, "--endpoint-url", b.endpoint]
            extra = os.environ.get("RF_MOUNT_ARGS", "")
        elif self.kind == "s3fs":
            argv = ["s3fs", BUCKET, self.path, "-f", "-o", f"url={b.endpoint}", "-o", "use_path_request_style",
                    "-o", f"passwd_file={b.passwd}", "-o", "listobjectsv2"]
            extra = os.environ.get("S3FS_ARGS", "")
        else:
            # rclone 1.60's S3 client refuses to start with AWS_CA_BUNDLE set
            # ("unable to load custom CA bundle"); the store is plain HTTP.
            env.pop("AWS_CA_BUNDLE", None)
            env.update(RCLONE_CONFIG_EMU_TYPE="s3", RCLONE_CONFIG_EMU_PROVIDER="Other",
                       RCLONE_CONFIG_EMU_ENDPOINT=b.endpoint, RCLONE_CONFIG_EMU_ACCESS_KEY_ID=KEY_ID,
                       RCLONE_CONFIG_EMU_SECRET_ACCESS_KEY=SECRET, RCLONE_CONFIG_EMU_LIST_VERSION="2")
            argv = ["rclone", "mount", f"emu:{BUCKET}", self.path]
            extra = os.environ.get("RCLONE_ARGS", "")
        return argv + shlex.split(extra), env

    def start(self, log):
        if mounted(self.path):
            sys.exit(f"{self.path} is still mounted")
        argv, env = self.argv_env()
        self.log = log
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=open(log, "wb"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.b.live_mounts.append(self)
        deadline = t0 + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} mount exited with {self.proc.returncode}: {self.tail()}")
            if mounted(self.path) and (self.kind != "ringfeed" or b"mounted on" in open(log, "rb").read()):
                return time.perf_counter() - t0
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{self.kind} mount not ready after 60 s: {self.tail()}")
            time.sleep(0.002)

    def tail(self):
        try:
            return open(self.log, errors="replace").read()[-800:].strip()
        except OSError:
            return ""

    def cpu(self):
        return _timing.proc_cpu_seconds([self.proc.pid])

    def stop(self):
        """fusermount3 -u, then the daemon's exit awaited (30 s); past that,
        SIGTERM, SIGKILL and a lazy unmount. Returns a note when it had to
        go past the first step."""
        note = None
        if self.proc is None:
            return None
        if mounted(self.path):
            r = subprocess.run(["fusermount3", "-u", self.path], capture_output=True, text=True)
            if r.returncode != 0:
                note = f"fusermount3 -u: {r.stderr.strip()}"
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            note = (note or "") + f"; {self.kind} still running 30 s after the unmount: SIGTERM"
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                note += ", SIGKILL"
        if mounted(self.path):
            subprocess.run(["fusermount3", "-uz", self.path], capture_output=True)
            note = (note or "") + "; still mounted after the daemon exited: fusermount3 -uz"
        if self in self.b.live_mounts:
            self.b.live_mounts.remove(self)
        self.proc = None
        return note


class Bench:
    def __init__(self, a):
        self.a = a
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.out = os.path.abspath(os.environ.get("OUT_DIR") or f"{ROOT}/benches/out/mount/{stamp}")
        os.makedirs(self.out, exist_ok=True)
        self.cmds = open(f"{self.out}/commands.txt", "w")
        self.scratch = tempfile.mkdtemp(prefix="ringfeed-mount-bench-")
        self.data = os.path.abspath(os.environ.get("DATA_ROOT") or f"/dev/shm/ringfeed-mount-{os.getpid()}")
        self.bucket = f"{self.data}/{BUCKET}"
        os.makedirs(self.bucket, exist_ok=True)
        self.python = os.environ.get("PYTHON") or sys.executable
        self.env = dict(os.environ)
        self.live_mounts = []
        self.skipped = {}
        self.notes = []
        self.emu = None
        self.passwd = f"{self.scratch}/s3fs-passwd"
        with open(self.passwd, "w") as f:
            f.write(f"{KEY_ID}:{SECRET}\n")
        os.chmod(self.passwd, 0o600)

    def note(self, text):
        self.cmds.write(text + "\n")
        self.cmds.flush()

    # --- binaries, emulator -------------------------------------------------
    def snapshot_binaries(self):
        """Copies the CLI and the library to the scratch folder: the tree is
        shared, and a rebuild in the middle of a run would change the
        contender between rounds."""
        rf = os.environ.get("RINGFEED_BIN") or f"{ROOT}/target/release/ringfeed"
        lib = os.environ.get("RINGFEED_LIB") or f"{ROOT}/target/release/libringfeed.so"
        for p, hint in ((rf, "cargo build --release"), (lib, "cargo build --release")):
            if not os.path.isfile(p):
                sys.exit(f"no {p}: {hint}")
        os.makedirs(f"{self.scratch}/bin")
        self.rf_bin = shutil.copy2(rf, f"{self.scratch}/bin/ringfeed")
        self.rf_lib = shutil.copy2(lib, f"{self.scratch}/bin/libringfeed.so")
        self.env["RINGFEED_LIB"] = self.rf_lib
        self.env["PYTHONPATH"] = os.pathsep.join(
            [f"{ROOT}/bindings/python"] + ([self.env["PYTHONPATH"]] if self.env.get("PYTHONPATH") else []))
        self.versions = {
            "ringfeed": f"{rf} (built {time.strftime('%H:%M:%S', time.localtime(os.path.getmtime(rf)))}), "
                        f"{lib} (built {time.strftime('%H:%M:%S', time.localtime(os.path.getmtime(lib)))})",
            "tree": subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                                   text=True).stdout.strip(),
        }
        for name, argv in (("s3fs", ["s3fs", "--version"]), ("rclone", ["rclone", "version"]),
                           ("curl", ["curl", "--version"])):
            try:
                self.versions[name] = subprocess.run(argv, capture_output=True, text=True).stdout.splitlines()[0]
            except (OSError, IndexError):
                self.versions[name] = "missing"
        q = subprocess.run([self.python, "-c", "import sys, torch, safetensors, webdataset, ringfeed; "
                            "print('python', sys.version.split()[0], 'torch', torch.__version__, "
                            "'safetensors', safetensors.__version__, 'webdataset', webdataset.__version__, "
                            "'ringfeed', ringfeed.__version__)"], env=self.env, capture_output=True, text=True)
        if q.returncode != 0:
            sys.exit(f"{self.python}: {q.stderr.strip()[-400:]}")
        self.versions["python"] = q.stdout.strip()
        for k, v in self.versions.items():
            print(f"{k}: {v}")
            self.note(f"# {k}: {v}")

    def start_emulator(self):
        exe = os.environ.get("EMULATOR") or f"{ROOT}/target/release/examples/store_emulator"
        if not os.access(exe, os.X_OK):
            sys.exit(f"no emulator at {exe}: cargo build --release --example store_emulator")
        exe = shutil.copy2(exe, f"{self.scratch}/bin/store_emulator")
        argv = [exe, self.data, "--latency", self.a.latency]
        line = f"$ {' '.join(_q(x) for x in argv)}"
        print(line)
        self.note(line)
        # stdin a pipe: the emulator stops when this program dies.
        self.emu = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=open(f"{self.out}/emulator.stderr", "wb"))
        self.endpoint = self.emu.stdout.readline().decode().strip()
        if not self.endpoint.startswith("http://"):
            sys.exit(f"store_emulator printed {self.endpoint!r}")
        print(f"emulator at {self.endpoint}, ROOT {self.data}")

    def stop_emulator(self):
        if self.emu and self.emu.poll() is None:
            self.emu.stdin.close()
            try:
                self.emu.wait(10)
            except subprocess.TimeoutExpired:
                self.emu.kill()
                self.emu.wait()

    def emu_get(self, what):
        with urllib.request.urlopen(f"{self.endpoint}/_emulator/{what}", timeout=10) as r:
            return json.loads(r.read())

    # --- data ---------------------------------------------------------------
    def make_data(self, only):
        a, t0 = self.a, time.perf_counter()
        self.info = {}
        if "A" in only:
            p = f"{self.bucket}/big/object.bin"
            if not (os.path.exists(p) and os.path.getsize(p) == a.size):
                os.makedirs(os.path.dirname(p), exist_ok=True)
                rng = random.Random(1)
                with open(p + ".tmp", "wb") as f:
                    left = a.size
                    while left:
                        k = min(left, 64 * MiB)
                        f.write(rng.randbytes(k))
                        left -= k
                os.rename(p + ".tmp", p)
        if "B" in only:
            d = f"{self.bucket}/ckpt"
            os.makedirs(d, exist_ok=True)
            man = f"{self.data}/ckpt-manifest-{a.ckpt_size}.json"
            if not os.path.exists(man):
                spec = {"bytes": a.ckpt_size, "seed": 2, "pt": f"{d}/model.pt", "st": f"{d}/model.safetensors"}
                r = subprocess.run([self.python, f"{HERE}/_mount_read.py", "gen_ckpt", json.dumps(spec)],
                                   env=self.env, capture_output=True, text=True)
                if r.returncode != 0:
                    sys.exit(f"making the checkpoint failed: {r.stderr.strip()[-800:]}")
                with open(man, "w") as f:
                    f.write(r.stdout)
            self.info["manifest"] = json.load(open(man))
        if "C" in only:
            d = f"{self.bucket}/small"
            done = f"{self.data}/small-{a.files}x{a.file_size}.done"
            if not os.path.exists(done):
                shutil.rmtree(d, ignore_errors=True)
                os.makedirs(d)
                rng = random.Random(3)
                pool = rng.randbytes(64 * MiB)
                for i in range(a.files):
                    off = rng.randrange(0, len(pool) - a.file_size)
                    body = i.to_bytes(8, "little") + pool[off + 8:off + a.file_size]
                    with open(f"{d}/f-{i:05d}.bin", "wb") as f:
                        f.write(body[:a.file_size])
                open(done, "w").close()
        if "D" in only:
            d = f"{self.bucket}/shards"
            done = f"{self.data}/shards-{a.shards}x{a.shard_size}.done"
            if not os.path.exists(done):
                shutil.rmtree(d, ignore_errors=True)
                argv = [self.rf_bin, "gen", d, "--shards", str(a.shards), "--shard-size", str(a.shard_size),
                        "--seed", "0"]
                self.note("$ " + " ".join(_q(x) for x in argv))
                subprocess.run(argv, check=True, capture_output=True)
                open(done, "w").close()
            names = sorted(n for n in os.listdir(d) if n.endswith(".tar"))
            samples = payload = total = 0
            for n in names:
                total += os.path.getsize(f"{d}/{n}")
                last = None
                with tarfile.open(f"{d}/{n}") as t:
                    for m in t:
                        if not m.isfile():
                            continue
                        # webdataset's key: the path up to the first dot of the basename.
                        head, _, base = m.name.rpartition("/")
                        key = head + "/" + base.split(".", 1)[0]
                        if key != last:
                            samples += 1
                            last = key
                        payload += m.size
            first, lastn = names[0][len("shard-"):-4], names[-1][len("shard-"):-4]
            self.info["shards"] = {"pattern": f"shards/shard-{{{first}..{lastn}}}.tar", "count": len(names),
                                   "samples": samples, "payload": payload, "bytes": total}
        print(f"data in {self.bucket} ready ({time.perf_counter() - t0:.1f} s)")

    # --- running ------------------------------------------------------------
    def reader(self, mode, spec):
        return [self.python, f"{HERE}/_mount_read.py", mode, json.dumps(spec)]

    def native_config(self):
        cfg = {"s3_endpoint": self.endpoint, "s3_region": "us-east-1", "aws_access_key_id": KEY_ID,
               "aws_secret_access_key": SECRET}
        cfg.update(json.loads(os.environ.get("RF_READ") or "{}"))
        return cfg

    def spawn(self, argv, daemon=None):
        """The reader, timed whole (spawn to exit, CPU from wait4). Killed
        with its process group past --timeout, when the machine's
        MemAvailable falls under --mem-guard (a daemon running away with
        memory must not take the shared machine down), or when this program
        is stopped. The wait is a pidfd in select, in the main thread, so a
        signal to this program interrupts it."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            t0 = time.perf_counter()
            p = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                 start_new_session=True)
            why = None
            try:
                fd = os.pidfd_open(p.pid)
                try:
                    while not select.select([fd], [], [], 0.25)[0]:
                        if time.perf_counter() - t0 > self.a.timeout:
                            why = f"killed after {self.a.timeout:.0f} s (--timeout)"
                        elif _meminfo("MemAvailable") < self.a.mem_guard:
                            rss = f", the mount daemon's RSS {_rss(daemon) / 2**30:.1f} GiB" if daemon else ""
                            why = (f"killed: MemAvailable under {self.a.mem_guard / 2**30:.1f} GiB "
                                   f"(--mem-guard){rss}")
                        if why:
                            os.killpg(p.pid, signal.SIGKILL)
                            break
                finally:
                    os.close(fd)
                _, status, ru = os.wait4(p.pid, 0)
            except BaseException:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
                raise
            wall = time.perf_counter() - t0
            p.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            err.seek(0)
            text, etext = out.read().decode(), err.read().decode(errors="replace")
        if why:
            raise RuntimeError(f"{why}: {etext.strip()[-600:]}")
        if p.returncode != 0:
            raise RuntimeError(f"exit {p.returncode}: {etext.strip()[-800:]}")
        rec = json.loads(text.strip().splitlines()[-1])
        rec.update(process_wall_s=wall, process_cpu_s=ru.ru_utime + ru.ru_stime, process_sys_s=ru.ru_stime,
                   process_peak_rss_bytes=ru.ru_maxrss * 1024)
        return rec

    def run(self, tag, c):
        """One run of contender ``c``: its mount made fresh (when it has
        one), the emulator's counters zeroed, the reader timed whole, the
        counters read, the mount taken down. The record, or an exception."""
        m = None
        rec = {}
        try:
            # Zeroed first: what the last run's unmount and tear-down sent
            # is no one's.
            self.emu_get("reset")
            if c.get("mount"):
                mnt = f"{self.scratch}/mnt-{c['mount']}"
                os.makedirs(mnt, exist_ok=True)
                m = Mount(self, c["mount"], mnt)
                rec["mount_start_s"] = m.start(f"{self.out}/{tag}.mount.log")
                # The reset answers the counts it zeroed: the mount's start-up.
                rec["mount_requests"] = self.emu_get("reset")
                fs0 = m.cpu()
                argv = c["argv"](mnt)
            else:
                self.emu_get("reset")
                argv = c["argv"](None)
            self.last_argv = argv
            emu0 = _timing.proc_cpu_seconds([self.emu.pid])
            rec.update(self.spawn(argv, m.proc.pid if m else None))
            rec["store_cpu_s"] = _timing.proc_cpu_seconds([self.emu.pid]) - emu0
            rec["store"] = self.emu_get("stats")
            if m:
                rec["fs_cpu_s"] = m.cpu() - fs0
                rec["fs_peak_rss_bytes"] = _rss(m.proc.pid, "VmHWM")
        finally:
            if m:
                n = m.stop()
                if n:
                    self.notes.append(f"{tag}: {n}")
                    print(f"  {tag}: {n}")
        json.dump(rec, open(f"{self.out}/{tag}.json", "w"), indent=1)
        return rec

    def rounds(self, name, contenders, warmup=True):
        """Warm-up (one run each, not counted; a contender failing it is
        dropped with its error), then ROUNDS rounds, each in its own seeded
        order. ``contenders``: {who: {"mount": kind or None, "argv": f(mnt)}}."""
        live = {}
        for who, c in contenders.items():
            argv = c["argv"](f"{self.scratch}/mnt-{c['mount']}" if c.get("mount") else None)
            self.note(f"# {name} {who}" + (f" (on a fresh `{c['mount']}` mount at MNT)" if c.get("mount") else ""))
            self.note("$ " + " ".join(_q(x) for x in argv))
        if self.a.warmup and warmup:
            print(f"\n== {name}: warm-up")
            for who, c in contenders.items():
                try:
                    r = self.run(f"{name}-warmup-{who.replace(' ', '_')}", c)
                    print(f"  {who}: {r['process_wall_s']:.2f} s")
                    live[who] = c
                except Exception as e:  # a contender that cannot run is reported, not fatal
                    print(f"  {who} FAILED in the warm-up: {e}")
                    self.skipped.setdefault(name, {})[who] = str(e)[-600:]
        else:
            live = dict(contenders)
        recs = {w: [] for w in live}
        names = list(live)
        print(f"== {name}: {self.a.rounds} rounds; load average before {os.getloadavg()[0]:.2f} "
              f"on {os.cpu_count()} CPUs")
        for r in range(1, self.a.rounds + 1):
            order = random.Random(r).sample(list(live), len(live))
            order = [w for w in order if w in names]
            print(f"round {r}: {', '.join(order)}")
            for who in order:
                tag = f"{name}-{r}-{who.replace(' ', '_')}"
                try:
                    rec = self.run(tag, live[who])
                except Exception as e:
                    # Left out of the later rounds too: a contender that
                    # failed once (a hang, a memory run-away) is not run again.
                    print(f"  {who} FAILED in round {r}, left out: {e}")
                    self.skipped.setdefault(name, {})[who] = f"round {r}: {str(e)[-600:]}"
                    names.remove(who)
                    continue
                recs[who].append(rec)
                print(f"  {who}: {rec['process_wall_s']:.2f} s")
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        return {w: rs for w, rs in recs.items() if len(rs) == self.a.rounds}

    # --- workloads ------------------------------------------------------------
    def mount_contenders(self, spec_of, mode, kinds):
        return {LABEL[k]: {"mount": k, "argv": (lambda mnt, s=spec_of: self.reader(mode, s(mnt)))}
                for k in kinds}

    def workload_a(self):
        n = self.a.size
        src = f"{self.bucket}/big/object.bin"
        cont = self.mount_contenders(
            lambda mnt: {"path": f"{mnt}/big/object.bin", "src": src, "bytes": n, "block": 8 * MiB},
            "seq", self.a.mounts)
        spec = {"url": f"s3://{BUCKET}/big/object.bin", "config": self.native_config(), "src": src, "bytes": n}
        cont["read_object"] = {"mount": None, "argv": lambda _: self.reader("rf_read", spec)}
        return self.rounds("A", cont)

    def workload_b(self):
        man = self.info["manifest"]
        res = {}
        for sub, fname, path_mode, rf_mode in (("torch", "model.pt", "torch_path", "torch_rf"),
                                               ("safetensors", "model.safetensors", "st_path", "st_rf")):
            n = os.path.getsize(f"{self.bucket}/ckpt/{fname}")
            cont = self.mount_contenders(
                lambda mnt, f=fname, n=n: {"path": f"{mnt}/ckpt/{f}", "bytes": n, "manifest": man},
                path_mode, self.a.mounts)
            spec = {"url": f"s3://{BUCKET}/ckpt/{fname}", "config": self.native_config(), "bytes": n,
                    "manifest": man}
            cont["native"] = {"mount": None, "argv": lambda _, s=spec, m=rf_mode: self.reader(m, s)}
            res[sub] = (n, self.rounds(f"B-{sub}", cont))
        return res

    def workload_c(self):
        a = self.a
        cont = self.mount_contenders(
            lambda mnt: {"dir": f"{mnt}/small", "src": f"{self.bucket}/small", "threads": a.threads,
                         "files": a.files, "bytes": a.files * a.file_size},
            "files", self.a.mounts)
        return self.rounds("C", cont, warmup=a.c_warmup)

    def workload_d(self):
        sh = self.info["shards"]
        spec = {"samples": sh["samples"], "payload": sh["payload"], "bytes": sh["bytes"]}
        kinds = self.a.mounts if self.a.d_peers else [k for k in self.a.mounts if k == "ringfeed"]
        cont = self.mount_contenders(lambda mnt: dict(spec, urls=f"{mnt}/{sh['pattern']}"), "wds", kinds)
        curl = dict(spec, urls=f"pipe:curl -sf {self.endpoint}/{BUCKET}/{sh['pattern']}")
        cont["pipe:curl"] = {"mount": None, "argv": lambda _: self.reader("wds", curl)}
        return self.rounds("D", cont)

    def cleanup(self):
        for m in list(self.live_mounts):
            try:
                n = m.stop()
                if n:
                    print(f"cleanup {m.kind}: {n}")
            except Exception as e:
                print(f"cleanup {m.kind} at {m.path}: {e}")
        self.stop_emulator()
        if os.environ.get("KEEP_DATA") != "1" and not os.environ.get("DATA_ROOT"):
            shutil.rmtree(self.data, ignore_errors=True)
        shutil.rmtree(self.scratch, ignore_errors=True)


# --------------------------------------------------------------------------
# Tables.
# --------------------------------------------------------------------------

def summarize(recs, unit_of):
    """{who: lists per round}: process seconds, the rate (unit_of(rec, secs)),
    reader and file system CPU, the reader's own clock, the store's counts."""
    s = {}
    for who, rs in recs.items():
        secs = [r["process_wall_s"] for r in rs]
        s[who] = {
            "secs": secs,
            "rate": [unit_of(r, x) for r, x in zip(rs, secs)],
            "cpu": [r["process_cpu_s"] for r in rs],
            "fs_cpu": [r.get("fs_cpu_s", 0.0) for r in rs],
            "own": [r["seconds"] for r in rs],
            "gets": [r["store"]["gets"] for r in rs],
            "heads": [r["store"]["heads"] for r in rs],
            "lists": [r["store"]["lists"] for r in rs],
            "reqs": [r["store"]["requests"] for r in rs],
            "slow": [r["store"]["slow_down"] for r in rs],
            "mb": [r["store"]["bytes"] / 1e6 for r in rs],
            "inflight": [r["store"]["transfers_mean"] for r in rs],
            "fs_rss": [r.get("fs_peak_rss_bytes", 0) / 2**20 for r in rs],
            "store_cpu": [r.get("store_cpu_s", 0.0) for r in rs],
            "mount_s": [r["mount_start_s"] for r in rs if "mount_start_s" in r],
            "mount_reqs": [r["mount_requests"]["requests"] for r in rs if "mount_requests" in r],
        }
    return s


def table(title, s, ref, unit):
    print(f"\n{title}")
    print(f"  {'contender':<15} {'s [min-max]':>19} {unit:>9} {'CPU s':>6} {'fs CPU':>6} {'st CPU':>6} "
          f"{'fs MiB':>6} {'own s':>6} "
          f"{'GETs':>6} {'HEADs':>6} {'LISTs':>5} {'503':>4} {'MB':>6} {'in flt':>6} {'vs ' + ref:>10}")
    for who, v in s.items():
        r = _timing.ratio_of_medians(v["rate"], s[ref]["rate"])[0] if ref in s else float("nan")
        sec = v["secs"]
        print(f"  {who:<15} {med(sec):6.2f} [{min(sec):5.2f}-{max(sec):5.2f}] {med(v['rate']):9.3f} "
              f"{med(v['cpu']):6.2f} {med(v['fs_cpu']):6.2f} {med(v['store_cpu']):6.2f} "
              f"{med(v['fs_rss']):6.0f} {med(v['own']):6.2f} "
              f"{med(v['gets']):6.0f} "
              f"{med(v['heads']):6.0f} {med(v['lists']):5.0f} {med(v['slow']):4.0f} {med(v['mb']):6.0f} "
              f"{med(v['inflight']):6.1f} {r:10.3f}")


def main():
    doc = __doc__
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=doc.split("\n\n", 1)[1])
    p.add_argument("--size", type=size, default=size("1GiB"))
    p.add_argument("--ckpt-size", type=size, default=size("256MiB"))
    p.add_argument("--files", type=int, default=1500)
    p.add_argument("--file-size", type=size, default=size("100KB"))
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--shard-size", type=size, default=size("64MiB"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--latency", default="20ms:120ms")
    p.add_argument("--only", default="A,B,C,D")
    p.add_argument("--mounts", default=",".join(MOUNTS))
    p.add_argument("--d-peers", action="store_true")
    p.add_argument("--no-warmup", dest="warmup", action="store_false")
    p.add_argument("--c-warmup", action="store_true")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--mem-guard", type=size, default=size("3GiB"))
    a = p.parse_args()
    a.mounts = [k for k in a.mounts.split(",") if k]
    if any(k not in MOUNTS for k in a.mounts):
        sys.exit(f"--mounts: one of {', '.join(MOUNTS)}")
    only = set(a.only.upper().split(","))
    b = Bench(a)
    b.note(f"# {' '.join(_q(x) for x in sys.argv)}  (in {ROOT})")
    print(f"mount bench in {ROOT}; out {b.out}; {os.cpu_count()} CPUs")
    summary = {"args": {k: v for k, v in vars(a).items()}, "skipped": b.skipped}
    checks = {}

    def target(name, r, bound, label):
        ok = r[0] >= bound
        checks[name] = ok
        summary.setdefault("targets", {})[name] = {"ratio_of_medians": r[0], "round_min": r[1],
                                                   "round_max": r[2], "bound": f">= {bound}", "met": ok}
        print(f"  {label:<50} {_timing.fmt_ratio(r):<28} target >= {bound:<4} {'MET' if ok else 'NOT MET'}")

    def info(label, r):
        print(f"  {label:<50} {_timing.fmt_ratio(r)}")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))
    res = {}
    try:
        b.snapshot_binaries()
        summary["versions"] = b.versions
        b.make_data(only)
        b.start_emulator()
        if "A" in only:
            res["A"] = b.workload_a()
        if "B" in only:
            res["B"] = b.workload_b()
        if "C" in only:
            res["C"] = b.workload_c()
        if "D" in only:
            res["D"] = b.workload_d()
    finally:
        b.cleanup()

    gb = lambda n: (lambda r, secs: n / 1e9 / secs)  # noqa: E731
    rf = LABEL["ringfeed"]
    print(f"\nmedians of {a.rounds} rounds [min-max], whole reader process (spawn to exit); emulator "
          f"--latency {a.latency}; tree {b.versions['tree']}")
    print("  CPU s: the reader's (wait4); fs CPU: the mount daemon's over the reader's run; st CPU: the "
          f"emulator's over the same run (the {os.cpu_count()} CPUs are shared by all three); fs MiB: the daemon's "
          "peak resident memory (VmHWM); own s: the "
          "reader's own clock around the read; GETs.. MB: the emulator's counts over the run; in flt: "
          "transfers in flight, time-weighted mean")
    if "A" in res and res["A"]:
        s = summarize(res["A"], gb(a.size))
        summary["A"] = s
        table(f"A. read one {a.size / 2**30:.2f} GiB file front to back (8 MiB reads), GB/s", s, "read_object",
              "GB/s")
        if rf in s and "read_object" in s:
            target("A_mount_vs_read_object", _timing.ratio_of_medians(s[rf]["rate"], s["read_object"]["rate"]),
                   0.8, "ringfeed mount GB/s / read_object GB/s")
        if rf in s and "read_object" in s:
            info("own clocks (the read alone): ringfeed mount / read_object",
                 _timing.ratio_of_medians(s["read_object"]["own"], s[rf]["own"]))
        for peer in ("s3fs", "rclone"):
            if rf in s and peer in s:
                target(f"A_mount_vs_{peer}", _timing.ratio_of_medians(s[rf]["rate"], s[peer]["rate"]), 2.0,
                       f"ringfeed mount GB/s / {peer} GB/s")
    if "B" in res:
        summary["B"] = {}
        for sub, (n, recs) in res["B"].items():
            if not recs:
                continue
            s = summarize(recs, gb(n))
            summary["B"][sub] = s
            what = ("torch.load (mounts) / torch.load(ringfeed.open_object) (native)" if sub == "torch" else
                    "safetensors.torch.load_file (mounts) / ringfeed.load_safetensors (native)")
            table(f"B. {sub}: {n / 2**20:.0f} MiB checkpoint, {b.info['manifest']['tensors']} tensors, "
                  f"{what}, GB/s", s, "native", "GB/s")
            if rf in s and "native" in s:
                target(f"B_{sub}_mount_vs_native", _timing.ratio_of_medians(s[rf]["rate"], s["native"]["rate"]),
                       0.8, f"{sub}: ringfeed mount GB/s / native GB/s")
                info(f"{sub}: own clocks (load and touch): ringfeed mount / native",
                     _timing.ratio_of_medians(s["native"]["own"], s[rf]["own"]))
    if "C" in res and res["C"]:
        s = summarize(res["C"], lambda r, secs: r["files"] / secs)
        summary["C"] = s
        table(f"C. {a.files} files of {a.file_size / 1e3:.0f} KB, listed then read by {a.threads} threads, files/s",
              s, rf if rf in s else next(iter(s)), "files/s")
        for who, rs in res["C"].items():
            print(f"  {who}: listing {med([r['list_seconds'] for r in rs]):.2f} s of the reader's own clock")
        peers = [w for w in ("s3fs", "rclone") if w in s]
        if rf in s and peers:
            best = max(peers, key=lambda w: med(s[w]["rate"]))
            target("C_mount_vs_best_peer", _timing.ratio_of_medians(s[rf]["rate"], s[best]["rate"]), 2.0,
                   f"ringfeed mount files/s / {best} files/s (the faster peer)")
    if "D" in res and res["D"]:
        sh = b.info["shards"]
        s = summarize(res["D"], lambda r, secs: r["samples"] / secs)
        summary["D"] = s
        table(f"D. webdataset, one epoch of {sh['count']} shards ({sh['bytes'] / 1e9:.2f} GB, {sh['samples']} "
              f"samples), samples/s", s, "pipe:curl", "samples/s")
        for who in s:
            if who != "pipe:curl" and "pipe:curl" in s:
                info(f"{who} samples/s / pipe:curl samples/s",
                     _timing.ratio_of_medians(s[who]["rate"], s["pipe:curl"]["rate"]))
        print("  (no target)")
    starts = {}
    for wname, w in res.items():
        items = [(who, rs) for _, g in w.values() for who, rs in g.items()] if wname == "B" else list(w.items())
        for who, rs in items:
            for r in rs:
                if "mount_start_s" in r:
                    starts.setdefault(who, []).append((r["mount_start_s"], r["mount_requests"]["requests"]))
    if starts:
        print("\nmount start-up (spawn to mounted and ready), every counted run:")
        for who, xs in starts.items():
            t = [x[0] * 1e3 for x in xs]
            print(f"  {who:<15} {med(t):7.1f} ms [{min(t):.1f}-{max(t):.1f}] over {len(t)} mounts, "
                  f"{med([x[1] for x in xs]):.0f} requests to the store")
        summary["mount_start_ms"] = {w: [x[0] * 1e3 for x in xs] for w, xs in starts.items()}
    for name, d in b.skipped.items():
        for who, why in d.items():
            print(f"  skipped {name} {who}: {why}")
    for n in b.notes:
        print(f"  note: {n}")
    summary["targets_met"] = checks
    summary["notes"] = b.notes
    json.dump(summary, open(f"{b.out}/summary.json", "w"), indent=1, default=str)
    b.cmds.close()
    print(f"\ncommands: {b.out}/commands.txt")
    print(open(f"{b.out}/commands.txt").read())
    print(f"per-run JSON, mount logs, summary.json: {b.out}")
    if os.environ.get("STRICT") == "1" and not all(checks.values()):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
