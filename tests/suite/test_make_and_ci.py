"""What `make test`, `.ci/run` and pyproject.toml promise, checked by running them (dry, or with stand-ins for
pytest and make): a suite that ran nothing, or a run of CI by hand that is laxer than CI, must not look green."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[2]


def _default_ports_line(makefile: Path, pytest_args: str, stub: Path) -> str:
    """The recipe line of `make test` that runs the default_ports tests where no network namespace can be made,
    as make expands it (a dry run, with pytest replaced by ``stub``)."""
    res = subprocess.run(["make", "-n", "--no-print-directory", "-f", str(makefile), "test", "NETNS=no",
                          f"PY={stub}", f"PYTEST_ARGS={pytest_args}"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    found = [line for line in res.stdout.splitlines() if line.startswith(str(stub)) and "-m default_ports" in line]
    assert len(found) == 1, res.stdout[-3000:]
    return found[0]


@pytest.mark.parametrize("pytest_args, accepted", [("", False), ("tests/data/test_data.py", True)],
                         ids=["every-test", "chosen-tests"])
def test_no_default_ports_test_collected_passes_only_where_pytest_args_chose_the_tests(tmp_path, pytest_args,
                                                                                        accepted):
    """pytest exits 5 when it collects nothing. With PYTEST_ARGS choosing a few tests that is expected of the
    default_ports leg; with every test selected it means the marked tests went missing, and make must fail."""
    stub = tmp_path / "python"
    stub.write_text("#!/bin/sh\nexit 5  # pytest: no tests collected\n")
    stub.chmod(0o755)
    line = _default_ports_line(REPO / "Makefile", pytest_args, stub)
    rc = subprocess.run(["bash", "-e", "-c", line], cwd=tmp_path, capture_output=True, timeout=60).returncode
    assert (rc == 0) == accepted, (line, rc)
    failing = tmp_path / "failing"  # any other failure of that leg fails make, whatever PYTEST_ARGS says
    failing.write_text("#!/bin/sh\nexit 1\n")
    failing.chmod(0o755)
    assert subprocess.run(["bash", "-e", "-c", line.replace(str(stub), str(failing), 1)], cwd=tmp_path,
                          capture_output=True, timeout=60).returncode != 0


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
