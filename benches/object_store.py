#!/usr/bin/env python3
"""The driver of benches/object_store.sh (see its header for what runs and
why): starts the object-store emulator per scenario, runs the contenders in
interleaved rounds through benches/timed.py, reads the emulator's counters
between them, prints medians, ratios of medians and PASS/MISS.

    object_store.py   (every setting from the environment the .sh sets)
"""

import json
import mmap
import os
import shlex
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
env = os.environ.get
RF = env("RF")
EMU = env("EMU")
PEER_PY = env("PEER_PY")
DATA = env("DATA_DIR")
OUT = env("OUT_DIR")
ROUNDS = int(env("ROUNDS", "3"))
SCENARIOS = env("SCENARIOS", "A B C D E F L").split()
PASSES = int(env("PASSES", "3"))
STRICT = env("STRICT", "0") == "1"
PART = env("PART", "8MiB")
RATE_N = int(env("RATE_N", "200"))
SHARDS = int(env("SHARDS", "16"))
SMALL_SHARDS = int(env("SMALL_SHARDS", "1000"))
ONLY = env("CONTENDERS", "").split()
# The memory every contender starts on (see `settle`): warm, cold or asis.
PAGES = env("PAGES", "asis")
PAGES_BYTES = 2 << 30
SKIPS = json.loads(env("SKIPS", "{}"))  # peer -> why it cannot run

UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30,
         "KB": 10**3, "MB": 10**6, "GB": 10**9}


def size(text):
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    return int(float(num) * UNITS[t[len(num):]])


PART_BYTES = size(PART)
# The models of the issue: first byte lognormal (median:p99) and bandwidth
# per connection; 1250 MB/s per object (one stored part) throughout.
MODELS = {
    "A": ["--latency", "20ms:120ms", "--conn-rate", "90MB/s"],
    "B": ["--latency", "50ms:300ms", "--conn-rate", "60MB/s"],
    "C": ["--latency", "off", "--conn-rate", "90MB/s"],
}
P99_S = {"A": 0.120, "B": 0.300}
CREDS = {"AWS_ACCESS_KEY_ID": "AKIAEMULATOR", "AWS_SECRET_ACCESS_KEY": "emulator-does-not-check",
         "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}


def log(*a):
    print(*a, flush=True)


class Emulator:
    def __init__(self, name, flags):
        argv = [EMU, DATA, "--unlimited", "--object-rate", "1250MB/s", *flags]
        self.argv = argv
        self.stderr = open(f"{OUT}/emulator-{name}.stderr", "w")
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.stderr, text=True)
        self.url = self.p.stdout.readline().strip()
        if not self.url.startswith("http://"):
            sys.exit(f"object_store: the emulator did not start: {shlex.join(argv)}")

    def call(self, what):
        with urllib.request.urlopen(f"{self.url}/_emulator/{what}", timeout=30) as r:
            return json.loads(r.read())

    def stop(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


def keys(bucket, n):
    return [f"shard-{i:06d}.tar" for i in range(n)]


def sizes_of(bucket, ks):
    return [os.path.getsize(os.path.join(DATA, bucket, k)) for k in ks]


def curl_config(path, base, bucket, ks, part, passes=1):
    """One transfer per `part` range of every key, each to /dev/null, the
    whole list `passes` times."""
    n = 0
    with open(path, "w") as f:
        for k, sz in list(zip(ks, sizes_of(bucket, ks))) * passes:
            for off in range(0, sz, part):
                end = min(off + part, sz) - 1
                f.write(("next\n" if n else "") + curl_transfer(f"{base}/{bucket}/{k}", off, end))
                n += 1
    return n


def curl_transfer(url, first, last):
    """One block of a curl config: options other than --parallel* hold for
    one block only (`next` between blocks), so each carries its own."""
    return (f'url = "{url}"\noutput = "/dev/null"\nheader = "Range: bytes={first}-{last}"\n'
            'silent\nshow-error\nfail\nwrite-out = "%{size_download}\\n"\n')


def contenders(scn, emu, bucket, ks, passes=1):
    """name -> argv (None: skipped, with the reason in SKIPS); each reads
    every key `passes` times (ringfeed: epochs)."""
    last = len(ks) - 1
    width = 6
    s3_url = f"s3://{bucket}/shard-{{{0:0{width}d}..{last:0{width}d}}}.tar"
    ep = ["--endpoint-url", emu.url]
    rf = [RF, "bench", s3_url, "--json", *ep] + (["--epochs", str(passes)] if passes > 1 else [])
    c = {"rf": rf, "rf_rif16": rf + ["--reads-in-flight", "16"]}
    if scn in ("D",):
        return {"rf": rf + ["--chunk-size", PART]}
    if scn in ("C", "E"):
        return {"rf": rf}
    c["boto3"] = [PEER_PY, f"{ROOT}/benches/boto3_ranged.py", "--endpoint", emu.url,
                  "--bucket", bucket, "--threads", "32", "--part-size", PART,
                  "--epochs", str(passes), *ks]
    if passes == 1:
        c["s3torch"] = [PEER_PY, f"{ROOT}/benches/_s3torch_read.py", emu.url, bucket, *ks]
        c["s3dlio"] = [PEER_PY, f"{ROOT}/benches/_s3dlio_read.py", emu.url, bucket, *ks]
    for n in (32, 64, 128):
        cfg = f"{OUT}/curl-{bucket}-x{passes}.cfg"
        curl_config(cfg, emu.url, bucket, ks, PART_BYTES, passes)
        c[f"curl{n}"] = ["curl", "--parallel", "--parallel-immediate", "--parallel-max", str(n), "-s",
                         "-K", cfg]
    return c


def objects_contenders(emu, bucket, key, sz):
    """Scenario F: one whole object."""
    c = {"get": [RF, "get", f"s3://{bucket}/{key}", "-o", "/dev/null",
                 "--endpoint-url", emu.url]}
    for n, part in ((4, -(-sz // 4)), (64, PART_BYTES)):
        cfg = f"{OUT}/curl-{bucket}-{n}.cfg"
        with open(cfg, "w") as f:
            for off in range(0, sz, part):
                end = min(off + part, sz) - 1
                f.write(("next\n" if off else "") + curl_transfer(f"{emu.url}/{bucket}/{key}", off, end))
        c[f"curl{n}"] = ["curl", "--parallel", "--parallel-immediate", "--parallel-max", str(n), "-s",
                         "-K", cfg]
    return c


def settle():
    """Puts the machine's free memory in the same state before every
    contender. On a VM whose balloon reports free pages to its host
    (VIRTIO_BALLOON_F_REPORTING), a page free for ~2 s is the host's again,
    and its next first touch faults on the host too: 1.5-3 ms per MB here
    (benches/first_touch.sh) against ~0.05 for a page freed a moment ago.
    Without this, a contender that follows one that freed much memory
    starts on backed pages, and the order of a round decides part of its
    time. warm: 2 GiB of huge pages touched and freed just before (backed, as on a
    host that does not take free memory back); cold: 5 s idle before
    (every first touch faults on the host); asis: nothing."""
    if PAGES == "warm":
        # Huge pages, as the readers' arenas and buffers mostly are: 2 MiB
        # blocks freed whole come back whole.
        m = mmap.mmap(-1, PAGES_BYTES)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            m.madvise(mmap.MADV_HUGEPAGE)
        m[::4096] = bytes(len(range(0, PAGES_BYTES, 4096)))
        m.close()
    elif PAGES == "cold":
        time.sleep(5)


def cpu_seconds(pid):
    """User and system CPU seconds process `pid` has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy():
    """(busy, total) CPU seconds of the whole machine since boot."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - idle) / hz, sum(ticks) / hz


def run_one(tag, name, argv, emu, expect_bytes):
    out = f"{OUT}/{tag}-{name}.json"
    emu.call("reset")
    settle()
    e = dict(os.environ, **CREDS, AWS_ENDPOINT_URL=emu.url, AWS_ENDPOINT_URL_S3=emu.url)
    # The emulator's CPU and the machine's: on a machine of few CPUs the
    # emulator and the client share them, and a client that spends more
    # leaves the emulator less.
    emu_cpu0, (busy0, total0) = cpu_seconds(emu.p.pid), machine_busy()
    r = subprocess.run([sys.executable, f"{ROOT}/benches/timed.py", out, "--", *argv], env=e)
    emu_cpu, (busy1, total1) = cpu_seconds(emu.p.pid) - emu_cpu0, machine_busy()
    st = emu.call("stats")
    if r.returncode != 0:
        log(f"  {name}: FAILED (exit {r.returncode}; {out}.stderr)")
        return None
    d = json.load(open(out))
    if "stdout" in d and name.startswith("curl"):
        got = sum(int(x) for x in d["stdout"].split())
        if got != expect_bytes:
            log(f"  {name}: read {got} bytes, expected {expect_bytes}")
            return None
    # Every contender is counted in the objects' bytes; the emulator's own
    # count must cover them (retries and hedges may add).
    if st["bytes"] < expect_bytes:
        log(f"  {name}: the emulator sent {st['bytes']} bytes, fewer than the {expect_bytes} asked")
        return None
    f = {"gbs": expect_bytes / 1e9 / d["process_wall_s"],
         "cpu": d["process_cpu_s"] / (expect_bytes / 1e9), "wall": d["process_wall_s"],
         "t_mean": st["transfers_mean"], "t_max": st["transfers_max"],
         "requests": st["requests"], "gets": st["gets"], "slow_down": st["slow_down"],
         "served": st["bytes"], "emu_cpu": emu_cpu / (expect_bytes / 1e9),
         "busy": (busy1 - busy0) / max(total1 - total0, 1e-9)}
    if "stats" in d:
        f["ttfb"] = d["stats"].get("time_to_first_batch_ns", 0) / 1e9
    json.dump({"contender": f, "emulator": st}, open(f"{out}.summary", "w"))
    return f


def rounds(tag, cs, emu, expect_bytes):
    names = [n for n in cs if (not ONLY or n in ONLY or n.startswith("curl") and "curl" in ONLY)
             and n not in SKIPS]
    rows = {n: [] for n in names}
    for r in range(1, ROUNDS + 1):
        order = names[(r - 1) % len(names):] + names[:(r - 1) % len(names)]
        log(f"  round {r}: {' '.join(order)}")
        for n in order:
            f = run_one(f"{tag}-r{r}", n, cs[n], emu, expect_bytes)
            if f is not None:
                rows[n].append(f)
    med = {}
    for n, fs in rows.items():
        if not fs:
            continue
        med[n] = {k: statistics.median(x[k] for x in fs) for k in fs[0]}
        med[n]["n"] = len(fs)
    return med


LABEL = {"rf": "ringfeed, defaults", "rf_rif16": "ringfeed, reads_in_flight=16",
         "boto3": "boto3, 8 MiB ranges, 32 threads", "s3torch": "s3torchconnector (CRT)",
         "s3dlio": "s3dlio", "curl32": "curl, 32 parallel ranged GETs",
         "curl64": "curl, 64 parallel ranged GETs", "curl128": "curl, 128 parallel ranged GETs",
         "get": "ringfeed get", "curl4": "curl x4 ranged"}


def table(title, med, skipped=()):
    log(f"\n{title}: medians of {ROUNDS} rounds, whole process")
    log(f"  {'client':<34} {'GB/s':>6} {'CPU-s/GB':>9} {'transfers mean/max':>19} {'requests':>9} {'503s':>6}"
        f" {'emulator CPU-s/GB':>18} {'machine busy':>13}")
    for n, m in med.items():
        log(f"  {LABEL.get(n, n):<34} {m['gbs']:>6.2f} {m['cpu']:>9.3f} {m['t_mean']:>11.1f} / {m['t_max']:<5.0f}"
            f" {m['requests']:>9.0f} {m['slow_down']:>6.0f} {m['emu_cpu']:>18.3f} {m['busy']:>12.0%}")
    for n in skipped:
        log(f"  {LABEL.get(n, n):<34} SKIPPED: {SKIPS[n]}")


checks = {}
summary = {"rf": RF, "rounds": ROUNDS, "scenarios": {}}


def target(name, value, op, bound, what):
    ok = value >= bound if op == ">=" else value <= bound
    checks[name] = ok
    log(f"  {what:<62} {value:7.3f}  target {op} {bound:<5} {'PASS' if ok else 'MISS'}")


def ceiling(med):
    cs = {n: med[n]["gbs"] for n in ("curl32", "curl64", "curl128") if n in med}
    if not cs:
        return None, None
    best = max(cs, key=cs.get)
    return best, cs[best]


def main():
    os.makedirs(OUT, exist_ok=True)
    big = keys("big", SHARDS)
    big_bytes = sum(sizes_of("big", big))
    results = {}
    for scn in SCENARIOS:
        if scn in ("A", "B", "C"):
            log(f"\n== scenario {scn}: {' '.join(MODELS[scn])}, {SHARDS} shards, {big_bytes / 1e9:.2f} GB")
            emu = Emulator(scn, MODELS[scn])
            log(f"$ {shlex.join(emu.argv)}")
            cs = contenders(scn, emu, "big", big)
            for n, a in cs.items():
                log(f"  {n}: $ {shlex.join(a)[:300]}")
            results[scn] = rounds(scn, cs, emu, big_bytes)
            emu.stop()
            table(f"scenario {scn}", results[scn], [n for n in cs if n in SKIPS])
        elif scn == "L":
            log(f"\n== scenario L: {' '.join(MODELS['A'])}, {SHARDS} shards, {PASSES} passes, "
                f"{PASSES * big_bytes / 1e9:.2f} GB")
            emu = Emulator("L", MODELS["A"])
            log(f"$ {shlex.join(emu.argv)}")
            cs = contenders("L", emu, "big", big, PASSES)
            for n, a in cs.items():
                log(f"  {n}: $ {shlex.join(a)[:300]}")
            results["L"] = rounds("L", cs, emu, PASSES * big_bytes)
            emu.stop()
            table(f"scenario L ({PASSES} passes)", results["L"])
        elif scn == "D":
            flags = ["--latency", "20ms:120ms", "--rate-limit", f"{RATE_N}/s", "--rate-scope", "bucket"]
            log(f"\n== scenario D: {' '.join(flags)}, {PART} parts")
            emu = Emulator("D", flags)
            log(f"$ {shlex.join(emu.argv)}")
            cs = contenders("D", emu, "big", big)
            results["D"] = rounds("D", cs, emu, big_bytes)
            emu.stop()
            table("scenario D", results["D"])
        elif scn == "E":
            small = keys("small", SMALL_SHARDS)
            small_bytes = sum(sizes_of("small", small))
            log(f"\n== scenario E: {' '.join(MODELS['A'])}, {SMALL_SHARDS} shards, {small_bytes / 1e9:.2f} GB")
            emu = Emulator("E", MODELS["A"])
            log(f"$ {shlex.join(emu.argv)}")
            cs = contenders("E", emu, "small", small)
            results["E"] = rounds("E", cs, emu, small_bytes)
            emu.stop()
            table("scenario E", results["E"])
        elif scn == "F":
            sz = os.path.getsize(os.path.join(DATA, "obj", "shard-000000.tar"))
            log(f"\n== scenario F: {' '.join(MODELS['A'])}, one object of {sz / 2**30:.2f} GiB")
            emu = Emulator("F", MODELS["A"])
            log(f"$ {shlex.join(emu.argv)}")
            cs = objects_contenders(emu, "obj", "shard-000000.tar", sz)
            for n, a in cs.items():
                log(f"  {n}: $ {shlex.join(a)[:300]}")
            results["F"] = rounds("F", cs, emu, sz)
            emu.stop()
            table("scenario F", results["F"])

    log("\n== targets (ratios of medians, whole process)")
    for scn in ("A", "B", "L"):
        m = results.get(scn, {})
        best, ceil = ceiling(m)
        if "rf" in m and ceil:
            target(f"{scn}_vs_ceiling", m["rf"]["gbs"] / ceil, ">=", 0.9,
                   f"{scn}: ringfeed defaults / curl ceiling ({best}) GB/s")
        if "rf" in m and "boto3" in m:
            target(f"{scn}_vs_boto3", m["rf"]["gbs"] / m["boto3"]["gbs"], ">=", 1.75,
                   f"{scn}: ringfeed defaults / boto3 32 threads GB/s")
        if scn != "L" and "rf" in m and "C" in results and "rf" in results["C"]:
            target(f"{scn}_cpu_vs_C", m["rf"]["cpu"] / results["C"]["rf"]["cpu"], "<=", 1.25,
                   f"{scn}: ringfeed CPU-s/GB / its own with the latency model off (C)")
    if "D" in results and "rf" in results["D"]:
        # The part size is ringfeed's own: the bytes sent per GET answered
        # with data (a chunk's data region, a little under the chunk). The
        # emulator's `gets` counts those only: a 503 is `slow_down`.
        m = results["D"]["rf"]
        part = m["served"] / max(1.0, m["gets"])
        allowed = RATE_N * part / 1e9
        target("D_vs_limit", m["gbs"] / allowed, ">=", 0.9,
               f"D: ringfeed GB/s / ({RATE_N}/s x {part / 1e6:.2f} MB = {allowed:.2f} GB/s)")
    if "E" in results and "rf" in results["E"]:
        if "A" in results and "rf" in results["A"]:
            target("E_vs_A", results["E"]["rf"]["gbs"] / results["A"]["rf"]["gbs"], ">=", 0.5,
                   "E: ringfeed small shards / large shards (A) GB/s")
        target("E_first_batch", results["E"]["rf"].get("ttfb", 0) / P99_S["A"], "<=", 3.0,
               "E: ringfeed first batch / the model's p99 first byte")
    if "F" in results and "get" in results["F"]:
        m = results["F"]
        if "curl4" in m:
            target("F_vs_curl4", m["get"]["gbs"] / m["curl4"]["gbs"], ">=", 0.9,
                   "F: ringfeed get / curl x4 ranged GB/s")
        if "curl64" in m:
            target("F_vs_ceiling", m["get"]["gbs"] / m["curl64"]["gbs"], ">=", 0.9,
                   "F: ringfeed get / curl 64 parallel ranged GB/s (the ceiling)")
    for n, why in SKIPS.items():
        log(f"  {LABEL.get(n, n)}: SKIPPED ({why})")
    summary["scenarios"] = results
    summary["targets"] = {k: "PASS" if v else "MISS" for k, v in checks.items()}
    summary["skipped"] = SKIPS
    json.dump(summary, open(f"{OUT}/summary.json", "w"), indent=1)
    log(f"\nraw JSON and summary.json: {OUT}")
    if STRICT and not all(checks.values()):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
