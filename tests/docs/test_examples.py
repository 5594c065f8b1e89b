"""examples/minimal_moco.py: runs end to end on real Fashion-MNIST, and needs neither Ray nor MLflow."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mocolab.data.sets import fashion_mnist_dir

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "minimal_moco.py"

pytestmark = pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)")


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_minimal_moco_runs_and_reports_loss_and_knn():
    proc = _run([str(EXAMPLE), "--steps", "5", "--subset", "1024", "--batch-size", "64", "--print-every", "1"])
    assert proc.returncode == 0, proc.stderr
    steps = re.findall(r"^step\s+(\d+)/5\s+loss (\S+)\s+pretext acc (\S+)", proc.stdout, re.MULTILINE)
    assert [int(s) for s, _, _ in steps] == [1, 2, 3, 4, 5], proc.stdout
    for _, loss, pretext in steps:
        assert 0.0 < float(loss) < 100.0  # InfoNCE over 1 + K logits: finite and positive
        assert 0.0 <= float(pretext) <= 1.0
    knn = re.search(r"^kNN top-1 .*: (\d+\.\d+) %$", proc.stdout, re.MULTILINE)
    assert knn is not None, proc.stdout
    assert 0.0 <= float(knn.group(1)) <= 100.0


def test_minimal_moco_imports_neither_ray_nor_mlflow():
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('minimal_moco', {str(EXAMPLE)!r})\n"
        "mod = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(mod)\n"
        "acc = mod.main(['--steps', '2', '--subset', '512', '--batch-size', '64', '--queue', '512'])\n"
        "assert isinstance(acc, float) and 0.0 <= acc <= 1.0, acc\n"
        "leaked = [m for m in ('ray', 'mlflow') if m in sys.modules]\n"
        "assert not leaked, f'the method layer imported {leaked}'\n"
        "print('ok', acc)\n"
    )
    proc = _run(["-c", code])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith("ok ")
