"""The reading side of benches/mount.py: one contender's read, run as its own
process and timed whole by the driver, and the data it makes.

    _mount_read.py MODE SPEC_JSON

Each mode prints one JSON object: ``bytes`` read, and its own clock
(``seconds``, ``cpu_seconds`` over the same window, from getrusage: every
thread of the process), plus what the mode checks. A wrong byte, a missing
file or a short read exits with a message and status 1, so the driver stops.

Modes (the driver's contenders):

  seq         a file read front to back with SPEC.block-byte reads into one
              buffer (``readinto``, no Python bytes made); three 1 MiB windows
              (start, middle, end) kept as they pass and compared with the
              emulator's file afterwards
  rf_read     ringfeed.read_object(url, **config) of the same object, the
              same windows checked
  torch_path  torch.load(path, weights_only=True) of a checkpoint
  torch_rf    torch.load(ringfeed.open_object(url, **config), weights_only=True)
  st_path     safetensors.torch.load_file(path)
  st_rf       ringfeed.load_safetensors(url, framework="pt", **config)
              (the four above then read one byte of every page of every
              tensor, inside the clock: safetensors' load_file returns
              tensors over a mapping of the file, not yet read; and check
              the tensors' count and three tensors' first MiB against the
              manifest written with the checkpoint)
  files       sorted(os.listdir(dir)), then THREADS threads, thread i reading
              the i-th contiguous share of that list, each file opened, read
              whole and closed; every 997th file compared with the source
  wds         webdataset.WebDataset(urls, shardshuffle=False) iterated once,
              the samples and their fields' bytes counted and checked

and, untimed, ``gen_ckpt`` (a seeded state dict saved with torch.save and
safetensors' save_file, and its manifest).
"""

import json
import os
import resource
import sys
import time
import zlib

MiB = 1 << 20


def _cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _windows(n):
    """Three 1 MiB windows: the start, a middle off any block boundary, the end."""
    w = min(MiB, n)
    return sorted({(0, w), (max(0, n // 2 - 12345), w), (n - w, w)})


def _check_windows(got, src):
    with open(src, "rb") as f:
        for (off, ln), data in got.items():
            f.seek(off)
            if bytes(data) != f.read(ln):
                sys.exit(f"bytes at offset {off} (+{ln}) differ from {src}")


def run_seq(spec):
    n = spec["bytes"]
    wins = {w: bytearray(w[1]) for w in _windows(n)}
    buf = bytearray(spec["block"])
    mv = memoryview(buf)
    pos = 0
    c0, t0 = _cpu(), time.perf_counter()
    with open(spec["path"], "rb", buffering=0) as f:
        while True:
            got = f.readinto(buf)
            if not got:
                break
            for (wo, wl), keep in wins.items():
                a, b = max(wo, pos), min(wo + wl, pos + got)
                if a < b:
                    keep[a - wo:b - wo] = mv[a - pos:b - pos]
            pos += got
    secs, cpu = time.perf_counter() - t0, _cpu() - c0
    if pos != n:
        sys.exit(f"read {pos} bytes of {spec['path']}, expected {n}")
    _check_windows(wins, spec["src"])
    return {"bytes": pos, "seconds": secs, "cpu_seconds": cpu}


def run_rf_read(spec):
    import ringfeed
    c0, t0 = _cpu(), time.perf_counter()
    b = ringfeed.read_object(spec["url"], **spec["config"])
    secs, cpu = time.perf_counter() - t0, _cpu() - c0
    mv = b.memoryview()
    if len(mv) != spec["bytes"]:
        sys.exit(f"read_object gave {len(mv)} bytes, expected {spec['bytes']}")
    _check_windows({w: mv[w[0]:w[0] + w[1]] for w in _windows(len(mv))}, spec["src"])
    return {"bytes": len(mv), "seconds": secs, "cpu_seconds": cpu}


def _tensor_crc(t):
    import torch
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)[:MiB]
    return zlib.crc32(raw.numpy().tobytes())


def _touch(sd):
    """Reads one byte of every 4 KiB page of every tensor, as a
    load_state_dict or a copy to a device reads them all: a loader that
    hands back tensors still mapped from the file (safetensors' load_file
    maps the file and returns tensors over the mapping) has read nothing
    yet, and its reads are paid here, inside the clock, the same for all."""
    import torch
    total = 0
    for t in sd.values():
        raw = t.detach().reshape(-1).view(torch.uint8)
        total += int(raw[::4096].sum())
    return total


def _check_tensors(sd, manifest):
    if len(sd) != manifest["tensors"]:
        sys.exit(f"{len(sd)} tensors, expected {manifest['tensors']}")
    for name, crc in manifest["crc"].items():
        if _tensor_crc(sd[name]) != crc:
            sys.exit(f"tensor {name}: first MiB differs from the saved one")


def run_torch(spec, native):
    import torch
    c0, t0 = _cpu(), time.perf_counter()
    if native:
        import ringfeed
        with ringfeed.open_object(spec["url"], **spec["config"]) as f:
            sd = torch.load(f, weights_only=True, map_location="cpu")
    else:
        sd = torch.load(spec["path"], weights_only=True, map_location="cpu")
    _touch(sd)
    secs, cpu = time.perf_counter() - t0, _cpu() - c0
    _check_tensors(sd, spec["manifest"])
    return {"bytes": spec["bytes"], "seconds": secs, "cpu_seconds": cpu}


def run_st(spec, native):
    import torch  # noqa: F401  (imported before the clock, as in run_torch)
    c0, t0 = _cpu(), time.perf_counter()
    if native:
        import ringfeed
        sd = ringfeed.load_safetensors(spec["url"], framework="pt", **spec["config"])
    else:
        import safetensors.torch
        sd = safetensors.torch.load_file(spec["path"])
    _touch(sd)
    secs, cpu = time.perf_counter() - t0, _cpu() - c0
    _check_tensors(sd, spec["manifest"])
    return {"bytes": spec["bytes"], "seconds": secs, "cpu_seconds": cpu}


def run_files(spec):
    import threading
    d, k = spec["dir"], spec["threads"]
    c0, t0 = _cpu(), time.perf_counter()
    names = sorted(os.listdir(d))
    t_list = time.perf_counter() - t0
    n = len(names)
    if n != spec["files"]:
        sys.exit(f"{d} lists {n} files, expected {spec['files']}")
    totals = [0] * k
    kept = {}
    errors = []

    def worker(i):
        try:
            for j in range(i * n // k, (i + 1) * n // k):
                with open(os.path.join(d, names[j]), "rb", buffering=0) as f:
                    data = f.readall()
                totals[i] += len(data)
                if j % 997 == 0:
                    kept[names[j]] = data
        except Exception as e:  # reported after the join: the run fails
            errors.append(f"thread {i}: {e!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs, cpu = time.perf_counter() - t0, _cpu() - c0
    if errors:
        sys.exit("; ".join(errors))
    total = sum(totals)
    if total != spec["bytes"]:
        sys.exit(f"read {total} bytes from {n} files, expected {spec['bytes']}")
    for name, data in kept.items():
        with open(os.path.join(spec["src"], name), "rb") as f:
            if f.read() != data:
                sys.exit(f"{name} differs from the source")
    return {"bytes": total, "files": n, "seconds": secs, "cpu_seconds": cpu, "list_seconds": t_list}


def run_wds(spec):
    c0, t0 = _cpu(), time.perf_counter()
    import webdataset as wds
    samples = nbytes = 0
    for s in wds.WebDataset(spec["urls"], shardshuffle=False):
        samples += 1
        for key, v in s.items():
            if not key.startswith("__"):
                nbytes += len(v)
    secs, cpu = time.perf_counter() - t0, _cpu() - c0
    if (samples, nbytes) != (spec["samples"], spec["payload"]):
        sys.exit(f"{samples} samples of {nbytes} bytes, expected {spec['samples']} of {spec['payload']}")
    return {"bytes": spec["bytes"], "samples": samples, "payload": nbytes, "seconds": secs,
            "cpu_seconds": cpu}


def gen_ckpt(spec):
    """A transformer-like state dict of about spec.bytes (d_model 1024:
    float32 attention weights, bfloat16 MLP weights, float32 norms), seeded,
    saved as spec.pt (torch.save) and spec.st (safetensors); the manifest
    names three tensors and the crc32 of their first MiB."""
    import torch
    import safetensors.torch
    g = torch.Generator().manual_seed(spec["seed"])
    d = 1024
    sd, total, i = {}, 0, 0
    while total < spec["bytes"]:
        layer = {
            f"layers.{i}.attn.qkv.weight": torch.randn(3 * d, d, generator=g),
            f"layers.{i}.attn.out.weight": torch.randn(d, d, generator=g),
            f"layers.{i}.mlp.up.weight": torch.randn(4 * d, d, generator=g).to(torch.bfloat16),
            f"layers.{i}.mlp.down.weight": torch.randn(d, 4 * d, generator=g).to(torch.bfloat16),
            f"layers.{i}.norm1.weight": torch.randn(d, generator=g),
            f"layers.{i}.norm2.weight": torch.randn(d, generator=g),
        }
        sd.update(layer)
        total += sum(t.numel() * t.element_size() for t in layer.values())
        i += 1
    names = list(sd)
    pick = [names[0], names[len(names) // 2 + 2], names[-3]]
    manifest = {"tensors": len(sd), "tensor_bytes": total, "crc": {k: _tensor_crc(sd[k]) for k in pick}}
    torch.save(sd, spec["pt"] + ".tmp")
    os.rename(spec["pt"] + ".tmp", spec["pt"])
    safetensors.torch.save_file(sd, spec["st"] + ".tmp")
    os.rename(spec["st"] + ".tmp", spec["st"])
    return manifest


def main():
    mode, spec = sys.argv[1], json.loads(sys.argv[2])
    runs = {
        "seq": run_seq,
        "rf_read": run_rf_read,
        "torch_path": lambda s: run_torch(s, False),
        "torch_rf": lambda s: run_torch(s, True),
        "st_path": lambda s: run_st(s, False),
        "st_rf": lambda s: run_st(s, True),
        "files": run_files,
        "wds": run_wds,
        "gen_ckpt": gen_ckpt,
    }
    if mode not in runs:
        sys.exit(f"unknown mode {mode}")
    out = runs[mode](spec)
    out["mode"] = mode
    print(json.dumps(out))


if __name__ == "__main__":
    main()
