"""`cuda_register` where no CUDA runtime loads: `auto` runs and says why in
the stats notes, `on` fails naming CUDA, `off` never tries.

The runtime is looked up once per process, so each case runs in a child
whose `RINGFEED_CUDART` names a file that does not exist: the same answer on
machines with CUDA and without."""

import json
import os
import subprocess
import sys

import ringfeed
from conftest import tar_keys

CHILD = r"""
import json, sys
import ringfeed

out = {}
for mode in ("auto", "on", "off"):
    try:
        with ringfeed.Loader(sys.argv[1:], batch_size=8, cuda_register=mode) as loader:
            n = sum(len(b) for b in loader)
            stats = loader.stats()
        out[mode] = {"samples": n, "registered": stats["cuda_registered"], "notes": stats["notes"]}
    except ringfeed.Error as e:
        out[mode] = {"error": type(e).__name__, "message": str(e)}
print(json.dumps(out))
"""


def run_without_cuda(shards):
    env = dict(os.environ, RINGFEED_CUDART="/nonexistent/libcudart.so")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *shards], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_cuda_register_without_a_runtime(small_shards):
    out = run_without_cuda(small_shards)

    auto = out["auto"]
    assert auto["samples"] == len(tar_keys(small_shards)) and auto["registered"] == 0
    cuda = [n for n in auto["notes"] if "CUDA" in n]
    assert len(cuda) == 1 and cuda[0].startswith("CUDA runtime not found: /nonexistent/libcudart.so"), auto

    on = out["on"]
    assert on["error"] == "MemorySetupError", on
    assert "`cuda_register` is \"on\"" in on["message"] and "/nonexistent/libcudart.so" in on["message"], on

    off = out["off"]
    assert off["samples"] == auto["samples"] and off["registered"] == 0
    assert not [n for n in off["notes"] if "CUDA" in n], off


def test_cuda_register_is_checked_like_every_toggle(small_shards):
    try:
        ringfeed.Loader(small_shards, cuda_register="maybe")
    except ringfeed.ConfigError as e:
        assert "cuda_register" in str(e)
    else:
        raise AssertionError("a bad `cuda_register` value was accepted")
