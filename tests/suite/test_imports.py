"""Every import inside a function is listed here, with why it waits: a new one is added knowingly.

An import belongs at the top of its module, where the import graph (and whoever draws it) sees it. It waits
inside a function only for start-up time, so that ``mocolab --help``, a refused input or a light layer does
not pay for torch, Ray, MLflow, pandas or matplotlib it does not use (tests/suite/test_layers.py checks the
layers), or because the function runs in another process (a Ray task) or guards an optional dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "platform" / "mocolab"

# module (path under platform/mocolab/) -> what its functions import (absolute names).
LAZY: dict[str, set[str]] = {
    # `import mocolab` loads nothing until an API name is asked for (PEP 562)
    "__init__.py": {"mocolab.api", "mocolab.config.manifest"},  # the version: pyproject's, read on first use
    "tune/__init__.py": {"mocolab.tune.sweep"},  # Ray: the sweep's runner, on first use
    "training/__init__.py": {"mocolab.training.launch"},  # the driver's side (Ray, MLflow): the loop goes without
    # MLflow's record of an ended run, asked only where a run's folder has none; the CLI reads the flags here
    "training/rerun.py": {"mocolab.tracking.store"},
    # MLflow's table definitions load only where the store is a database (whose MLflow store has loaded them):
    # a client of an MLflow server goes without
    "tracking/store.py": {"mocolab.tracking.sql_runs"},
    # the API and the command line refuse bad input before torch, Ray, MLflow or the sweep layer loads
    "api.py": {"mocolab.training.trainer", "mocolab.training", "mocolab.tune.grid", "mocolab.tune.spec",
               "mocolab.tune.study", "mocolab.tracking", "mocolab.tracking.logged_models",
               "mocolab.evaluation.encoder_source"},
    "cli/commands.py": {"mocolab.tracking", "mocolab.tracking.logged_models", "mocolab.analysis.report",
                        "mocolab.evaluation.leaderboard", "mocolab.tune.grid", "mocolab.tune.search",
                        "mocolab.tune.study", "mocolab.repro.baseline_runs"},
    "evaluation/transfer.py": {"torch", "mocolab.data.splits", "mocolab.data.sources", "mocolab.evaluation.scoring",
                               "mocolab.evaluation.knn", "mocolab.evaluation.probe", "mocolab.config.hardware",
                               "mocolab.tracking", "mocolab.evaluation.precision"},
    "repro/run.py": {"torch", "mocolab.config.hardware", "mocolab.repro.baseline_runs", "mocolab.tracking",
                     "mocolab.repro.document", "mocolab.repro.export", "mocolab.repro.status",
                     "mocolab.repro.preregistration"},
    # the plan's tag names the tracking layer's environment variable; repro's plan stays free of MLflow
    "repro/preregistration.py": {"mocolab.tracking.source"},
    # t-SNE's libraries load where a map is made (mocolab report), never in a trainer; umap only where installed
    "analysis/feature_maps.py": {"torch", "sklearn.manifold", "threadpoolctl", "umap"},
    "tune/study.py": {"mocolab.tracking.chart_view", "mocolab.tune.sweep", "mocolab.tune.lost",
                      "mocolab.tracking.logged_models",
                      "mocolab.analysis.report", "mocolab.analysis.feature_maps", "mocolab.tracking"},
    "tune/grid.py": {"mocolab.analysis"},
    # a study answers --help and refuses its flags before pandas, matplotlib and MLflow draw its report
    "tune/studies/augmentation.py": {"mocolab.analysis"},
    # ... and measures its random-init baselines (torch, MLflow) only after the sweep
    "tune/studies/momentum.py": {"mocolab.analysis.momentum_plots", "mocolab.repro.baseline_runs"},
    # a backbone by name (timm, torchvision) or a plugin method (entry points) loads only where a config names one
    "config/validate.py": {"mocolab.method.plugins", "mocolab.models.named"},
    "models/named.py": {"timm", "timm.layers", "torchvision", "torchvision.models.vision_transformer"},
    # the plan is read without torch; a study's step count (the budget rules) builds the trainer's schedule
    "repro/plan.py": {"mocolab.config", "mocolab.data.roots", "mocolab.training.build"},
    "tune/studies/negatives.py": {"mocolab.analysis", "mocolab.tracking", "mocolab.analysis.negatives_plots"},
    "tune/studies/queue.py": {"mocolab.analysis"},
    "tune/studies/vit.py": {"mocolab.analysis", "mocolab.tracking", "mocolab.analysis.vit_plots"},
    # Ray where a run needs it: a run in this process (W = 0, --in-process) and the driver's checks go without
    "training/launch.py": {"ray", "ray.train", "ray.train.torch", "ray.train._internal.session",
                        "mocolab.training.worker"},  # the training loop, in the Ray Train worker that runs it
    "training/ray_output.py": {"ray._private.ray_logging"},
    "training/resources.py": {"ray", "ray.util"},
    "training/session.py": {"ray.train", "ray.train.torch", "ray"},
    "training/shipping.py": {"ray", "ray.util.scheduling_strategies",
                          "importlib", "importlib.metadata", "socket", "sys"},  # the probe runs on each node
    "training/stream.py": {"ray.data"},
    # matplotlib: rank 0 draws one plot, and logs its feature map's features, at the end
    "training/worker.py": {"ray", "mocolab.analysis", "mocolab.analysis.feature_maps"},
    "tune/search.py": {"ray", "ray.tune.search.optuna", "ray.tune.schedulers"},
    # matplotlib: a trial's process imports this module, and draws nothing
    "tune/sweep.py": {"mocolab.analysis.report"},
    # heavy libraries where one feature uses them
    "data/augment.py": {"kornia.augmentation"},  # the views; config reads the presets without kornia
    "data/torchvision_sets.py": {"torchvision.datasets"},  # CIFAR-10, STL-10 and their downloads
    "data/fashion_mnist.py": {"torchvision.datasets"},  # its download, only where no copy is found
    "models/backbones.py": {"torchvision"},  # the ResNets
    "data/image_folders.py": {"pyarrow.parquet"},  # a parquet set's count; config imports this module
    "data/image_index.py": {"pyarrow", "pyarrow.parquet", "PIL", "torchvision.io"},  # per format, at its first file
    "training/storage.py": {"pyarrow.fs"},  # a URI's file system; config imports this module
    # MLflow for a run id or models:/ URI; an export folder needs none
    "evaluation/encoder_source.py": {"mocolab.tracking.logged_models"},
    "tracking/logged_models.py": {"mlflow.pytorch"},  # the flavour, where a model is logged or loaded
    "tracking/system.py": {"mlflow.system_metrics.system_metrics_monitor",  # optional: a failure turns it off
                           "mlflow.system_metrics.metrics.gpu_monitor", "pynvml"},  # ... and NVML where a GPU is
}


def _absolute(path: Path, node: ast.ImportFrom) -> list[str]:
    """The module a ``from ... import`` names, relative ones resolved against the file's package."""
    if not node.level:  # from mocolab.x import y, where y is a module of its own: that module
        folder = PACKAGE.parent / (node.module or "").replace(".", "/")
        subs = [a.name for a in node.names if (folder / f"{a.name}.py").is_file() or (folder / a.name).is_dir()]
        return [f"{node.module}.{name}" for name in subs] if subs else [node.module or ""]
    package = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)[:-1]  # a package's __init__: itself
    base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
    if node.module:
        return [base]
    return [f"{base}.{alias.name}" for alias in node.names]  # from . import api: the submodule


def function_level_imports(path: Path) -> set[str]:
    """What the functions (and methods, and functions inside them) of one file import."""
    found: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if in_function and isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif in_function and isinstance(child, ast.ImportFrom):
                found.update(_absolute(path, child))
            visit(child, inside)

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return found


def test_every_function_level_import_is_listed_with_its_reason():
    actual = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        names = function_level_imports(path)
        if names:
            actual[str(path.relative_to(PACKAGE))] = names
    unlisted = {f: sorted(names - LAZY.get(f, set())) for f, names in actual.items() if names - LAZY.get(f, set())}
    assert not unlisted, (f"imports inside functions that tests/suite/test_imports.py does not list: {unlisted}; move "
                          f"them to the top of the module, or add them to LAZY with the reason they wait")
    stale = {f: sorted(names - actual.get(f, set())) for f, names in LAZY.items() if names - actual.get(f, set())}
    assert not stale, f"LAZY lists imports the code no longer makes inside a function: {stale}"


def test_relative_imports_are_named_as_the_package_resolves_them():
    """``from . import api`` in the package's __init__ is mocolab.api; ``from ..report import`` in tune/ is
    mocolab.analysis.report, ``from .sweep import`` there mocolab.tune.sweep."""
    assert function_level_imports(PACKAGE / "__init__.py") == {"mocolab.api", "mocolab.config.manifest"}
    assert {"mocolab.tune.sweep", "mocolab.analysis.report"} <= function_level_imports(PACKAGE / "tune" / "study.py")
