"""A sweep after a code change, trial by trial: an interrupted trial continues across it only when asked, a
trial other code made runs again beside its old run, and an edit the training process does not import leaves
every trial settled.  The sweep runs from a copy of the package (Ray's processes inherit its path), edited
between the commands; its trials train in their own processes (--workers-per-trial 0) on synthetic data."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import thread_share_env

REPO = Path(__file__).resolve().parents[2]
TINY = ["--set", "data.name=synthetic", "--set", "data.subset=512", "--set", "optim.batch_size=64", "--set",
        "queue.size=256", "--set", "optim.max_steps=4", "--set", "eval.knn_bank=256", "--set", "eval.knn_test=100",
        "--set", "eval.linear_train=256", "--set", "eval.linear_steps=3", "--set", "run.log_models=false",
        "--set", "run.system_metrics_s=0"]


def _sweep(root: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")},
           **thread_share_env(), "PYTHONPATH": str(root / "platform"), "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", "mocolab", "sweep", "--grid", "moco.m=0.99", "--preset", "smoke",
                           "--name", "code", "--workers-per-trial", "0", "--max-concurrent", "1", *TINY, *extra],
                          cwd=root / "work", env=env, capture_output=True, text=True, timeout=900)


def _children(root: Path) -> list:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{root / 'work' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sweeps")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    return [r for r in runs if "mlflow.parentRunId" in r.data.tags]


def _copy(tmp_path: Path) -> None:
    shutil.copytree(REPO / "platform" / "mocolab", tmp_path / "platform" / "mocolab",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "work").mkdir()


def _scale_the_temperature(root: Path, old: str, new: str) -> None:
    moco = root / "platform" / "mocolab" / "method" / "moco.py"
    text = moco.read_text()
    assert f"self.m, self.tau = m, {old}tau\n" in text
    moco.write_text(text.replace(f"self.m, self.tau = m, {old}tau\n", f"self.m, self.tau = m, {new}tau\n", 1))


@pytest.mark.slow
def test_a_sweep_continues_an_interrupted_trial_across_code_only_when_asked_and_reruns_only_what_other_code_made(
        tmp_path):
    """One story, five sweeps: interrupted, refused after an edit, continued across it, settled after an edit
    the training process does not import, and a new run beside the old after another edit of the method."""
    _copy(tmp_path)
    crash = ["--set", "run.fault_step=3", "--set", "run.max_failures=0", "--set", "run.checkpoint_every=1"]
    assert _sweep(tmp_path, *crash).returncode == 1  # the trial dies at step 3, its step-2 checkpoint kept
    [run] = _children(tmp_path)
    started = run.data.tags["mocolab.code_fingerprint"]
    _scale_the_temperature(tmp_path, "", "2 * ")
    refused = _sweep(tmp_path, *crash)
    out = refused.stdout + refused.stderr
    assert refused.returncode == 1 and f"was started by code {started[:8]} and this checkout's code is" in out, out
    assert "(mocolab.method.moco: changed)" in out and "--continue-across-code" in out
    assert len(_children(tmp_path)) == 1
    continued = _sweep(tmp_path, *crash, "--continue-across-code")
    assert continued.returncode == 0, continued.stdout[-3000:] + continued.stderr[-3000:]
    [old] = _children(tmp_path)
    old_code = old.data.tags["mocolab.code_fingerprint"]
    assert old_code != started and old.data.tags["mocolab.status"] == "finished"
    assert old.data.tags["mocolab.code_segments"] == f"{started}@0,{old_code}@2"

    # every sweep of a name keeps its overrides (the parent refuses others), so the crash stays asked for: it
    # fires once per run, and the continued run above had fired it
    report = tmp_path / "platform" / "mocolab" / "analysis" / "report.py"  # not on the training path
    report.write_text(report.read_text() + "\n\ndef _unused() -> None:\n    pass\n")
    settled = _sweep(tmp_path, *crash)
    assert settled.returncode == 0, settled.stdout[-3000:] + settled.stderr[-3000:]
    assert "1 trial(s) already done, 0 to run" in settled.stdout
    assert len(_children(tmp_path)) == 1

    _scale_the_temperature(tmp_path, "2 * ", "3 * ")
    again = _sweep(tmp_path, *crash)  # a new run of the trial, beside the old: it meets its own crash at step 3
    assert again.returncode == 1 and "already done" not in again.stdout, again.stdout[-3000:]
    old, new = _children(tmp_path)
    assert new.data.tags["trial"] == old.data.tags["trial"] == "moco.m=0.99 seed=0"
    assert new.data.tags["mocolab.code_fingerprint"] not in (old_code, started)
    assert new.data.tags["mocolab.run_name"] == f"{old.data.tags['mocolab.run_name']}-c" \
                                                f"{new.data.tags['mocolab.code_fingerprint'][:8]}"
    assert old.data.tags["mocolab.status"] == "finished" and new.data.tags["mocolab.status"] != "finished"
    assert old.data.tags["mocolab.code_segments"] == f"{started}@0,{old_code}@2"  # the old run left as it was
