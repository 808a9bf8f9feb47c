#!/usr/bin/env python3
"""Runs one benchmark contender as a whole process and records what it cost.

    timed.py OUT.json -- COMMAND [ARG ...]

The wall time runs from just before the process is spawned to its exit, and
the CPU time is the user + system time wait4() reports for it, which includes
every descendant it waited for (curl processes under a driver, Python
threads, the engine's workers). That is the window every contender in a
benchmark is compared over: start-up, open and tear-down included.

The command's standard output, when it is one JSON object (a contender's own
report, measured by its own clock), is kept and the whole-process figures
are added to it as ``process_wall_s`` and ``process_cpu_s``; otherwise the
output is kept as text under ``stdout``. Standard error goes to OUT.json's
name with ``.stderr``. A command that fails makes this exit with its status,
after printing its standard error.
"""

import json
import os
import subprocess
import sys
import time


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    out, argv = sys.argv[1], sys.argv[3:]
    with open(out + ".stdout", "wb") as so, open(out + ".stderr", "wb") as se:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdout=so, stderr=se)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.stderr.write(open(out + ".stderr").read())
        print(f"timed.py: exit status {p.returncode}: {' '.join(argv)[:400]}", file=sys.stderr)
        return p.returncode if p.returncode > 0 else 1
    text = open(out + ".stdout").read()
    try:
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ValueError
    except ValueError:
        d = {"stdout": text}
    d["process_wall_s"] = wall
    d["process_cpu_s"] = ru.ru_utime + ru.ru_stime
    d["process_peak_rss_bytes"] = ru.ru_maxrss * 1024
    with open(out, "w") as f:
        json.dump(d, f, indent=1)
    os.unlink(out + ".stdout")
    if os.path.getsize(out + ".stderr") == 0:
        os.unlink(out + ".stderr")
    return 0


if __name__ == "__main__":
    sys.exit(main())
