#!/usr/bin/env python3
"""Every `--flag` the docs give the `ringfeed` command exists in that
subcommand, as the built program's `--help` lists it (clap's options and
their aliases).

Where the docs name flags (README.md, docs/*.md, and deploy/'s manifests
and their comments):

- in a command line — a shell block's line, a code span, a manifest's
  ``command`` — from ``ringfeed SUB`` (or ``cargo run --release -- SUB``)
  to the end of that command (``|``, ``&&``, ``;``, ``&``, a redirection):
  each ``--flag`` is SUB's;
- in a code span that starts with a subcommand's name (`` `demo --local` ``);
- alone, in a paragraph or a table row (`` `--overwrite` ``): it is the
  flag of the command the unit names nearest before it — a ``ringfeed
  SUB`` span, or a span that is a subcommand's bare name (`` `get` and
  `put` ``: both) — or, when the unit names none before it, the
  subcommand the headings above it name (docs/mount.md's title names
  ``ringfeed mount``), else the first command the unit names after it. A unit that names
  another program (a span such as `` `fio --direct=1` `` or a script's
  path, or a word such as fio, tar, curl, torchrun, cargo) gives its flags
  to that program, which is not this check's business: a span that starts
  with another word than ``ringfeed`` and holds flags is that program's
  command line.

A flag that falls to no command at all fails too: the docs must say whose
flag it is. `--self-test` first checks the controls: a made-up flag in a
command line, a real flag of another subcommand, and a bare flag under no
command must each be reported.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mdblocks  # noqa: E402  (tests/docs/mdblocks.py)
from mdblocks import REPO  # noqa: E402

CLI = REPO / "target" / "release" / "ringfeed"
SHELL_LANGS = {"sh", "bash", "console", "shell", "yaml", "dockerfile", "text", ""}
# Words that end a command on a line.
OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1", "&>", ")"}
# Programs whose flags are theirs: a unit that names one gives them its flags.
OTHERS = {
    "aws", "boto3", "cargo", "cc", "c++", "cmake", "curl", "dd", "docker", "fio", "fusermount3",
    "git", "hadolint", "kubectl", "kubelet", "mountpoint", "mount-s3", "nginx", "pip", "pytest",
    "python", "python3", "rclone", "rustc", "s3fs", "s5cmd", "tar", "torchrun", "valgrind", "wget",
}
FLAG = re.compile(r"--[a-z][a-z0-9-]*")


def _help(args: list[str]) -> str:
    return subprocess.run([str(CLI), *args, "--help"], capture_output=True, text=True, check=True).stdout


def _section(text: str, title: str) -> list[str]:
    lines = text.splitlines()
    try:
        start = lines.index(title)
    except ValueError:
        return []
    out = []
    for line in lines[start + 1:]:
        if line and not line.startswith(" "):
            break
        out.append(line)
    return out


def cli_flags() -> dict[str, set[str]]:
    """{subcommand: its long flags and their aliases}; nested ones as
    ``"cache ls"``. From `ringfeed [SUB...] --help`."""
    flags: dict[str, set[str]] = {}

    def walk(path: list[str]) -> None:
        text = _help(path)
        names = set()
        for line in _section(text, "Options:"):
            m = re.match(r"\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", line)
            if m:
                names.add(m.group(1))
            for alias in re.findall(r"\[alias(?:es)?: ([^\]]+)\]", line):
                names |= set(FLAG.findall(alias))
        if path:
            flags[" ".join(path)] = names
        for line in _section(text, "Commands:"):
            m = re.match(r"\s+([a-z][a-z0-9-]*)\s", line + " ")
            if m and m.group(1) != "help":
                walk(path + [m.group(1)])

    walk([])
    return flags


@dataclass
class Use:
    where: str
    sub: str | None  # None: no command named
    flag: str
    how: str  # "command line" or "named"


def _clean(token: str) -> str:
    return token.strip("[]()\"',;`")


def commands(text: str, subs: set[str]) -> list[tuple[str, list[str]]]:
    """(subcommand, its flags) of every ``ringfeed SUB ...`` in `text`."""
    text = re.sub(r"\\\n", " ", text)
    found = []
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*", "", line)  # a shell comment
        tokens = line.split()
        i = 0
        while i < len(tokens):
            word = _clean(tokens[i])
            starts = word == "ringfeed" or word.endswith("/ringfeed")
            if word == "--" and i >= 2 and "cargo" in map(_clean, tokens[:i]) and "run" in map(_clean, tokens[:i]):
                starts = True
            nxt = _clean(tokens[i + 1]) if i + 1 < len(tokens) else ""
            if not starts or nxt not in {s.split()[0] for s in subs}:
                i += 1
                continue
            sub = nxt
            i += 2
            if i < len(tokens) and f"{sub} {_clean(tokens[i])}" in subs:
                sub = f"{sub} {_clean(tokens[i])}"
                i += 1
            flags = []
            while i < len(tokens) and tokens[i] not in OPERATORS and not tokens[i].startswith((">", "2>")):
                flags += [m for m in FLAG.findall(_clean(tokens[i]).split("=")[0]) if _clean(tokens[i]).startswith("--")]
                i += 1
            found.append((sub, flags))
    return found


def _other(code: str) -> bool:
    """Whether a code span is another program's command or name."""
    first = code.split()[0] if code.split() else ""
    name = first.rsplit("/", 1)[-1].lower()
    return name in OTHERS or "/" in first or first.endswith((".py", ".sh"))


def uses_in_units(path: Path, subs: set[str]) -> list[Use]:
    out: list[Use] = []
    bare_subs = {s for s in subs if " " not in s}
    for unit in mdblocks.units(path):
        heading_sub = None
        for h in unit.headings:
            for sub, _ in commands(" ".join(re.findall(r"`([^`]*)`", h)), subs):
                heading_sub = sub
        # The unit as a sequence of events: a context (a set of
        # subcommands, or "other") or a bare flag.
        events: list[tuple[str, object]] = []
        prev_was_sub = False
        for kind, text in unit.items:
            if kind == "text":
                words = {w.lower() for w in re.findall(r"[A-Za-z0-9+_-]+", text)}
                if words & OTHERS:
                    events.append(("ctx", "other"))
                    prev_was_sub = False
                elif text.strip(" ,") not in ("", "and", "or", "and the"):
                    prev_was_sub = False
                continue
            # `demo --local`: a subcommand's bare name starts the span.
            cmds = commands(text, subs)
            if not cmds and FLAG.search(text) and text.split()[0] in bare_subs:
                cmds = commands(f"ringfeed {text}", subs)
            if cmds:
                for sub, flags in cmds:
                    out += [Use(unit.where(), sub, f, "command line") for f in flags]
                    events.append(("ctx", {sub}))
                prev_was_sub = False
            elif text.strip() in bare_subs:
                if prev_was_sub and events and isinstance(events[-1][1], set):
                    events[-1][1].add(text.strip())
                else:
                    events.append(("ctx", {text.strip()}))
                prev_was_sub = True
            elif text.lstrip("[(").startswith("--"):
                for f in FLAG.findall(text):
                    if re.search(rf"(^|\s|\[){re.escape(f)}(?![a-z0-9-])", text):
                        events.append(("flag", f))
                prev_was_sub = False
            elif FLAG.search(text) or _other(text):
                # `fio --direct=1`, `benches/report.py`: another program's.
                events.append(("ctx", "other"))
                prev_was_sub = False
            else:
                prev_was_sub = False
        for i, (kind, value) in enumerate(events):
            if kind != "flag":
                continue
            before = next((v for k, v in reversed(events[:i]) if k == "ctx"), None)
            after = next((v for k, v in events[i + 1:] if k == "ctx"), None)
            ctx = before
            if ctx is None and heading_sub is not None:
                ctx = {heading_sub}
            if ctx is None:
                ctx = after
            if ctx == "other":
                continue
            if ctx is None:
                out.append(Use(unit.where(), None, value, "named"))
            else:
                out += [Use(unit.where(), sub, value, "named") for sub in sorted(ctx)]
    return out


def uses_in_file(path: Path, subs: set[str]) -> list[Use]:
    """Command lines of a page's code blocks and prose, or of a manifest."""
    shown = mdblocks.shown(path)
    if path.suffix == ".md":
        out = uses_in_units(path, subs)
        for b in mdblocks.blocks(path):
            if b.lang in SHELL_LANGS:
                out += [Use(b.where(), sub, f, "command line") for sub, fl in commands(b.text, subs) for f in fl]
        return out
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        out += [Use(f"{shown}:{n}", sub, f, "command line") for sub, fl in commands(line, subs) for f in fl]
    return out


def sources() -> list[Path]:
    deploy = sorted(p for p in (REPO / "deploy").rglob("*") if p.suffix in (".yaml", ".yml", ".json"))
    return [*mdblocks.docs(), *deploy, REPO / "docker" / "Dockerfile"]


def problems(uses: list[Use], flags: dict[str, set[str]]) -> list[str]:
    out = []
    for u in uses:
        if u.sub is None:
            out.append(f"{u.where}: `{u.flag}` is named with no command: say whose flag it is")
        elif u.flag not in flags[u.sub] | {"--help"}:
            out.append(f"{u.where}: `ringfeed {u.sub}` has no `{u.flag}` ({u.how})")
    return out


CONTROLS = {
    "a made-up flag in a command line": ("```sh\nringfeed mount s3://b/ /mnt --bucket-region us-east-1\n```\n", 1),
    "another subcommand's flag, named": ("`ringfeed serve` takes `--overwrite`.\n", 1),
    "a bare flag under no command": ("Give it `--overwrite`.\n", 1),
    "a span of a subcommand's name with another's flag": ("Run `serve --overwrite`.\n", 1),
    "the controls' control: flags where they are": (
        "```sh\nringfeed get s3://b/k -o x --overwrite | cat\n```\n\n"
        "`get` and `put` take `--endpoint-url` (alias `--s3-endpoint`); fio takes `--direct=1`.\n", 0),
}


def self_test(tmp: Path, flags: dict[str, set[str]]) -> bool:
    good = True
    for i, (what, (text, want)) in enumerate(CONTROLS.items()):
        page = tmp / f"control-{i}.md"
        page.write_text(text)
        found = problems(uses_in_file(page, set(flags)), flags)
        ok = len(found) == want
        print(f"flags: control {what}: {len(found)} problem(s), {'as it must' if ok else f'WRONG: {found}'}")
        good &= ok
    return good


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--self-test", action="store_true", help="check the controls first")
    a = ap.parse_args()
    flags = cli_flags()
    if a.self_test:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            if not self_test(Path(tmp), flags):
                print("flags: a control did not come out as it must: the check cannot be trusted")
                return 1
    uses = [u for p in sources() for u in uses_in_file(p, set(flags))]
    found = problems(uses, flags)
    for line in found:
        print(f"flags: {line}")
    checked = {(u.sub, u.flag) for u in uses if u.sub is not None}
    print(f"flags: {len(uses)} uses of {len(checked)} (subcommand, flag) pairs in {len(sources())} files,"
          f" against {len(flags)} subcommands of {CLI.relative_to(REPO)}")
    print(f"{len(uses) - len(found)} passed, {len(found)} failed")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
