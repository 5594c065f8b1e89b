"""Where a command's CPU goes, process by process: drivers, Ray's daemons, each kind of Ray worker, servers.

    .venv/bin/python benchmarks/suite/process_cpu.py [--trials 2] [--workers-per-trial 1] [--set key=value ...]
    .venv/bin/python benchmarks/suite/process_cpu.py --command "make test"

The suite is made of small studies and `mocolab train` runs whose training is a few steps, and it keeps
both cores busy: what it spends is CPU time, not waiting. By default this runs one such study (smoke
preset, the trials one at a time, in a fresh folder with its own Ray temp dir); ``--command`` runs any
shell command from the repository root instead. Every process started on the machine after the command
(daemons that leave its process tree included) is sampled four times a second, keeping its last CPU time
(user + system) and its last title (Ray renames a worker when it takes an actor: ``ray::IDLE`` becomes
``ray::TrainController``).

Printed: CPU seconds per kind of process, how many of each, and their share; and the machine's busy CPU
time over the same span (/proc/stat), which the sampled sum approaches from below: a process that ends
between two samples loses its last quarter second, and one that lives less than that is not seen.
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
MOMENTA = ["0.99", "0.9", "0.999", "0.9999", "0"]
SAMPLE_S = 0.25


def kind(cmdline: list[str], name: str) -> str:
    """A short name for what a process is: Ray's title for its workers, the script or module for Python,
    the program's name otherwise."""
    if not cmdline:
        return name
    joined = " ".join(cmdline)
    if joined.startswith("ray::"):
        return joined.split()[0]
    program = Path(cmdline[0]).name
    if program.startswith("python"):
        if "-m" in cmdline[1:-1]:
            at = cmdline.index("-m")
            rest = [a for a in cmdline[at + 2:] if not a.startswith("-")][:1]
            return " ".join(["python -m", cmdline[at + 1], *rest])
        script = next((Path(a).name for a in cmdline[1:] if a.endswith(".py")), None)
        if script is not None:
            return script
        if "-c" in cmdline[1:]:
            return "python -c (pytest-xdist worker, or an inline script)"
        return "python"
    return program


def busy_seconds() -> float:
    """The machine's busy CPU time so far (every core), from /proc/stat: all but idle and iowait."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def watch(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float, int, dict[int, tuple[str, float]]]:
    """Run ``argv``; (wall s, busy CPU s of the machine, exit code, {pid: (kind, CPU s)}) of every process
    started on the machine meanwhile."""
    seen: dict[int, tuple[str, float]] = {}
    t0, busy0, me = time.time(), busy_seconds(), os.getpid()
    child = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(child.stdout), daemon=True)
    reader.start()
    while True:
        done = child.poll() is not None
        for p in psutil.process_iter(["create_time", "cmdline", "name", "cpu_times"]):
            info = p.info
            if p.pid == me or info["cpu_times"] is None or (info["create_time"] or 0) < t0 - 1:
                continue
            ct = info["cpu_times"]
            # an ended process (a zombie) has no command line left: it keeps the kind it was seen as alive
            label = (kind(info["cmdline"], info["name"] or "?") if info["cmdline"] or p.pid not in seen
                     else seen[p.pid][0])
            seen[p.pid] = (label, ct.user + ct.system)
        if done:
            break
        time.sleep(SAMPLE_S)
    reader.join(timeout=10)
    wall, busy = time.time() - t0, busy_seconds() - busy0
    if child.returncode != 0:
        print("".join(out)[-3000:])
    return wall, busy, child.returncode, seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=2, help=f"1..{len(MOMENTA)} (default 2)")
    ap.add_argument("--workers-per-trial", type=int, default=1, choices=(0, 1, 2))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--command", help="a shell command to watch instead of the study (run from the repository root)")
    ap.add_argument("--top", type=int, default=25, help="kinds of process printed (default 25)")
    args = ap.parse_args()
    if not 1 <= args.trials <= len(MOMENTA):
        ap.error(f"--trials: {args.trials} must be in 1..{len(MOMENTA)}")
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ}
        env.pop("RAY_ADDRESS", None)
        if args.command:
            print(f"machine: {machine}; command: {args.command}")
            wall, busy, rc, seen = watch(["bash", "-c", args.command], str(REPO), env)
        else:
            sets = [w for kv in args.set for w in ("--set", kv)]
            print(f"machine: {machine}; smoke preset, {args.trials} trial(s) one at a time, "
                  f"{args.workers_per_trial} Ray Train worker(s) a trial ({' '.join(args.set) or 'no --set'})")
            argv = [sys.executable, str(REPO / "experiments" / "momentum_ablation.py"), "--preset", "smoke",
                    "--momenta", ",".join(MOMENTA[:args.trials]), "--max-concurrent", "1",
                    "--workers-per-trial", str(args.workers_per_trial), *sets]
            wall, busy, rc, seen = watch(argv, tmp, {**env, "RAY_TMPDIR": tmp})
    if rc != 0:
        raise SystemExit(f"the command exited {rc}")
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for name, cpu in seen.values():
        by_kind[name].append(cpu)
    total = sum(sum(v) for v in by_kind.values())
    print(f"wall {wall:.1f} s; CPU sampled {total:.1f} s in {len(seen)} processes; the machine was busy "
          f"{busy:.1f} CPU s ({100 * busy / (wall * (os.cpu_count() or 1)):.0f} % of its cores)")
    print(f"{'process':56s} {'count':>6s} {'CPU s':>8s} {'share':>6s}")
    for name, cpus in sorted(by_kind.items(), key=lambda kv: -sum(kv[1]))[:args.top]:
        print(f"{name[:56]:56s} {len(cpus):6d} {sum(cpus):8.1f} {100 * sum(cpus) / total:5.1f}%")


if __name__ == "__main__":
    main()
