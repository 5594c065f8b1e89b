"""The command line: `python -m mocolab` is `mocolab`, and the help lists every closed set of values."""

from __future__ import annotations

import pytest

import subprocess
import sys
from pathlib import Path

from mocolab.config import CHOICES


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_python_dash_m_is_the_mocolab_command():
    console = str(Path(sys.executable).with_name("mocolab"))
    for args in (["--version"], ["train", "--help"]):
        by_module = _run(sys.executable, "-m", "mocolab", *args)
        by_script = _run(console, *args)
        assert by_module.returncode == by_script.returncode == 0, by_module.stderr + by_script.stderr
        assert by_module.stdout.replace("python -m mocolab", "mocolab").replace("__main__.py", "mocolab") == \
            by_script.stdout
    bad = _run(sys.executable, "-m", "mocolab", "train", "--set", "moco.bn=group")
    assert bad.returncode == 2 and "moco.bn: unknown value 'group'" in bad.stderr


def test_train_help_lists_the_allowed_values_from_their_single_source():
    out = _run(sys.executable, "-m", "mocolab", "train", "--help").stdout
    for key, values in CHOICES.items():
        line = next(line for line in out.splitlines() if line.strip().startswith(key + " "))
        assert line.split(None, 1)[1].strip() == ", ".join(values)
