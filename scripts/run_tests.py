#!/usr/bin/env python3
"""Builds the Rust test binaries once, then runs them several at a time.

    scripts/run_tests.py [--jobs N] [CARGO TEST ARGUMENTS...]

`cargo test` runs its test binaries one after another, and the slowest of
them spend their time waiting on timers (retry back-offs, credential
lifetimes, the throttling pacer), not on the CPU, so most of a serial run is
idle. This builds with `cargo test ARGS --no-run`, then runs every binary
cargo built for testing, at most N at once, the longest first, each in its
package's directory as cargo would.

Each binary's output (stdout and stderr together) is printed whole, in the
order the binaries finish, under a header like cargo's `Running` line, so
the outputs never interleave. Every binary runs even when another fails (as
`--no-fail-fast`); the run fails if any binary fails or the build does, and
the failed ones are named at the end. Test arguments after a `--` are given
to every binary.
"""

import argparse
import json
import os
import queue
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# The binaries that take longest (tens of seconds, most of it waiting), to
# start first so that the run is not left waiting on one of them at its end.
# Only the order depends on this list; a binary missing from it still runs,
# after the ones named.
LONGEST_FIRST = [
    "retry_storm",
    "s3_refresh",
    "memory_bound",
    "http",
    "s3",
    "c_abi",
    "objects",
    "objects_s3",
    "versions",
    "https",
    "observability",
    "secrets",
    "soak",
]

# Test binaries at once. They mostly wait, so more than the CPUs; not so
# many that the CPU-bound ones (the sanitizer builds of c_abi, the 20 GB of
# memory_bound) crowd each other out. Measured on 2 CPUs: 6 kept the run
# within a few seconds of its longest binary; 4 leaves the tests that
# wait on a busy machine (valgrind's, DataLoader workers') more room, for
# little more wall time, since the longest binaries mostly sleep.
DEFAULT_JOBS = 4


def build(cargo_args):
    """Runs `cargo test ARGS --no-run` and returns the test binaries it
    built, [(name, source, executable, package directory)]; exits with
    cargo's status if the build fails. Diagnostics go to stderr as usual."""
    cargo = os.environ.get("CARGO", "cargo")
    cmd = [cargo, "test", *cargo_args, "--no-run", "--message-format=json-render-diagnostics"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    binaries = []
    for line in proc.stdout:
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue  # a build script's stray output
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        # `--all-targets` also builds plain binaries and examples to run, not
        # to test; only artifacts built with the test harness are tests.
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        binaries.append((target["name"], target["src_path"], msg["executable"],
                         str(Path(msg["manifest_path"]).parent)))
    status = proc.wait()
    if status != 0:
        print(f"run_tests.py: `{' '.join(cmd)}` failed ({status})", file=sys.stderr)
        sys.exit(status)
    return binaries


def order(binaries):
    """`binaries` with the LONGEST_FIRST ones first, in that list's order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    return sorted(binaries, key=lambda b: rank.get(b[0], len(rank)))


def run_one(binary, test_args):
    """Runs one test binary; returns (exit status, its output, wall s, CPU s)."""
    name, _, exe, cwd = binary
    env = dict(os.environ, CARGO_MANIFEST_DIR=cwd)
    start = time.monotonic()
    # A file, not a pipe: a process a test leaves behind holding its stdout
    # cannot keep the run waiting for an end of file.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([exe, *test_args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)
        # wait4 rather than wait: the child's own CPU time, which says
        # whether a slow binary was busy or waiting.
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        output = log.read()
    return proc.returncode, output, time.monotonic() - start, usage.ru_utime + usage.ru_stime


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="test binaries at once")
    args, rest = parser.parse_known_args()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    cargo_args, test_args = rest, []
    if "--" in rest:
        split = rest.index("--")
        cargo_args, test_args = rest[:split], rest[split + 1:]

    binaries = order(build(cargo_args))
    todo = queue.Queue()
    for b in binaries:
        todo.put(b)
    lock = threading.Lock()
    failed = []
    start = time.monotonic()

    def worker():
        while True:
            try:
                binary = todo.get_nowait()
            except queue.Empty:
                return
            name, src, exe, _ = binary
            try:
                status, output, wall, cpu = run_one(binary, test_args)
            except OSError as e:
                status, output, wall, cpu = 127, f"cannot run {exe}: {e}\n".encode(), 0.0, 0.0
            with lock:
                out = sys.stdout.buffer
                out.write(f"     Running {src} ({exe}): {'ok' if status == 0 else f'FAILED ({status})'}, "
                          f"{wall:.1f} s, {cpu:.1f} CPU-s\n".encode())
                out.write(output)
                out.write(b"\n")
                out.flush()
                if status != 0:
                    failed.append(f"{name} ({src})")

    threads = [threading.Thread(target=worker) for _ in range(min(args.jobs, len(binaries)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"run_tests.py: {len(binaries)} test binaries, {len(failed)} failed, in {time.monotonic() - start:.1f} s "
          f"({children.ru_utime + children.ru_stime:.1f} CPU-s, cargo's build included), {args.jobs} at once")
    if failed:
        print("run_tests.py: failed: " + ", ".join(failed), file=sys.stderr)
        sys.exit(1)
    if not binaries:
        print("run_tests.py: cargo built no test binaries", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
