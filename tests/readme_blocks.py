"""The fenced command blocks of README.md and docs/*.md, and the mark before each that says who runs it.

A user copies these blocks into a shell, so each is either run by a test or
says why it is not. The mark is an HTML comment on the line before the fence:

    <!-- NAME: run as written by tests/FOLDER/test_x.py -->
    <!-- NAME: run by tests/FOLDER/test_x.py with a size override appended -->
    <!-- not run here: WHY -->

Tests read a block by its NAME (``block``/``commands``), so README and the
test that runs it cannot drift apart; ``tests/docs/test_command_blocks.py`` fails on a
command block with no mark, and on a mark naming a test that never reads it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMAND_LANGUAGES = {"bash", "sh", "shell", "python"}
MARK = re.compile(r"^<!-- (?:(?P<name>[\w-]+): run (?:as written )?by (?P<test>tests/(?:\w+/)*\w+\.py)[^>]*"
                  r"|not run here: (?P<why>[^>]+)) -->$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    mark: str  # the line before the fence

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(path: Path | None = None) -> list[Block]:
    """Every fenced block (``` with or without a language) of the documents, in order."""
    out = []
    for doc in [path] if path else documents():
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"^```(\w*)\s*$", lines[i])
            if not m:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            out.append(Block(doc, i + 1, m.group(1), "\n".join(lines[i + 1:end]) + "\n",
                             lines[i - 1].strip() if i else ""))
            i = end + 1
    return out


def block(name: str) -> str:
    """The block marked ``NAME``, as a user would copy it."""
    found = [b for b in blocks() if (m := MARK.match(b.mark)) and m.group("name") == name]
    assert len(found) == 1, f"{len(found)} blocks marked {name!r} in {[str(p) for p in documents()]}"
    return found[0].text


def commands(name: str, fill: dict[str, str] | None = None) -> list[str]:
    """The block's commands, one string each: continuation lines joined, comments and blank lines dropped.

    ``fill``: text to replace first, for the placeholders a user fills in (``<run id>``, an optional
    ``[--flag VALUE]``).
    """
    text = block(name)
    for placeholder, value in (fill or {}).items():
        assert placeholder in text, f"{name}: no {placeholder!r} to fill"
        text = text.replace(placeholder, value)
    joined = text.replace("\\\n", " ")
    return [shlex.join(argv) for argv in (shlex.split(line, comments=True) for line in joined.splitlines()) if argv]
