"""The test suite's CPU, test by test, counting every process a test starts: Ray's daemons and orphans too.

    .venv/bin/python benchmarks/suite/suite_cpu.py [--top 40] [--json FILE] [--workers N] [-- PYTEST_ARGS ...]

The suite is bound by its CPU (benchmarks/RESULTS.md, "Where the suite's CPU goes"), so what a test costs
is CPU seconds: under three xdist workers on two cores its wall time says as much about its neighbours as
about it, and `benchmarks/suite/process_cpu.py` sees kinds of process, not tests. Here each pytest-xdist worker
moves itself into a cgroup of its own, which every process it starts inherits whatever reparents it (a
raylet's workers, a cluster node's daemons, a killed driver's children); the cgroup's CPU time (user +
system) is read before and after each test, its fixtures' set-up and teardown included. The suite runs
through `make test` itself (its set-up, its workers, its network-namespace fallback), the plugin and any
PYTEST_ARGS added; --workers sets its TEST_WORKERS.

Needs a cgroup file system it may write (root, or a delegated subtree): cgroup v1's cpuacct controller or
v2's cpu.stat; says which is missing otherwise.

Printed: the tests by CPU seconds with their wall time and running share of the summed CPU, each file's
total, the workers' totals (the remainder is start-up and collection), and any process left in a worker's
cgroup after the suite (a test that leaked it).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from mocolab.config.hardware import cpu_description

REPO = Path(__file__).resolve().parents[2]
V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup")

# Loaded by every xdist worker (-p): joins a cgroup of its own, writes {test id: [CPU s, wall s]} at exit.
PLUGIN = textwrap.dedent('''
    import json, os, time
    import pytest

    _state = {}

    def _usage():
        if _state["v1"]:
            with open(os.path.join(_state["group"], "cpuacct.usage")) as f:
                return int(f.read()) / 1e9
        with open(os.path.join(_state["group"], "cpu.stat")) as f:
            return int(dict(line.split() for line in f)["usage_usec"]) / 1e6

    def pytest_configure(config):
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        if not worker and getattr(config.option, "numprocesses", None):
            return  # the xdist controller: it runs no test
        group = os.path.join(os.environ["SUITE_CPU_ROOT"], f"suite-cpu-{os.getpid()}")
        os.makedirs(group, exist_ok=True)
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        with open(os.path.join(os.environ["SUITE_CPU_OUT"], f"{os.getpid()}.group"), "w") as f:
            f.write(group)  # for the script to remove it, however the run ends
        _state.update(group=group, v1=os.environ["SUITE_CPU_V1"] == "1", tests={})

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        if not _state:
            yield
            return
        cpu, wall = _usage(), time.monotonic()
        yield
        _state["tests"][item.nodeid] = [_usage() - cpu, time.monotonic() - wall]

    def pytest_unconfigure(config):
        if _state:
            out = os.path.join(os.environ["SUITE_CPU_OUT"], f"{os.getpid()}.json")
            with open(out, "w") as f:
                json.dump({"group": _state["group"], "total": _usage(), "tests": _state["tests"]}, f)
''')


def cgroup_root() -> tuple[Path, bool]:
    """(folder to make the workers' cgroups in, whether it is cgroup v1), after checking one can be made."""
    controllers = V2 / "cgroup.controllers"
    if (V1 / "cpuacct.usage").is_file():
        root, v1 = V1, True
    elif controllers.is_file() and "cpu" in controllers.read_text().split():
        root, v1 = V2, False
    else:
        raise SystemExit("no cgroup CPU accounting here: neither cgroup v1's cpuacct (/sys/fs/cgroup/cpuacct) "
                         "nor cgroup v2 with the cpu controller (/sys/fs/cgroup/cgroup.controllers)")
    probe = root / f"suite-cpu-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as err:
        raise SystemExit(f"cannot make a cgroup under {root} ({err}): run as root or in a delegated cgroup") from None
    return root, v1


def release(group: Path, root: Path) -> list[int]:
    """Move what is left in a worker's cgroup to the root one and remove it; the pids that were left."""
    procs = group / "cgroup.procs"
    left = [int(p) for p in procs.read_text().split()] if procs.is_file() else []
    for pid in left:
        try:
            (root / "cgroup.procs").write_text(str(pid))
        except OSError:
            pass  # ended meanwhile
    try:
        group.rmdir()
    except OSError:
        pass
    return left


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=40, help="tests printed (default 40)")
    ap.add_argument("--json", type=Path, help="also write {test: [CPU s, wall s]} here")
    ap.add_argument("--workers", type=int, help="pytest-xdist workers (default: make test's, TEST_WORKERS)")
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.workers is not None and args.workers < 1:
        ap.error(f"--workers: {args.workers} must be >= 1")
    root, v1 = cgroup_root()
    with tempfile.TemporaryDirectory() as tmp:
        plugin_dir, out_dir = Path(tmp, "plugin"), Path(tmp, "out")
        plugin_dir.mkdir()
        out_dir.mkdir()
        (plugin_dir / "_suite_cpu_plugin.py").write_text(PLUGIN)
        env = {**os.environ, "SUITE_CPU_ROOT": str(root), "SUITE_CPU_V1": "1" if v1 else "0",
               "SUITE_CPU_OUT": str(out_dir),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(plugin_dir), os.environ.get("PYTHONPATH")]))}
        cmd = ["make", "-C", str(REPO), "test", f"PYTEST_ARGS={shlex.join(['-p', '_suite_cpu_plugin', *extra])}",
               *([f"TEST_WORKERS={args.workers}"] if args.workers else [])]
        print(f"machine: {cpu_description()}\n$ {shlex.join(cmd)}", flush=True)
        t0 = time.monotonic()
        try:
            rc = subprocess.run(cmd, cwd=REPO, env=env).returncode
        except KeyboardInterrupt:
            raise SystemExit("interrupted: no figures") from None
        finally:  # an interrupted run leaves no cgroup behind either
            leaked = {g: release(Path(g), root) for g in (p.read_text() for p in out_dir.glob("*.group"))}
        wall = time.monotonic() - t0
        reports = [json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json"))]
    tests = {k: v for r in reports for k, v in r["tests"].items()}
    if not tests:
        raise SystemExit(f"make test exited {rc} and no pytest worker reported a test")
    total = sum(cpu for cpu, _ in tests.values())
    print(f"\n{len(tests)} tests in {wall:.0f} s (make test exit status {rc}); {total:.0f} CPU s inside tests, "
          f"{sum(r['total'] for r in reports):.0f} CPU s in the {len(reports)} workers' cgroups")
    print(f"\n{'CPU s':>7} {'wall s':>7} {'share':>6}  test (cumulative share of the CPU inside tests)")
    running = 0.0
    for name, (cpu, w) in sorted(tests.items(), key=lambda kv: -kv[1][0])[:args.top]:
        running += cpu
        print(f"{cpu:7.1f} {w:7.1f} {100 * running / total:5.1f}%  {name}")
    files = collections.Counter()
    for name, (cpu, _) in tests.items():
        files[name.split("::")[0]] += cpu
    print(f"\n{'CPU s':>7} {'share':>6}  file")
    for name, cpu in files.most_common():
        print(f"{cpu:7.1f} {100 * cpu / total:5.1f}%  {name}")
    for group, pids in leaked.items():
        if pids:
            print(f"left running after the suite in {group}: {len(pids)} process(es), pids {pids[:10]}")
    if args.json:
        args.json.write_text(json.dumps({k: [round(c, 2), round(w, 2)] for k, (c, w) in tests.items()}, indent=0))
        print(f"\nwritten: {args.json}")


if __name__ == "__main__":
    main()
