"""The suite's own rules, checked on a throwaway test file run with this conftest: under CI=true a skip (at run
time or at collection) is a failure that says what was missing; elsewhere it stays a skip with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

PROBE = '''
import pytest

@pytest.mark.skipif(True, reason="no chromium here")
def test_marked():
    pass

def test_called():
    pytest.skip("moto_server is not installed")

def test_runs():
    assert True
'''


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_skip_fails_under_ci_and_stays_a_skip_elsewhere(pytester, monkeypatch, ci):
    pytester.makeconftest((Path(__file__).parents[1] / "conftest.py").read_text())
    pytester.makepyfile(test_probe=PROBE)
    monkeypatch.setenv("CI", ci)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    if ci:
        result.assert_outcomes(passed=1, failed=1, errors=1)  # a skip while setting up fails as an error
        result.stdout.fnmatch_lines(["*CI=true: skipping is not allowed here*no chromium here*",
                                     "*CI=true: skipping is not allowed here*moto_server is not installed*"])
    else:
        result.assert_outcomes(passed=1, skipped=2)


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_module_skipped_at_collection_fails_under_ci_beside_tests_that_pass(pytester, monkeypatch, ci):
    """A module-level ``importorskip`` of a package that is missing takes every test of its module out of the
    run before any of them is an item: under CI=true the run must end in failure, not green with the rest."""
    pytester.makeconftest((Path(__file__).parents[1] / "conftest.py").read_text())
    pytester.makepyfile(test_needs_it='import pytest\n\npytest.importorskip("mocolab_no_such_package")\n\n\n'
                                      'def test_hidden():\n    pass\n',
                        test_other="def test_runs():\n    assert True\n")
    monkeypatch.setenv("CI", ci)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    if ci:
        assert result.ret != 0
        result.assert_outcomes(errors=1)  # a collection error: pytest stops the run before any test
        result.stdout.fnmatch_lines(["*CI=true: skipping is not allowed here*mocolab_no_such_package*"])
    else:
        assert result.ret == 0
        result.assert_outcomes(passed=1, skipped=1)


GROUPED = '''
import os

import pytest

@pytest.mark.parametrize("arm", ["a", "b", "c"])
@pytest.mark.xdist_group("together")
def test_grouped(arm):
    with open(os.environ["GROUP_LOG"], "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + " ")

@pytest.mark.parametrize("n", range(4))
def test_free(n):
    pass
'''


def test_a_group_runs_on_one_worker(pytester, monkeypatch, tmp_path):
    """Tests that must not run at once (the clusters: together they exhaust the memory) or that share a
    module fixture are kept on one worker by ``--dist loadgroup``. A pytest that drops the group (9.2 ignores
    the node id xdist gives a grouped test: pytest-xdist#1386) would run them at once without a word."""
    pytester.makeconftest((Path(__file__).parents[1] / "conftest.py").read_text())
    pytester.makepyfile(test_grouped=GROUPED)
    monkeypatch.setenv("GROUP_LOG", str(tmp_path / "workers.txt"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup")
    result.assert_outcomes(passed=7)
    workers = (tmp_path / "workers.txt").read_text().split()
    assert len(workers) == 3 and len(set(workers)) == 1, workers


def test_make_test_fast_leaves_out_every_test_measured_slow():
    """`make test-fast` selects -m "not slow": a test that took over SLOW_SECONDS in tests/durations.json, or
    that needs the session's Ray, is not in it, marked or not."""
    import json
    import subprocess
    import sys

    from conftest import DURATIONS, SLOW_SECONDS

    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not slow",
                          "-p", "no:cacheprovider"],
                         cwd=repo, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    fast = [line for line in out.stdout.splitlines() if "::" in line]
    known = json.loads(DURATIONS.read_text())
    assert len(fast) > 100 and max(known.values()) > SLOW_SECONDS
    assert not [t for t in fast if known.get(t, 0.0) > SLOW_SECONDS]
    # on Ray
    assert "tests/training/test_shipping.py::test_every_node_is_checked_against_the_drivers_versions" not in fast
