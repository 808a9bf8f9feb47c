"""The engine's log in Python's `logging` and its metrics as Prometheus
text: a fallback (direct reads refused on tmpfs) reaches the "ringfeed"
logger once, as a warning naming the file; `Loader.metrics()` is well formed
and agrees with the stats."""

import re
import subprocess
import sys
import textwrap

import ringfeed

from conftest import gen

SCRIPT = textwrap.dedent(
    """
    import logging, sys
    records = []
    class Keep(logging.Handler):
        def emit(self, r):
            records.append((r.levelname, r.getMessage()))
    logging.getLogger("ringfeed").addHandler(Keep())
    logging.getLogger("ringfeed").setLevel(logging.INFO)
    import ringfeed
    for _ in range(2):
        with ringfeed.Loader(sys.argv[1:], batch_size=8, direct_io="on", chunk_size="1MiB") as loader:
            for b in loader:
                b.release()
    for level, msg in records:
        print(level, msg)
    """
)


def test_a_fallback_reaches_the_ringfeed_logger_once(tmp_path_factory):
    import tempfile

    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        paths = gen(shm, shards=2, shard_size="1MiB")
        out = subprocess.run([sys.executable, "-c", SCRIPT, *map(str, paths)], capture_output=True, text=True,
                             timeout=120)
    assert out.returncode == 0, out.stderr
    direct = [line for line in out.stdout.splitlines() if "read buffered, not direct" in line]
    assert len(direct) == 1, out.stdout
    assert direct[0].startswith("WARNING "), direct[0]
    assert shm in direct[0], direct[0]


def test_metrics_are_prometheus_text_that_agrees_with_the_stats(small_shards):
    with ringfeed.Loader(small_shards, batch_size=8) as loader:
        for b in loader:
            b.release()
        text = loader.metrics()
        stats = loader.stats()
    families, values = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            families[name] = kind
            if kind == "counter":
                assert name.endswith("_total"), name
        elif not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name = series.split("{")[0]
            assert re.fullmatch(r"ringfeed_[a-z0-9_]+", name), name
            assert name in families, f"{name} before its TYPE"
            values[series] = float(value)
    assert values["ringfeed_delivered_samples_total"] == stats["samples_delivered"]
    assert values["ringfeed_delivered_bytes_total"] == stats["bytes_delivered"]
    assert 'ringfeed_info{version="' in text
