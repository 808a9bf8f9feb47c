"""Process timing, page-cache checks and ratios shared by the benchmark scripts.

Every contender of a benchmark runs in its own process, timed whole by its
parent: from just before the spawn to the exit, with the CPU time that
``os.wait4`` reports for the child (user + system, its own threads and every
child it waited for, such as DataLoader workers). A contender's own clock,
where it has one, is printed beside it; the two answer different questions
(what a job pays, and what the steady loop costs) and both must be seen.

What the python and torch benches use:

    run_timed(cmd)        -> (times, stdout): wall_seconds, cpu_seconds, ...
    ensure_hot(files)     -> {"resident_before", "rewarmed", "resident_at_start"}:
                             re-reads the files when some of their pages left
                             the page cache
    ratio_of_medians(a, b)-> (median(a) / median(b), lowest and highest a[i] / b[i])

The shell scripts time their contenders the same way with
``benches/timed.py``. Only the standard library is used.
"""

import ctypes
import ctypes.util
import mmap
import os
import statistics
import subprocess
import tempfile
import time

PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


def spawn_timed(cmd, env=None, stdin=None, stdout=None, stderr=None):
    """Runs ``cmd`` (arguments as for ``subprocess.Popen``) and times it
    whole: returns ``(times, returncode)``, ``times`` holding
    ``wall_seconds`` (spawn to exit, measured here), ``cpu_seconds``,
    ``user_seconds``, ``sys_seconds`` and ``max_rss_bytes`` (the child's
    rusage from wait4)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdin=stdin, stdout=stdout, stderr=stderr)
    # wait4 on the pid, not Popen.wait: only wait4 returns the rusage of
    # this one child (getrusage(RUSAGE_CHILDREN) would sum every child).
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    times = {
        "wall_seconds": wall,
        "cpu_seconds": ru.ru_utime + ru.ru_stime,
        "user_seconds": ru.ru_utime,
        "sys_seconds": ru.ru_stime,
        "max_rss_bytes": ru.ru_maxrss * 1024,
    }
    return times, p.returncode


def run_timed(cmd, env=None):
    """Runs ``cmd``, times it whole (see ``spawn_timed``) and returns
    ``(times, stdout text)``; raises ``subprocess.CalledProcessError``, with
    the child's stderr, when it fails."""
    # Files, not pipes: nothing has to be read while the child runs, so the
    # parent sleeps in wait4 and takes no CPU from the contender.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        times, rc = spawn_timed(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        out.seek(0)
        err.seek(0)
        text = out.read().decode()
        if rc != 0:
            raise subprocess.CalledProcessError(rc, cmd, text, err.read().decode())
    return times, text


def proc_cpu_seconds(pids):
    """User + system CPU seconds so far of the live processes ``pids``
    (from /proc/PID/stat), for a clock that must count workers that have
    not exited yet; a process already gone counts 0."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                # The command name (field 2) may hold spaces; fields after
                # its closing parenthesis are fixed: utime, stime are 14, 15.
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]


def resident_bytes(path):
    """(bytes of ``path`` in the page cache, its size), from mincore(2)
    over a private read mapping (mapping faults nothing in)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        buf = (ctypes.c_char * size).from_buffer(m)
        pages = (size + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * pages)()
        try:
            if _libc.mincore(ctypes.addressof(buf), size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
        finally:
            del buf
        res = sum(v & 1 for v in vec) * PAGE
    finally:
        m.close()
    return min(res, size), size


def residency(files):
    """Fraction of the files' bytes in the page cache."""
    res = size = 0
    for f in files:
        r, s = resident_bytes(f)
        res += r
        size += s
    return res / size if size else 1.0


def ensure_hot(files, threshold=0.9999):
    """Reads the files again when some of their pages fell out of the page
    cache, so a run times the contender and not the disk (memory pressure is
    not the only cause: a VM may page out idle memory on its own). Called
    before every contender's run, the same for all."""
    before = after = residency(files)
    rewarmed = before < threshold
    if rewarmed:
        for f in files:
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass
        # Read back: under memory pressure a re-read may not stay.
        after = residency(files)
    return {"resident_before": before, "rewarmed": rewarmed, "resident_at_start": after}


def residency_summary(runs):
    """One line over the ensure_hot results merged into ``runs``."""
    before = [m["resident_before"] for m in runs]
    start = [m["resident_at_start"] for m in runs]
    return (f"resident {min(before):.4f}-{max(before):.4f} when checked, re-read before "
            f"{sum(m['rewarmed'] for m in runs)} of {len(runs)} runs, lowest at a run's start {min(start):.4f}")


def ratio_of_medians(a, b):
    """median(a) / median(b), and the lowest and highest per-round ratio
    a[i] / b[i] (rounds paired by index) to show how far one round strays."""
    per_round = [x / y for x, y in zip(a, b)]
    return statistics.median(a) / statistics.median(b), min(per_round), max(per_round)


def fmt_ratio(r):
    """'1.23x (rounds 1.01-1.40)' from ratio_of_medians' triple."""
    med, lo, hi = r
    return f"{med:.2f}x (rounds {lo:.2f}-{hi:.2f})"
