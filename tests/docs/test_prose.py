"""README and docs/ say how and why, not when: no date and no commit id in their prose, and a README a reader
finishes in five minutes.

History belongs in git and measurements in benchmarks/RESULTS.md (with their machine and command), so a page
that names a date or a commit has started to keep a log. Prose is what a page says in its own words: fenced
blocks (commands, captured output with its run ids) and generated text (docs/REPRODUCTION.md, README's block
between its repro markers) are left out. A commit id is a hex word that git resolves to a commit of this
repository; an MLflow run id or a rules hash is not one.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from mocolab.repro.plan import HEADLINE_BEGIN, HEADLINE_END
from readme_blocks import OPEN, REPO

README_LINES = 120
ARCHITECTURE_LINES = 250  # the map, the layers and their rules, where each concept lives: no more
GENERATED = {"REPRODUCTION.md"}  # written by `mocolab repro --document-only`
DATE = re.compile(r"\b(?:19|20)\d{2}-\d{2}-\d{2}\b")
HEX = re.compile(r"(?<![\w/.#-])[0-9a-f]{7,40}(?![\w/-])")


def pages() -> list[Path]:
    """README.md and the hand-written pages of docs/."""
    return [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if p.name not in GENERATED)]


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the text's own words: fenced blocks and README's generated block left out."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == HEADLINE_BEGIN:
            i = next((j for j in range(i, len(lines)) if lines[j].strip() == HEADLINE_END), len(lines)) + 1
            continue
        m = OPEN.match(line)
        if m and not (m.group("fence")[0] == "`" and "`" in m.group("rest")):
            fence = m.group("fence")
            close = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
            i = next((j for j in range(i + 1, len(lines)) if close.match(lines[j])), len(lines)) + 1
            continue
        out.append((i + 1, line))
        i += 1
    return out


def commits(words: set[str]) -> set[str]:
    """The words git resolves to a commit of this repository (one ``git cat-file`` for all of them)."""
    if not words:
        return set()
    ordered = sorted(words)
    res = subprocess.run(["git", "cat-file", "--batch-check=%(objecttype)"], cwd=REPO, capture_output=True,
                         text=True, input="".join(f"{w}^{{commit}}\n" for w in ordered), timeout=60)
    assert res.returncode == 0, res.stderr
    return {w for w, kind in zip(ordered, res.stdout.splitlines()) if kind == "commit"}


def history(name: str, text: str) -> list[str]:
    """``name:line: word`` for each date and each commit id in the text's prose."""
    found = [(n, w) for n, line in prose(text) for w in DATE.findall(line)]
    candidates = [(n, w) for n, line in prose(text) for w in HEX.findall(line)]
    real = commits({w for _, w in candidates})
    found += [(n, w) for n, w in candidates if w in real]
    return [f"{name}:{n}: {w}" for n, w in sorted(found)]


def _git_checkout() -> bool:
    if (REPO / ".git").exists():
        return True
    if os.environ.get("CI") == "true":
        pytest.fail("the prose check needs this repository's git history (a checkout, not an export)")
    pytest.skip("not a git checkout: no commits to tell a commit id from a run id")


def test_readme_and_docs_prose_name_no_date_and_no_commit():
    _git_checkout()
    found = [hit for page in pages() for hit in history(str(page.relative_to(REPO)), page.read_text())]
    assert not found, ("dates and commit ids in README/docs prose (history goes to git, figures to "
                       f"benchmarks/RESULTS.md with a link from the page): {found}")


def test_readme_is_read_in_five_minutes_and_the_architecture_page_stays_a_map():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_LINES, f"README.md has {lines} lines, over {README_LINES}: move detail to docs/"
    lines = len((REPO / "docs" / "ARCHITECTURE.md").read_text().splitlines())
    assert lines <= ARCHITECTURE_LINES, (f"docs/ARCHITECTURE.md has {lines} lines, over {ARCHITECTURE_LINES}: "
                                         "move detail to the page of its concept")


def test_the_check_sees_dates_and_commits_in_prose_but_not_in_fences_or_generated_text():
    _git_checkout()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          timeout=60).stdout.strip()
    text = "\n".join([
        f"The suite took 24 minutes for {head[:7]} on 2026-12-06.",  # line 1: a commit and a date
        "The run d4f58efedda440db8cc6165373ccee25 is a run id, and cafe123 names no commit.",
        "```text",
        f"2026-12-05 {head}",  # captured output: left alone
        "```",
        HEADLINE_BEGIN,
        f"generated on 2026-12-05 at {head[:10]}",
        HEADLINE_END,
        f"  At commit {head[:12]}, see `benchmarks/x.py`.",  # line 9
    ])
    expected = [f"x.md:1: {head[:7]}", "x.md:1: 2026-12-06", f"x.md:9: {head[:12]}"]
    assert sorted(history("x.md", text)) == sorted(expected)
