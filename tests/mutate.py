"""`make mutate`: mutmut over the modules whose rules matter most, each against its own area's tests.

A test that cannot fail is a claim with nothing behind it: mutmut changes one operator, constant or call at a
time in a module and runs the tests that reach it; a mutant they all pass (a survivor) is a change of the rule
that no test notices.  Each target runs in a scratch copy of the checkout (mutmut edits its own ``mutants/``
copy, never these files, so it runs beside other work), laid out as mutmut expects (``src/``), with
``platform`` pointing at the mutated copy for the tests that read the package's files.

    python tests/mutate.py [TARGET ...]      # default: every target; --list names them
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# target: (modules to mutate under platform/mocolab, the area's tests).  Slow tests are left out: a mutant runs
# each test that reaches it, and the fast tests of an area are the ones that state its rules.
TARGETS = {
    "verdicts": (["analysis/verdicts.py"], ["tests/repro/test_verdict_rules.py"]),
    "code_fingerprint": (["training/code_fingerprint.py"], ["tests/training/test_code_fingerprint.py"]),
    "named": (["models/named.py"], ["tests/models/test_named_backbones.py"]),
    "method": (["method/*.py"], ["tests/method"]),
}
PYTEST = ["-p", "no:randomly", "-p", "no:cacheprovider", "-n", "0", "-m", "not slow and not cluster", "-q"]


def _scratch(root: Path, modules: list[str], tests: list[str], select: str | None) -> Path:
    """A copy of what the tests read (the package as src/, tests/, results/, examples/, pyproject.toml), with
    mutmut's settings for this target in its setup.cfg."""
    shutil.copytree(REPO / "platform", root / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("tests", "results", "examples", "experiments", "docs"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, root / name)
    only = "\n    ".join(f"src/mocolab/{m}" for m in modules)
    (root / "setup.cfg").write_text(
        "[mutmut]\nsource_paths = src\n"
        f"only_mutate =\n    {only}\n"
        "pytest_add_cli_args_test_selection =\n    " + "\n    ".join(tests) + "\n"
        "pytest_add_cli_args =\n    " + "\n    ".join([*PYTEST, *(["-k", select] if select else [])]) + "\n"
        "also_copy =\n    results\n    examples\n    experiments\n    docs\n    README.md\n"
        "process_isolation = forkserver\n")
    (root / "mutants").mkdir()
    (root / "mutants" / "platform").symlink_to("src")  # REPO / "platform" in the tests: the mutated copy
    return root


def run(target: str, keep: Path | None, select: str | None = None) -> dict[str, int]:
    """mutmut's counts for ``target``: mutants by outcome, and the survivors' names printed."""
    modules, tests = TARGETS[target]
    root = Path(tempfile.mkdtemp(prefix=f"mutate-{target}-", dir=keep))
    _scratch(root, modules, tests, select)
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    env = {**os.environ, "PYTHONPATH": "", "CI": ""}
    subprocess.run([mutmut, "run", "--max-children", str(os.cpu_count() or 1)], cwd=root, env=env, check=False)
    res = subprocess.run([mutmut, "results", "--all", "true"], cwd=root, env=env, capture_output=True, text=True)
    counts: dict[str, int] = {}
    for line in res.stdout.splitlines():
        m = re.match(r"\s*(\S+): (.+)$", line)
        if m:
            counts[m.group(2).strip()] = counts.get(m.group(2).strip(), 0) + 1
            if m.group(2).strip() == "survived":
                print(f"survived: {m.group(1)}")
    print(f"{target}: {counts} (browse: cd {root} && {mutmut} browse)")
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("targets", nargs="*", default=list(TARGETS), choices=list(TARGETS))
    p.add_argument("--keep", type=Path, default=None, help="the folder for the scratch copies (default: $TMPDIR)")
    p.add_argument("-k", dest="select", default=None, help="pytest's -k over the targets' tests: a subset of them")
    args = p.parse_args(argv)
    totals = {t: run(t, args.keep, args.select) for t in args.targets}
    for t, counts in totals.items():
        print(f"{t:>18}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
