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


def _marks(nodes: list[ast.expr], marker: str) -> bool:
    """Whether decorators, or a ``pytestmark`` value (one mark or a list of them), hold ``pytest.mark.<marker>``."""
    found = [m for n in nodes for m in (n.elts if isinstance(n, (ast.List, ast.Tuple)) else [n])]
    return any(ast.unparse(m).startswith(f"pytest.mark.{marker}") for m in found)


def _pytestmark(body: list[ast.stmt]) -> list[ast.expr]:
    return [node.value for node in body if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)]


def _marked(source: str, marker: str) -> set[str]:
    """The tests of a module's ``source`` that carry ``pytest.mark.<marker>`` as pytest reads them: from their
    decorators, their class's decorators or ``pytestmark``, or the module's ``pytestmark`` (``Class::test``
    for a method)."""
    tree = ast.parse(source)
    everywhere = _marks(_pytestmark(tree.body), marker)
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            if everywhere or _marks(node.decorator_list, marker):
                out.add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            whole = everywhere or _marks([*node.decorator_list, *_pytestmark(node.body)], marker)
            out |= {f"{node.name}::{m.name}" for m in node.body
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test")
                    and (whole or _marks(m.decorator_list, marker))}
    return out


def test_the_marker_check_reads_a_module_s_pytestmark_and_test_classes():
    module = ("import pytest\n\npytestmark = [pytest.mark.slow, pytest.mark.cluster]\n\n\n"
              "def test_plain():\n    pass\n\n\nclass TestNodes:\n    def test_lost(self):\n        pass\n")
    assert _marked(module, "cluster") == _marked(module, "slow") == {"test_plain", "TestNodes::test_lost"}
    classes = ("import pytest\n\n\n@pytest.mark.cluster\nclass TestA:\n    def test_a(self):\n        pass\n\n\n"
               "class TestB:\n    pytestmark = pytest.mark.cluster\n\n    def test_b(self):\n        pass\n\n\n"
               "class TestC:\n    @pytest.mark.cluster\n    def test_c(self):\n        pass\n\n"
               "    def test_unmarked(self):\n        pass\n\n\n"
               "@pytest.mark.cluster\ndef test_d():\n    pass\n\n\ndef test_e():\n    pass\n")
    assert _marked(classes, "cluster") == {"TestA::test_a", "TestB::test_b", "TestC::test_c", "test_d"}
    assert _marked(classes, "slow") == set()


def test_make_test_leaves_the_clusters_to_make_test_cluster_and_ci_runs_them_in_every_case(tmp_path):
    """The Ray clusters of several nodes are the tests of tests/cluster marked slow: `make test` deselects them,
    `make test-cluster` runs them one at a time, and CI runs them whether or not it has the time and disk for
    the containers."""
    stub = tmp_path / "python"
    [suite] = _dry_run("test", stub)
    [clusters] = _dry_run("test-cluster", stub)
    assert '-m "not cluster"' in suite and "-m cluster" in clusters and " -n 0 " in clusters, (suite, clusters)
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        marked = _marked(path.read_text(), "cluster")
        if path.parent.name == "cluster":
            assert marked and marked == _marked(path.read_text(), "slow"), (path.name, marked)
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
