"""The wheel stands alone: ``python -m build --no-isolation`` makes an sdist and, from it, a wheel out of the files
a clone has; the wheel, installed with ``pip install --no-deps`` into a venv outside the checkout that sees the
project's installed dependencies but not the checkout, runs ``mocolab --version``, ``mocolab presets``, ``mocolab
train --preset smoke`` (tiny) and examples/minimal_moco.py (copied out) from a folder outside the checkout.
The version is written once, in pyproject.toml.

Affordable by construction: no build isolation (no download of setuptools), no dependency install (torch's CUDA
build is gigabytes): the venv lists this environment's site-packages in a ``.pth`` file, whose own ``.pth``
files (the editable install's) are not run, so only the wheel can provide mocolab.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from mocolab.data.sets import fashion_mnist_dir
from conftest import mlflow_store, python_without_mocolab, repo_copy, thread_share_env

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
# `mocolab train --preset smoke` on 1,024 images for 4 steps of batch 64, evaluated on a few hundred; no models
# logged (tests/tracking/test_mlflow_models.py logs and loads them)
TINY = ["--set", "data.subset=1024", "--set", "optim.batch_size=64", "--set", "queue.size=256", "--set",
        "optim.epochs=1", "--set", "optim.warmup_epochs=0", "--set", "optim.max_steps=4", "--set",
        "eval.knn_bank=512", "--set", "eval.knn_test=200", "--set", "eval.linear_train=512", "--set",
        "eval.linear_steps=5", "--set", "run.log_models=false"]

needs_data = pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)")


@dataclass(frozen=True)
class Installed:
    dist: Path  # the sdist and the wheel
    venv: Path  # mocolab from the wheel, its dependencies from this environment
    work: Path  # a folder outside the checkout, where the commands run

    def run(self, argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
        env = {"HOME": os.environ.get("HOME", str(self.work)), "PATH": f"{self.venv / 'bin'}:/usr/bin:/bin",
               "LANG": "C.UTF-8", **{k: os.environ[k] for k in ("RAY_TMPDIR", "MOCOLAB_LOCKS") if k in os.environ},
               **thread_share_env()}
        if fashion_mnist_dir() is not None:
            env["MOCOLAB_DATA"] = str(fashion_mnist_dir())
        return subprocess.run(argv, cwd=self.work, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    clone = repo_copy(base / "clone")  # the files a clone has: nothing ignored, nothing built
    dist = base / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(clone)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    python = python_without_mocolab(base / "venv")
    wheel = next(dist.glob("mocolab-*.whl"))
    pip = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
                          "-q", str(wheel)], capture_output=True, text=True, timeout=300, cwd=base)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    (base / "work").mkdir()
    return Installed(dist, base / "venv", base / "work")


@pytest.mark.slow
def test_build_makes_an_sdist_and_a_wheel_that_hold_every_file_the_package_reads(installed):
    assert sorted(p.name for p in installed.dist.iterdir()) == [f"mocolab-{VERSION}-py3-none-any.whl",
                                                               f"mocolab-{VERSION}.tar.gz"]
    names = set(zipfile.ZipFile(installed.dist / f"mocolab-{VERSION}-py3-none-any.whl").namelist())
    tracked = subprocess.run(["git", "ls-files", "platform/mocolab"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    data = [f for f in tracked if not f.endswith(".py")]
    assert any(f.endswith("presets/smoke.yaml") for f in data)
    missing = [f for f in tracked if f.removeprefix("platform/") not in names]
    assert not missing, f"the wheel lacks {missing}: [tool.setuptools.package-data] in pyproject.toml"
    assert f"mocolab-{VERSION}.dist-info/entry_points.txt" in names


@pytest.mark.slow
def test_the_wheel_runs_outside_the_checkout_and_says_its_version(installed):
    where = installed.run([str(installed.venv / "bin" / "python"), "-c",
                           "import mocolab, sys, importlib.metadata as md\n"
                           "print(mocolab.__file__); print(md.distribution('mocolab').locate_file(''))\n"
                           "print(mocolab.__version__); print('\\n'.join(sys.path))"])
    assert where.returncode == 0, where.stderr[-3000:]
    module, dist, version, *path = where.stdout.splitlines()
    assert Path(module).is_relative_to(installed.venv) and Path(dist).is_relative_to(installed.venv), where.stdout
    assert version == VERSION
    # the checkout's only part on the path is the environment the dependencies come from, never its source
    deps = Path(sys.prefix).resolve()
    assert not [p for p in path if p and Path(p).resolve().is_relative_to(REPO) and
                not Path(p).resolve().is_relative_to(deps)], path
    shown = installed.run([str(installed.venv / "bin" / "mocolab"), "--version"])
    assert shown.returncode == 0 and shown.stdout.strip() == f"mocolab {VERSION}", shown.stdout + shown.stderr
    presets = installed.run([str(installed.venv / "bin" / "mocolab"), "presets"])
    assert presets.returncode == 0, presets.stderr[-3000:]
    listed = [line.split()[0] for line in presets.stdout.splitlines() if line and not line.startswith("use one")]
    assert sorted(listed) == sorted(p.stem for p in (REPO / "platform/mocolab/config/presets").glob("*.yaml"))


@pytest.mark.slow
@needs_data
def test_the_wheel_trains_the_smoke_preset(installed):
    store = mlflow_store(installed.work)  # an sqlite store with MLflow's tables made (seconds saved)
    res = installed.run([str(installed.venv / "bin" / "mocolab"), "train", "--preset", "smoke",
                         "--tracking-uri", store, *TINY])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "linear top-1" in res.stdout and "MLflow run" in res.stdout, res.stdout[-3000:]
    assert (installed.work / "runs").is_dir()  # its checkpoints: in the working folder, as README says


@pytest.mark.slow
@needs_data
def test_the_wheel_runs_the_component_example(installed):
    example = installed.work / "minimal_moco.py"
    shutil.copy(REPO / "examples" / "minimal_moco.py", example)
    res = installed.run([str(installed.venv / "bin" / "python"), str(example), "--steps", "3", "--subset", "512",
                         "--batch-size", "64", "--queue", "512", "--print-every", "1"])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "step    3/3" in res.stdout and "kNN top-1" in res.stdout, res.stdout


def test_the_version_is_written_in_pyproject_only():
    """The package reads its version from the installed metadata (config/manifest.py's ``mocolab_version``);
    no module spells it out, and CITATION.cff (where the field is optional) leaves it out."""
    from mocolab.config.manifest import mocolab_version

    assert mocolab_version() == VERSION, "the installed metadata is stale: pip install -e . again"
    spelled = [f"{path.relative_to(REPO)}:{node.lineno}"
               for path in sorted((REPO / "platform").rglob("*.py"))
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Constant) and node.value == VERSION]
    assert not spelled, f"the version {VERSION} is written in {spelled}: read it with mocolab_version()"
    citation = (REPO / "CITATION.cff").read_text()
    stated = [line.split(":", 1)[1].strip().strip("'\"") for line in citation.splitlines()
              if line.startswith("version:")]
    assert stated == [], f"CITATION.cff states version {stated}: the version is pyproject.toml's alone"
