"""The Python API (mocolab.build_config, train, sweep, load_encoder, evaluate): named at the top of the
package, light to import, what the command line calls; the docs' API block and the quick-start notebook
run as written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import thread_share_env
from mocolab.data.sets import fashion_mnist_dir
from readme_blocks import block

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "examples" / "quickstart.ipynb"
needs_data = pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)")
API = ("build_config", "train", "sweep", "load_encoder", "evaluate")


def _env(home: Path) -> dict[str, str]:
    return {"HOME": os.environ.get("HOME", str(home)), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "LANG": "C.UTF-8", "MOCOLAB_DATA": str(fashion_mnist_dir()),
            **{k: v for k, v in os.environ.items() if k.startswith(("RAY_TMPDIR", "MOCOLAB_LOCKS"))},
            **thread_share_env()}


def test_import_mocolab_names_the_api_and_loads_nothing_heavy():
    code = ("import json, sys, mocolab; print(json.dumps({'heavy': [m for m in ('torch', 'ray', 'mlflow') "
            "if m in sys.modules], 'api': [n for n in %r if n in dir(mocolab) and mocolab.__doc__.count(n)], "
            "'callable': [n for n in %r if callable(getattr(mocolab, n))]}))" % (API, API))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    # the names and their documentation are there; torch, Ray and MLflow load only when a function runs
    assert out["api"] == list(API) and out["callable"] == list(API)
    assert out["heavy"] == [], out


def test_mocolab_train_is_the_function_and_still_the_subpackage():
    import mocolab
    import mocolab.training.launch
    from mocolab.training import fit

    assert callable(mocolab.train) and mocolab.training.fit is fit
    assert mocolab.training.launch is sys.modules["mocolab.training.launch"]
    with pytest.raises(ValueError, match=r"moco\.m: 2\.0 is out of range"):  # refused before anything starts
        mocolab.train("smoke", {"moco.m": 2})
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        mocolab.train("nope")


def test_build_config_applies_preset_then_file_then_overrides(tmp_path):
    import mocolab

    mine = tmp_path / "mine.yaml"
    mine.write_text("moco:\n  m: 0.9\n  tau: 0.1\n")
    cfg = mocolab.build_config("smoke", {"moco.tau": 0.3}, config_file=mine)
    assert (cfg.run.preset, cfg.moco.m, cfg.moco.tau, cfg.queue.size) == ("smoke", 0.9, 0.3, 1024)
    assert mocolab.build_config("smoke", ["moco.m=0.5"]).moco.m == 0.5
    with pytest.raises(ValueError, match="unknown config key 'moco.nope'"):
        mocolab.build_config("smoke", {"moco.nope": 1})


def test_sweep_refuses_an_unknown_setting_by_name_before_any_work(tmp_path, monkeypatch):
    import mocolab

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^sweep: 'max_concurent' is not a sweep setting \(did you mean "
                                         r"max_concurrent\?\); the settings: .*workers_per_trial"):
        mocolab.sweep({"moco.m": [0.9]}, preset="smoke", max_concurent=1)
    with pytest.raises(ValueError, match=r"^sweep: 'source' is not a sweep setting"):  # the driver's own
        mocolab.sweep({"moco.m": [0.9]}, preset="smoke", source={})
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_cli_calls_the_api():
    """The commands hand their work to the API's functions rather than repeat it."""
    import ast

    cli = ast.parse((REPO / "platform" / "mocolab" / "cli" / "commands.py").read_text())
    from_api = {a.name for n in ast.walk(cli)
                if isinstance(n, ast.ImportFrom) and n.module == "mocolab.api" for a in n.names}
    assert {"train", "sweep", "evaluate"} <= from_api
    direct = {a.name for n in ast.walk(cli) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert "fit" not in direct and "run_training" not in direct


@needs_data
def test_in_process_training_returns_an_outcome_without_mlflow(tmp_path, monkeypatch):
    import mocolab

    monkeypatch.chdir(tmp_path)
    out = mocolab.train("smoke", {"data.subset": 512, "optim.batch_size": 64, "queue.size": 256,
                                  "optim.max_steps": 4, "eval.knn_bank": 256, "eval.knn_test": 100,
                                  "eval.linear_train": 256, "eval.linear_steps": 3},
                        in_process=True, progress=lambda _m: None)
    assert out.status == "finished" and out.steps == 4 and out.mlflow_run_id is None
    assert 0 < out.linear_top1 <= 1 and not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
@needs_data
def test_docs_python_api_block_runs_as_written(tmp_path):
    res = subprocess.run([sys.executable, "-c", block("python-api")], cwd=tmp_path, env=_env(tmp_path),
                         capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    names = {e.name: e.experiment_id for e in client.search_experiments()}
    assert {"mocolab", "transfer", "sweeps"} <= set(names)
    trials = [r for r in client.search_runs([names["sweeps"]]) if "mlflow.parentRunId" in r.data.tags]
    assert sorted(r.data.params["moco.tau"] for r in trials) == ["0.1", "0.2"]
    assert all(r.info.status == "FINISHED" for r in trials)
    assert "'linear_top1'" in res.stdout and res.stdout.count("finished") >= 2


@pytest.mark.slow
@needs_data
def test_quickstart_notebook_trains_loads_and_plots(tmp_path):
    nbformat = pytest.importorskip("nbformat", reason="nbformat is in the dev extra (make setup)")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is in the dev extra (make setup)")
    pytest.importorskip("ipykernel", reason="ipykernel is in the dev extra (make setup)")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    # committed without outputs: nothing of the machine that last ran it
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    old = dict(os.environ)
    os.environ.update(_env(tmp_path))
    try:
        nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the kNN curve was not drawn"
    text = "".join(o.get("text", "") for o in outputs)
    assert "finished" in text and "(8, " in text and "logged as" in text
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("mocolab").experiment_id])[0]
    assert len(client.get_metric_history(run.info.run_id, "knn_top1")) == 3  # one point per epoch
