"""Shard lists in Python: WebDataset brace expansion and directories, as the
engine does them (src/dataset/parse.rs), so `ringfeed.torch` can split shards by
worker and rank before it opens a loader. `tests/test_urls.py` checks this
expansion against the engine's on real files.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._typing import Urls

MAX_EXPANSION = 1_000_000


def _unescape(s):
    return s.replace("\\{", "{").replace("\\}", "}")


def _find_group(s):
    depth = 0
    start = None
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 1
        elif c == "{":
            if depth == 0:
                start = i
            depth += 1
        elif c == "}":
            if depth == 0:
                raise ValueError(f"unmatched `}}` at byte {i}")
            depth -= 1
            if depth == 0:
                return start, i
        i += 1
    if start is not None:
        raise ValueError(f"unmatched `{{` at byte {start}")
    return None


def _alternatives(body):
    parts = []
    depth = 0
    start = 0
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            i += 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
        i += 1
    if parts:
        parts.append(body[start:])
        return parts
    return _numeric_range(body)


def _numeric_range(body):
    fields = body.split("..")
    bad = f"`{{{body}}}` is neither a list `{{a,b}}` nor a numeric range `{{000..127}}`"
    if not 2 <= len(fields) <= 3 or any(not f or not f.isdigit() for f in fields):
        raise ValueError(bad)
    lo, hi = int(fields[0]), int(fields[1])
    step = int(fields[2]) if len(fields) == 3 else 1
    if step == 0:
        raise ValueError(f"`{{{body}}}` has a step of 0")
    count = abs(hi - lo) // step + 1
    if count > MAX_EXPANSION:
        raise ValueError(f"`{{{body}}}` expands to more than {MAX_EXPANSION} names")
    width = len(fields[0]) if len(fields[0]) > 1 and fields[0].startswith("0") else 0
    sign = 1 if lo <= hi else -1
    return [str(lo + sign * k * step).zfill(width) for k in range(count)]


def expand_braces(pattern: str) -> list[str]:
    """WebDataset brace expansion: ``{a,b}``, ``{000..127}``, ``{0..100..10}``,
    nested groups; ``\\{`` and ``\\}`` are literal braces."""
    out: list[str] = []

    def rec(rest: str, prefix: str) -> None:
        g = _find_group(rest)
        if g is None:
            out.append(prefix + _unescape(rest))
            if len(out) > MAX_EXPANSION:
                raise ValueError(f"expands to more than {MAX_EXPANSION} names")
            return
        o, c = g
        head = prefix + _unescape(rest[:o])
        tail = rest[c + 1 :]
        for alt in _alternatives(rest[o + 1 : c]):
            rec(alt + tail, head)

    try:
        rec(pattern, "")
    except ValueError as e:
        raise ValueError(f"{pattern}: {e}") from None
    return out


def _local(url):
    if url.startswith("file://"):
        return url[len("file://") :]
    return url


def expand_urls(urls: Urls) -> list[str]:
    """The ordered list of shards that `urls` names: each string brace-expanded,
    local directories replaced by their ``.tar`` files in name order. Network
    URLs (``http://``, ``s3://``) are kept as they are."""
    if isinstance(urls, (str, os.PathLike)):
        urls = [urls]
    out: list[str] = []
    for url in urls:
        for one in expand_braces(os.fspath(url)):
            if "://" in one and not one.startswith("file://"):
                out.append(one)
                continue
            path = _local(one)
            if os.path.isdir(path):
                names = sorted(n for n in os.listdir(path) if n.endswith(".tar") and n != ".tar")
                out.extend(os.path.join(path, n) for n in names)
            else:
                out.append(one)
    return out
