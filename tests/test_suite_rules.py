"""The suite's own rules, checked on a throwaway test file run with this conftest: under CI=true a skip is a
failure that says what was missing; elsewhere it stays a skip with its reason."""

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
    pytester.makeconftest((Path(__file__).with_name("conftest.py")).read_text())
    pytester.makepyfile(test_probe=PROBE)
    monkeypatch.setenv("CI", ci)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    if ci:
        result.assert_outcomes(passed=1, failed=1, errors=1)  # a skip while setting up fails as an error
        result.stdout.fnmatch_lines(["*CI=true: skipping is not allowed here*no chromium here*",
                                     "*CI=true: skipping is not allowed here*moto_server is not installed*"])
    else:
        result.assert_outcomes(passed=1, skipped=2)
