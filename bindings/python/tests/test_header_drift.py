"""The ctypes declarations of ringfeed._ffi against include/ringfeed.h."""

import re
import shutil
import subprocess

import pytest
import ringfeed
from ringfeed import _ffi, errors

from conftest import HEADER, REPO


def header_text():
    text = HEADER.read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def norm(t):
    t = re.sub(r"\s+", " ", t.strip())
    return re.sub(r"\s*\*", " *", t).replace("* *", "**").replace(" **", " **").strip()


def parse_header():
    text = header_text()
    defines = {m.group(1): int(m.group(2)) for m in re.finditer(r"#define\s+(RINGFEED_\w+)\s+(-?\d+)", text)}
    structs = {}
    for m in re.finditer(r"typedef struct (\w+) \{(.*?)\} \1;", text, re.S):
        fields = []
        for decl in m.group(2).split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            fm = re.match(r"(.*?)(\w+)$", decl)
            fields.append((norm(fm.group(1)), fm.group(2)))
        structs[m.group(1)] = fields
    funcs = {}
    for m in re.finditer(r"^([\w \*]+?)\s*\b(ringfeed_\w+)\s*\(([^)]*)\);", text, re.M | re.S):
        params = []
        body = " ".join(m.group(3).split())
        if body and body != "void":
            for p in body.split(","):
                pm = re.match(r"(.*?)(\w+)$", p.strip())
                params.append((norm(pm.group(1)), pm.group(2)))
        funcs[m.group(2)] = (norm(m.group(1)), params)
    return defines, structs, funcs


def test_constants_match_the_header():
    defines, _, _ = parse_header()
    assert defines == _ffi.CONSTANTS


def test_structs_match_the_header():
    _, structs, _ = parse_header()
    ours = {k: [(norm(t), n) for t, n in v] for k, v in _ffi.STRUCTS.items()}
    assert structs == ours


def test_functions_match_the_header():
    _, _, funcs = parse_header()
    ours = {k: (norm(r), [(norm(t), n) for t, n in ps]) for k, (r, ps) in _ffi.FUNCTIONS.items()}
    assert funcs == ours
    for name, (ret, params) in _ffi.FUNCTIONS.items():
        f = getattr(_ffi.lib, name)
        assert f.restype is _ffi.C_TYPES[ret]
        assert f.argtypes == [_ffi.C_TYPES[t] for t, _ in params]


def test_every_error_status_has_an_exception_class():
    defines, _, _ = parse_header()
    for name, value in defines.items():
        if name.startswith("RINGFEED_ERR_"):
            cls = errors.BY_STATUS[value]
            assert issubclass(cls, ringfeed.Error)
            assert _ffi.lib.ringfeed_status_name(value).decode() == name


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to measure the C layout")
def test_struct_layout_matches_the_compiler(tmp_path):
    import ctypes

    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "ringfeed.h"', "int main(void) {"]
    for s, fields in _ffi.STRUCTS.items():
        lines.append(f'printf("{s} %zu\\n", sizeof(struct {s}));')
        for _, f in fields:
            lines.append(f'printf("{s}.{f} %zu\\n", offsetof(struct {s}, {f}));')
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-I", str(REPO / "include"), str(src), "-o", str(exe)], check=True)
    out = dict(line.rsplit(" ", 1) for line in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines())
    for s, fields in _ffi.STRUCTS.items():
        ty = _ffi.STRUCT_TYPES[s]
        assert int(out[s]) == ctypes.sizeof(ty), s
        for _, f in fields:
            assert int(out[f"{s}.{f}"]) == getattr(ty, f).offset, f"{s}.{f}"
