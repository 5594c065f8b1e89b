"""What a driver ships to a cluster and checks there (mocolab/training/shipping.py), on the session's real Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import re
import tomllib
from pathlib import Path

import pytest

import mocolab
from mocolab.tracking import local_store_path
from mocolab.training import shipping

REPO = Path(__file__).resolve().parents[2]


def test_node_requirements_cover_every_dependency():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!\[ ;]", d, maxsplit=1)[0].lower() for d in deps}
    assert names == set(shipping.NODE_REQUIREMENTS) | set(shipping.DRIVER_ONLY) | set(shipping.NODE_OPTIONAL)


def test_every_node_is_checked_against_the_drivers_versions(ray_session):
    lines = []
    reports = shipping.check_nodes(say=lines.append)
    assert len(reports) == 1 and reports[0]["torch"] == shipping.driver_versions()["torch"]
    assert reports[0]["mocolab"] == mocolab.__file__
    assert lines and lines[0].startswith("Ray cluster: 1 node(s) checked: python ")
    with pytest.raises(ValueError) as err:
        shipping.check_nodes(requirements={"pytest": "pytest_is_not_this_module"})
    assert "pytest is missing (ModuleNotFoundError" in str(err.value)
    assert re.search(r"node [0-9.]+ \([0-9a-f]{8}\): pytest is missing", str(err.value))
    assert f"install pytest=={shipping.driver_versions(['pytest'])['pytest']} into " in str(err.value)


def test_paths_inside_a_working_dir_copy_are_refused(tmp_path, monkeypatch):
    outside = tmp_path / "kept"
    copy = tmp_path / "copy"
    copy.mkdir()
    monkeypatch.chdir(copy)
    shipping.check_job_paths({"--storage": str(copy / "runs")})  # not a job: nothing to refuse
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR",
                       json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_0.zip"}}))
    shipping.check_job_paths({"--storage": str(outside), "--tracking-uri": None})
    with pytest.raises(ValueError, match=r"^--storage: .*runs is inside this job's --working-dir copy"):
        shipping.check_job_paths({"--storage": str(copy / "runs")})
    with pytest.raises(ValueError, match=r"^--tracking-uri: "):
        shipping.check_job_paths({"--tracking-uri": local_store_path(f"sqlite:///{copy / 'mlflow.db'}")})


def test_a_jobs_own_py_modules_are_kept():
    env, override = shipping.code_runtime_env()
    assert env == {"py_modules": [str(shipping.package_dir())]} and not override


def test_a_jobs_own_py_modules_are_extended(monkeypatch):
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"py_modules": ["s3://b/x.zip"]}}))
    env, override = shipping.code_runtime_env()
    assert env == {"py_modules": ["s3://b/x.zip", str(shipping.package_dir())]} and override


@pytest.mark.parametrize("uri, path", [
    ("sqlite:////data/m.db", "/data/m.db"), ("sqlite:///:memory:", None), ("file:///data/mlruns", "/data/mlruns"),
    ("file:/data/mlruns", "/data/mlruns"), ("/data/mlruns", "/data/mlruns"), ("http://h:5000", None),
    ("postgresql://u:p@h/db", None), ("databricks", None),
])
def test_local_store_path(uri, path):
    assert local_store_path(uri) == path


@pytest.mark.slow  # a Ray node of its own
def test_a_node_with_another_torch_is_refused_naming_both_versions(tmp_path):
    """The version-mismatch branch on a real node: a Ray whose workers see another torch's metadata first on
    their path (as an image built with another torch would), checked by the driver that runs this torch."""
    fake = tmp_path / "site"
    (fake / "torch-2.0.0.dist-info").mkdir(parents=True)
    (fake / "torch-2.0.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.0.0\n")
    code = ("import ray\n"
            "from mocolab.training import shipping\n"
            f"ray.init(address='local', num_cpus=1, include_dashboard=False, log_to_driver=False,"
            f" runtime_env={{'env_vars': {{'PYTHONPATH': {str(fake)!r}}}}})\n"
            "try:\n    shipping.check_nodes(timeout_s=120)\nexcept ValueError as err:\n    print(err)\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    want = shipping.driver_versions()["torch"]
    assert re.search(rf"node [0-9.]+ \([0-9a-f]{{8}}\): torch 2\.0\.0, but the driver runs {re.escape(want)}; "
                     r"the versions must match", res.stdout), res.stdout[-3000:]


def test_make_run_installs_only_what_the_main_job_uses():
    """`make run` (on a fresh machine: nothing installed yet, -B) installs mocolab, not the test tools, the
    cluster extra, a database server or a browser; `make test` installs those."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    run = subprocess.run(["make", "-n", "-B", "run", "VENV=/nonexistent-venv"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "pip install -q -e ." in run.stdout and "experiments/momentum_ablation.py" in run.stdout
    for unused in ("[dev", "cluster]", "postgresql", "chromium", "lightly"):
        assert unused not in run.stdout, f"make run installs {unused!r}:\n{run.stdout}"
    test = subprocess.run(["make", "-n", "-B", "test", "VENV=/nonexistent-venv"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert test.returncode == 0, test.stderr
    for needed in (".[dev,cluster]", "postgresql", "chromium", "-m pytest"):
        assert needed in test.stdout, f"make test does not install {needed!r}:\n{test.stdout}"
