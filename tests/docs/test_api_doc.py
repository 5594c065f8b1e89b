"""docs/api.md, the component API: every name its table lists is importable from the module it names and is
in that module's ``__all__``; every Python block runs as a user runs it (a file of its own, a fresh
interpreter, a folder outside the checkout) and loads neither Ray nor MLflow; the blocks and
examples/minimal_moco.py import nothing from mocolab that the table does not list."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mocolab.data.sets import fashion_mnist_dir
from conftest import thread_share_env
from readme_blocks import MARK, REPO, block, blocks, names_read_by

API = REPO / "docs" / "api.md"
EXAMPLE = REPO / "examples" / "minimal_moco.py"
NEEDS_DATA = {"api-data"}
# Run after the block, in its interpreter: the component API is plain PyTorch.
NO_RAY_NO_MLFLOW = ("import runpy, sys\n"
                    "runpy.run_path(sys.argv[1], run_name='__main__')\n"
                    "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'mlflow'})\n"
                    "assert not loaded, f'the block loaded {loaded}'\n")


def page_blocks() -> list[str]:
    """The names of the Python blocks of docs/api.md, in order (the ``where`` of an unnamed one)."""
    found = [b for b in blocks(API) if b.language in ("python", "py", "python3")]
    return [m.group("name") if (m := MARK.match(b.mark)) and m.group("test") else b.where for b in found]


def stable_names() -> dict[str, list[str]]:
    """module -> its stable names, from the table of docs/api.md (rows whose first cell is a mocolab module)."""
    rows = re.findall(r"^\| `(mocolab(?:\.\w+)+)` \| ([^|]+) \|", API.read_text(), re.MULTILINE)
    return {module: re.findall(r"`(\w+)`", names) for module, names in rows}


def mocolab_imports(code: str) -> set[tuple[str, str]]:
    """(module, name) for every ``from mocolab... import name``; (module, "*") for ``import mocolab...``."""
    found = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mocolab":
            found |= {(node.module, a.name) for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {(a.name, "*") for a in node.names if a.name.split(".")[0] == "mocolab"}
    return found


def test_the_table_names_the_parts_and_each_is_in_its_modules_all():
    table = stable_names()
    assert {"mocolab.method.key_queue", "mocolab.method.queue_layouts", "mocolab.method.shuffle",
            "mocolab.method.batchnorm", "mocolab.method.losses", "mocolab.method.moco",
            "mocolab.evaluation.knn", "mocolab.evaluation.probe"} <= set(table), table
    assert {"KeyQueue", "ShardedKeyQueue", "LocalShuffle", "CrossRankShuffle", "GlobalBatchNorm",
            "SplitBatchNorm2d", "info_nce", "momentum_update", "knn_accuracy", "linear_probe"} <= \
        {n for names in table.values() for n in names}
    for module, names in table.items():
        mod = importlib.import_module(module)
        assert names, f"docs/api.md lists no names for {module}"
        absent = [n for n in names if not hasattr(mod, n)]
        assert not absent, f"{module} has no {absent}, which docs/api.md lists"
        unlisted = [n for n in names if n not in getattr(mod, "__all__", ())]
        assert not unlisted, f"{module}.__all__ lacks {unlisted}, which docs/api.md lists as stable"


def test_every_python_block_of_the_page_is_run_here():
    names = page_blocks()
    assert len(names) >= 7 and set(names) <= names_read_by(Path(__file__)), \
        f"Python blocks of docs/api.md that test_block_runs_on_its_own_without_ray_or_mlflow does not run: " \
        f"{sorted(set(names) - names_read_by(Path(__file__)))}"


def test_the_blocks_and_the_example_import_only_stable_names():
    allowed = {(module, name) for module, names in stable_names().items() for name in names}
    for name in page_blocks():
        assert mocolab_imports(block(name)) - allowed == set(), f"{name} imports what docs/api.md does not list"
        assert mocolab_imports(block(name)), f"{name} shows none of the stable names"
    used = mocolab_imports(EXAMPLE.read_text())
    assert used and used - allowed == set(), "examples/minimal_moco.py imports what docs/api.md does not list"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["api-queue", "api-sharded-queue", "api-shuffle", "api-batchnorm", "api-losses",
                                  "api-momentum", "api-evaluation", "api-data"])
def test_block_runs_on_its_own_without_ray_or_mlflow(name, tmp_path):
    if name in NEEDS_DATA and fashion_mnist_dir() is None:
        pytest.skip("Fashion-MNIST not installed (make data)")
    script = tmp_path / f"{name}.py"
    script.write_text(block(name))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "PYTHONPATH")}
    env.update(thread_share_env())
    if fashion_mnist_dir() is not None:
        env["MOCOLAB_DATA"] = str(fashion_mnist_dir())
    res = subprocess.run([sys.executable, "-c", NO_RAY_NO_MLFLOW, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{name}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
