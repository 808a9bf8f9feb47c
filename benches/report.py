#!/usr/bin/env python3
"""Runs the benchmarks one after another and writes one report of them:
report.md (a table per workload, the commit, the date and the commands) and
report.png (a bar chart of GB/s, a panel per comparison).

    benches/report.py [--quick] [--only cache,local_vs_fio] [--from DIR]

A benchmark program, not a test (docs/design.md): every figure comes from
the benchmark scripts' own summary.json, medians over rounds interleaved
with a reference measured in the same run; this script only runs them and
lays out what they wrote. On a shared machine the absolute GB/s are a
floor; the ratios against the reference are the result.

Workloads (`--only`, comma-separated; all of them when not given), each run
as its own script with OUT_DIR set to REPORT_DIR/<workload>:
  local_vs_fio  benches/local_vs_fio.sh: `ringfeed bench` on local shards
                hot in the page cache against fio reading the same files in
                ringfeed's shape (threads, block size, depth), and the best
                of 12 fio configurations (one run each)
  cache         benches/cache.sh: epoch 1 over HTTP from nginx with the disk
                cache writing against without; then a run from the cache
                files, page cache dropped, against fio --direct=1 reading
                the same files (needs nginx and fio, installed as root)
  shuffle       benches/shuffle.sh: `ringfeed bench` with a shuffle buffer
                against the same without, same shards, same run
  http_vs_curl  benches/http_vs_curl.sh: ringfeed over http:// and s3://
                from nginx against a C receive floor, curl x4 and boto3
                (boto3 in the venv benches/out/venv, made there)
  objects       benches/objects.py: whole objects, read_object /
                write_object / load_safetensors against curl and boto3
                (needs the Python package importable: PYTHON, PYTHONPATH)

Profiles: the default runs each script with its own defaults; --quick sets
few rounds and small data (QUICK below: minutes in all on a 2-CPU machine),
its data in folders of its own so a later default run regenerates nothing.
Variables already set in the environment win over the profile's.

Output: benches/out/report/<time>/ holds report.md, report.png, run.json
(what ran: commands, exit statuses, commit) and a folder and a .log per
workload. A workload whose script fails is reported as failed, with its log,
and the others still run.

--from DIR builds the report from outputs already there, running nothing:
DIR/run.json when this script made DIR (the report is written there again),
else DIR/<workload>/summary.json, else the newest
DIR/<workload>/<time>/summary.json (the scripts' own layout, so `--from
benches/out` reports their latest runs); DIR is then only read, the report
going to benches/out/report/from-<time>/.

The chart needs matplotlib: when this interpreter has none, the venv
benches/out/venv is made (as benches/http_vs_curl.sh makes it), matplotlib
installed there with pip, and this script run again under it.
"""

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
VENV = os.path.join(ROOT, "benches", "out", "venv")

# Scripts in the order they run (the cheap local ones first, so a slow
# network one failing late costs the least).
SCRIPTS = {
    "local_vs_fio": "benches/local_vs_fio.sh",
    "cache": "benches/cache.sh",
    "shuffle": "benches/shuffle.sh",
    "http_vs_curl": "benches/http_vs_curl.sh",
    "objects": "benches/objects.py",
}

# --quick: 3 rounds (the fewest that have a median other than one round's
# figure) over 256-512 MiB of shards instead of 1-2 GiB, in folders of
# their own under benches/out/report/ (gen_shards would otherwise
# regenerate a default run's shards). Each script takes a few tens of
# seconds to a couple of minutes on the 2-CPU dev VM, plus the first
# `cargo build --release`. The price: a run then lasts 0.2-0.8 s, so process
# start-up (fio's is ~0.3 s) and a loaded machine's bursts weigh far more
# than in the default profile (the first quick run's per-round ratios
# spread 1.8-3.2x for local_vs_fio, 0.16-0.76 for shuffle). It shows that
# everything runs and roughly where it stands; the default gives figures.
QUICK_DATA = "benches/out/report/data"
QUICK = {
    "local_vs_fio": {"ROUNDS": "3", "SHARDS": "8", "SHARD_SIZE": "32MiB",
                     "SHARDS_DIR": f"{QUICK_DATA}/local_vs_fio"},
    # cache_min_free's default, 10% of the file system, is more than a
    # shared dev VM's disk often has free (4% of 270 GB here), and a cache
    # that may write nothing measures nothing; 1 GiB still keeps the disk
    # from filling, and the quick run writes at most 0.5 GiB of entries.
    "cache": {"ROUNDS": "3", "SHARDS": "8", "SHARD_SIZE": "32MiB", "CACHE_MIN_FREE": "1GiB",
              "SERVE_ROOT": f"{QUICK_DATA}/cache-s3root",
              "CACHE_DIR": f"{QUICK_DATA}/cache-dir"},
    # 16 x 32 MiB of ~20 KB samples is ~26,000 samples, so the default
    # 10,000-sample buffer still turns over more than twice a pass.
    "shuffle": {"ROUNDS": "3", "EPOCHS": "2", "SHARDS": "16", "SHARD_SIZE": "32MiB",
                "SHARDS_DIR": f"{QUICK_DATA}/shuffle"},
    "http_vs_curl": {"ROUNDS": "3", "EPOCHS": "2", "SHARDS": "8", "SHARD_SIZE": "32MiB",
                     "SERVE_ROOT": f"{QUICK_DATA}/http-s3root"},
    "objects": {"ROUNDS": "3", "SIZE": "512MiB", "SIZE_W": "256MiB", "SIZE_ST": "256MiB",
                "DATA_DIR": f"{QUICK_DATA}/objects"},
}


# --- what a report shows ------------------------------------------------------

@dataclass
class Contender:
    name: str
    gbs: float                 # median GB/s, whole process
    cpu: float | None = None   # median CPU-s per GB, whole process, where known
    ringfeed: bool = True      # ringfeed (any configuration), or a peer
    note: str = ""             # e.g. "one run", for a figure that is no median
    per_round: list = None     # GB/s of each round, where the summary keeps them


@dataclass
class Target:
    name: str
    value: float
    bound: str                 # ">= 0.9", as the script states it
    verdict: str               # PASS / MISS, as the script decided it


@dataclass
class Comparison:
    """One table and one chart panel: contenders against one reference."""
    title: str
    reference: str
    contenders: list
    targets: list = field(default_factory=list)
    notes: list = field(default_factory=list)


def med(xs):
    return statistics.median(xs)


def verdict(ok):
    return "PASS" if ok else "MISS"


def target_label(name):
    """'http_vs_floor_gbs' -> 'http / floor GB/s': a script's target name
    as a table shows it."""
    for key, words in (("_gbs", " GB/s"), ("_cpu", " CPU-s/GB"), ("_vs_", " / "), ("_", " ")):
        name = name.replace(key, words)
    return name


# --- reading each script's summary.json ---------------------------------------
# One function per script, each turning that script's summary into
# Comparisons. The bounds of the targets are the ones each script's header
# states; the verdicts are the script's own, except where its summary.json
# keeps none (shuffle), where they are worked out here the way it does.

def read_local_vs_fio(s):
    rounds = s["rounds"]
    best = s.get("best_fio")
    if s.get("cold"):
        m = s["median"]
        cs = [Contender("ringfeed, O_DIRECT", m["ringfeed_direct_gb_per_s"],
                        per_round=[r["ringfeed"]["gbs"] for r in rounds]),
              Contender("ringfeed, buffered", m["ringfeed_buffered_gb_per_s"],
                        per_round=[r["ringfeed_buffered"]["gbs"] for r in rounds]),
              Contender("fio --direct=1, ringfeed's shape", m["fio_direct_gb_per_s"], ringfeed=False,
                        per_round=[r["fio"]["gbs"] for r in rounds])]
        if best:
            cs.append(Contender(f"best fio --direct=1 ({best['config']})", best["gb_per_s"],
                                ringfeed=False, note="one run"))
        targets = []
        if "best_fio" in s["targets"]:
            targets.append(Target("ringfeed O_DIRECT / best fio", best["ratio"], ">= 0.9",
                                  s["targets"]["best_fio"]))
        return [Comparison("local shards, cold (COLD=1)", "fio --direct=1, ringfeed's shape", cs, targets,
                           ["CPU-s/GB: the cold run keeps no whole-process CPU figure"])]
    def c(w, name, ringfeed=True):
        gbs = [r[w]["e2e_gbs"] for r in rounds]
        return Contender(name, med(gbs), med([r[w]["e2e_cpu"] for r in rounds]), ringfeed, per_round=gbs)

    cs = [c("ringfeed", "ringfeed"), c("fio", "fio, ringfeed's shape", ringfeed=False)]
    if best:
        cs.append(Contender(f"best fio ({best['config']})", best["e2e_gb_per_s"], ringfeed=False,
                            note="one run"))
    m, t = s["median"], s["targets"]
    MiB = 1 << 20
    targets = [Target("ringfeed / fio GB/s, own clocks", m["ratio"], ">= 0.9", t["ratio"]),
               Target("bytes copied / delivered", m["copied_per_delivered"], "<= 0.02", t["copied"]),
               Target("peak RSS MiB", m["peak_rss_bytes"] / MiB, f"<= {m['rss_limit_bytes'] / MiB:.0f}",
                      t["rss"])]
    if best:
        targets.append(Target("ringfeed / best fio GB/s, whole process", best["ratio"], ">= 0.9",
                              t["best_fio"]))
    return [Comparison("local shards, hot in the page cache", "fio, ringfeed's shape", cs, targets)]


def read_cache(s):
    m, ratios, t = s["median"], s["ratios"], s["targets"]
    fios = [w for w in m if w.startswith("fio")]
    ref = s["fio_reference"]

    def fio_name(w):
        j = w[3:]
        return f"fio --direct=1, {j} job{'' if j == '1' else 's'}"

    def c(w, name, ringfeed=True):
        return Contender(name, m[w]["gbs"], m[w]["cpu"], ringfeed,
                         per_round=[r[w]["gbs"] for r in s["rounds"]])

    epoch1 = Comparison(
        "epoch 1 over HTTP", "ringfeed, no cache",
        [c("nocache", "ringfeed, no cache"), c("fill", "ringfeed, cache writing"),
         c("fillall", "ringfeed, cache writing all")],
        [Target("cache writing / no cache GB/s", ratios["fill_vs_nocache_gbs"]["ratio_of_medians"],
                ">= 0.9", t["fill_vs_nocache_gbs"])])
    cold = Comparison(
        "reading the cache, page cache dropped", fio_name(ref),
        [c("cached", "ringfeed from the cache")] + [c(w, fio_name(w), False) for w in fios],
        [Target(f"from the cache / {fio_name(ref)} GB/s", ratios["cached_vs_fio_gbs"]["ratio_of_medians"],
                ">= 0.9", t["cached_vs_fio_gbs"])],
        [f"reference: the fio job count with the higher median ({ref})"])
    return [epoch1, cold]


def read_shuffle(s):
    rounds = s["rounds"]

    def c(w, name):
        gbs = [r[w]["whole_gbs"] for r in rounds]
        return Contender(name, med(gbs), med([r[w]["whole_cpu"] for r in rounds]), per_round=gbs)

    budget = rounds[0]["plain"]["budget"]
    rss_mib = max(r["shuffled"]["rss"] for r in rounds) / (1 << 20)
    rss_limit = budget / (1 << 20) + 64
    targets = [
        Target("shuffled / plain GB/s, whole process", s["whole_ratio"], ">= 0.95",
               verdict(s["whole_ratio"] >= 0.95)),
        Target("shuffled / plain GB/s, own clock", s["ratio"], ">= 0.95", verdict(s["ratio"] >= 0.95)),
        Target("peak arena use / budget", s["peak_over_budget"], "<= 1", verdict(s["peak_over_budget"] <= 1)),
        Target("peak RSS MiB, shuffled", rss_mib, f"<= {rss_limit:.0f}", verdict(rss_mib <= rss_limit)),
    ]
    return [Comparison("shuffle buffer", "ringfeed, no shuffle",
                       [c("plain", "ringfeed, no shuffle"), c("shuffled", "ringfeed, shuffled")], targets,
                       [f"shuffle compaction copied {s['shuffle_copied']:.4f} bytes per byte delivered"])]


def read_http_vs_curl(s):
    m, ratios, t = s["median"], s["ratios"], s["targets"]
    tls = "threads" in m
    names = {"floor": "receive floor (C)", "curl": "curl x4", "http": "ringfeed http://",
             "s3": "ringfeed s3://", "boto3": "boto3 8 MiB ranges", "boto3tm": "boto3 transfer manager",
             "threads": "ringfeed https:// threads"}
    if tls:
        names.update(http="ringfeed https:// io_uring", curl="curl x4 https")
    cs = [Contender(names[w], v["gbs"], v["cpu"], ringfeed=w in ("http", "s3", "threads"),
                    per_round=[r[w]["gbs"] for r in s["rounds"]])
          for w, v in m.items()]
    ref = names["floor" if "floor" in m else "curl"]
    # The bounds of http_vs_curl.sh's targets (its header), by the target's
    # name as its summary.json keeps it.
    bounds = {"_vs_floor_gbs": ">= 0.9", "_vs_floor_cpu": "<= 1.25", "_vs_curl_gbs": ">= 1.0",
              "https_vs_curl_cpu": "<= 0.8", "http_copied": "<= 0.02"}
    targets = []
    for name, v in t.items():
        bound = next((b for k, b in bounds.items() if name.endswith(k)), "?")
        if name == "http_copied":
            value = med([r["http"]["copied"] for r in s["rounds"]])
        else:
            value = ratios[name]["ratio_of_medians"]
        targets.append(Target(target_label(name), value, bound, v))
    notes = [] if tls or "s3" in m else [f"ringfeed s3://: {s['s3']}"]
    return [Comparison("HTTPS (TLS=1)" if tls else "HTTP and S3 from nginx", ref, cs, targets, notes)]


def read_objects(s):
    # (summary key, title, reference, prefix of its targets' names)
    sections = [("read", "read one object", "curl x4", "read_"),
                ("write", "write one object", "boto3 tm", "write_"),
                ("safetensors", "safetensors, load vs read", "read", "safetensors_")]
    out = []
    for key, title, ref, prefix in sections:
        if key not in s:
            continue
        part = s[key]["whole_process"]
        cs = [Contender(w, med(v["gbs"]), med(v["cpu_per_gb"]),
                        ringfeed=w.startswith("ringfeed") or key == "safetensors", per_round=v["gbs"])
              for w, v in part.items()]
        targets = [Target(target_label(n), v["ratio_of_medians"], v["bound"], verdict(v["met"]))
                   for n, v in s.get("targets", {}).items() if n.startswith(prefix)]
        notes = [f"{s[key]['bytes'] / 1e9:.2f} GB an object"] if "bytes" in s[key] else []
        if key == "write":
            notes.append("targets judged on the client's clock around the call (objects.py), "
                         "the table on the whole process")
        out.append(Comparison(title, ref if ref in part else cs[0].name, cs, targets, notes))
    return out


READERS = {
    "local_vs_fio": read_local_vs_fio,
    "cache": read_cache,
    "shuffle": read_shuffle,
    "http_vs_curl": read_http_vs_curl,
    "objects": read_objects,
}


# --- running the scripts ------------------------------------------------------

def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True).stdout.strip()


def tree_state():
    """The commit and how many files differ from it (untracked ones too,
    ignored outputs not)."""
    changed = [line for line in git("status", "--porcelain").splitlines() if line]
    return {"commit": git("rev-parse", "--short", "HEAD") or "unknown", "changed_files": len(changed)}


def rel(path):
    """path relative to the repo root where it lies inside it."""
    p = os.path.relpath(path, ROOT)
    return path if p.startswith("..") else p


def command_line(env, argv):
    return " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.quote(a) for a in argv])


def run_workload(name, report_dir, quick):
    """Runs one script with its profile's settings; returns the run record."""
    out_dir = os.path.join(report_dir, name)
    log = os.path.join(report_dir, f"{name}.log")
    # The environment's value of a profile's variable wins, and is shown.
    settings = {k: os.environ.get(k, v) for k, v in (QUICK[name] if quick else {}).items()}
    settings["OUT_DIR"] = rel(out_dir)
    argv = [SCRIPTS[name]]
    cmd = command_line(settings, argv)
    print(f"\n== {name}\n$ {cmd}\n  (log: {rel(log)})", flush=True)
    t0 = time.monotonic()
    with open(log, "wb") as f:
        rc = subprocess.run(argv, cwd=ROOT, env={**os.environ, **settings}, stdout=f,
                            stderr=subprocess.STDOUT).returncode
    secs = time.monotonic() - t0
    print(f"  exit status {rc} after {secs:.0f} s", flush=True)
    return {"workload": name, "command": cmd, "out_dir": rel(out_dir), "log": rel(log),
            "exit_status": rc, "seconds": round(secs, 1)}


def new_report_dir(prefix=""):
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = os.path.join(ROOT, "benches", "out", "report", prefix + stamp)
    os.makedirs(path)
    return path


def run_all(workloads, quick, argv):
    stamp = datetime.datetime.now(datetime.timezone.utc)
    report_dir = new_report_dir()
    run = {"command": command_line({}, argv), "profile": "quick" if quick else "default",
           "date": stamp.strftime("%Y-%m-%d %H:%M UTC"), **tree_state(),
           "cpus": os.cpu_count(), "load_before": open("/proc/loadavg").read().split()[:3],
           "runs": []}
    for name in workloads:
        run["runs"].append(run_workload(name, report_dir, quick))
        # Written after each script, so a run cut short still reports.
        json.dump(run, open(os.path.join(report_dir, "run.json"), "w"), indent=1)
    return report_dir, run


def find_outputs(src, workloads):
    """The run record of an earlier run in src (run.json), or one made up
    from the summary.json files found there (module docstring)."""
    path = os.path.join(src, "run.json")
    if os.path.exists(path):
        run = json.load(open(path))
        run["runs"] = [r for r in run["runs"] if r["workload"] in workloads]
        return run
    run = {"command": None, "profile": None, "date": None, "cpus": None, "load_before": None,
           "runs": []}
    for name in workloads:
        d = os.path.join(src, name)
        if not os.path.isdir(d):
            continue
        if not os.path.exists(os.path.join(d, "summary.json")):
            times = sorted(x for x in os.listdir(d) if os.path.exists(os.path.join(d, x, "summary.json")))
            if not times:
                continue
            d = os.path.join(d, times[-1])
        run["runs"].append({"workload": name, "command": None, "out_dir": rel(os.path.abspath(d)),
                            "log": None, "exit_status": 0, "seconds": None})
    return run


# --- the report ---------------------------------------------------------------

def load_results(run):
    """Each run with its Comparisons, or the reason there are none."""
    results = []
    for r in run["runs"]:
        summary = os.path.join(ROOT, r["out_dir"], "summary.json")
        res = {**r, "comparisons": [], "error": None, "source": None}
        if r["exit_status"] != 0:
            res["error"] = f"failed: exit status {r['exit_status']}"
        elif not os.path.exists(summary):
            res["error"] = "no summary.json written"
        else:
            s = json.load(open(summary))
            res["source"] = s.get("source")
            try:
                res["comparisons"] = READERS[r["workload"]](s)
            except (KeyError, IndexError, TypeError, ZeroDivisionError) as e:
                res["error"] = f"summary.json not in the expected shape ({type(e).__name__}: {e})"
        results.append(res)
    return results


def log_tail(path, n=8):
    if not path or not os.path.exists(os.path.join(ROOT, path)):
        return []
    return open(os.path.join(ROOT, path), errors="replace").read().splitlines()[-n:]


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def ratio_cell(x, ref):
    """The ratio of the medians, with the lowest and highest per-round
    ratio (rounds paired by index) where both kept their rounds."""
    cell = f"{x.gbs / ref.gbs:.3f}"
    if x is not ref and x.per_round and ref.per_round and 1 < len(x.per_round) == len(ref.per_round):
        per = [a / b for a, b in zip(x.per_round, ref.per_round)]
        cell += f" [{min(per):.2f}-{max(per):.2f}]"
    return cell


def markdown(run, results, report_cmd):
    state = run.get("commit") and (f"`{run['commit']}`" + (
        f", tree dirty ({run['changed_files']} files changed)" if run["changed_files"] else ", clean tree"))
    lines = ["# ringfeed benchmark report", ""]
    if run["command"]:
        lines += [f"- commit: {state}",
                  f"- date: {run['date']}",
                  f"- profile: {run['profile']}",
                  f"- machine: {run['cpus']} CPUs, load average before {' '.join(run['load_before'])}",
                  f"- command: `{run['command']}`"]
    else:
        lines += ["- made from earlier outputs; the commit of each workload is the one its script "
                  "recorded (\"ringfeed built from\")"]
    if run["profile"] == "quick":
        lines.append("- quick profile: small data and 3 rounds, so each run lasts well under a second "
                     "and start-up and the machine's load weigh heavily (see the per-round ranges); "
                     "the default profile gives the figures to quote")
    lines += [f"- report written by: `{report_cmd}`", "",
              "GB/s and CPU-s/GB are medians over the rounds, each contender timed over its whole "
              "process (spawn to exit, CPU from wait4), all contenders of a table interleaved in the "
              "same run. The ratio is a contender's median GB/s over the reference's, with the lowest "
              "and highest per-round ratio in brackets. The absolute "
              "figures depend on the machine and its load; the ratios are the result.", ""]
    for res in results:
        lines += [f"## {res['workload']}", ""]
        if res["error"]:
            lines += [f"**{res['error']}**" + (f"; log: `{res['log']}`" if res["log"] else ""), ""]
            tail = log_tail(res["log"])
            if tail:
                lines += ["```", *tail, "```", ""]
        for c in res["comparisons"]:
            ref = next(x for x in c.contenders if x.name == c.reference)
            lines += [f"### {c.title}", "",
                      f"| contender | GB/s | CPU-s/GB | vs {c.reference} |",
                      "| --- | ---: | ---: | ---: |"]
            for x in c.contenders:
                name = f"**{x.name}**" if x.ringfeed else x.name
                if x.name == c.reference:
                    name += " (reference)"
                if x.note:
                    name += f" ({x.note})"
                lines.append(f"| {name} | {fmt(x.gbs)} | {fmt(x.cpu, 3)} | {ratio_cell(x, ref)} |")
            lines.append("")
            if c.targets:
                lines += ["| target | value | bound | result |", "| --- | ---: | --- | --- |"]
                lines += [f"| {t.name} | {fmt(t.value, 0 if t.value >= 100 else 3)} | {t.bound} | {t.verdict} |"
                          for t in c.targets]
                lines.append("")
            if c.notes:
                lines += [f"- {n}" for n in c.notes] + [""]
        if res["source"]:
            lines.append(f"- ringfeed built from `{res['source']}`")
        lines.append(f"- outputs: `{res['out_dir']}`" + (f", log `{res['log']}`" if res["log"] else ""))
        if res["command"]:
            lines.append(f"- ran in {res['seconds']:.0f} s")
        lines.append("")
    cmds = [r["command"] for r in run["runs"] if r["command"]]
    if cmds:
        lines += ["## Commands", "", "From the repository root, one after another:", "", "```sh",
                  *cmds, "```", ""]
    return "\n".join(lines)


def chart(run, results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(res["workload"], c) for res in results for c in res["comparisons"]]
    panels += [(res["workload"], None) for res in results if res["error"]]
    if not panels:
        return False
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.4 * nrows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (workload, c) in zip(axes.flat, panels):
        if c is None:
            ax.set_title(workload, fontsize=10)
            ax.text(0.5, 0.5, "failed (see report.md)", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        names = [x.name + (" (ref)" if x.name == c.reference else "") + (f"\n{x.note}" if x.note else "")
                 for x in c.contenders]
        bars = ax.bar(range(len(names)), [x.gbs for x in c.contenders],
                      color=["tab:blue" if x.ringfeed else "tab:gray" for x in c.contenders],
                      hatch=["//" if x.name == c.reference else "" for x in c.contenders],
                      edgecolor="black", linewidth=0.6)
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
        ax.set_xticks(range(len(names)), names, rotation=25, ha="right", fontsize=8)
        ax.set_ylabel("GB/s, whole process (median)")
        ax.set_title(f"{workload}\n{c.title}", fontsize=10)
        ax.margins(y=0.15)
    what = (f"commit {run['commit']}{' (dirty)' if run['changed_files'] else ''}, {run['date']}, "
            f"{run['profile']} profile" if run["command"] else "from earlier outputs")
    fig.suptitle(f"ringfeed benchmarks: ringfeed (blue) and peers (gray), reference hatched; {what}",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def ensure_matplotlib():
    """Re-runs this script under benches/out/venv, with matplotlib installed
    there, when this interpreter has no matplotlib."""
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    py = os.path.join(VENV, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        sys.exit(f"report.py: matplotlib missing in {VENV} after installing it")
    if subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode != 0:
        if not os.path.exists(py):
            print(f"$ python3 -m venv {rel(VENV)}", flush=True)
            subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        print(f"$ {rel(VENV)}/bin/pip install -q matplotlib", flush=True)
        subprocess.run([os.path.join(VENV, "bin", "pip"), "install", "-q", "matplotlib"], check=True)
    os.execv(py, [py, os.path.abspath(__file__), *sys.argv[1:]])


def main():
    doc = __doc__
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=doc.split("\n\n", 2)[2])
    p.add_argument("--quick", action="store_true", help="few rounds, small data (QUICK)")
    p.add_argument("--only", help=f"comma-separated workloads [{','.join(SCRIPTS)}]")
    p.add_argument("--from", dest="src", metavar="DIR", help="report an earlier run's outputs, run nothing")
    a = p.parse_args()
    workloads = a.only.split(",") if a.only else list(SCRIPTS)
    unknown = [w for w in workloads if w not in SCRIPTS]
    if unknown:
        p.error(f"unknown workload {', '.join(unknown)} (known: {', '.join(SCRIPTS)})")
    ensure_matplotlib()
    argv = ["benches/report.py", *sys.argv[1:]]
    if a.src:
        src = os.path.abspath(a.src)
        run = find_outputs(src, workloads)
        if not run["runs"]:
            sys.exit(f"report.py: no outputs of {', '.join(workloads)} in {a.src}")
        # A run of this script gets its report back in place; anything else
        # (the scripts' own folders) is only read, the report going to a
        # folder of its own.
        report_dir = src if os.path.exists(os.path.join(src, "run.json")) else new_report_dir("from-")
    else:
        report_dir, run = run_all(workloads, a.quick, argv)
    results = load_results(run)
    md = os.path.join(report_dir, "report.md")
    with open(md, "w") as f:
        f.write(markdown(run, results, command_line({}, argv)))
    png = os.path.join(report_dir, "report.png")
    print(f"\nreport: {rel(md)}" + (f", {rel(png)}" if chart(run, results, png) else " (nothing to chart)"))
    failed = [r["workload"] for r in results if r["error"]]
    if failed:
        print(f"not reported: {', '.join(failed)} (report.md says why)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
