#!/usr/bin/env python3
"""Whole objects: ringfeed's read_object, write_object and load_safetensors
against curl and boto3, on one machine, each contender a whole process.

A benchmark program, not a test (docs/design.md): every figure is a median
over ROUNDS interleaved rounds (each round in its own seeded order, so no
contender always runs on a warmer machine or after the same neighbour), and ringfeed is judged by ratios of medians
measured in the same run, so a noisy machine moves all contenders alike.
MET / NOT MET marks the targets below; STRICT=1 turns a NOT MET into exit
status 1.

Servers, both started here and stopped at the end:
  nginx      on 127.0.0.1, serving DATA_DIR whose subfolder BUCKET holds the
             objects, so `GET /BUCKET/KEY` is both a plain HTTP URL and a
             path-style, unsigned S3 GetObject. The objects are kept hot in
             the page cache (checked with mincore before every run of every
             contender alike, re-read when pages left), so the network path
             and the client are what is timed.
  s3_server  the project's S3-compatible example server (SigV4, multipart
             uploads), for writes; its ROOT on tmpfs (/dev/shm), so no disk
             is timed; the objects written are deleted after every run.

A. read one SIZE object [4GiB], whole process (spawn to exit, CPU from
   wait4: interpreter start, import, connections and tear-down included):
     ringfeed http   python: b = ringfeed.read_object(http://.../KEY, **RF_READ)
                     (the bytes land in ringfeed's memory; length and three
                     1 MiB windows checked against the file after the clock)
     ringfeed into   ringfeed.read_object_into(http://..., buf): buf a
                     bytearray taken and touched (memset) before the clock,
                     so its own clock is the transfer into mapped memory; its
                     whole-process figures include taking that memory
     ringfeed s3     the same as ringfeed http with s3://BUCKET/KEY, s3_endpoint = nginx,
                     s3_unsigned (skipped, with the error, if refused)
     ringfeed get    `ringfeed get URL -o - >/dev/null` (skipped, with a
                     note, when this build's CLI has no `get`)
     boto3 tm        download_fileobj with the default TransferConfig (8 MB
                     parts, 10 threads) into a sink that counts and discards
                     (benches/boto3_transfer.py's DiscardSink: seekable, so
                     parts are written where they belong, none held)
     boto3 tm c8     the same with max_concurrency=8, 8 MiB parts
     curl            one curl, one connection, -o /dev/null
     curl x4         4 curl processes with -r covering a quarter each, in
                     parallel under one sh, timed together
   Targets: ringfeed http GB/s >= 0.9 x curl x4's, and >= 1.5 x the faster
   boto3's.
   First 8 MiB: the same contenders (ringfeed http, boto3 get_object().read(),
   curl) reading an 8 MiB object, whole process: what a job waits from
   starting a reader process to holding its first 8 MiB. curl's
   time_starttransfer (request to first byte, process start excluded) and
   the contenders' own clocks are printed beside.
B. write SIZE_W bytes [1GiB] from memory (read from a file before the
   clock), each run to a new key, to s3_server:
     ringfeed        ringfeed.write_object(s3://BUCKET/KEY, data, s3_endpoint,
                     credentials, **RF_WRITE) [part_size 8MiB, parts_in_flight 8]
     boto3 tm        upload_fileobj(BytesIO(data)) with the default
                     TransferConfig
     boto3 tm c8     the same with max_concurrency=8, 8 MiB parts
   Timed by the client's own clock around the call (the data's loading is
   set-up, not the write), CPU from getrusage of the client process over the
   same window (every thread; the server, shared by both, is not counted);
   the whole-process figures are in the JSON. Targets: ringfeed GB/s >= the
   faster boto3's; ringfeed CPU-s/GB <= 0.5 x the leaner boto3's.
C. a SIZE_ST [1536MiB] safetensors file (made here, the format written by
   hand: 8-byte header length, JSON header, tensors' bytes) from nginx:
     load            ringfeed.load_safetensors(http://...) (tensors pointing
                     into ringfeed's buffer)
     read            ringfeed.read_object(http://...) of the same file
   Whole process as in A. Target: load GB/s >= 0.9 x read GB/s.

Usage:
  benches/objects.py [--size 4GiB] [--write-size 1GiB] [--st-size 1536MiB]
                     [--rounds 3] [--only read,first,write,safetensors]
Environment (the flags win over it):
  SIZE, SIZE_W, SIZE_ST, ROUNDS, ONLY  the flags' defaults
  PYTHON        interpreter of the contenders (ringfeed and boto3 importable)
                [this one]
  RINGFEED_LIB, PYTHONPATH  passed on; when `import ringfeed` fails without
                them, PYTHONPATH gets the repo's bindings/python
  RINGFEED_BIN  the CLI, for `ringfeed get`    [target/release/ringfeed]
  S3_SERVER     the example server [target/release/examples/s3_server]
  RF_READ       JSON object of read_object keyword arguments [{}]
  RF_WRITE      JSON object of write_object keyword arguments
                [{"part_size": "8MiB", "parts_in_flight": 8}]
  DATA_DIR      where the objects are made and served [benches/out/objects/data]
  S3_ROOT       s3_server's ROOT [/dev/shm/ringfeed-objects-PID]
  NGINX_WORKERS nginx worker_processes [2]
  OUT_DIR       JSON per run, commands, summary [benches/out/objects/<time>]
  STRICT        1: exit 1 when a target is not met [0]
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import _timing

BUCKET = "ringfeed-bench"
MiB = 1 << 20
# The s3_server's fixed test credentials (examples/s3_server.rs).
ACCESS_KEY = "AKIARINGFEEDTEST"
SECRET_KEY = "ringfeed-test-secret-0123456789abcdef"
UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30,
         "KB": 10**3, "MB": 10**6, "GB": 10**9}


def size(text):
    t = str(text).strip().upper().replace(" ", "")
    num = t.rstrip("KMGIB")
    return int(float(num) * UNITS[t[len(num):]])


# --------------------------------------------------------------------------
# The contenders' side: `objects.py _run MODE SPEC_JSON`, one process each.
# Each prints one JSON object: bytes, and its own clock (seconds, cpu_seconds
# over the same window, from getrusage: every thread of the process).
# --------------------------------------------------------------------------

def _cpu():
    import resource
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _check_windows(buf, path):
    """Compares three 1 MiB windows (start, middle, end) of ``buf`` with the
    file the server serves: a misplaced part shows, at little cost."""
    # ObjectBuffer.memoryview(): Python 3.11 has no buffer protocol for
    # classes written in Python (PEP 688 is 3.12).
    mv = buf.memoryview() if hasattr(buf, "memoryview") else memoryview(buf).cast("B")
    n = os.path.getsize(path)
    with open(path, "rb") as f:
        for off in (0, n // 2 - 12345, max(0, n - MiB)):
            f.seek(off)
            want = f.read(MiB)
            if bytes(mv[off:off + len(want)]) != want:
                sys.exit(f"bytes at offset {off} differ from {path}")


def _boto3_client(endpoint, signed, pool):
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config
    kw = dict(s3={"addressing_style": "path"}, retries={"max_attempts": 3, "mode": "standard"})
    if pool:
        kw["max_pool_connections"] = pool
    if not signed:
        kw["signature_version"] = UNSIGNED
    creds = dict(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY) if signed else {}
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=Config(**kw), **creds)


def _transfer_config(concurrency):
    """boto3's default TransferConfig, or ``concurrency`` threads of 8 MiB parts."""
    from boto3.s3.transfer import TransferConfig
    if not concurrency:
        return TransferConfig()
    return TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB,
                          max_concurrency=concurrency, use_threads=True)


def run_contender(mode, spec):
    out = {"mode": mode}
    if mode == "rf_read":
        import ringfeed
        c0, t0 = _cpu(), time.perf_counter()
        b = ringfeed.read_object(spec["url"], **spec["config"])
        secs, cpu = time.perf_counter() - t0, _cpu() - c0
        n = len(b)
        if n != spec["bytes"]:
            sys.exit(f"read_object returned {n} bytes, expected {spec['bytes']}")
        _check_windows(b, spec["path"])
    elif mode == "rf_read_into":
        import ctypes
        import ringfeed
        # Memory taken from the kernel and touched before the clock: what
        # is left is the transfer into pages already mapped.
        b = bytearray(spec["bytes"])
        ctypes.memset((ctypes.c_char * len(b)).from_buffer(b), 1, len(b))
        c0, t0 = _cpu(), time.perf_counter()
        n = ringfeed.read_object_into(spec["url"], b, **spec["config"])
        secs, cpu = time.perf_counter() - t0, _cpu() - c0
        _check_windows(b, spec["path"])
    elif mode == "rf_write":
        import ringfeed
        with open(spec["path"], "rb") as f:
            data = f.read()
        c0, t0 = _cpu(), time.perf_counter()
        ringfeed.write_object(spec["url"], data, **spec["config"])
        secs, cpu = time.perf_counter() - t0, _cpu() - c0
        n = len(data)
    elif mode == "rf_safetensors":
        import ringfeed
        c0, t0 = _cpu(), time.perf_counter()
        tensors = ringfeed.load_safetensors(spec["url"], framework=spec["framework"], **spec["config"])
        secs, cpu = time.perf_counter() - t0, _cpu() - c0
        if len(tensors) != spec["tensors"]:
            sys.exit(f"load_safetensors gave {len(tensors)} tensors, expected {spec['tensors']}")
        out["tensor_type"] = type(next(iter(tensors.values()))).__module__ + "." + \
            type(next(iter(tensors.values()))).__name__
        n = spec["bytes"]
    elif mode == "import":
        # The start-up every Python contender pays before its first byte.
        c0, t0 = _cpu(), time.perf_counter()
        __import__(spec["module"])
        secs, cpu = time.perf_counter() - t0, _cpu() - c0
        n = 0
    elif mode == "boto3_read":
        from boto3_transfer import DiscardSink
        client = _boto3_client(spec["endpoint"], False, spec["concurrency"])
        cfg = _transfer_config(spec["concurrency"])
        sink = DiscardSink()
        c0, t0 = _cpu(), time.perf_counter()
        client.download_fileobj(BUCKET, spec["key"], sink, Config=cfg)
        secs, cpu = time.perf_counter() - t0, _cpu() - c0
        n = sink.written
        out.update(max_concurrency=cfg.max_request_concurrency, part_size=cfg.multipart_chunksize)
    elif mode == "boto3_get":
        client = _boto3_client(spec["endpoint"], False, None)
        c0, t0 = _cpu(), time.perf_counter()
        n = len(client.get_object(Bucket=BUCKET, Key=spec["key"])["Body"].read())
        secs, cpu = time.perf_counter() - t0, _cpu() - c0
    elif mode == "boto3_write":
        import io
        client = _boto3_client(spec["endpoint"], True, spec["concurrency"])
        cfg = _transfer_config(spec["concurrency"])
        with open(spec["path"], "rb") as f:
            data = f.read()
        c0, t0 = _cpu(), time.perf_counter()
        client.upload_fileobj(io.BytesIO(data), BUCKET, spec["key"], Config=cfg)
        secs, cpu = time.perf_counter() - t0, _cpu() - c0
        n = len(data)
        out.update(max_concurrency=cfg.max_request_concurrency, part_size=cfg.multipart_chunksize)
    else:
        sys.exit(f"unknown mode {mode}")
    if n != spec["bytes"]:
        sys.exit(f"{mode}: {n} bytes, expected {spec['bytes']}")
    out.update(bytes=n, seconds=secs, cpu_seconds=cpu)
    print(json.dumps(out))


# --------------------------------------------------------------------------
# The driver.
# --------------------------------------------------------------------------

class Bench:
    def __init__(self, a):
        self.a = a
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.out = os.path.abspath(os.environ.get("OUT_DIR") or f"{ROOT}/benches/out/objects/{stamp}")
        self.data = os.path.abspath(os.environ.get("DATA_DIR") or f"{ROOT}/benches/out/objects/data")
        os.makedirs(self.out, exist_ok=True)
        os.makedirs(f"{self.data}/{BUCKET}", exist_ok=True)
        self.cmds = open(f"{self.out}/commands.txt", "w")
        self.python = os.environ.get("PYTHON") or sys.executable
        self.env = dict(os.environ)
        self.procs = []  # servers started here, stopped at exit
        self.skipped = {}  # {workload: {contender: why}}

    # --- bookkeeping ------------------------------------------------------
    def note(self, text):
        self.cmds.write(text + "\n")
        self.cmds.flush()

    def show(self, argv, env=None):
        pre = " ".join(f"{k}={v}" for k, v in (env or {}).items())
        line = "$ " + (pre + " " if pre else "") + " ".join(_q(x) for x in argv)
        self.note(line)
        return line

    # --- servers ------------------------------------------------------------
    def start_nginx(self):
        ng = f"{self.out}/nginx"
        os.makedirs(f"{ng}/tmp", exist_ok=True)
        port = _free_port()
        workers = os.environ.get("NGINX_WORKERS", "2")
        # The settings of benches/http_vs_curl.sh, where each is explained:
        # sendfile from the page cache, no access log, keep-alive for as long
        # as a client wants, two workers for the two cores.
        conf = f"""worker_processes {workers};
pid {ng}/nginx.pid;
error_log {ng}/error.log warn;
events {{ worker_connections 4096; multi_accept on; }}
http {{
    access_log off;
    default_type application/octet-stream;
    types {{ }}
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 300s;
    keepalive_requests 10000000;
    open_file_cache max=1024 inactive=300s;
    client_body_temp_path {ng}/tmp/body;
    proxy_temp_path {ng}/tmp/proxy;
    fastcgi_temp_path {ng}/tmp/fastcgi;
    uwsgi_temp_path {ng}/tmp/uwsgi;
    scgi_temp_path {ng}/tmp/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {self.data};
        location / {{ }}
    }}
}}
"""
        open(f"{ng}/nginx.conf", "w").write(conf)
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        argv = [nginx, "-p", ng, "-e", f"{ng}/error.log", "-c", f"{ng}/nginx.conf"]
        print(self.show(argv))
        subprocess.run(argv, check=True)
        self.nginx_pidfile = f"{ng}/nginx.pid"
        self.base = f"http://127.0.0.1:{port}"
        _wait_port(port)

    def stop_nginx(self):
        pidfile = getattr(self, "nginx_pidfile", None)
        if not pidfile or not os.path.exists(pidfile):
            return
        pid = int(open(pidfile).read())
        try:
            os.kill(pid, signal.SIGQUIT)
            for _ in range(50):
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        print("nginx stopped")

    def start_s3_server(self):
        exe = os.environ.get("S3_SERVER") or f"{ROOT}/target/release/examples/s3_server"
        if not os.access(exe, os.X_OK):
            sys.exit(f"no s3_server at {exe}: cargo build --release --example s3_server, or set S3_SERVER")
        self.s3_root = os.environ.get("S3_ROOT") or f"/dev/shm/ringfeed-objects-{os.getpid()}"
        os.makedirs(self.s3_root, exist_ok=True)
        argv = [exe, self.s3_root, "--bucket", BUCKET]
        print(self.show(argv))
        # stdin a pipe: the server also stops if this driver dies.
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=open(f"{self.out}/s3_server.stderr", "wb"))
        self.s3_proc = p
        self.s3_endpoint = p.stdout.readline().decode().strip()
        if not self.s3_endpoint.startswith("http://"):
            sys.exit(f"s3_server printed {self.s3_endpoint!r}")
        print(f"s3_server at {self.s3_endpoint}, ROOT {self.s3_root}")

    def stop_s3_server(self):
        p = getattr(self, "s3_proc", None)
        if p and p.poll() is None:
            p.terminate()
            p.wait(10)
            print("s3_server stopped")
        root = getattr(self, "s3_root", None)
        if root and not os.environ.get("S3_ROOT"):
            shutil.rmtree(root, ignore_errors=True)

    def clear_s3_objects(self):
        """Deletes what the writes left in the server's ROOT (the bucket's
        objects and any upload leftovers), keeping the bucket."""
        for name in os.listdir(self.s3_root):
            p = os.path.join(self.s3_root, name)
            if name == BUCKET:
                for inner in os.listdir(p):
                    q = os.path.join(p, inner)
                    shutil.rmtree(q) if os.path.isdir(q) else os.unlink(q)
            else:
                shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.unlink(p)

    # --- data ---------------------------------------------------------------
    def make_object(self, key, n):
        """A file of n bytes whose 64 MiB blocks all differ (a counter at the
        start of each), so a part landed at the wrong offset shows."""
        path = f"{self.data}/{BUCKET}/{key}"
        if os.path.exists(path) and os.path.getsize(path) == n:
            return path
        block = bytearray(os.urandom(64 * MiB))
        with open(path + ".tmp", "wb") as f:
            left, i = n, 0
            while left:
                block[:8] = i.to_bytes(8, "little")
                k = min(left, len(block))
                f.write(memoryview(block)[:k])
                left -= k
                i += 1
        os.rename(path + ".tmp", path)
        return path

    def make_safetensors(self, key, n):
        """A safetensors file of about n bytes: float32 and bfloat16 tensors
        of a few shapes, as a model's layers come, the header written by hand
        (8-byte little-endian length, JSON, padded with spaces to 8 bytes)."""
        path = f"{self.data}/{BUCKET}/{key}"
        # F16, not BF16: numpy has no bfloat16, and the target is timed with
        # numpy arrays (see workload_safetensors).
        shapes = [("F32", 4, (4096, 1024)), ("F16", 2, (4096, 4096)), ("F32", 4, (1024,)),
                  ("F16", 2, (11008, 1024)), ("F32", 4, (257, 513))]
        header, off, i = {"__metadata__": {"format": "pt"}}, 0, 0
        while off < n:
            dt, w, shape = shapes[i % len(shapes)]
            nb = w
            for d in shape:
                nb *= d
            header[f"layer.{i:04d}.{dt.lower()}"] = {"dtype": dt, "shape": list(shape),
                                                     "data_offsets": [off, off + nb]}
            off += nb
            i += 1
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        total = 8 + len(h) + off
        if not (os.path.exists(path) and os.path.getsize(path) == total):
            block = os.urandom(64 * MiB)
            with open(path + ".tmp", "wb") as f:
                f.write(len(h).to_bytes(8, "little"))
                f.write(h)
                left = off
                while left:
                    k = min(left, len(block))
                    f.write(block[:k])
                    left -= k
            os.rename(path + ".tmp", path)
        return path, i, total

    # --- running ------------------------------------------------------------
    def contender_argv(self, mode, spec):
        return [self.python, os.path.abspath(__file__), "_run", mode, json.dumps(spec)]

    def run(self, tag, argv, files):
        """Runs one contender whole; returns its record or None on failure."""
        hot = _timing.ensure_hot(files) if files else {}
        # Free memory at the start: a contender that keeps the object in
        # fresh memory pays the kernel for reclaiming page cache when little
        # is free (sys time in the table), so it is recorded beside.
        free = _meminfo("MemFree")
        try:
            times, text = _timing.run_timed(argv, env=self.env)
        except subprocess.CalledProcessError as e:
            print(f"  {tag} FAILED (exit {e.returncode}): {e.stderr.strip()[-600:]}")
            return None
        rec = {"process_wall_s": times["wall_seconds"], "process_cpu_s": times["cpu_seconds"],
               "process_sys_s": times["sys_seconds"], "mem_free_at_start": free,
               "process_peak_rss_bytes": times["max_rss_bytes"], **hot}
        try:
            d = json.loads(text)
        except ValueError:
            d = None
        rec.update(d if isinstance(d, dict) else {"stdout": text})
        json.dump(rec, open(f"{self.out}/{tag}.json", "w"), indent=1)
        return rec

    def rounds(self, name, contenders, files, rounds, after=None):
        """Warm-up (one run each, not counted; a contender failing it is
        dropped with its error), then ROUNDS rounds, each in its own order.
        ``contenders``: {who: argv or callable(round) -> argv}."""
        print(f"\n== {name}: warm-up")
        live = {}
        for who, argv in contenders.items():
            a = argv(0) if callable(argv) else argv
            self.show(a)
            if self.run(f"{name}-warmup-{who}", a, files) is not None:
                live[who] = argv
            else:
                self.skipped.setdefault(name, {})[who] = "failed in the warm-up (see above)"
            if after:
                after()
        recs = {w: [] for w in live}
        names = list(live)
        print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        for r in range(1, rounds + 1):
            # A seeded shuffle, not a rotation: a rotation keeps who runs
            # right after whom, and a run that follows one which freed
            # gigabytes gets its memory from the kernel cheaply.
            order = random.Random(r).sample(names, len(names))
            print(f"round {r}: {' '.join(order)}")
            for who in order:
                argv = live[who](r) if callable(live[who]) else live[who]
                rec = self.run(f"{name}-{r}-{who}", argv, files)
                if after:
                    after()
                if rec is None:
                    sys.exit(f"{who} failed in round {r}")
                recs[who].append(rec)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        return recs

    # --- workloads ------------------------------------------------------------
    def probe_ringfeed(self):
        code = "import ringfeed, ringfeed._ffi as f; print(ringfeed.__file__, 'library', f.LIBRARY_PATH)"
        p = subprocess.run([self.python, "-c", code], env=self.env, capture_output=True, text=True)
        if p.returncode != 0 and "PYTHONPATH" not in os.environ:
            self.env["PYTHONPATH"] = f"{ROOT}/bindings/python"
            p = subprocess.run([self.python, "-c", code], env=self.env, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"{self.python} cannot import ringfeed: {p.stderr.strip()[-400:]}")
        missing = [f for f in ("read_object", "write_object", "load_safetensors")
                   if subprocess.run([self.python, "-c", f"import ringfeed; ringfeed.{f}"],
                                     env=self.env, capture_output=True).returncode != 0]
        q = subprocess.run([self.python, "-c", "import boto3, botocore, s3transfer, sys; "
                            "print('boto3', boto3.__version__, 'botocore', botocore.__version__, "
                            "'s3transfer', s3transfer.__version__, 'python', sys.version.split()[0])"],
                           env=self.env, capture_output=True, text=True)
        if q.returncode != 0:
            sys.exit(f"{self.python} cannot import boto3 (pip install boto3): {q.stderr.strip()[-300:]}")
        self.versions = {"ringfeed_module": p.stdout.strip(), "peers": q.stdout.strip(),
                         "curl": subprocess.run(["curl", "--version"], capture_output=True,
                                                text=True).stdout.splitlines()[0],
                         "RINGFEED_LIB": self.env.get("RINGFEED_LIB", ""),
                         "PYTHONPATH": self.env.get("PYTHONPATH", ""), "python": self.python}
        for k, v in self.versions.items():
            print(f"{k}: {v}")
            self.note(f"# {k}: {v}")
        if missing:
            sys.exit(f"this ringfeed has no {', '.join(missing)}")

    def workload_read(self, n, rounds):
        key = f"object-{n}.bin"
        path = self.make_object(key, n)
        url = f"{self.base}/{BUCKET}/{key}"
        rf_cfg = json.loads(os.environ.get("RF_READ") or "{}")
        spec = {"url": url, "config": rf_cfg, "bytes": n, "path": path}
        cont = {"ringfeed http": self.contender_argv("rf_read", spec),
                "ringfeed into": self.contender_argv("rf_read_into", spec)}
        # s3:// against nginx: unsigned, path-style GetObjects.
        s3cfg = dict(rf_cfg, s3_endpoint=self.base, s3_unsigned=True)
        s3spec = dict(spec, url=f"s3://{BUCKET}/{key}", config=s3cfg)
        cont["ringfeed s3"] = self.contender_argv("rf_read", s3spec)
        rf = os.environ.get("RINGFEED_BIN") or f"{ROOT}/target/release/ringfeed"
        if subprocess.run([rf, "get", "--help"], capture_output=True).returncode == 0:
            # To stdout, sent to /dev/null by sh: `-o /dev/null` is refused
            # (the file exists) and with --overwrite it would rename a
            # temporary file over /dev/null, replacing the device.
            cont["ringfeed get"] = ["sh", "-c", f"exec {_q(rf)} get {_q(url)} -o - >/dev/null"]
        else:
            msg = f"skipped: `{rf} get --help` failed (this build's CLI has no `get`)"
            print(f"ringfeed get: {msg}")
            self.skipped.setdefault("read", {})["ringfeed get"] = msg
        for who, conc in (("boto3 tm", 0), ("boto3 tm c8", 8)):
            cont[who] = self.contender_argv("boto3_read", {"endpoint": self.base, "key": key,
                                                           "concurrency": conc, "bytes": n})
        cont["curl"] = ["curl", "--silent", "--show-error", "--fail", "--http1.1",
                        "-o", "/dev/null", "-w", "%{size_download}\\n", url]
        cont["curl x4"] = ["sh", "-c", _curl_ranges_script(url, n, 4)]
        recs = self.rounds("read", cont, [path], rounds)
        for who, rs in recs.items():
            for r in rs:
                if who.startswith("curl"):
                    got = sum(int(x) for x in r["stdout"].split())
                    if got != n:
                        sys.exit(f"{who} read {got} bytes, expected {n}")
        return recs

    def workload_first(self, rounds):
        n = 8 * MiB
        key = "object-8MiB.bin"
        path = self.make_object(key, n)
        url = f"{self.base}/{BUCKET}/{key}"
        spec = {"url": url, "config": json.loads(os.environ.get("RF_READ") or "{}"), "bytes": n, "path": path}
        cont = {"ringfeed http": self.contender_argv("rf_read", spec),
                "boto3 get": self.contender_argv("boto3_get", {"endpoint": self.base, "key": key, "bytes": n}),
                "curl": ["curl", "--silent", "--show-error", "--fail", "--http1.1", "-o", "/dev/null",
                         "-w", "%{size_download} %{time_starttransfer} %{time_total}\\n", url],
                # What the Python contenders pay before any I/O.
                "import ringfeed": self.contender_argv("import", {"module": "ringfeed", "bytes": 0}),
                "import boto3": self.contender_argv("import", {"module": "boto3", "bytes": 0})}
        recs = self.rounds("first", cont, [path], rounds)
        for r in recs.get("curl", []):
            got, ttfb, total = r["stdout"].split()
            if int(got) != n:
                sys.exit(f"curl read {got} bytes, expected {n}")
            r["seconds"], r["time_starttransfer"] = float(total), float(ttfb)
        return recs

    def workload_write(self, n, rounds):
        src = self.make_object(f"write-source-{n}.bin", n)
        rf_cfg = {"part_size": "8MiB", "parts_in_flight": 8}
        rf_cfg.update(json.loads(os.environ.get("RF_WRITE") or "{}"))
        cfg = dict(rf_cfg, s3_endpoint=self.s3_endpoint, aws_access_key_id=ACCESS_KEY,
                   aws_secret_access_key=SECRET_KEY)
        stamp = time.strftime("%H%M%S")

        def rf(r):
            return self.contender_argv("rf_write", {"url": f"s3://{BUCKET}/rf-{stamp}-{r}", "config": cfg,
                                                    "path": src, "bytes": n})

        def boto(conc, tag):
            return lambda r: self.contender_argv("boto3_write", {
                "endpoint": self.s3_endpoint, "key": f"{tag}-{stamp}-{r}", "concurrency": conc,
                "path": src, "bytes": n})

        cont = {"ringfeed": rf, "boto3 tm": boto(0, "boto3"), "boto3 tm c8": boto(8, "boto3c8")}
        return self.rounds("write", cont, [src], rounds, after=self.clear_s3_objects)

    def workload_safetensors(self, n, rounds):
        key = f"model-{n}.safetensors"
        path, count, total = self.make_safetensors(key, n)
        url = f"{self.base}/{BUCKET}/{key}"
        cfg = json.loads(os.environ.get("RF_READ") or "{}")
        st = {"url": url, "config": cfg, "bytes": total, "tensors": count}
        # numpy arrays for the target: torch tensors cost `import torch`
        # (a second or more of start-up) that is not the loading's.
        cont = {"load": self.contender_argv("rf_safetensors", dict(st, framework="numpy")),
                "load torch": self.contender_argv("rf_safetensors", dict(st, framework="pt")),
                "read": self.contender_argv("rf_read", {"url": url, "config": cfg, "bytes": total,
                                                        "path": path})}
        self.st_info = {"bytes": total, "tensors": count}
        return self.rounds("safetensors", cont, [path], rounds)


# --------------------------------------------------------------------------
# Tables.
# --------------------------------------------------------------------------

def _q(s):
    import shlex
    return shlex.quote(str(s))


def _meminfo(field):
    """A /proc/meminfo field, in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return None


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _wait_port(port):
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"nothing listens on 127.0.0.1:{port}")


def _curl_ranges_script(url, n, k):
    """sh that runs k curls, each on a contiguous k-th of the object, in
    parallel, waits for each and fails when one does; each prints its byte
    count."""
    step = -(-n // k)
    lines = []
    for i in range(k):
        a, b = i * step, min(n, (i + 1) * step) - 1
        lines.append(f"curl --silent --show-error --fail --http1.1 -r {a}-{b} -o /dev/null "
                     f"-w '%{{size_download}}\\n' {_q(url)} & p{i}=$!")
    lines.append("; ".join(f"wait $p{i} || exit 1" for i in range(k)))
    return "\n".join(lines)


def summarize(recs, n, whole=True):
    """{who: medians and ranges}; whole: the process's clock, else the
    contender's own."""
    GB = n / 1e9
    s = {}
    for who, rs in recs.items():
        if whole:
            secs = [r["process_wall_s"] for r in rs]
            cpu = [r["process_cpu_s"] for r in rs]
        else:
            secs = [r["seconds"] for r in rs]
            cpu = [r["cpu_seconds"] for r in rs]
        # The other clock, printed beside: the contender's own, or the process's.
        other = [r["seconds"] for r in rs if "seconds" in r] if whole else [r["process_wall_s"] for r in rs]
        s[who] = {"gbs": [GB / x for x in secs], "secs": secs, "cpu_per_gb": [c / GB for c in cpu],
                  "sys_per_gb": [r["process_sys_s"] / GB for r in rs],
                  "other_secs": other, "rewarmed": sum(r.get("rewarmed", False) for r in rs)}
    return s


def med(xs):
    return statistics.median(xs)


def ratio(s, a, b, k="gbs"):
    return _timing.ratio_of_medians(s[a][k], s[b][k])


def table(title, s, ref, other_label="own s"):
    print(f"\n{title}")
    print(f"  {'contender':<15} {'GB/s [min-max]':>20} {'s':>8} {'CPU-s/GB':>9} {'sys':>6} {other_label:>8} "
          f"{'GB/s vs ' + ref:>18}")
    for who, v in s.items():
        g = v["gbs"]
        r = ratio(s, who, ref)[0] if ref in s else float("nan")
        own = f"{med(v['other_secs']):8.3f}" if v["other_secs"] else f"{'-':>8}"
        print(f"  {who:<15} {med(g):7.3f} [{min(g):.2f}-{max(g):.2f}] {med(v['secs']):8.3f} "
              f"{med(v['cpu_per_gb']):9.3f} {med(v['sys_per_gb']):6.3f} {own} {r:18.3f}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_run":
        return run_contender(sys.argv[2], json.loads(sys.argv[3]))
    doc = __doc__
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=doc.split("\n\n", 1)[1])
    p.add_argument("--size", type=size, default=size(os.environ.get("SIZE", "4GiB")))
    p.add_argument("--write-size", type=size, default=size(os.environ.get("SIZE_W", "1GiB")))
    p.add_argument("--st-size", type=size, default=size(os.environ.get("SIZE_ST", "1536MiB")))
    p.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", "3")))
    p.add_argument("--only", default=os.environ.get("ONLY", "read,first,write,safetensors"))
    a = p.parse_args()
    only = set(a.only.split(","))
    b = Bench(a)
    b.note(f"# {' '.join(_q(x) for x in sys.argv)}  (in {ROOT})")
    b.note(f"# size {a.size}, write size {a.write_size}, safetensors size {a.st_size}, rounds {a.rounds}")
    src = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    avail = _meminfo("MemAvailable")
    print(f"objects bench in {ROOT} ({src}); out {b.out}; MemAvailable {avail / 2**30:.1f} GiB")
    # The read object stays in the page cache while ringfeed holds a copy.
    if "read" in only and 2.3 * a.size > avail:
        print(f"warning: {a.size} B object x 2 (page cache + ringfeed's copy) is near MemAvailable")
    b.probe_ringfeed()
    summary = {"source": src, "rounds": a.rounds, "versions": b.versions, "skipped": b.skipped}
    checks = {}

    def target(name, r, op, bound, label):
        ok = r[0] >= bound if op == ">=" else r[0] <= bound
        checks[name] = ok
        summary.setdefault("targets", {})[name] = {"ratio_of_medians": r[0], "round_min": r[1],
                                                   "round_max": r[2], "bound": f"{op} {bound}",
                                                   "met": ok}
        print(f"  {label:<52} {_timing.fmt_ratio(r):<28} target {op} {bound:<4} "
              f"{'MET' if ok else 'NOT MET'}")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if only & {"read", "first", "safetensors"}:
            b.start_nginx()
        if "write" in only:
            b.start_s3_server()
        res = {}
        if "read" in only:
            res["read"] = b.workload_read(a.size, a.rounds)
        if "first" in only:
            # Short runs: three times the rounds, for steadier medians.
            res["first"] = b.workload_first(3 * a.rounds)
        if "write" in only:
            res["write"] = b.workload_write(a.write_size, a.rounds)
        if "safetensors" in only:
            res["safetensors"] = b.workload_safetensors(a.st_size, a.rounds)
    finally:
        b.stop_nginx()
        b.stop_s3_server()

    print(f"\nmedians of {a.rounds} rounds [min-max]; bench at {src}; ringfeed {b.versions['ringfeed_module']}; "
          f"{b.versions['peers']}")
    if "read" in res:
        s = summarize(res["read"], a.size)
        ref = "curl x4"
        table(f"A. read one {a.size / 1e9:.2f} GB object from nginx (whole process: spawn to exit, "
              f"CPU of the process tree)", s, ref)
        boto = [w for w in ("boto3 tm", "boto3 tm c8") if w in s]
        if "ringfeed http" in s and ref in s:
            target("read_vs_curl_x4", ratio(s, "ringfeed http", ref), ">=", 0.9,
                   "ringfeed http GB/s / curl x4 GB/s")
        if "ringfeed http" in s and boto:
            best = max(boto, key=lambda w: med(s[w]["gbs"]))
            target("read_vs_boto3", ratio(s, "ringfeed http", best), ">=", 1.5,
                   f"ringfeed http GB/s / {best} GB/s (the faster boto3)")
        print("  sys: the kernel's share of CPU-s/GB (whole process); ringfeed's includes taking "
              f"{a.size / 1e9:.2f} GB of fresh memory (page faults, reclaiming page cache), which the "
              "discarding sinks of boto3 and curl never need")
        for w in ("ringfeed http", "ringfeed into", "ringfeed s3"):
            if w in res["read"]:
                per = ", ".join(f"{r['process_sys_s']:.1f} s sys at {r['mem_free_at_start'] / 2**30:.1f} GiB free"
                                for r in res["read"][w])
                print(f"  {w} per round: {per}")
        for w in ("ringfeed http", "ringfeed into", "ringfeed s3"):
            if w in s:
                own = [a.size / 1e9 / x for x in s[w]["other_secs"]]
                print(f"  {w} own clock (the read call only): {med(own):.3f} GB/s")
        for who, why in b.skipped.get("read", {}).items():
            print(f"  {who}: {why}")
        summary["read"] = {"bytes": a.size, "whole_process": s}
    if "first" in res:
        s = summarize(res["first"], 8 * MiB)
        print(f"\nA'. first 8 MiB: whole process (start to 8 MiB in hand and exit), medians of "
              f"{3 * a.rounds} rounds in ms; 'import' rows: the interpreter and the import alone")
        print(f"  {'contender':<15} {'process ms [min-max]':>24} {'own ms':>8} {'CPU ms':>8}")
        for who, v in s.items():
            ms = [x * 1e3 for x in v["secs"]]
            own = f"{med(v['other_secs']) * 1e3:8.1f}" if v["other_secs"] else f"{'-':>8}"
            cpu = med([r["process_cpu_s"] for r in res["first"][who]]) * 1e3
            print(f"  {who:<15} {med(ms):8.1f} [{min(ms):.1f}-{max(ms):.1f}]{'':4} {own} {cpu:8.1f}")
        if "curl" in res["first"]:
            st = med([r["time_starttransfer"] for r in res["first"]["curl"]]) * 1e3
            print(f"  curl time_starttransfer (request to first byte): {st:.2f} ms")
        print("  own: ringfeed read_object / boto3 get_object().read() / curl time_total, "
              "interpreter start and import excluded")
        summary["first_8MiB"] = s
    if "write" in res:
        s = summarize(res["write"], a.write_size, whole=False)
        table(f"B. write {a.write_size / 1e9:.2f} GB from memory to s3_server (the client's clock around "
              f"the call; client CPU only; 'sys', 'proc s': the whole process's)", s, "boto3 tm", other_label="proc s")
        boto = [w for w in ("boto3 tm", "boto3 tm c8") if w in s]
        if "ringfeed" in s and boto:
            fast = max(boto, key=lambda w: med(s[w]["gbs"]))
            lean = min(boto, key=lambda w: med(s[w]["cpu_per_gb"]))
            target("write_vs_boto3_gbs", ratio(s, "ringfeed", fast), ">=", 1.0,
                   f"ringfeed GB/s / {fast} GB/s (the faster boto3)")
            target("write_vs_boto3_cpu", ratio(s, "ringfeed", lean, "cpu_per_gb"), "<=", 0.5,
                   f"ringfeed CPU-s/GB / {lean}'s (the leaner boto3)")
        summary["write"] = {"bytes": a.write_size, "call": s,
                            "whole_process": summarize(res["write"], a.write_size)}
    if "safetensors" in res:
        n = b.st_info["bytes"]
        s = summarize(res["safetensors"], n)
        table(f"C. safetensors, {n / 1e9:.2f} GB, {b.st_info['tensors']} tensors, from nginx "
              f"(whole process)", s, "read")
        if "load" in s and "read" in s:
            target("safetensors_load_vs_read", ratio(s, "load", "read"), ">=", 0.9,
                   "load_safetensors GB/s / read_object GB/s")
        t = res["safetensors"].get("load", [{}])[0].get("tensor_type")
        if t:
            print(f"  load_safetensors gave {t} values")
        summary["safetensors"] = {**b.st_info, "whole_process": s}
    rewarmed = sum(v.get("rewarmed", False) for w in res.values() for rs in w.values() for v in rs)
    if rewarmed:
        print(f"  note: objects had left the page cache before {rewarmed} runs and were re-read first")
    summary["targets_met"] = {k: v for k, v in checks.items()}
    json.dump(summary, open(f"{b.out}/summary.json", "w"), indent=1)
    b.cmds.close()
    print(f"\ncommands: {b.out}/commands.txt")
    print(open(f"{b.out}/commands.txt").read())
    print(f"per-run JSON and summary.json: {b.out}")
    if os.environ.get("STRICT") == "1" and not all(checks.values()):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
