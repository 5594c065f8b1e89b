"""The layers point one way: the method layer loads neither Ray nor MLflow, MLflow is spoken only in tracking/.

Checked twice: by importing each module in a fresh child process and reading
``sys.modules`` (what a user pays), and by reading every module's import
statements (what a contributor adds).
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
from conftest import run_concurrently

PACKAGE = Path(__file__).resolve().parents[2] / "platform" / "mocolab"


CHECKED = [
    ("mocolab.training.trainer", False), ("mocolab.training.build", False), ("mocolab.training.monitors", False),
    ("mocolab.method.moco", False), ("mocolab.method.queue_layouts", False), ("mocolab.method.shuffle", False),
    ("mocolab.method.collectives", False), ("mocolab.config", False), ("mocolab.analysis", False),
    ("mocolab.analysis.report", True), ("mocolab.tracking", True), ("mocolab.cli.commands", False),
    ("mocolab.cluster", False), ("mocolab.models.exported", False), ("mocolab.config.choices", False),
    ("mocolab.config.manifest", False), ("mocolab.evaluation.scoring", False),
]
# What a command loads before it checks its input: none of torch, Ray or MLflow, so --help answers and a bad
# value or flag is refused in a fraction of a second instead of after their seconds of start-up.
STARTS_LIGHT = ["mocolab.config", "mocolab.data.roots", "mocolab.cli.commands", "mocolab.config.choices",
                "mocolab.tune", "mocolab.tune.study"]
HEAVY = ("torch", "ray", "mlflow")
# What reads a store and draws (mocolab report, the leaderboard): MLflow, pandas and matplotlib, never torch,
# whose seconds of start-up a researcher would wait on for nothing these commands compute
READS_STORE = ["mocolab.analysis.report", "mocolab.evaluation.leaderboard"]


# Imports each module named on the command line in a child forked from one interpreter (so each starts from
# the same sys.modules, as a fresh interpreter would, less what the parent preloaded) and prints, per module,
# which of ray, mlflow, mocolab.tune and torch the child then holds.
FORKED_IMPORTS = """
import json, os, sys
for name in filter(None, sys.argv[1].split(",")):
    __import__(name)
children = {}
for module in sys.argv[2:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            __import__(module)
            held = {name: name in sys.modules for name in ("ray", "mlflow", "mocolab.tune", "torch")}
        except BaseException as e:
            held = {"error": repr(e)}
        os.write(w, json.dumps(held).encode())
        os._exit(0)
    os.close(w)
    children[module] = r
out = {}
for module, r in children.items():
    with os.fdopen(r) as f:
        out[module] = json.loads(f.read())
    os.wait()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def loaded() -> dict[str, dict[str, bool]]:
    """Per module: which of ray, mlflow, mocolab.tune and torch an interpreter holds after importing it alone.

    The modules that check input or read a store are imported from a bare interpreter (torch must not load);
    the rest from one that preloaded torch, numpy and matplotlib, which none of their checks is about, so each
    child pays only for what it adds (Ray, MLflow) instead of torch's seconds again.
    """
    light = STARTS_LIGHT + READS_STORE
    rest = [m for m, _ in CHECKED if m not in light]
    runs = run_concurrently([[sys.executable, "-c", FORKED_IMPORTS, "", *dict.fromkeys(light)],
                             [sys.executable, "-c", FORKED_IMPORTS, "torch,numpy,matplotlib.pyplot", *rest]],
                            timeout=120)
    out = {}
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
        out.update(json.loads(run.stdout.strip().splitlines()[-1]))
    for module, held in out.items():
        assert "error" not in held, f"import {module}: {held}"
    return out


@pytest.mark.parametrize("module, mlflow_allowed", CHECKED)
def test_import_loads_neither_ray_nor_mlflow(loaded, module, mlflow_allowed):
    held = loaded[module]
    assert not held["ray"], f"import {module} loaded ray"
    assert not held["mocolab.tune"], f"import {module} loaded mocolab.tune (a layer above it)"
    if not mlflow_allowed:
        assert not held["mlflow"], f"import {module} loaded mlflow"


@pytest.mark.parametrize("module", STARTS_LIGHT)
def test_what_checks_input_loads_no_torch_ray_or_mlflow(loaded, module):
    heavy = [name for name in HEAVY if loaded[module][name]]
    assert not heavy, f"import {module} loaded {heavy} (allowed values belong in config/choices.py, a sweep's " \
                      f"checks in tune/spec.py; the rest loads after the input is checked)"


@pytest.mark.parametrize("module", READS_STORE)
def test_what_reads_the_store_loads_no_torch(loaded, module):
    assert not loaded[module]["torch"], \
        f"import {module} loaded torch (an import for a type hint only belongs under TYPE_CHECKING)"


def _imports(path: Path) -> set[str]:
    """Top-level names of every module a file imports (absolute and package-relative)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the file's package
                parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)[:-node.level]
                base = ".".join(parts + ([base] if base else []))
            names.add(base)
    return names


def _files(*, under: str | None = None, exclude: str | None = None) -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py"))
    if under:
        files = [f for f in files if f.relative_to(PACKAGE).parts[0] == under]
    if exclude:
        files = [f for f in files if f.relative_to(PACKAGE).parts[0] != exclude]
    return files


def test_only_tracking_imports_mlflow():
    offenders = [str(f.relative_to(PACKAGE)) for f in _files(exclude="tracking")
                 if any(n == "mlflow" or n.startswith("mlflow.") for n in _imports(f))]
    assert offenders == []


def test_tracking_analysis_and_cluster_never_import_ray():
    for under in ("tracking", "analysis", "cluster"):  # cluster/ starts Ray and MLflow as programs only
        files = _files(under=under)
        assert files, under
        offenders = [str(f.relative_to(PACKAGE)) for f in files
                     if any(n == "ray" or n.startswith("ray.") for n in _imports(f))]
        assert offenders == [], f"{under}/ imports ray: {offenders}"


RAY_SIDE = ("launch", "worker", "session", "stream", "shipping", "checkpoint", "resources", "ray_output",
            "interrupts", "lock")


def test_method_layer_never_imports_ray_mlflow_or_upper_layers():
    """method/, models/, data/, config/, the plain loop of training/ and evaluation's scoring: plain PyTorch."""
    files = [f for under in ("method", "models", "data", "config") for f in _files(under=under)]
    files += [PACKAGE / "training" / f"{name}.py"
              for name in ("trainer", "build", "monitors", "optimizers", "schedule")]
    files += [PACKAGE / "evaluation" / f"{name}.py" for name in ("knn", "probe", "scoring")]
    upper = ("mocolab.tune", "mocolab.tracking", "mocolab.analysis.report", "mocolab.cli", "mocolab.repro",
             *(f"mocolab.training.{name}" for name in RAY_SIDE))
    for path in files:
        bad = {n for n in _imports(path) if n.split(".")[0] in ("ray", "mlflow") or n.startswith(upper)}
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"


def test_report_does_not_import_tune():
    assert not any(n.startswith("mocolab.tune") for n in _imports(PACKAGE / "analysis" / "report.py"))


def test_the_package_root_holds_a_table_of_contents():
    """A handful of entries at the root (packages named for the field's concepts), and no module name used
    twice anywhere in the package: a newcomer finds a thing by its name."""
    root = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__" and (p.suffix == ".py" or p.is_dir()))
    assert len(root) <= 15, root
    names: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            names.setdefault(path.stem, []).append(str(path.relative_to(PACKAGE)))
    assert {n: p for n, p in names.items() if len(p) > 1} == {}
    # a package and a module never share a name either (mocolab.train the function, mocolab.training the package)
    packages = {p.name for p in PACKAGE.rglob("*") if p.is_dir() and (p / "__init__.py").exists()}
    assert not packages & set(names), packages & set(names)
