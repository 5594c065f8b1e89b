"""The real cluster path: `ray start --head` on 127.0.0.1, `ray job submit` of a study, MLflow checked after.

The cluster is this test's own (own temp dir and ports) and is stopped through
the process handle that started it, never by `ray stop` (which would stop
every Ray on the machine).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mocolab.data import fashion_mnist_dir

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture
def local_cluster(free_port):
    temp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    gcs, dash, client = free_port(), free_port(), free_port()
    # every port of its own: another Ray on this machine (the suite's session Ray) holds the defaults
    own_ports = []
    for flag in ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--metrics-export-port",
                 "--runtime-env-agent-port", "--node-manager-port", "--object-manager-port"):
        own_ports += [flag, str(free_port())]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--ray-client-server-port", str(client),
         "--num-cpus", "2", "--temp-dir", temp, "--include-dashboard", "true", *own_ports],
        stdout=subprocess.DEVNULL, stderr=open(Path(temp) / "start.log", "w"), env=env, start_new_session=True)
    url = f"http://127.0.0.1:{dash}"
    deadline = time.time() + 120
    while True:
        try:
            with urllib.request.urlopen(url + "/api/version", timeout=2):
                break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                log = (Path(temp) / "start.log").read_text()[-3000:]
                os.killpg(proc.pid, signal.SIGTERM) if proc.poll() is None else None
                pytest.fail(f"ray start --head did not come up: {log}")
            time.sleep(1)
    yield url, env
    os.killpg(proc.pid, signal.SIGTERM)  # our cluster only: `ray start --block` stops its node on SIGTERM
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)")
def test_ray_job_submit_runs_a_study_on_a_real_cluster(tmp_path, local_cluster):
    url, env = local_cluster
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cmd = [str(BIN / "ray"), "job", "submit", "--address", url, "--working-dir", str(REPO), "--",
           "python", "experiments/momentum_ablation.py", "--preset", "smoke", "--momenta", "0.9,0.99",
           "--set", "data.subset=1024", "--set", "eval.knn_bank=1024", "--set", "eval.knn_test=500",
           "--set", "eval.linear_train=1024", "--set", "eval.linear_steps=20", "--set", "optim.max_steps=10",
           "--set", "queue.size=512", "--tracking-uri", uri, "--storage", str(tmp_path / "sweeps"),
           "--name", "cluster-smoke"]
    for _ in range(12):  # the job agent can come up a little after the dashboard answers
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        out = res.stdout + res.stderr
        if "No available agent to submit job" not in out:
            break
        time.sleep(5)
    assert res.returncode == 0 and "succeeded" in out, out[-4000:]
    assert "Open the UI: mlflow ui" in out
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("momentum-ablation")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(r.data.tags["trial"] for r in children) == ["m=0.9 seed=0", "m=0.99 seed=0"]
    assert all(r.info.status == "FINISHED" and "linear_top1" in r.data.metrics for r in children)
    assert all(r.data.tags.get("ray_job_id") for r in children)
    artifacts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"summary.csv", "summary.json", "momentum.png"} <= artifacts
