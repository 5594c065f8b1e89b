"""docs/performance.md ("Many GPUs, on paper") shows what its command prints: the block marked gpu-paper-model is
run as written, and its output must equal the text block below it, so the page's figures follow the code's
(the preset, the parameter count, the checkpoint's parts). Whether the model counts the bytes the collectives
move is tests/method/test_collective_bytes.py's question."""

from __future__ import annotations

import os
import subprocess

import pytest
from readme_blocks import MARK, REPO, blocks, commands

PAGE = REPO / "docs" / "performance.md"


@pytest.mark.slow  # builds the preset's two ResNet-50s
def test_performance_page_shows_what_the_paper_model_prints():
    (command,) = commands("gpu-paper-model")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the command sets its own
    printed = subprocess.run(command, shell=True, cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                             check=True).stdout
    page = blocks(PAGE)
    at = next(i for i, b in enumerate(page) if (m := MARK.match(b.mark)) and m.group("name") == "gpu-paper-model")
    shown = page[at + 1]
    assert shown.language == "text", f"{shown.where}: the command's output belongs right below it"
    assert shown.text == printed, f"{shown.where} differs from what the command prints:\n{printed}"
