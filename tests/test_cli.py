"""The command line: `python -m mocolab` is `mocolab`, and the help lists every closed set of values."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_concurrently

from mocolab.config import CHOICES, list_presets


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


@pytest.mark.parametrize("mark, script, n_trains, n_studies", [
    ("v3-quickstart", "vit_ablation.py", 3, 2),
    ("negatives-quickstart", "negatives_ablation.py", 4, 2),
])
def test_readme_blocks_are_valid_as_written(mark, script, n_trains, n_studies):
    """README's MoCo v3 and negatives blocks: each `mocolab train` line resolves (run with --print-config, so
    no training) to the values it sets, and each study line's flags are the script's (test_readme.py runs
    them)."""
    import re
    import shlex

    from readme_blocks import commands

    repo = Path(__file__).resolve().parents[1]
    lines = commands(mark)
    trains = [line for line in lines if line.startswith(".venv/bin/mocolab train")]
    studies = [line for line in lines if f"experiments/{script}" in line]
    assert len(trains) == n_trains and len(studies) == n_studies
    mocolab = str(Path(sys.executable).with_name("mocolab"))
    *shown_configs, usage = run_concurrently(
        [[mocolab, *shlex.split(line)[1:], "--print-config"] for line in trains]
        + [[sys.executable, str(repo / "experiments" / script), "--help"]], timeout=120)
    for line, res in zip(trains, shown_configs):
        argv = shlex.split(line)[1:]
        assert res.returncode == 0, line + "\n" + res.stderr
        shown = dict(row.split(" = ", 1) for row in res.stdout.splitlines() if " = " in row)
        for key, value in (argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--set"):
            assert shown[key].lower() == value.lower(), (key, shown[key], value)
    assert usage.returncode == 0, usage.stderr
    usage = usage.stdout
    for line in studies:
        for flag in (a for a in shlex.split(line) if a.startswith("--")):
            assert flag in usage, flag


def test_a_command_ends_without_the_final_heap_walk_and_keeps_its_status():
    """``exit_now`` (every entry point's last call) freezes the heap, so the exit's last collection skips
    it, and exits with the command's status; output written before it is flushed as usual."""
    code = ("import gc, atexit\nfrom mocolab.exiting import exit_now\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0, flush=True))\n"
            "print('ran', end='')\nexit_now(3)\n")
    res = _run(sys.executable, "-c", code)
    assert res.returncode == 3 and res.stdout == "ranfrozen True\n", res
    assert _run(str(Path(sys.executable).with_name("mocolab")), "train", "--set", "optim.epochs=-1").returncode == 2


def test_presets_lists_every_preset_with_what_it_is_for():
    res = subprocess.run([str(Path(sys.executable).with_name("mocolab")), "presets"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert [line.split()[0] for line in lines[:-1]] == list_presets()
    assert all(len(line.split(None, 1)[1]) >= 20 for line in lines[:-1])
    assert "MoCo v2 on ImageNet" in res.stdout and "--print-config" in lines[-1]
