"""MLflow tracking against a real ``mlflow server`` process on 127.0.0.1, and URI resolution."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from conftest import mlflow_store, start_mlflow_server, stop_mlflow_server
from mocolab.config import build_config
from mocolab.data.sets import fashion_mnist_dir
from mocolab.config.manifest import RunManifest
from mocolab.tracking import check_tracking_uri, redact_uri, resolve_tracking_uri
from mocolab.training import fit


@pytest.fixture
def mlflow_server(tmp_path, free_port):
    port = free_port()
    proc = start_mlflow_server(tmp_path, port)
    yield f"http://127.0.0.1:{port}"
    stop_mlflow_server(proc)


@pytest.mark.slow
@pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)")
def test_run_logged_over_http_to_a_real_server(tmp_path, mlflow_server):
    tiny = {"data.subset": 1024, "eval.knn_bank": 1024, "eval.knn_test": 500, "eval.linear_train": 1024,
            "eval.linear_steps": 20, "optim.max_steps": 10, "queue.size": 512, "run.output_dir": str(tmp_path / "runs"),
            "run.experiment": "server-test"}
    cfg = build_config("smoke", {**tiny, "run.name": "over-http"})
    out = fit(cfg, tracking_uri=mlflow_server, progress=lambda _m: None)  # W = 0: Ray Train local mode
    client = MlflowClient(mlflow_server)
    run = client.get_run(out.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.data.tags["mocolab.status"] == "finished"
    assert run.data.metrics["linear_top1"] == pytest.approx(out.linear_top1)
    # the final evaluation's low-label probes and k = 20 kNN, beside the full probe (evaluation/low_label.py)
    assert {"linear_top1_1pct", "linear_top1_10pct", "knn20_top1"} <= set(run.data.metrics)
    assert all(0.0 <= run.data.metrics[k] <= 1.0 for k in ("linear_top1_1pct", "linear_top1_10pct", "knn20_top1"))
    assert run.data.tags["mocolab.low_label_draws"].count("draws") == 2  # each fraction's three draws
    assert sorted(m.step for m in client.get_metric_history(out.mlflow_run_id, "loss")) == [8, 10]
    assert run.info.run_name == "over-http" and "run.name" not in run.data.params  # a trial's name is no axis
    assert (tmp_path / "artifacts").exists()  # the config artifact went through the server
    # the encoder went through the server too (MLflow's artifact proxy): export and register it from there
    from mocolab.cli.commands import main

    import subprocess
    import sys
    from pathlib import Path

    # what `mocolab train` prints after a run on a server: the server's own UI, not `mlflow ui`
    cli = subprocess.run([str(Path(sys.executable).with_name("mocolab")), "train", "--preset", "smoke",
                          "--tracking-uri", mlflow_server, "--set=run.name=over-http-cli",
                          *[f"--set={k}={v}" for k, v in tiny.items()]],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert cli.returncode == 0 and "mlflow ui" not in cli.stdout, cli.stdout[-2000:] + cli.stderr[-2000:]
    assert f"open the run in the MLflow server's UI: {mlflow_server.rstrip('/')}/#/experiments/" in cli.stdout
    assert main(["export", out.mlflow_run_id, "--out", str(tmp_path / "export"), "--register", "over-http-enc",
                 "--tracking-uri", mlflow_server]) == 0
    assert {p.name for p in (tmp_path / "export").iterdir()} == {"README.md", "backbone.pt", "encoder.pt2",
                                                                 "classifier.pt2", "config.yaml", "metrics.json"}
    version = client.get_registered_model("over-http-enc").latest_versions[0]
    assert version.run_id == out.mlflow_run_id and version.source.startswith("models:/")


def test_tracking_uri_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert resolve_tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert resolve_tracking_uri() == "http://127.0.0.1:5000"
    # Ray moves trials and workers to other folders: a relative store means the caller's folder.
    assert resolve_tracking_uri("sqlite:///x.db") == f"sqlite:///{tmp_path / 'x.db'}"
    assert resolve_tracking_uri("sqlite:///sub/x.db?timeout=5") == f"sqlite:///{tmp_path / 'sub/x.db'}?timeout=5"
    assert resolve_tracking_uri("sqlite:////abs/x.db") == "sqlite:////abs/x.db"
    assert resolve_tracking_uri("file:./mlruns") == f"file:{tmp_path / 'mlruns'}"
    assert resolve_tracking_uri("file:///abs/mlruns") == "file:///abs/mlruns"
    assert resolve_tracking_uri("./mlruns") == str(tmp_path / "mlruns")
    assert resolve_tracking_uri("postgresql://u:p@db/mlflow") == "postgresql://u:p@db/mlflow"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///env.db")
    assert resolve_tracking_uri() == f"sqlite:///{tmp_path / 'env.db'}"


def test_credentials_in_a_uri_are_never_shown():
    assert redact_uri("postgresql://alice:s3cret@db:5432/mlflow") == "postgresql://alice:***@db:5432/mlflow"
    assert redact_uri("http://bob:pw@127.0.0.1:5000/") == "http://bob:***@127.0.0.1:5000/"
    assert redact_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    with pytest.raises(ValueError) as info:  # a server that does not answer: the error quotes the URI
        check_tracking_uri("http://bob:s3cret@127.0.0.1:9/", timeout=1)
    assert "s3cret" not in str(info.value) and "bob:***@" in str(info.value)


def test_unwritable_sqlite_folder_is_an_error():
    with pytest.raises(ValueError, match="not writable"):
        check_tracking_uri("sqlite:////nonexistent-folder/mlflow.db")


def test_the_ui_advice_names_the_server_itself_for_a_server_and_mlflow_ui_for_a_local_store(tmp_path):
    from mocolab.tracking import ui_advice

    assert ui_advice("http://user:secret@10.0.0.5:5000/") == (None, "http://10.0.0.5:5000")  # no password
    assert ui_advice("https://mlflow.example/prefix") == (None, "https://mlflow.example/prefix")
    assert ui_advice(f"sqlite:///{tmp_path}/mlflow.db") == (
        f"mlflow ui --backend-store-uri sqlite:///{tmp_path}/mlflow.db", "http://127.0.0.1:5000")


def test_a_run_whose_params_the_store_refuses_is_not_left_behind(tmp_path):
    """A run that exists without all its params would be found again by name and refused as another config
    (or shown RUNNING forever): the store refusing them removes it, and the same start then creates it whole."""
    from mocolab.tracking.mlflow_log import RunTracker

    uri = mlflow_store(tmp_path)
    with pytest.raises(Exception, match="bad\\?key"):  # MLflow's own check of a param's name
        RunTracker(uri, "orphans").start(RunManifest("r", {"moco.m": 0.99, "bad?key": 1}, ""))
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("orphans")
    assert client.search_runs([exp.experiment_id]) == []
    run_id, resumed = RunTracker(uri, "orphans").start(RunManifest("r", {"moco.m": 0.99}, ""))
    assert not resumed and client.get_run(run_id).data.params == {"moco.m": "0.99"}


@pytest.mark.slow
def test_an_mlflow_run_holds_the_manifest_and_finished_trials_of_an_older_format_still_count_as_done(tmp_path):
    """The MLflow run is one of the manifest's three homes: read back, it is the manifest it was started with.
    A store carried over from run format 1 (the reproduction's committed one) keeps its finished trials
    done, so a resumed grid does not run them; only continuing its unfinished trial is refused."""
    from mocolab.config.manifest import OldRunFormat
    from mocolab.tracking import Store, SweepRun, recorded_manifest
    from mocolab.tracking.mlflow_log import RunTracker

    uri = mlflow_store(tmp_path)
    cfg = build_config("smoke", {"run.name": "sweep--m=0.9", "moco.m": 0.9})
    manifest = RunManifest.of(cfg)
    store = Store(uri)
    parent = SweepRun.open(store, "old-study", "sweep", description="", params={"sweep.trials": 3}, tags={})
    tracker = RunTracker(uri, "old-study")
    run_id, resumed = tracker.start(manifest, tags={"trial": "m=0.9"}, parent_run_id=parent.run_id)
    assert not resumed
    recorded = recorded_manifest(store.client.get_run(run_id))
    assert recorded == RunManifest(manifest.name, {k: str(v) for k, v in manifest.config.items() if k != "run.name"},
                                   manifest.fingerprint, code={"digest": manifest.code_fingerprint.digest})
    assert tracker.start(manifest, parent_run_id=parent.run_id) == (run_id, True)  # the same run continues
    # two trials as run format 1 left them: params and tags, no format tag; one finished, one stopped midway
    for label, status in (("m=0.99", "finished"), ("m=0", "stopped")):
        old = store.client.create_run(parent.experiment_id, run_name=label, tags={
            "mocolab.run_name": f"sweep--{label}", "trial": label, "mlflow.parentRunId": parent.run_id})
        store.log_params(old.info.run_id, {k: v for k, v in cfg.replace(**{"moco.m": label[2:]}).flatten().items()
                                           if k != "run.name"})
        store.set_status(old.info.run_id, status, mlflow_status="FINISHED" if status == "finished" else "KILLED")
        assert recorded_manifest(store.client.get_run(old.info.run_id)).format == 1
    tracker.finish()
    assert parent.done_labels() == {"m=0.9", "m=0.99"}  # the old finished trial counts as done
    with pytest.raises(OldRunFormat, match=r"^run 'sweep--m=0' \(MLflow run \w+\) was started by mocolab 0.1.0 "
                                           r"\(run format 1\)[^\n]*delete that MLflow run$"):
        tracker.start(RunManifest.of(cfg.replace(**{"run.name": "sweep--m=0", "moco.m": 0.0})),
                      parent_run_id=parent.run_id)
