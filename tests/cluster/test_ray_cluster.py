"""The real cluster path: `ray start --head` with token authentication on, `ray job submit` of a study,
MLflow checked after.

Two clusters: README's block run as written (default ports, a fresh home folder, in a network namespace
of its own so no other Ray holds those ports), and one of this test's own ports whose head and worker
node run a Python that cannot import mocolab. Each is stopped through what the test started (process
handles, or the processes carrying its own RAY_TMPDIR), never by `ray stop`, which would stop every
Ray on the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import (in_private_network, kill_processes_with_env, mlflow_store, python_without_mocolab, repo_copy,
                      thread_share_env)
from mocolab.data.sets import fashion_mnist_dir

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
needs_data = pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)")


def readme_cluster_block() -> str:
    """The bash block marked cluster-quickstart (docs/cluster.md), as a user would copy it."""
    from readme_blocks import block

    return block("cluster-quickstart")


def check_study_in_mlflow(uri: str, labels: list[str]) -> None:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("momentum-ablation")
    assert exp is not None, f"no experiment 'momentum-ablation' in {uri}"
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(r.data.tags["trial"] for r in children) == sorted(labels)
    assert all(r.info.status == "FINISHED" and "linear_top1" in r.data.metrics for r in children)
    assert all(r.data.tags.get("ray_job_id") for r in children)
    # submitted with `ray job submit`: MLflow's source type says so, on the parent and every trial
    assert all(r.data.tags.get("mlflow.source.type") == "JOB" for r in runs), [r.data.tags for r in runs]
    artifacts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"summary.csv", "summary.json", "momentum.png"} <= artifacts


@pytest.mark.slow
@pytest.mark.cluster
@needs_data
def test_readme_cluster_block_runs_as_written(tmp_path):
    block = in_private_network(["bash", "-e", "-c", readme_cluster_block()])
    if block[0] != "unshare":  # run alone, on this machine's own ports
        taken = []
        for port in (6379, 8265, 52365):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    taken.append(port)
        assert not taken, (f"ports {taken} are in use: another Ray runs on this machine, and README's block "
                           f"starts Ray on its default ports; stop it and run again")
    work = repo_copy(tmp_path / "mocolab")
    home = tmp_path / "home"  # a fresh machine: no ~/.ray/auth_token yet
    home.mkdir()
    ray_tmp = tempfile.mkdtemp(prefix="rr", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
           "MOCOLAB_DATA": str(fashion_mnist_dir()), "RAY_TMPDIR": ray_tmp,  # RAY_TMPDIR: to find our processes
           **thread_share_env()}
    try:
        res = subprocess.run(block, cwd=work, env=env, capture_output=True, text=True,
                             timeout=2400)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-6000:]
    finally:
        kill_processes_with_env("RAY_TMPDIR", ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert (home / ".ray" / "auth_token").is_file()
    assert "succeeded" in out and "Open the UI: mlflow ui" in out, out[-4000:]
    assert "Ray cluster: 1 node(s) checked" in out, out[-4000:]
    check_study_in_mlflow(f"sqlite:///{work / 'mlflow.db'}", ["m=0.9 seed=0", "m=0.99 seed=0"])


def _start(cmd: list[str], env: dict, log: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=env, cwd=cwd,
                            start_new_session=True)


def _stop(procs: list[subprocess.Popen]) -> None:
    """Worker nodes first, killed with their process group (a clean stop drains the node and, after a
    job, waits 30 s for it); then the head: SIGTERM to the `ray start --block` process alone, which
    stops its children in 2 s (signalling its group kills the GCS under it, and the drain waits 30 s)."""
    head, workers = procs[0], procs[1:]
    for proc in workers:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    if head.poll() is None:
        head.send_signal(signal.SIGTERM)
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)


@pytest.fixture
def cluster_without_mocolab(free_port, tmp_path):
    """A head (no CPUs for work) and a worker node (2 CPUs), both on a Python that cannot import
    mocolab, token authentication on, ports of their own; yields (dashboard URL, client env)."""
    python = python_without_mocolab(tmp_path / "node-env")
    temp = tempfile.mkdtemp(prefix="rc", dir="/tmp")
    home = Path(temp) / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": f"{BIN}:/usr/bin:/bin", "LANG": "C.UTF-8", "RAY_AUTH_MODE": "token",
           "MOCOLAB_DATA": str(fashion_mnist_dir()), **thread_share_env()}
    subprocess.run([str(BIN / "ray"), "get-auth-token", "--generate"], env=env, check=True, capture_output=True)
    node_env = {**env, "PATH": f"{python.parent}:/usr/bin:/bin"}  # the nodes' python, not this one
    gcs, dash, client = free_port(), free_port(), free_port()

    def own_ports() -> list[str]:  # the session's Ray holds the defaults
        out = []
        for flag in ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--metrics-export-port",
                     "--runtime-env-agent-port", "--node-manager-port", "--object-manager-port"):
            out += [flag, str(free_port())]
        return out

    ray_cli = [str(python), "-m", "ray.scripts.scripts", "start", "--block", "--node-ip-address", "127.0.0.1"]
    head = _start(ray_cli + ["--head", "--port", str(gcs), "--dashboard-host", "127.0.0.1", "--dashboard-port",
                             str(dash), "--ray-client-server-port", str(client), "--num-cpus", "0",
                             "--temp-dir", temp, "--include-dashboard", "true", *own_ports()],
                  node_env, Path(temp) / "head.log", cwd=home)
    procs, temps = [head], [temp]
    try:
        url = f"http://127.0.0.1:{dash}"
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/api/version", timeout=2):
                    break
            except urllib.error.HTTPError:  # token authentication on: an answer (401) says it is up
                break
            except OSError:
                if head.poll() is not None or time.time() > deadline:
                    pytest.fail(f"ray start --head did not come up: {(Path(temp) / 'head.log').read_text()[-3000:]}")
                time.sleep(1)
        # its own temp folder, as on its own machine: two nodes sharing one would fetch and delete
        # each other's copies of the job's working_dir
        worker_temp = tempfile.mkdtemp(prefix="rw", dir="/tmp")
        temps.append(worker_temp)
        worker = _start(ray_cli + ["--address", f"127.0.0.1:{gcs}", "--num-cpus", "2", "--temp-dir", worker_temp,
                                   *own_ports()],
                        node_env, Path(temp) / "worker.log", cwd=home)
        procs.append(worker)
        yield url, env
    finally:
        _stop(procs)
        for folder in temps:
            shutil.rmtree(folder, ignore_errors=True)


def _submit(cmd: list[str], env: dict, cwd: Path) -> tuple[int, str]:
    for _ in range(24):  # the job agent (and the worker node) can come up a little after the dashboard answers
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env, cwd=cwd)
        out = res.stdout + res.stderr
        if "No available agent to submit job" not in out:
            return res.returncode, out
        time.sleep(5)
    return res.returncode, out


@pytest.mark.slow
@pytest.mark.cluster
@needs_data
def test_working_dir_job_runs_on_nodes_that_have_no_mocolab(tmp_path, cluster_without_mocolab):
    url, env = cluster_without_mocolab
    submit = [str(BIN / "ray"), "job", "submit", "--address", url, "--working-dir", ".", "--",
              "python", "experiments/momentum_ablation.py", "--preset", "smoke", "--momenta", "0.99",
              "--set", "data.subset=1024", "--set", "eval.knn_bank=1024", "--set", "eval.knn_test=500",
              "--set", "eval.linear_train=1024", "--set", "eval.linear_steps=20", "--set", "optim.max_steps=10",
              "--set", "queue.size=512", "--name", "cluster-smoke"]
    # Relative (default) store and storage would land in the job's temporary copy: refused, nothing written.
    rc, out = _submit(submit, env, REPO)
    assert rc != 0 and "is inside this job's --working-dir copy" in out, out[-4000:]
    # .rayignore keeps the reproduction's store (results/runs.db and its packed form) out of the job's package
    assert "is very large" not in out, out[-4000:]
    assert "--tracking-uri" in out or "--storage" in out
    uri = mlflow_store(tmp_path)
    rc, out = _submit(submit + ["--tracking-uri", uri, "--storage", str(tmp_path / "sweeps")], env, REPO)
    assert rc == 0 and "succeeded" in out, out[-6000:]
    assert "Ray cluster: 2 node(s) checked" in out and "working_dir_files" in out, out[-4000:]
    check_study_in_mlflow(uri, ["m=0.99 seed=0"])  # one trial: what the job proves is where its code came from
