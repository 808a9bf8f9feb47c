"""The parts of the project's markdown the doc checks read, from
markdown-it-py's tokens (CommonMark with GitHub's tables).

- `blocks(path)`: every fenced code block, with its language and the
  words after it on the fence line (its *info*: ``python doctest
  file=train.py``). A block is *marked* when the word ``doctest`` is
  among them; its output block is the next fenced block when that one's
  info is ``text doctest-output``.
- `units(path)`: the prose, as units a reader takes as one statement — a
  paragraph, a table row, a heading — each a list of ``("code", text)``
  and ``("text", text)`` items in order, with the headings above it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parents[2]
MARK = "doctest"
OUTPUT_MARK = "doctest-output"


def docs() -> list[Path]:
    """README.md and docs/*.md, the documentation the checks read."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def shown(path: Path) -> str:
    """`path` relative to the repository when it is in it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _parser():
    return MarkdownIt("commonmark").enable("table")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    words: list[str]  # the info string's words after the language
    text: str
    output: "Block | None" = None

    @property
    def marked(self) -> bool:
        return MARK in self.words

    @property
    def attrs(self) -> dict[str, str]:
        """``key=value`` words of the info string."""
        return dict(w.split("=", 1) for w in self.words if "=" in w)

    @property
    def flags(self) -> set[str]:
        """The other words of the info string (``doctest`` among them)."""
        return {w for w in self.words if "=" not in w}

    def where(self) -> str:
        return f"{shown(self.path)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    out: list[Block] = []
    for tok in _parser().parse(path.read_text()):
        if tok.type != "fence":
            continue
        info = shlex.split(tok.info) if tok.info.strip() else []
        lang, words = (info[0], info[1:]) if info else ("", [])
        b = Block(path=path, line=tok.map[0] + 1, lang=lang, words=words, text=tok.content)
        if out and lang == "text" and OUTPUT_MARK in words and out[-1].output is None:
            out[-1].output = b
        out.append(b)
    return out


@dataclass
class Unit:
    path: Path
    line: int
    headings: list[str]  # the headings above this unit, outermost first (their text)
    items: list[tuple[str, str]] = field(default_factory=list)

    def where(self) -> str:
        return f"{shown(self.path)}:{self.line}"


def _inline_items(tok) -> list[tuple[str, str]]:
    items = []
    for c in tok.children or []:
        if c.type == "code_inline":
            items.append(("code", c.content))
        elif c.type == "text":
            items.append(("text", c.content))
        elif c.type in ("softbreak", "hardbreak"):
            items.append(("text", " "))
    return items


def units(path: Path) -> list[Unit]:
    """Paragraphs, table rows and headings, with the heading chain."""
    out: list[Unit] = []
    stack: list[tuple[int, str]] = []  # (level, heading text)
    row: Unit | None = None
    pending_heading: int | None = None
    for tok in _parser().parse(path.read_text()):
        if tok.type == "heading_open":
            pending_heading = int(tok.tag[1:])
        elif tok.type == "tr_open":
            row = Unit(path, tok.map[0] + 1 if tok.map else 0, [h for _, h in stack])
        elif tok.type == "tr_close" and row is not None:
            out.append(row)
            row = None
        elif tok.type == "inline":
            items = _inline_items(tok)
            if pending_heading is not None:
                level = pending_heading
                pending_heading = None
                while stack and stack[-1][0] >= level:
                    stack.pop()
                text = "".join(f"`{t}`" if k == "code" else t for k, t in items)
                out.append(Unit(path, tok.map[0] + 1, [h for _, h in stack], items))
                stack.append((level, text))
            elif row is not None:
                row.items += items + [("text", " | ")]
            else:
                out.append(Unit(path, tok.map[0] + 1, [h for _, h in stack], items))
    return out
