#!/usr/bin/env python3
"""Builds the Rust test binaries once, then runs them several at a time.

    scripts/run_tests.py [--jobs N] [CARGO TEST ARGUMENTS...]

`cargo test` runs its test binaries one after another, and the slowest of
them spend their time waiting on timers (retry back-offs, credential
lifetimes, the throttling pacer), not on the CPU, so most of a serial run is
idle. This builds with `cargo test ARGS --no-run`, then runs every binary
cargo built for testing, at most N at once, the longest first, each in its
package's directory as cargo would; the few that do little but wait (the
WAITING list) run all at once beside those N.

Each binary's output (stdout and stderr together) is printed whole, in the
order the binaries finish, under a header like cargo's `Running` line, so
the outputs never interleave. Every binary runs even when another fails (as
`--no-fail-fast`); the run fails if any binary fails or the build does, and
the failed ones are named at the end. Test arguments after a `--` are given
to every binary.

A binary still running after `--timeout` seconds (default 600; the longest
takes about 200 on 2 CPUs) has hung: its threads are listed (the test
harness names each test's thread after the test) with where each waits in
the kernel, and the processes it started, then it and everything it started
are killed and it counts as failed, so that a hang names itself instead of
holding the run until CI's own limit ends it with nothing said.
"""

import argparse
import json
import os
import queue
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# The binaries that take longest (tens of seconds), to
# start first so that the run is not left waiting on one of them at its end.
# Only the order depends on this list; a binary missing from it still runs,
# after the ones named.
LONGEST_FIRST = [
    "decode_budget",
    "c_abi",
    "memory_bound",
    "http",
    "s3",
    "objects",
    "objects_s3",
    "versions",
    "https",
    "observability",
    "secrets",
    "soak",
]

# The binaries that spend nearly all their time waiting on timers (back-offs
# through a minute of throttling, credentials that expire every few seconds,
# the Hub emulator's retries), by their sources' paths in the repository
# (two packages may have test binaries of the same name); their wall and CPU
# are in docs/testing.md, "How long it takes". None of them checks a rate
# or a pace a busy machine could change (tests/throttle.rs, which rides a
# rate limit, stays among the others). Each runs at once, beside the --jobs
# others rather than in one of their places: counted among them, they left
# the CPU-bound binaries one place between them at the start.
WAITING = {"tests/retry_storm.rs", "tests/s3_refresh.rs", "tests/s3_refresh_web_identity.rs", "tests/hub.rs"}
REPO = Path(__file__).resolve().parent.parent


def waits(binary):
    """Whether `binary` is one of WAITING."""
    try:
        return Path(binary[1]).resolve().relative_to(REPO).as_posix() in WAITING
    except ValueError:
        return False


# Test binaries at once, besides those WAITING: more than the CPUs, since
# many still wait on servers and timers part of the time; not so many that
# the CPU-bound ones (the sanitizer builds of c_abi, the 20 GB of
# memory_bound) crowd each other out, or the tests that wait on a busy
# machine (valgrind's, DataLoader workers').
DEFAULT_JOBS = 4

# Seconds a test binary may run before it counts as hung (see the docstring).
DEFAULT_TIMEOUT = 600


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


def _read(path):
    try:
        return Path(path).read_text(errors="replace").strip()
    except OSError:
        return "?"


def _session(sid):
    """The processes of session `sid`, [(pid, state, command line)]."""
    procs = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _read(entry / "stat")
        # pid (comm) state ppid pgrp session ...: comm may hold spaces.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 3 and fields[3] == str(sid):
            cmdline = _read(entry / "cmdline").replace("\0", " ")
            procs.append((int(entry.name), fields[0], cmdline))
    return sorted(procs)


def hang_report(pid):
    """What a hung binary is doing: each thread's name, state and kernel
    wait, then the processes of its session."""
    lines = [f"run_tests.py: threads of {pid} (name, state, kernel wait):"]
    for task in sorted(Path(f"/proc/{pid}/task").glob("*"), key=lambda t: int(t.name)):
        stat = _read(task / "stat")
        state = stat[stat.rfind(")") + 2:].split()[:1]
        lines.append(f"  {task.name} {_read(task / 'comm')!r} {' '.join(state)} {_read(task / 'wchan')}")
    lines.append("run_tests.py: processes it started (pid, state, command):")
    for p, state, cmdline in _session(pid):
        if p != pid:
            lines.append(f"  {p} {state} {cmdline[:300]}")
    return "\n".join(lines) + "\n"


def run_one(binary, test_args, timeout):
    """Runs one test binary; returns (exit status, its output, wall s, CPU s).
    Past `timeout` seconds the binary and its session are killed and the
    status is "timed out"."""
    name, _, exe, cwd = binary
    env = dict(os.environ, CARGO_MANIFEST_DIR=cwd)
    start = time.monotonic()
    # A file, not a pipe: a process a test leaves behind holding its stdout
    # cannot keep the run waiting for an end of file.
    with tempfile.TemporaryFile() as log:
        # A session of its own, so that a hang can be killed whole.
        proc = subprocess.Popen([exe, *test_args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        report = b""
        while True:
            # wait4 rather than wait: the child's own CPU time, which says
            # whether a slow binary was busy or waiting.
            waited, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if waited:
                break
            if time.monotonic() - start > timeout:
                report = hang_report(proc.pid).encode()
                os.killpg(proc.pid, signal.SIGKILL)
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.1)
        code = "timed out" if report else os.waitstatus_to_exitcode(status)
        log.seek(0)
        output = log.read() + report
    return code, output, time.monotonic() - start, usage.ru_utime + usage.ru_stime


# The harness's summary line of a binary: `test result: ok. 12 passed; 0
# failed; 1 ignored; 0 measured; 0 filtered out; finished in 1.2s`.
RESULT = re.compile(rb"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored;", re.M)


def counts(output):
    """(passed, failed, ignored) summed over the harness's result lines in
    a binary's output (one per binary; none where it did not get that far)."""
    total = [0, 0, 0]
    for m in RESULT.finditer(output):
        for i in range(3):
            total[i] += int(m.group(i + 1))
    return tuple(total)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="test binaries at once")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help="seconds a test binary may run before it counts as hung")
    args, rest = parser.parse_known_args()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    cargo_args, test_args = rest, []
    if "--" in rest:
        split = rest.index("--")
        cargo_args, test_args = rest[:split], rest[split + 1:]

    binaries = order(build(cargo_args))
    todo = queue.Queue()
    waiting = [b for b in binaries if waits(b)]
    for b in binaries:
        if not waits(b):
            todo.put(b)
    lock = threading.Lock()
    failed = []
    tests = [0, 0, 0]
    start = time.monotonic()

    def worker():
        while True:
            try:
                binary = todo.get_nowait()
            except queue.Empty:
                return
            run_and_report(binary)

    def run_and_report(binary):
        name, src, exe, _ = binary
        try:
            status, output, wall, cpu = run_one(binary, test_args, args.timeout)
        except OSError as e:
            status, output, wall, cpu = 127, f"cannot run {exe}: {e}\n".encode(), 0.0, 0.0
        except Exception as e:  # counted as failed, never lost with its thread
            status, output, wall, cpu = 1, f"run_tests.py failed running {exe}: {e!r}\n".encode(), 0.0, 0.0
        with lock:
            out = sys.stdout.buffer
            out.write(f"     Running {src} ({exe}): {'ok' if status == 0 else f'FAILED ({status})'}, "
                      f"{wall:.1f} s, {cpu:.1f} CPU-s\n".encode())
            out.write(output)
            out.write(b"\n")
            out.flush()
            if status != 0:
                failed.append(f"{name} ({src})")
            for i, n in enumerate(counts(output)):
                tests[i] += n

    threads = [threading.Thread(target=run_and_report, args=(b,)) for b in waiting]
    threads += [threading.Thread(target=worker) for _ in range(min(args.jobs, len(binaries) - len(waiting)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"run_tests.py: {len(binaries)} test binaries, {len(failed)} failed, in {time.monotonic() - start:.1f} s "
          f"({children.ru_utime + children.ru_stime:.1f} CPU-s, cargo's build included), {args.jobs} at once "
          f"and {len(waiting)} that mostly wait beside them; "
          f"tests: {tests[0]} passed, {tests[1]} failed, {tests[2]} ignored")
    if failed:
        print("run_tests.py: failed: " + ", ".join(failed), file=sys.stderr)
        sys.exit(1)
    if not binaries:
        print("run_tests.py: cargo built no test binaries", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
