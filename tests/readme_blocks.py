"""The fenced blocks of the documents a user reads (README.md, docs/*.md and the READMEs and notes of the
folders beside them), and the mark before each that says who runs it.

A user copies these blocks into a shell, so each command block is either run by a test or says why it is
not. The mark is an HTML comment on the line before the fence:

    <!-- NAME: run as written by tests/FOLDER/test_x.py -->
    <!-- NAME: run by tests/FOLDER/test_x.py with a size override appended -->
    <!-- not run here: WHY -->

A block is a command block when its language is a shell's or Python's, or when it has none: an unlabelled
fence is what a command pasted in a hurry looks like, so it is marked like a command block or, where it
shows output, labelled ``text``. Fences of ``` or ~~~, indented (inside a list) or with a title after the
language are all read.

Tests read a block by its NAME (``block``/``commands``), so a document and the test that runs it cannot
drift apart; ``tests/docs/test_command_blocks.py`` fails on a command block with no mark, and on a mark
naming a test that never reads the block by that name.
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMAND_LANGUAGES = {"", "bash", "sh", "shell", "zsh", "console", "shell-session", "shellsession", "python", "py",
                     "python3", "pycon"}
# The folders beside the code whose Markdown a user reads as instructions (besides README.md and docs/).
DOC_FOLDERS = ("docker", "dashboards", "benchmarks", "results", "experiments", "examples")
MARK = re.compile(r"^<!-- (?:(?P<name>[\w-]+): run (?:as written )?by (?P<test>tests/(?:\w+/)*\w+\.py)[^>]*"
                  r"|not run here: (?P<why>[^>]+)) -->$")
# CommonMark's fence: three or more backticks or tildes, after any indentation (a list item's), then an
# info string whose first word is the language (``bash``, ``{.bash}``) and the rest a title or attributes.
OPEN = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*\{?\.?(?P<lang>[\w+-]*)\}?(?P<rest>.*)$")


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
    """README.md, docs/*.md, and every Markdown file under DOC_FOLDERS."""
    beside = sorted(p for folder in DOC_FOLDERS for p in (REPO / folder).rglob("*.md"))
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *beside]


def blocks(path: Path | None = None) -> list[Block]:
    """Every fenced block of the documents, in order; a fence left open runs to the end, as Markdown reads it."""
    out = []
    for doc in [path] if path else documents():
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = OPEN.match(lines[i])
            if not m or (m.group("fence")[0] == "`" and "`" in m.group("rest")):  # ``` then a backtick: inline
                i += 1
                continue
            fence, indent = m.group("fence"), len(m.group("indent").expandtabs())
            close = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
            end = next((j for j in range(i + 1, len(lines)) if close.match(lines[j])), len(lines))
            body = [line[indent:] if not line[:indent].strip() else line.lstrip() for line in lines[i + 1:end]]
            out.append(Block(doc, i + 1, m.group("lang").lower(), "\n".join(body) + "\n",
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


READERS = {"block", "commands"}


def _reader_argument(node: ast.AST) -> ast.expr | None:
    """The first argument of a call to ``block``/``commands`` (a name, or the attribute of a module)."""
    if isinstance(node, ast.Call) and node.args:
        func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        if func in READERS:
            return node.args[0]
    return None


def _parametrized(decorators: list[ast.expr], argname: str) -> set[str]:
    """The string values ``pytest.mark.parametrize`` gives ``argname`` among ``decorators``."""
    out: set[str] = set()
    for d in decorators:
        if not (isinstance(d, ast.Call) and getattr(d.func, "attr", None) == "parametrize" and len(d.args) >= 2):
            continue
        names = d.args[0]
        names = ([n.strip() for n in names.value.split(",")] if isinstance(names, ast.Constant)
                 else [e.value for e in getattr(names, "elts", []) if isinstance(e, ast.Constant)])
        if argname not in names or not isinstance(d.args[1], (ast.List, ast.Tuple)):
            continue
        at = names.index(argname)
        for case in d.args[1].elts:
            value = case.elts[at] if len(names) > 1 and isinstance(case, (ast.List, ast.Tuple)) else case
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                out.add(value.value)
    return out


def names_read_by(test: Path) -> set[str]:
    """The block names a test file reads explicitly: a string given to ``block``/``commands`` as written, or a
    value ``pytest.mark.parametrize`` gives the argument a test function passes to them. A name that only
    appears in the file's text (``eval``, ``report`` are ordinary words) is not read."""
    tree = ast.parse(test.read_text())
    out: set[str] = set()
    for fn in ast.walk(tree):
        for node in ast.walk(fn):
            arg = _reader_argument(node)
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                out.add(arg.value)
            elif isinstance(arg, ast.Name) and isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out |= _parametrized(fn.decorator_list, arg.id)
    return out
