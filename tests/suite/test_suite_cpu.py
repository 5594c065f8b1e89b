"""benchmarks/suite/suite_cpu.py: each test is charged the CPU of every process it starts, orphans included."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "suite" / "suite_cpu.py"

# A test whose CPU is spent by a process it does not wait for: double-forked (reparented to init, so the
# test's own rusage never sees it), it burns a second of CPU and leaves a file; the test waits for the file.
TESTS = '''
import subprocess, sys, time

BURN = """import sys, time
t = time.process_time()
while time.process_time() - t < 1.0:
    pass
open(sys.argv[1], "w").close()
"""

def test_orphan_burns(tmp_path):
    (tmp_path / "burn.py").write_text(BURN)
    done = tmp_path / "done"
    subprocess.run(["sh", "-c", f"{sys.executable} {tmp_path / 'burn.py'} {done} >/dev/null 2>&1 &"], check=True)
    deadline = time.monotonic() + 60
    while not done.exists():
        assert time.monotonic() < deadline, "the burner never finished"
        time.sleep(0.05)

def test_idle():
    time.sleep(0.5)
'''


@pytest.mark.slow  # a pytest run of its own
def test_a_test_is_charged_the_cpu_of_an_orphan_it_started(tmp_path):
    spec = importlib.util.spec_from_file_location("suite_cpu", SCRIPT)
    suite_cpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite_cpu)
    try:
        suite_cpu.cgroup_root()
    except SystemExit as err:  # a machine without a cgroup it may write: the script says what is missing
        res = subprocess.run([sys.executable, str(SCRIPT), "--", "--collect-only"], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path)
        said = re.sub(r"probe-\d+", "probe-PID", str(err))  # the probe's name holds the pid that tried
        assert res.returncode != 0 and said in re.sub(r"probe-\d+", "probe-PID", res.stderr), res.stderr[-2000:]
        # the charge itself was not measured: a skip with the reason, which CI=true turns into a failure
        pytest.skip(f"the CPU charge is not checked here: {err}")
    (tmp_path / "test_burn.py").write_text(TESTS)
    out = tmp_path / "cpu.json"
    res = subprocess.run([sys.executable, str(SCRIPT), "--workers", "1", "--json",
                          str(out), "--", str(tmp_path / "test_burn.py"), "-q", "-p", "no:cacheprovider",
                          "--rootdir", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    cpu = {name.split("::")[-1]: c for name, (c, _) in json.loads(out.read_text()).items()}
    assert cpu["test_orphan_burns"] >= 0.9, cpu  # the orphan's second, which rusage would not see
    assert cpu["test_idle"] < 0.3, cpu
    assert "2 tests in" in res.stdout and "test_orphan_burns" in res.stdout, res.stdout[-2000:]
