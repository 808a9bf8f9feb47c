"""Python's brace expansion against the engine's, on real files."""

import os

import pytest
import ringfeed
from ringfeed.urls import expand_braces, expand_urls

from conftest import write_tar


def test_brace_forms():
    assert expand_braces("s-{000..003}.tar") == ["s-000.tar", "s-001.tar", "s-002.tar", "s-003.tar"]
    assert expand_braces("{a,b}-{1..2}") == ["a-1", "a-2", "b-1", "b-2"]
    assert expand_braces("x{0..6..3}") == ["x0", "x3", "x6"]
    assert expand_braces("{3..1}") == ["3", "2", "1"]
    assert expand_braces("{a,{b,c}d}") == ["a", "bd", "cd"]
    assert expand_braces("plain.tar") == ["plain.tar"]
    assert expand_braces("lit\\{x\\}") == ["lit{x}"]


@pytest.mark.parametrize(
    "pattern,why",
    [("a{0..3", "unmatched `{`"), ("a}b", "unmatched `}`"), ("{abc}", "neither a list"),
     ("{1..x}", "neither a list"), ("{0..9..0}", "step of 0"), ("{0..99999999999}", "more than")],
)
def test_bad_patterns(pattern, why):
    with pytest.raises(ValueError, match=why.replace("{", "\\{").replace("}", "\\}")):
        expand_braces(pattern)


PATTERNS = [
    "s-{000..011}.tar",
    "{a,b}-{1..3}.tar",
    "x{0..20..5}.tar",
    "r{9..7}.tar",
    "{p,{q,r}z}{01..02}.tar",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_expansion_matches_the_engine(tmp_path, pattern):
    names = expand_braces(pattern)
    for i, name in enumerate(names):
        # one sample per shard, its key naming the shard
        write_tar(tmp_path / name, [(f"{name[:-4]}.txt", name.encode())])
    with ringfeed.Loader(str(tmp_path / pattern), batch_size=1, workers=1) as loader:
        got = []
        for b in loader:
            with b:
                got.append(bytes(b["txt"][0]).decode())
        assert loader.stats()["shards_total"] == len(names)
    assert sorted(got) == sorted(names)
    assert got == names  # one engine worker reads the shards in order


def test_directories_expand_like_the_engine(tmp_path):
    for n in ["b.tar", "a.tar", "c.txt", "d.tar"]:
        write_tar(tmp_path / n, [(f"{n.split('.')[0]}.txt", n.encode())])
    shards = expand_urls([tmp_path])
    assert [os.path.basename(s) for s in shards] == ["a.tar", "b.tar", "d.tar"]
    with ringfeed.Loader(str(tmp_path), batch_size=1, workers=1) as loader:
        got = [bytes(b["txt"][0]).decode() for b in loader]
    assert got == ["a.tar", "b.tar", "d.tar"]
    assert expand_urls("http://h/x-{0..1}.tar") == ["http://h/x-0.tar", "http://h/x-1.tar"]
