"""`make mutate`: mutmut over the modules whose rules matter most, each against its own area's tests.

A test that cannot fail is a claim with nothing behind it: mutmut changes one operator, constant or call at a
time in a module and runs the tests that reach it; a mutant they all pass (a survivor) is a change of the rule
that no test notices.  Each target runs in a scratch copy of the checkout (mutmut edits its own ``mutants/``
copy, never these files, so it runs beside other work), laid out as mutmut expects (``src/``), with
``platform`` pointing at the mutated copy for the tests that read the package's files.

    python tests/mutate.py [TARGET ...]      # default: every target; --help names them (method: its three)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]


class Target(NamedTuple):
    """What one target mutates (modules under platform/mocolab) and the tests each mutant faces.

    Each mutant runs only the tests that reach the function it changes, fastest first, and stops at the first
    failure.  ``select`` (pytest's -k) keeps the tests that state the area's rules and leaves out those that
    restate them at a slower scale (a whole document written, a model trained); ``covered_only`` mutates only
    the lines those tests run (mutmut's mutate_only_covered_lines), where a function holds branches that only
    slow tests take: without it each mutant of such a branch runs every test of the function and survives."""

    modules: list[str]
    tests: list[str]
    select: str | None = None
    covered_only: bool = False


TARGETS = {
    # the document-writing cases restate the rules in a whole document: 30 s a mutant
    "verdicts": Target(["analysis/verdicts.py"], ["tests/repro/test_verdict_rules.py"],
                       "not csvs and not points_to and not borrow and not supervised and not same_config "
                       "and not two_machines"),
    "code_fingerprint": Target(["training/code_fingerprint.py"], ["tests/training/test_code_fingerprint.py"]),
    # torchvision's ConvNeXt and ViT (ImageNet's Tiny and Base, seconds each) are built by slow cases only
    "named": Target(["models/named.py"], ["tests/models/test_named_backbones.py"], covered_only=True),
    # method/ in three, each against the tests of tests/method that reach it
    "method-contrast": Target(["method/losses.py", "method/key_queue.py", "method/queue_layouts.py",
                               "method/negative_sources.py", "method/moco.py"], ["tests/method"]),
    "method-bn": Target(["method/batchnorm.py", "method/shuffle.py", "method/collectives.py", "method/rng.py",
                         "method/async_copy.py"], ["tests/method"]),
    "method-plugins": Target(["method/plugins.py", "method/registry.py", "method/protocol.py",
                              "method/supervised.py", "method/diagnostics.py"], ["tests/method"]),
}
GROUPS = {"method": [t for t in TARGETS if t.startswith("method-")]}
PYTEST = ["-p", "no:randomly", "-p", "no:cacheprovider", "-n", "0", "-m", "not slow and not cluster", "-q"]


def _scratch(root: Path, target: Target, select: str | None) -> Path:
    """A copy of what the tests read (the package as src/, tests/, results/, examples/, benchmarks/ and the
    Makefile that tests/method checks against, pyproject.toml), with mutmut's settings for this target in its
    setup.cfg."""
    shutil.copytree(REPO / "platform", root / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("tests", "results", "examples", "experiments", "docs", "benchmarks"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "Makefile"):
        shutil.copy2(REPO / name, root / name)
    # Without the measured durations "slow" is what a test's own marker says: tests/conftest.py also marks slow
    # every test measured over 2 s under `make test`'s load, cases written to kill mutants among them.
    (root / "tests" / "durations.json").unlink(missing_ok=True)
    only = "\n    ".join(f"src/mocolab/{m}" for m in target.modules)
    select = " and ".join(f"({k})" for k in (target.select, select) if k)
    (root / "setup.cfg").write_text(
        "[mutmut]\nsource_paths = src\n"
        f"only_mutate =\n    {only}\n"
        f"mutate_only_covered_lines = {str(target.covered_only).lower()}\n"
        "pytest_add_cli_args_test_selection =\n    " + "\n    ".join(target.tests) + "\n"
        "pytest_add_cli_args =\n    " + "\n    ".join([*PYTEST, *(["-k", select] if select else [])]) + "\n"
        "also_copy =\n    results\n    examples\n    experiments\n    docs\n    benchmarks\n    README.md\n"
        "    Makefile\n"
        "process_isolation = forkserver\n")
    (root / "mutants").mkdir()
    (root / "mutants" / "platform").symlink_to("src")  # REPO / "platform" in the tests: the mutated copy
    return root


def run(target: str, keep: Path | None, select: str | None = None) -> dict[str, int]:
    """mutmut's counts for ``target``: mutants by outcome, and the survivors' names printed."""
    root = Path(tempfile.mkdtemp(prefix=f"mutate-{target}-", dir=keep))
    _scratch(root, TARGETS[target], select)
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    env = {**os.environ, "PYTHONPATH": "", "CI": ""}
    start = time.monotonic()
    subprocess.run([mutmut, "run", "--max-children", str(os.cpu_count() or 1)], cwd=root, env=env, check=False)
    minutes = (time.monotonic() - start) / 60
    res = subprocess.run([mutmut, "results", "--all", "true"], cwd=root, env=env, capture_output=True, text=True)
    counts: dict[str, int] = {}
    for line in res.stdout.splitlines():
        m = re.match(r"\s*(\S+): (.+)$", line)
        if m:
            counts[m.group(2).strip()] = counts.get(m.group(2).strip(), 0) + 1
            if m.group(2).strip() in ("survived", "timeout", "suspicious"):
                print(f"{m.group(2).strip()}: {m.group(1)}")
    print(f"{target}: {counts} in {minutes:.1f} min (browse: cd {root} && {mutmut} browse)")
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("targets", nargs="*", default=list(TARGETS), choices=[*TARGETS, *GROUPS],
                   help="targets, or method for its three")
    p.add_argument("--keep", type=Path, default=None, help="the folder for the scratch copies (default: $TMPDIR)")
    p.add_argument("-k", dest="select", default=None, help="pytest's -k over the targets' tests: a subset of them")
    args = p.parse_args(argv)
    names = dict.fromkeys(n for t in args.targets for n in GROUPS.get(t, [t]))
    totals = {t: run(t, args.keep, args.select) for t in names}
    for t, counts in totals.items():
        print(f"{t:>18}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
