"""What `make test`, `.ci/run` and pyproject.toml promise, checked by running them (dry, or with stand-ins for
pytest and make): a suite that ran nothing, or a run of CI by hand that is laxer than CI, must not look green."""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[2]


def _dry_run(target: str, stub: Path) -> list[str]:
    """The pytest lines of ``make -n TARGET``, with pytest's Python replaced by ``stub``."""
    res = subprocess.run(["make", "-n", "--no-print-directory", target, f"PY={stub}"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return [line for line in res.stdout.splitlines() if line.startswith(f"{stub} -m pytest")]


def _marked(path: Path, marker: str) -> set[str]:
    """The test functions of ``path`` decorated with ``pytest.mark.<marker>``."""
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test")
            and any(ast.unparse(d).startswith(f"pytest.mark.{marker}") for d in node.decorator_list)}


def test_make_test_leaves_the_clusters_to_make_test_cluster_and_ci_runs_them_in_every_case(tmp_path):
    """The Ray clusters of several nodes are the tests of tests/cluster marked slow: `make test` deselects them,
    `make test-cluster` runs them one at a time, and CI runs them whether or not it has the time and disk for
    the containers."""
    stub = tmp_path / "python"
    [suite] = _dry_run("test", stub)
    [clusters] = _dry_run("test-cluster", stub)
    assert '-m "not cluster"' in suite and "-m cluster" in clusters and " -n 0 " in clusters, (suite, clusters)
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        marked = _marked(path, "cluster")
        if path.parent.name == "cluster":
            assert marked and marked == _marked(path, "slow"), (path.name, marked)
        else:
            assert not marked, (path.name, marked)

    seen = tmp_path / "seen"
    make = tmp_path / "bin" / "make"
    make.parent.mkdir()
    make.write_text(f"#!/bin/sh\necho \"$*\" >> {shlex.quote(str(seen))}\n")
    make.chmod(0o755)
    env = os.environ | {"PATH": f"{make.parent}:{os.environ['PATH']}"}
    for budget, need_gb, then in (("0", "1", "test-cluster"), ("90", "100000", "test-cluster"),
                                  ("90", "0", "test-deploy")):
        seen.unlink(missing_ok=True)
        res = subprocess.run([str(REPO / ".ci" / "run")], env=env | {"CI_MINUTES": budget,
                             "MOCOLAB_STANDIN_NEED_GB": need_gb}, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert seen.read_text().split("\n")[:2] == ["test", then], (budget, need_gb, seen.read_text())
        assert ("containers not run" in res.stderr) == (then == "test-cluster"), res.stderr


def test_ci_run_by_hand_is_as_strict_as_ci(tmp_path):
    """`.ci/run` sets CI=true itself (skips fail, tests/conftest.py): run by hand it is CI, not a laxer run."""
    seen = tmp_path / "seen"
    make = tmp_path / "bin" / "make"
    make.parent.mkdir()
    make.write_text(f"#!/bin/sh\necho \"CI=$CI $*\" > {shlex.quote(str(seen))}\nexit 3\n")
    make.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PATH": f"{make.parent}:{os.environ['PATH']}"}
    res = subprocess.run([str(REPO / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 3, res.stderr  # make's failure is CI's
    assert seen.read_text().split() == ["CI=true", "test"]


def test_requires_python_names_the_oldest_python_the_tests_run_on():
    """The tests read TOML with tomllib (3.11) and the image is py311: pyproject.toml must not promise 3.10."""
    spec = SpecifierSet(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"])
    assert "3.10" not in spec and "3.11" in spec, spec
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in spec, spec
