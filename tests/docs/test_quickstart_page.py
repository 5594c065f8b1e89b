"""docs/quickstart.md is examples/quickstart.ipynb with the outputs of one run, for reading where the notebook
is browsed without a kernel: the notebook is committed without outputs (tests/cli/test_api.py executes it), so
the page must not drift from it."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

from readme_blocks import blocks

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "quickstart.md"


def test_the_rendered_quickstart_holds_every_cell_of_the_notebook_in_order_with_its_outputs():
    nb = nbformat.read(REPO / "examples" / "quickstart.ipynb", as_version=4)
    found = blocks(PAGE)
    code = [b.text.rstrip("\n") for b in found if b.language == "python"]
    assert code == [c.source.rstrip("\n") for c in nb.cells if c.cell_type == "code"], \
        "docs/quickstart.md differs from the notebook's code: execute the notebook and render it again"
    text = PAGE.read_text()
    for cell in (c for c in nb.cells if c.cell_type == "markdown"):
        assert cell.source.split("\n", 1)[-1].strip() in text, cell.source[:200]
    printed = "\n".join(b.text for b in found if b.language == "text")
    assert re.search(r"^finished \| linear top-1 [\d.]+ \| kNN top-1 [\d.]+ \| MLflow run \w+$", printed, re.M), printed
    figures = re.findall(r"!\[[^\]]*\]\((figures/[\w.-]+\.png)\)", text)
    assert figures and all((PAGE.parent / f).is_file() for f in figures), figures
