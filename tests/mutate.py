"""`make mutate`: mutmut over the modules whose rules matter most, each against its own area's tests.

A test that cannot fail is a claim with nothing behind it: mutmut changes one operator, constant or call at a
time in a module and runs the tests that reach it; a mutant they all pass (a survivor) is a change of the rule
that no test notices.  Each target runs in a scratch copy of the checkout (mutmut edits its own ``mutants/``
copy, never these files, so it runs beside other work), laid out as mutmut expects (``src/``), with
``platform`` pointing at the mutated copy for the tests that read the package's files.

    python tests/mutate.py [TARGET ...]      # default: every target; --help names them (method: its four)
    python tests/mutate.py --cache .mutate   # each target's copy kept there: a later run re-tests what changed

With ``--cache`` (``make mutate`` passes ``.mutate``) a target's copy and mutmut's results stay between runs:
the copy's sources and tests are refreshed from the checkout, mutmut re-tests the mutants of every function
whose code changed (its own hashes) and collects what new tests reach, and the survivors of earlier runs
face the current tests again, where a new case may kill them. An unchanged checkout costs mutmut's start-up
and its survivors; a first run costs the whole target.
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

import libcst as cst  # mutmut's own parser: installed with it

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
    # method/ in four, each against the test files of tests/method that state its modules' rules (a survivor
    # runs every test that reaches its function, and nearly every test of tests/method reaches the forward pass);
    # test_device_rules (the GPU rules, on the meta device) faces every module that moves a tensor
    "method-moco": Target(["method/moco.py", "method/losses.py"],
                          [f"tests/method/{f}.py" for f in ("test_moco", "test_moco_v3", "test_losses",
                                                             "test_symmetric", "test_negatives", "test_dist",
                                                             "test_method_contract", "test_device_rules")]),
    "method-queue": Target(["method/key_queue.py", "method/queue_layouts.py", "method/negative_sources.py"],
                           [f"tests/method/{f}.py" for f in ("test_queue", "test_negatives", "test_dist",
                                                              "test_symmetric", "test_method_contract",
                                                              "test_device_rules")]),
    "method-bn": Target(["method/batchnorm.py", "method/shuffle.py", "method/collectives.py", "method/rng.py",
                         "method/async_copy.py"],
                        [f"tests/method/{f}.py" for f in ("test_norm", "test_dist", "test_collective_bytes",
                                                           "test_symmetric", "test_device_rules")]),
    "method-plugins": Target(["method/plugins.py", "method/registry.py", "method/protocol.py",
                              "method/supervised.py", "method/diagnostics.py"],
                             [f"tests/method/{f}.py" for f in ("test_plugins", "test_supervised", "test_diagnostics",
                                                                "test_method_contract")]),
}
GROUPS = {"method": [t for t in TARGETS if t.startswith("method-")]}
# the fast tests, and those marked slow only to keep make test-fast short (marked mutate too)
PYTEST = ["-p", "no:randomly", "-p", "no:cacheprovider", "-n", "0", "-m", "(not slow or mutate) and not cluster", "-q"]


def _scratch(root: Path, target: Target, select: str | None) -> Path:
    """A copy of what the tests read (the package as src/, tests/, results/, examples/, benchmarks/ and the
    Makefile that tests/method checks against, pyproject.toml), with mutmut's settings for this target in its
    setup.cfg. A copy made before is refreshed: everything but mutmut's ``mutants/`` (its results) goes first."""
    if root.is_dir():
        for entry in root.iterdir():
            if entry.name != "mutants":
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    shutil.copytree(REPO / "platform", root / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("tests", "results", "examples", "experiments", "docs", "benchmarks"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "Makefile"):
        shutil.copy2(REPO / name, root / name)
    # Without the measured durations "slow" is what a test's own marker says: tests/conftest.py also marks slow
    # every test measured over SLOW_SECONDS in tests/durations.json, cases written to kill mutants among them.
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
    undecorate(root / "src", target.modules)
    # mutants/src exists before mutmut starts: the PYTHONPATH entry that points there (see ``run``) is looked up
    # once, at the interpreter's start, and a folder missing then is skipped for good
    (root / "mutants" / "src").mkdir(parents=True, exist_ok=True)
    if not (root / "mutants" / "platform").is_symlink():
        (root / "mutants" / "platform").symlink_to("src")  # REPO / "platform" in the tests: the mutated copy
    return root


class _Undecorated(cst.CSTTransformer):
    """Each function under ``@torch.no_grad()`` rewritten as its body under ``with torch.no_grad():``, and each
    module-level function under a cache decorator as the plain function wrapped after its definition.

    mutmut mutates no function under a decorator other than a lone staticmethod or classmethod (a decorator
    runs at definition, and a mutant of it could break the import), and the rules that matter most are
    decorated: the momentum update, the keys, the queue's
    writes, the shuffle.  Both rewrites compute what the decorated function computes, so a mutant of the
    rewritten body is a mutant of the rule."""

    NO_GRAD = "torch.no_grad()"
    CACHES = ("functools.cache", "functools.lru_cache")

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0  # inside a class or function: a cache decorator there stays

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.depth += 1

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.depth -= 1
        return updated

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth += 1

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        self.depth -= 1
        if len(updated.decorators) != 1:
            return updated
        code = cst.Module([]).code_for_node(updated.decorators[0].decorator)
        if code == self.NO_GRAD:
            stmts = list(updated.body.body)
            doc = stmts[:1] if updated.get_docstring() is not None else []
            block = cst.With(items=[cst.WithItem(cst.parse_expression(self.NO_GRAD))],
                             body=cst.IndentedBlock(body=stmts[len(doc):]))
            return updated.with_changes(decorators=[], body=updated.body.with_changes(body=[*doc, block]))
        if self.depth == 0 and code.split("(")[0] in self.CACHES:
            name = updated.name.value
            return cst.FlattenSentinel([updated.with_changes(decorators=[]),
                                        cst.parse_statement(f"{name} = {code}({name})\n")])
        return updated


def undecorate(src: Path, modules: list[str]) -> None:
    """``modules`` (paths under ``src``/mocolab) rewritten in place by ``_Undecorated``."""
    for module in modules:
        path = src / "mocolab" / module
        path.write_text(cst.parse_module(path.read_text()).visit(_Undecorated()).code)


def run(target: str, keep: Path | None, select: str | None = None, cache: Path | None = None) -> dict[str, int]:
    """mutmut's counts for ``target``: mutants by outcome, and the survivors' names printed. ``cache``: the
    folder whose ``<target>/`` holds the target's copy from run to run (see the module's docstring)."""
    if cache is not None:
        root = (cache / target).resolve()
        root.mkdir(parents=True, exist_ok=True)
    else:
        root = Path(tempfile.mkdtemp(prefix=f"mutate-{target}-", dir=keep))
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    # The gloo tests' ranks come from a multiprocessing forkserver, which imports by PYTHONPATH alone (not the
    # sys.path mutmut sets in its own process): without it they would run the installed, unmutated package.
    env = {**os.environ, "PYTHONPATH": str(root / "mutants" / "src"), "CI": ""}
    before = [name for name, outcome in _outcomes(root, mutmut, env).items() if outcome in ALIVE] \
        if (root / "mutants").is_dir() else []
    _scratch(root, TARGETS[target], select)
    start = time.monotonic()
    children = ["--max-children", str(os.cpu_count() or 1)]
    subprocess.run([mutmut, "run", *children], cwd=root, env=env, check=False)
    if before:  # an earlier run's survivors against today's tests (mutmut keeps a verdict while its code stands)
        print(f"{target}: {len(before)} survivor(s) of the earlier run against the current tests", flush=True)
        subprocess.run([mutmut, "run", *children, *before], cwd=root, env=env, check=False)
    minutes = (time.monotonic() - start) / 60
    counts: dict[str, int] = {}
    by_module: dict[str, dict[str, int]] = {}
    for name, outcome in _outcomes(root, mutmut, env).items():
        counts[outcome] = counts.get(outcome, 0) + 1
        module = by_module.setdefault(_module(name), {})
        module[outcome] = module.get(outcome, 0) + 1
        if outcome in (*ALIVE, "suspicious"):
            print(f"{outcome}: {name}")
    for module, outcomes in sorted(by_module.items()):
        print(f"  {module}: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    print(f"{target}: {counts} in {minutes:.1f} min (browse: cd {root} && {mutmut} browse)")
    return counts


ALIVE = ("survived", "timeout")  # what no test killed: printed, and run again by a later run of a kept copy


def _outcomes(root: Path, mutmut: str, env: dict[str, str]) -> dict[str, str]:
    """Each mutant of the copy at ``root`` by its outcome (``mutmut results --all true``: killed ones too)."""
    res = subprocess.run([mutmut, "results", "--all", "true"], cwd=root, env=env, capture_output=True, text=True)
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^\s*(\S+): (.+)$", res.stdout, re.M)}


def _module(mutant: str) -> str:
    """The module of a mutant's name (``mocolab.method.moco.xǁMoCoǁforward__mutmut_3``: mocolab.method.moco)."""
    parts = mutant.split(".")
    at = next(i for i, p in enumerate(parts) if p.startswith(("x_", "xǁ")))  # mutmut's mangled function name
    return ".".join(parts[:at])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("targets", nargs="*", default=list(TARGETS), choices=[*TARGETS, *GROUPS],
                   help="targets, or method for its four")
    p.add_argument("--keep", type=Path, default=None, help="the folder for the scratch copies (default: $TMPDIR)")
    p.add_argument("--cache", type=Path, default=None,
                   help="keep each target's copy and results in CACHE/<target>: a later run re-tests what changed")
    p.add_argument("-k", dest="select", default=None, help="pytest's -k over the targets' tests: a subset of them")
    args = p.parse_args(argv)
    if args.cache is not None and args.keep is not None:
        p.error("--keep and --cache both say where the copies go: give one")
    names = dict.fromkeys(n for t in args.targets for n in GROUPS.get(t, [t]))
    totals = {t: run(t, args.keep, args.select, args.cache) for t in names}
    for t, counts in totals.items():
        print(f"{t:>18}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
