"""ringfeed groups and names samples as WebDataset does (docs/webdataset-compat.md).

Shards are generated with GNU tar (every format it writes), Python's tarfile
(GNU, pax, ustar) and WebDataset's own writer, with the awkward members
users' shards have: upper-case and multi-dot extensions, long names,
directories, hard links, symlinks, files without a dot, leading dots,
``__…__`` names, repeated keys, empty and non-ASCII names. Each shard is read
by ringfeed and by ``webdataset.WebDataset``; the samples must be the same:
the same ``__key__``s in the same order, the same field names, the same bytes.

Where they differ on purpose the test says why: GNU sparse members and
compressed shards are refused by ringfeed with a named error, and old GNU
headers from ``tar --incremental`` are read as GNU tar reads them (Python's
tarfile takes their atime for a path prefix).
"""

import io
import os
import re
import time
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import ringfeed
from conftest import require

GNU_FORMATS = ["gnu", "oldgnu", "posix", "ustar", "v7"]
OLDGNU_MAGIC = b"ustar  \0"


@pytest.fixture(scope="module")
def wds():
    return require("webdataset", "the WebDataset comparison")


@pytest.fixture(scope="module")
def gnu_tar():
    tar = shutil.which("tar")
    if tar is None or b"GNU tar" not in subprocess.run([tar, "--version"], capture_output=True).stdout:
        pytest.fail("GNU tar is needed to generate the shards of this test")
    return tar


def ringfeed_samples(path):
    """[{"__key__": key, field: bytes}] in the order ringfeed delivers them."""
    out = []
    with ringfeed.Loader(str(path), batch_size=3, workers=1) as loader:
        for batch in loader:
            with batch:
                for i, key in enumerate(batch.keys):
                    out.append({"__key__": key, **{n: bytes(v) for n, v in batch.sample(i).items()}})
    return out


def webdataset_samples(wds, path):
    """The same, from WebDataset with its defaults (no shuffle)."""
    ds = wds.WebDataset(str(path), shardshuffle=False, empty_check=False)
    return [{k: v for k, v in s.items() if k not in ("__url__", "__local_path__")} for s in ds]


def assert_same(got, want, path):
    assert [s["__key__"] for s in got] == [s["__key__"] for s in want], path
    for g, w in zip(got, want):
        assert sorted(g) == sorted(w), (path, g["__key__"])
        assert g == w, (path, g["__key__"])


def payload(name):
    return f"<{name}>".encode() * (1 + len(name) % 7)


# -- GNU tar -------------------------------------------------------------------

LONG_DIR = "a-long-directory-name-" + "d" * 100  # > 100 bytes: GNU `L`, pax `path`
USTAR_DIR = "p" * 90  # name over 100 bytes that ustar's prefix can hold


def gnu_tree(root, fmt):
    """A tree and the order GNU tar archives it in: [relative path]."""
    files = {
        "000001.JSON": b'{"a": 1}',
        "000001.jpg": b"jpeg bytes",
        "000001.Seg.PNG": b"png bytes",
        "000002.a.b.c.jpg": b"multi-dot",
        "000003.txt": b"",
        "noext": b"no dot: not a sample",
        "__meta__": b"webdataset passes over metadata names",
        "sub/.hidden.TXT": b"a leading dot: keyed by its directory",
        "sub/000004.cls": b"4",
        "000005.jpg": b"five",
        "000006.jpg": b"six",
        "000005.cls": b"five again, not consecutive: a new sample",
        "0000ä7.TXT": "non-ascii".encode(),
    }
    if fmt in ("gnu", "oldgnu", "posix"):
        files[f"{LONG_DIR}/000008.jpg"] = b"long name"
        files[f"{LONG_DIR}/{'n' * 110}.jpg"] = b"long basename"
    if fmt == "ustar":
        files[f"{USTAR_DIR}/000009.jpg"] = b"ustar prefix"
    order = []
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        if p.parent != root and p.parent.relative_to(root).as_posix() not in order:
            order.append(p.parent.relative_to(root).as_posix())
        order.append(rel)
    os.link(root / "000001.jpg", root / "000010.jpg")  # a hard link: tar type `1`
    os.symlink("000001.jpg", root / "000011.jpg")
    order += ["000010.jpg", "000011.jpg"]
    return order


def gnu_archive(gnu_tar, tmp, fmt, *extra):
    root = tmp / f"tree-{fmt}{''.join(extra)}"
    root.mkdir()
    order = gnu_tree(root, fmt)
    # One access time for every entry: `--incremental` headers carry it
    # where Python's tarfile reads a name prefix, so entries accessed in
    # different seconds would split one sample in WebDataset's reading.
    # An hour ahead and after the mtime and ctime, so tar's own reads
    # leave it (relatime updates only an atime behind them).
    when = int(time.time()) + 3600
    for p in [root, *sorted(root.rglob("*"))]:
        os.utime(p, (when, when - 60), follow_symlinks=False)
    listing = tmp / f"list-{fmt}{''.join(extra)}"
    listing.write_text("\n".join(f"./{p}" for p in order) + "\n")
    out = tmp / f"gnu-{fmt}{''.join(extra)}.tar"
    subprocess.run(
        [gnu_tar, f"--format={fmt}", *extra, "--no-recursion", "-cf", str(out), "-C", str(root), "-T", str(listing)],
        check=True, capture_output=True,
    )
    return out


@pytest.mark.parametrize("fmt", GNU_FORMATS)
def test_gnu_tar_shards(wds, gnu_tar, tmp_path, fmt):
    path = gnu_archive(gnu_tar, tmp_path, fmt)
    types = {m.name: m.type for m in tarfile.open(path)}
    assert types["./000010.jpg"] == tarfile.LNKTYPE and types["./000011.jpg"] == tarfile.SYMTYPE
    want = webdataset_samples(wds, path)
    got = ringfeed_samples(path)
    assert_same(got, want, path)
    keys = [s["__key__"] for s in got]
    assert keys.count("./000005") == 2 and "./000010" not in keys and "./000011" not in keys
    first = got[keys.index("./000001")]
    assert sorted(first) == ["__key__", "jpg", "json", "seg.png"]
    assert got[keys.index("./sub/")]["hidden.txt"].startswith(b"a leading dot")
    if fmt in ("gnu", "oldgnu", "posix"):
        assert f"./{LONG_DIR}/{'n' * 110}" in keys


@pytest.mark.parametrize("fmt", ["gnu", "oldgnu"])
def test_gnu_incremental_headers_keep_atime_out_of_the_name(wds, gnu_tar, tmp_path, fmt):
    """`--incremental` old GNU headers hold atime and ctime at byte 345, where
    ustar keeps its prefix: ringfeed names members as GNU tar lists them.
    Python's tarfile (so WebDataset) prepends the atime digits as a
    directory (CPython issue 155629); with that prefix taken off, the samples
    are WebDataset's."""
    path = gnu_archive(gnu_tar, tmp_path, fmt, "--incremental")
    raw = path.read_bytes()
    assert raw[257:265] == OLDGNU_MAGIC and raw[345] != 0, "the headers carry atime"
    listed = subprocess.run([gnu_tar, "-tf", str(path)], check=True, capture_output=True, text=True).stdout.split("\n")
    got = ringfeed_samples(path)
    assert got, path
    for s in got:
        assert any(n.startswith(s["__key__"] + ".") or n.startswith(s["__key__"]) for n in listed), s["__key__"]
    want = webdataset_samples(wds, path)
    for s in want:
        s["__key__"] = re.sub(r"^[0-7]+/(?=\./)", "", s["__key__"])
    assert_same(got, want, path)


@pytest.mark.parametrize("fmt", ["gnu", "oldgnu", "posix"])
def test_gnu_sparse_members_are_refused_by_name(wds, gnu_tar, tmp_path, fmt):
    root = tmp_path / "tree"
    root.mkdir()
    (root / "000001.txt").write_bytes(b"before")
    with open(root / "000002.bin", "wb") as f:
        f.truncate(1 << 20)
        f.seek(0, os.SEEK_END)
        f.write(b"after a hole")
    out = tmp_path / f"sparse-{fmt}.tar"
    subprocess.run([gnu_tar, f"--format={fmt}", "--sparse", "-cf", str(out), "-C", str(root), "000001.txt", "000002.bin"],
                   check=True, capture_output=True)
    want = webdataset_samples(wds, out)
    assert want[-1]["bin"][-12:] == b"after a hole" and len(want[-1]["bin"]) == (1 << 20) + 12
    if not any(m.sparse for m in tarfile.open(out) if m.isreg()):
        # A file system without holes: GNU tar stored the file whole.
        assert_same(ringfeed_samples(out), want, out)
        return
    with pytest.raises(ringfeed.FormatError, match=r"000002\.bin.*GNU sparse.*--sparse") as e:
        ringfeed_samples(out)
    assert out.name in str(e.value)


# -- Python's tarfile ------------------------------------------------------------


def tarfile_members(fmt):
    """(TarInfo, bytes) for an archive that tarfile writes in `fmt`."""
    long_dir = USTAR_DIR if fmt == tarfile.USTAR_FORMAT else LONG_DIR
    regular = [
        "s/000001.JSON", "s/000001.Jpg", "s/000001.seg.PNG",
        "s/000002.a.b.c.jpg", "s/000002.cls",
        "s/noext", "__meta__", "__x__/000003.jpg", "s/__key__.txt",
        "s/.hidden.TXT", ".top.txt",
        f"{long_dir}/000004.jpg", f"{long_dir}/000004.txt",
        "s/000005.txt", "s/000006.txt", "s/000005.cls",
        "s/0000ü7.ÄBC", "s/000008.empty",
        "./dotted/000009.jpg",
    ]
    if fmt != tarfile.USTAR_FORMAT:
        regular.append(f"{LONG_DIR}/{'n' * 120}.jpg")
    out = []
    d = tarfile.TarInfo("s")
    d.type = tarfile.DIRTYPE
    out.append((d, b""))
    for name in regular:
        data = b"" if name.endswith(".empty") else payload(name)
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        out.append((ti, data))
    hard = tarfile.TarInfo("s/000010.jpg")
    hard.type, hard.linkname = tarfile.LNKTYPE, "s/000001.Jpg"
    sym = tarfile.TarInfo("s/000011.jpg")
    sym.type, sym.linkname = tarfile.SYMTYPE, "000001.Jpg"
    out += [(hard, b""), (sym, b"")]
    return out


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT],
                         ids=["gnu", "pax", "ustar"])
def test_python_tarfile_shards(wds, tmp_path, fmt):
    path = tmp_path / "py.tar"
    with tarfile.open(path, "w", format=fmt) as t:
        for ti, data in tarfile_members(fmt):
            t.addfile(ti, io.BytesIO(data) if data or ti.isreg() else None)
    want = webdataset_samples(wds, path)
    got = ringfeed_samples(path)
    assert_same(got, want, path)
    keys = [s["__key__"] for s in got]
    assert "__x__/000003" not in keys and "s/__key__" in keys and "s/" in keys
    assert sorted(got[keys.index("s/000001")]) == ["__key__", "jpg", "json", "seg.png"]
    assert got[keys.index("s/0000ü7")]["äbc"] == payload("s/0000ü7.ÄBC")
    assert got[keys.index("s/000008")]["empty"] == b""


def test_webdataset_writer_shards(wds, tmp_path):
    samples = [
        {"__key__": f"sample{i:04d}", "JSON": b'{"i": %d}' % i, "jpg": bytes([i]) * (100 + i * 37), "Seg.PNG": b"p" * i}
        for i in range(10)
    ]
    samples.append({"__key__": "d/" + "k" * 120, "txt": b"a key over 100 bytes: a pax path"})
    samples.append({"__key__": "multi.dot", "jpg": b"key with a dot"})
    pattern = str(tmp_path / "wds-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=5) as sink:
        for s in samples:
            sink.write(dict(s))
    shards = sorted(tmp_path.glob("wds-*.tar"))
    assert len(shards) == 3
    got_all = []
    for shard in shards:
        want = webdataset_samples(wds, shard)
        got = ringfeed_samples(shard)
        assert_same(got, want, shard)
        got_all += got
    assert [s["__key__"] for s in got_all] == [s["__key__"] for s in samples[:-1]] + ["multi"]
    assert sorted(got_all[0]) == ["__key__", "jpg", "json", "seg.png"]


def test_compressed_shards_are_refused_with_the_fix(wds, tmp_path):
    """WebDataset reads `.tar.gz` through tarfile; ringfeed refuses it, naming
    the shard and the command that makes it readable."""
    path = tmp_path / "shard-000000.tar.gz"
    with wds.TarWriter(str(path)) as sink:
        for i in range(3):
            sink.write({"__key__": f"k{i}", "txt": b"x" * i})
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    assert [s["__key__"] for s in webdataset_samples(wds, path)] == ["k0", "k1", "k2"]
    with pytest.raises(ringfeed.FormatError, match=r"gzip-compressed.*gunzip") as e:
        ringfeed_samples(path)
    assert path.name in str(e.value)
    plain = tmp_path / "shard-000000.tar"
    subprocess.run(["gunzip", "-k", str(path)], check=True)
    assert_same(ringfeed_samples(plain), webdataset_samples(wds, plain), plain)
