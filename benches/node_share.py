"""Four consumers on one node (2 ranks x 2 DataLoader workers), three ways:

  (a) four standalone engines, one per consumer process (node="off");
  (b) four consumer processes attached to one node engine (`ringfeed node`,
      started by this script and timed with the rest);
  (c) the reference: one standalone engine, one consumer, all the data.

Each round runs the modes in a rotated order and times every process of a
mode over the same window (from the first spawn to the last exit): GB/s delivered, CPU-s per GB of every process
(wait4), the peak of the summed PSS of the live processes (sampled every
250 ms from /proc/<pid>/smaps_rollup: shared memory counted once), the summed
peak RSS (wait4; counts an arena mapped by two processes twice) and the peak
summed locked memory (VmLck). Prints the medians and the ratios of the
medians against (c), with per-round ranges; and (b)'s GB/s over the window
to its last consumer's exit, which leaves out the engine's linger and exit
after the job (an engine started on demand stays a linger for the next one).

usage: [EPOCHS=1] [BATCH=256] [STREAMS=1] [NODE_BUDGET=bytes] [SOURCE=http]
       [NODE_CONFIG='{"net_threads": 2}'] (more keys of the engine's own)
       [BASELINE=<another ringfeed program>] (adds (B): (b) with that
       program's engine, in the same rounds, for an A/B of two builds)
       [MODES=ab] (which of (a) and (b) run beside (c))
       .venv/bin/python benches/node_share.py RINGFEED_PROGRAM ROUNDS SHARD...
SOURCE=http serves the shards' folder with `ringfeed serve` and reads them
over http://127.0.0.1. Then it measures a consumer attaching to a running
engine and getting its first batch.
Consumers are forked from this script after it imported this checkout's
`ringfeed` package with the release library (benches/_checkout.py), as a
DataLoader forks its workers: no mode pays a Python start-up per consumer.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _checkout import use_checkout


def consume(cfg, out_fd, first_only=False):
    """A consumer: every batch of its configuration (or only the first);
    writes its report."""
    import ringfeed

    urls = cfg.pop("urls")
    t0 = time.monotonic_ns()
    n = 0
    first = None
    with ringfeed.Loader(urls, **cfg) as loader:
        for b in loader:
            if first is None:
                first = time.monotonic_ns() - t0
            n += b.nbytes
            if first_only:
                break
    os.write(out_fd, json.dumps({"bytes": n, "first_batch_ns": first}).encode())


class Forked:
    """A forked consumer process and the pipe of its report."""

    def __init__(self, cfg, first_only=False):
        r, w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(r)
            code = 0
            try:
                consume(cfg, w, first_only)
            except BaseException as e:  # noqa: BLE001 - reported, then exit
                print(f"consumer failed: {e!r}", file=sys.stderr)
                code = 1
            os._exit(code)
        os.close(w)
        self.r = r

    def report(self):
        data = b""
        while chunk := os.read(self.r, 65536):
            data += chunk
        os.close(self.r)
        return json.loads(data)


def read_kib(path, key):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def start_engine(program, shards, batch_size, streams, node_budget, linger_ms):
    """`ringfeed node` for the job on a new socket; (process, socket)."""
    folder = tempfile.mkdtemp(prefix="rf-node-bench-")
    socket = os.path.join(folder, "node.sock")
    # Its log, printed if a consumer of it fails.
    log = open(os.path.join(folder, "engine.log"), "w+")
    engine = subprocess.Popen(
        [program, "node", *shards, "--socket", socket, "--linger-ms", str(linger_ms),
         "--batch-size", str(batch_size), "--workers", str(streams),
         "--config", json.dumps({"world_size": 2, "loader_workers": 2,
                                 **json.loads(os.environ.get("NODE_CONFIG", "{}"))}),
         *(["--memory-budget", node_budget] if node_budget else [])],
        stderr=log,
    )
    engine.log = log
    while not os.path.exists(socket):
        if engine.poll() is not None:
            sys.exit(f"the node engine exited with {engine.returncode}")
        time.sleep(0.005)
    return engine, socket


def attach_ms(program, shards, batch_size, streams, node_budget, times=7):
    """Median ms for a consumer to attach to a running engine and get its
    first batch (the engine already served one consumer: it is started and
    has resolved the dataset)."""
    engine, socket = start_engine(program, shards, batch_size, streams, node_budget, 10000)
    cfg = dict(urls=shards, batch_size=batch_size, rank=0, world_size=2, loader_worker=0,
               loader_workers=2, workers=streams, node=socket)
    got = []
    for _ in range(times + 1):
        p = Forked(dict(cfg), first_only=True)
        out = p.report()
        os.waitpid(p.pid, 0)
        got.append(out["first_batch_ns"] / 1e6)
    engine.terminate()
    engine.wait()
    return statistics.median(got[1:])


def run_mode(mode, program, shards, batch_size, epochs, streams, node_budget=None):
    job = dict(urls=shards, batch_size=batch_size, epochs=epochs)
    procs = []
    engine = None
    t0 = time.monotonic()
    if mode in "bB":
        engine, socket = start_engine(program, shards, batch_size, streams, node_budget, 50)
    if mode == "c":
        layouts = [dict()]
    else:
        layouts = [
            dict(rank=r, world_size=2, loader_worker=w, loader_workers=2, workers=streams,
                 node=(socket if mode in "bB" else "off"))
            for r in (0, 1) for w in (0, 1)
        ]
    for extra in layouts:
        cfg = dict(job, **extra)
        procs.append(Forked(cfg))
    live = [p.pid for p in procs] + ([engine.pid] if engine else [])
    usage = {}
    peak_pss = peak_lck = 0
    sampled = 0.0
    while len(usage) < len(live):
        pid, _, ru = os.wait4(-1, os.WNOHANG)
        if pid:
            usage[pid] = ru
            if not engine or pid != engine.pid:
                consumers_done = time.monotonic()
            continue
        # Reading smaps_rollup walks every page table entry of the process:
        # for an arena of 4 KiB shared pages (a node engine's, where the
        # kernel gives shared memory no huge pages) every 20 ms it took 12 %
        # of this machine's CPU away from the contenders, every 100 ms 5 %;
        # every 250 ms (arenas are populated early, and stay).
        if time.monotonic() - sampled >= 0.25:
            sampled = time.monotonic()
            pss = sum(read_kib(f"/proc/{p}/smaps_rollup", "Pss:") for p in live if p not in usage)
            lck = sum(read_kib(f"/proc/{p}/status", "VmLck:") for p in live if p not in usage)
            peak_pss, peak_lck = max(peak_pss, pss), max(peak_lck, lck)
        time.sleep(0.002)
    if engine:
        engine.returncode = 0
    try:
        outs = [p.report() for p in procs]
    except ValueError:
        if engine:
            engine.log.seek(0)
            print(f"({mode}) the engine's log:\n{engine.log.read()}", file=sys.stderr)
        sys.exit(f"({mode}): a consumer wrote no report; its error is above")
    wall = time.monotonic() - t0
    # To the last consumer's exit: (b) without its engine's linger and
    # exit after the job (its CPU still counted).
    consumers_wall = consumers_done - t0
    cpu_of = lambda ru: ru.ru_utime + ru.ru_stime  # noqa: E731
    cpu = sum(cpu_of(ru) for ru in usage.values())
    total = sum(o["bytes"] for o in outs)
    return {
        "gb_s": total / wall / 1e9,
        "consumers_gb_s": total / consumers_wall / 1e9,
        "cpu_s_per_gb": cpu / (total / 1e9),
        "engine_cpu_s_per_gb": cpu_of(usage[engine.pid]) / (total / 1e9) if engine else 0.0,
        "rss_sum_mib": sum(ru.ru_maxrss for ru in usage.values()) / 1024,
        "pss_mib": peak_pss / 1024,
        "locked_mib": peak_lck / 1024,
        "bytes": total,
        "first_batch_ms": max(o["first_batch_ns"] or 0 for o in outs) / 1e6,
    }


def main():
    use_checkout()
    import ringfeed  # noqa: F401 - imported once, before the consumers fork

    program, rounds, shards = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    server = None
    if os.environ.get("SOURCE") == "http":
        # The shards served by `ringfeed serve` on 127.0.0.1 (its CPU is
        # the remote end's, in no contender's figure).
        folder = os.path.dirname(os.path.abspath(shards[0]))
        server = subprocess.Popen([program, "serve", folder], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        base = server.stdout.readline().strip().rstrip("/")
        urls = [f"{base}/{os.path.basename(s)}" for s in shards]
        # Splitting remote shards among consumers needs their sample
        # counts: a manifest, made once, before any timing.
        manifest = os.path.join(tempfile.mkdtemp(prefix="rf-node-bench-"), "set.manifest")
        subprocess.run([program, "index", *urls, "-o", manifest], check=True,
                       stderr=subprocess.DEVNULL)
        shards = [manifest]
        print(f"source: {base}/ ({len(urls)} shards, counts from {manifest})")
    batch_size = int(os.environ.get("BATCH", "256"))
    epochs = int(os.environ.get("EPOCHS", "1"))
    # Streams (`workers`) per consumer in (a) and (b): 1 gives every mode
    # the 4 streams that (c)'s one loader has by default.
    streams = int(os.environ.get("STREAMS", "1"))
    # The node engine's `memory_budget` (its default: what the standalone
    # engines of (a) take together).
    node_budget = os.environ.get("NODE_BUDGET")
    baseline = os.environ.get("BASELINE")
    # MODES=cb leaves (a) out (a profile of (b) against (c)); (c) always runs.
    modes = "c" + ("".join(m for m in os.environ.get("MODES", "ab") if m in "ab") or "ab") + \
        ("B" if baseline else "")
    results = {m: [] for m in modes}
    for i in range(rounds):
        # Each round in its own order, rotated: a mode runs after each of
        # the others in turn, so none always pays for what the same one
        # left (its memory to free or compact); (b) and (B) take turns
        # going first.
        order = modes[i % len(modes):] + modes[:i % len(modes)]
        if i % 2:
            order = order.replace("bB", "Bb")
        for m in order:
            prog = baseline if m == "B" else program
            r = run_mode(m, prog, shards, batch_size, epochs, streams, node_budget)
            results[m].append(r)
            print(f"round {i + 1} ({m}): {json.dumps(r)}", flush=True)
    names = {"a": "(a) 4 standalone engines", "b": "(b) 4 consumers, 1 node engine",
             "c": "(c) 1 engine, 1 consumer", "B": "(B) (b), BASELINE's engine"}
    keys = ["gb_s", "cpu_s_per_gb", "pss_mib", "locked_mib", "first_batch_ms"]
    med = {m: {k: statistics.median(r[k] for r in results[m]) for k in keys} for m in modes}
    four = [m for m in modes if m != "c"]
    print(f"\nmedians over {rounds} rounds; {'/'.join(four)} delivered the same bytes in every "
          f"round: {len({r['bytes'] for m in four for r in results[m]}) == 1} "
          f"((c) {results['c'][0]['bytes']} bytes, the others {results[four[0]][0]['bytes']}: "
          f"4 consumers pad their shares to equal length)")
    print(f"{'':32} {'GB/s':>7} {'CPU-s/GB':>9} {'PSS MiB':>8} {'locked':>7} {'1st batch ms':>12}")
    for m in modes:
        d = med[m]
        print(f"{names[m]:32} {d['gb_s']:7.2f} {d['cpu_s_per_gb']:9.3f} {d['pss_mib']:8.0f} "
              f"{d['locked_mib']:7.0f} {d['first_batch_ms']:12.1f}")
    print("\nratios of the medians to (c) [per-round range]:")
    for m in modes.replace("c", ""):
        parts = []
        for k in ("gb_s", "cpu_s_per_gb", "pss_mib"):
            per = [r[k] / c[k] for r, c in zip(results[m], results["c"])]
            parts.append(f"{k} {med[m][k] / med['c'][k]:.3f} [{min(per):.2f}-{max(per):.2f}]")
        print(f"  {names[m]}: " + ", ".join(parts))
    for m in modes.replace("c", "").replace("a", ""):
        per = [r["consumers_gb_s"] / c["gb_s"] for r, c in zip(results[m], results["c"])]
        print(f"  ({m}) to its last consumer's exit (the engine's linger and exit after "
              f"the job left out): gb_s "
              f"{statistics.median(r['consumers_gb_s'] for r in results[m]) / med['c']['gb_s']:.3f} "
              f"[{min(per):.2f}-{max(per):.2f}]")
    if baseline:
        parts = []
        for k in ("gb_s", "cpu_s_per_gb"):
            per = [r[k] / q[k] for r, q in zip(results["b"], results["B"])]
            parts.append(f"{k} {med['b'][k] / med['B'][k]:.3f} [{min(per):.2f}-{max(per):.2f}]")
        print("  (b) / (B), this program's engine against BASELINE's: " + ", ".join(parts))
    if "a" not in med or "b" not in med:
        return
    b, c, a = med["b"], med["c"], med["a"]
    print("\ntargets: (b) GB/s >= 0.9x (c): %s; (b) CPU/GB <= 1.25x (c): %s; (b) ahead of (a) on "
          "GB/s: %s, CPU/GB: %s, PSS: %s" % (
              b["gb_s"] >= 0.9 * c["gb_s"], b["cpu_s_per_gb"] <= 1.25 * c["cpu_s_per_gb"],
              b["gb_s"] > a["gb_s"], b["cpu_s_per_gb"] < a["cpu_s_per_gb"],
              b["pss_mib"] < a["pss_mib"]))
    ms = attach_ms(program, shards, batch_size, streams, node_budget)
    print(f"\nattach to a running node engine and get the first batch: {ms:.1f} ms "
          f"(median of 7; (c) opens its own engine and gets its first in "
          f"{c['first_batch_ms']:.1f} ms)")
    if server:
        server.terminate()


if __name__ == "__main__":
    main()
