"""Run state on storage Ray Train writes to: a local folder, or a URI (a real S3-compatible server here)."""

from __future__ import annotations

import json

import pyarrow.fs
import pytest
from mlflow.tracking import MlflowClient

from mocolab.config import build_config, with_absolute_paths
from mocolab.data.sets import fashion_mnist_dir
from mocolab.training.storage import Location, is_uri, shown
from mocolab.training import fit
from mocolab.config.manifest import MANIFEST
from mocolab.training.checkpoint import local_checkpoints
from conftest import mlflow_store

needs_fmnist = pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)")
TINY = {"data.subset": 1024, "eval.knn_bank": 512, "eval.knn_test": 300, "eval.linear_train": 512,
        "eval.linear_steps": 10, "optim.max_steps": 12, "queue.size": 512, "run.experiment": "storage",
        "run.log_models": False}


def test_uris_are_never_made_local_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for uri in ("s3://bucket/runs", "gs://b/x", "file:///tmp/runs", "hdfs://nn:8020/runs"):
        assert is_uri(uri)
        assert with_absolute_paths(build_config("smoke", {"run.output_dir": uri})).run.output_dir == uri
    assert with_absolute_paths(build_config("smoke", {"run.output_dir": "runs"})).run.output_dir == \
        str(tmp_path / "runs")
    assert not is_uri("runs") and not is_uri("/data/runs")
    assert shown("s3://key:secret@b/runs?endpoint_override=h:1") == "s3://b/runs"


def test_a_location_reads_and_writes_on_s3(s3_server, tmp_path):
    loc = Location(s3_server("x/run-1"))
    assert not loc.exists("manifest.json")
    loc.write_text("manifest.json", '{"a": 1}')
    assert loc.exists("manifest.json") and json.loads(loc.read_text("manifest.json")) == {"a": 1}
    assert str(loc) == "s3://mocolab/x/run-1" and "secret" not in str(loc)
    local = tmp_path / "ckpt"  # a folder up, and away again (the local-mode checkpoints)
    local.mkdir()
    (local / "rank0.pt").write_bytes(b"x")
    loc.put_dir(local, "checkpoint_1")
    assert loc.exists("checkpoint_1/rank0.pt") and "checkpoint_1" in loc.children()
    loc.delete_dir("checkpoint_1")
    loc.delete_dir("checkpoint_1")  # gone already: nothing to do
    assert not loc.exists("checkpoint_1/rank0.pt") and "checkpoint_1" not in loc.children()
    with pytest.raises(ValueError, match="run.output_dir: .* is not a storage URI pyarrow can open"):
        Location("nosuchscheme://x/y")
    dead = Location("s3://k:secret@mocolab/x?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1")
    with pytest.raises(ValueError, match=r"^--storage: s3://mocolab/x does not answer \(") as err:
        dead.check("--storage")
    assert "secret" not in str(err.value)


@pytest.mark.slow
@needs_fmnist
@pytest.mark.parametrize("workers", [0, 1])
def test_checkpoints_and_restarts_through_s3(tmp_path, s3_server, ray_session, workers):
    """A worker dies at step 6; the run restarts from the checkpoint it wrote to S3 and finishes."""
    storage = s3_server("runs")
    uri = mlflow_store(tmp_path)
    said: list[str] = []
    cfg = build_config("smoke", {**TINY, "run.output_dir": storage, "run.name": f"s3-w{workers}",
                                 "run.num_workers": workers, "run.fault_step": 6, "run.max_failures": 1,
                                 "run.checkpoint_every": 4})
    out = fit(cfg, tracking_uri=uri, progress=said.append)
    assert out.status == "finished" and out.steps == 12
    run_dir = Location(storage).child(f"s3-w{workers}")
    assert run_dir.exists(".fault-injected") and run_dir.exists(MANIFEST)
    assert out.checkpoint_path and out.checkpoint_path.startswith(("s3://", "mocolab/"))
    fs, _ = pyarrow.fs.FileSystem.from_uri(storage)
    files = [f.path for f in fs.get_file_info(pyarrow.fs.FileSelector("mocolab/runs", recursive=True))]
    # one layout in both modes: <run>/checkpoint_<time>/rank<r>.pt
    assert any(p.endswith("rank0.pt") and "/checkpoint_" in p for p in files), files
    if workers == 0:  # the run keeps run.keep_checkpoints of them, as Ray would
        assert len(local_checkpoints(run_dir)) == cfg.run.keep_checkpoints
        assert out.checkpoint_path == str(run_dir.child(local_checkpoints(run_dir)[-1]))
        assert any("restarting from its latest checkpoint (1/1)" in m for m in said)
    assert not any(p.startswith(str(tmp_path)) for p in files)
    if workers == 0:  # the same name again resumes from the bucket: nothing left to train, the same MLflow run
        again = fit(cfg, tracking_uri=uri, progress=said.append)
        assert again.resumed and again.steps == 12 and again.mlflow_run_id == out.mlflow_run_id
    run = MlflowClient(uri).get_run(out.mlflow_run_id)
    assert run.info.status == "FINISHED"


@pytest.mark.slow
@needs_fmnist
def test_a_study_keeps_its_state_on_s3_and_resumes_from_it(tmp_path, s3_server):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    storage = "s3://mocolab/sweeps"  # endpoint and credentials from the environment, as README recommends
    uri = mlflow_store(tmp_path)
    cmd = [sys.executable, str(repo / "experiments" / "momentum_ablation.py"), "--preset", "smoke", "--momenta",
           "0.9", "--set=data.subset=1024", "--set=eval.knn_bank=512", "--set=eval.knn_test=300",
           "--set=eval.linear_train=512", "--set=eval.linear_steps=10", "--set=optim.max_steps=8",
           "--set=queue.size=512", "--tracking-uri", uri, "--storage", storage, "--name", "s3-sweep",
           # the trial trains in its own process: what is on S3 here is the study's (Tune's state, the
           # trial's checkpoints, the report); Ray Train workers writing there are test_checkpoints_..._s3[1]'s
           "--workers-per-trial", "0"]
    env = {**{k: v for k, v in __import__("os").environ.items() if k != "RAY_ADDRESS"}, **s3_server.env}
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1800, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "and at s3://mocolab/sweeps/s3-sweep/report)" in out
    fs, _ = pyarrow.fs.FileSystem.from_uri(s3_server("sweeps"))
    files = [f.path for f in fs.get_file_info(pyarrow.fs.FileSelector("mocolab/sweeps/s3-sweep", recursive=True))]
    assert any("/train/" in p and p.endswith("rank0.pt") for p in files), files  # the trial's checkpoints
    assert any("/tune/attempt-1/" in p for p in files) and "mocolab/sweeps/s3-sweep/momentum.png" in files
    assert "mocolab/sweeps/s3-sweep/report/report.html" in files
    assert not (tmp_path / "runs").exists() and not (tmp_path / "sweeps").exists()  # nothing made locally
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1800, env=env)
    assert again.returncode == 0 and "1 trial(s) already done, 0 to run" in again.stdout + again.stderr
