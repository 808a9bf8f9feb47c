#!/usr/bin/env python3
"""Every file the docs and the code's comments cite is in the repository.

What is read: README.md, CHANGELOG.md and docs/*.md whole, and the
comments (Python's docstrings too) of every tracked source, script and
manifest (src/, cli/, tests/, bindings/, benches/, scripts/, deploy/,
docker/, examples/, fuzz/ less its corpora, include/, the build files);
this file's own examples are not citations. What counts as a citation:

- a path under one of the repository's top folders (``docs/x.md``,
  ``src/a/b.rs``, ``benches/x.py``, ``tests/x.rs``, ``deploy/tests/``);
- a top-level file by name (``README.md``, ``CHANGELOG.md``, ``LICENSE``,
  ``Cargo.toml``, ``build.rs``, ``cbindgen.toml``, and the two design
  notes the code once cited, ``DESIGN.md`` and ``STYLE.md``);
- a relative link of a markdown page (``[x](epochs.md#resume)``), taken
  from the page's folder.

A cited path must exist from the repository's root, or from the citing
file's folder or one of its parents (``tests/common/mod.rs`` in cli/'s
tests is cli/tests/common/mod.rs). Not paths: a name that goes on into a
placeholder or a pattern (``benches/out/report/<time>``, ``docs/*.md``,
``shard-{000000..000127}.tar``), one after a ``/``, ``=`` or a word
(``/opt/x``, ``$PREFIX/include``, ``syntax=docker/dockerfile``), a cargo
example by its name (``examples/s3_server``, the program
``examples/s3_server.rs`` builds), and what git ignores (build outputs
such as ``bindings/python/build``). `--self-test` first checks the controls: a
missing file, a missing design note and a broken link must be reported,
and a pattern must not be.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOP = ("src", "cli", "tests", "docs", "benches", "bindings", "scripts", "deploy", "docker", "examples",
       "fuzz", "include", "proptest-regressions", ".ci")
FILES = ("README.md", "CHANGELOG.md", "LICENSE", "Cargo.toml", "Cargo.lock", "build.rs", "cbindgen.toml",
         "DESIGN.md", "STYLE.md")
CITED = re.compile(
    r"(?<![\w./~$=-])((?:" + "|".join(re.escape(t) for t in TOP) + r")/[A-Za-z0-9_./-]*)"
    r"|(?<![\w./~$=-])(" + "|".join(re.escape(f) for f in FILES) + r")(?![\w-])"
)
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
# Characters that make a name a placeholder or a pattern when they follow it.
PATTERN = set("{*<$[?%")
SOURCE_SUFFIXES = {".rs", ".py", ".sh", ".c", ".h", ".cpp", ".hpp", ".toml", ".yaml", ".yml", ".txt", ".cmake",
                   ".in", ".json", ".md"}


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / p for p in out.decode().split("\0") if p]


def sources() -> list[Path]:
    """The files whose citations are checked."""
    out = []
    for p in tracked():
        rel = p.relative_to(REPO)
        if rel.parts[0] == "fuzz" and "corpus" in rel.parts:
            continue  # inputs, not text
        if rel.parts[0] == "proptest-regressions" or rel.name in ("Cargo.lock",) or p == Path(__file__).resolve():
            continue
        if p.suffix in SOURCE_SUFFIXES or p.name in ("Dockerfile", "run", "CMakeLists.txt"):
            out.append(p)
    return out


def ignored(rel: str) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", rel], cwd=REPO).returncode == 0


def exists_from(cited: str, path: Path) -> bool:
    """`cited` exists from the root, or from `path`'s folder or a parent
    (a cargo example also by its name)."""
    cited = cited.rstrip("/.")
    for base in [REPO, *[d for d in path.parents if d.is_relative_to(REPO)]]:
        if (base / cited).exists() or (cited.startswith("examples/") and (base / f"{cited}.rs").exists()):
            return True
    return False


HASH_COMMENTS = {".py", ".sh", ".toml", ".yaml", ".yml", ".txt", ".cmake", ".in", ""}


def comments(path: Path, text: str) -> str:
    """`text` with all but its comments blanked, line for line: `//` and
    `/* */` in Rust, C and C++; `#` and docstrings in Python; `#`
    elsewhere. Markdown and JSON are read whole."""
    if path.suffix in (".md", ".json"):
        return text
    out = []
    in_block = False  # inside /* */ or a Python docstring
    for line in text.splitlines():
        if path.suffix in (".rs", ".c", ".h", ".cpp", ".hpp"):
            if in_block:
                out.append(line)
                in_block = "*/" not in line
                continue
            if "/*" in line and "*/" not in line.split("/*", 1)[1]:
                in_block = True
                out.append(line.split("/*", 1)[1])
                continue
            out.append(line.split("//", 1)[1] if "//" in line else "")
        elif path.suffix == ".py":
            quotes = line.count('"""') + line.count("'''")
            if in_block or quotes:
                out.append(line)
                in_block = in_block != (quotes % 2 == 1)
                continue
            out.append(line.split("#", 1)[1] if "#" in line else "")
        else:
            out.append(line.split("#", 1)[1] if "#" in line else "")
    return "\n".join(out)


def citations(path: Path, text: str) -> list[tuple[int, str, bool]]:
    """(line, cited path, whether it is a markdown link) in `text`."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in CITED.finditer(line):
            name = m.group(1) or m.group(2)
            end = m.end()
            if end < len(line) and line[end] in PATTERN:
                continue
            name = name.rstrip(".,:;")
            if name.endswith("/") and name.count("/") == 1 and name[:-1] in TOP:
                continue  # a top folder alone: `docs/` is there
            out.append((n, name, False))
        if path.suffix == ".md":
            for m in LINK.finditer(line):
                target = m.group(1)
                if re.match(r"[a-z]+:", target) or any(c in target for c in PATTERN):
                    continue
                out.append((n, target, True))
    return out


def problems(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        for n, name, link in citations(path, comments(path, text)):
            if link:
                if not (path.parent / name).exists():
                    found.append(f"{shown}:{n}: links to `{name}`, which is not there")
            elif not exists_from(name, path) and not ignored(name):
                found.append(f"{shown}:{n}: cites `{name}`, which is not in the repository")
    return found


def self_test() -> bool:
    missing = "docs/" + "no-such-page.md"
    design = "DESIGN" + ".md"
    controls = {
        "a missing file": (f"See `{missing}`.\n", 1),
        "a missing design note": (f"as {design} says\n", 1),
        "a broken link": ("[x](" + "gone.md#a)\n", 1),
        "the controls' control: patterns, paths and links that are there": (
            "`docs/*.md`, `benches/out/report/<time>`, `src/plan/`, [d](design.md), /opt/docs/x.md\n", 0),
    }
    good = True
    with tempfile.TemporaryDirectory(dir=REPO / "docs") as tmp:
        for i, (what, (text, want)) in enumerate(controls.items()):
            page = Path(tmp) / f"control-{i}.md"
            page.write_text(text)
            # The pages sit one folder below docs/, so a link's folder is theirs.
            if "[d](design.md)" in text:
                (Path(tmp) / "design.md").write_text("")
            found = problems([page])
            ok = len(found) == want
            print(f"paths: control {what}: {len(found)} problem(s), {'as it must' if ok else f'WRONG: {found}'}")
            good &= ok
    return good


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--self-test", action="store_true", help="check the controls first")
    a = ap.parse_args()
    if a.self_test and not self_test():
        print("paths: a control did not come out as it must: the check cannot be trusted")
        return 1
    files = sources()
    found = problems(files)
    for line in found:
        print(f"paths: {line}")
    cited = sum(len(citations(p, comments(p, p.read_text(errors="replace")))) for p in files)
    print(f"paths: {cited} citations in {len(files)} files")
    print(f"{cited - len(found)} passed, {len(found)} failed")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
