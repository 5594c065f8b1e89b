"""docker/: the image built and the compose stack run for real, with podman (`make test-deploy`).

Not collected by `make test` (the file name is not test_*.py): it builds images and runs five
containers (7 min on two cores, about 20 the first time). `make test-deploy` runs it by name.

What runs: docker/Dockerfile built on a local stand-in for the Ray image (docker/standin/: no image
registry is reachable here; only the base differs from what a user builds); docker/compose.yaml with
podman-compose: Ray head, two Ray workers, MLflow on PostgreSQL, Ray token auth. Then, as
docker/README.md shows, a tiny momentum study submitted through the job API; the worker container that
holds the trial's driver killed while the trial trains (node loss); the study must finish, its MLflow
runs must be rows in PostgreSQL, and `down` then `up` must keep them.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import CI

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
BIN = Path(sys.executable).parent
PROJECT = "mocolab-deploytest"
IMAGE = "localhost/mocolab-deploytest:cpu"
FMNIST = Path("/usr/share/datasets/fashion-mnist")
STUDY = ["python", "experiments/momentum_ablation.py", "--preset", "smoke", "--momenta", "0.99",
         "--name", "deploytest", "--workers-per-trial", "2", "--cpus-per-worker", "1",
         "--set", "run.placement=spread", "--set", "data.subset=2048", "--set", "optim.epochs=3",
         "--set", "run.checkpoint_every=4", "--set", "run.max_failures=3", "--set", "eval.knn_bank=1024",
         "--set", "eval.knn_test=500", "--set", "eval.linear_train=1024", "--set", "eval.linear_steps=20"]
TIMES: dict[str, float] = {}
ENDED = ("SUCCEEDED", "FAILED", "STOPPED")
JOB = "deploytest-momentum"  # the study's submission id


def _missing(what: str) -> None:
    if CI:
        pytest.fail(f"{what}: the deploy test cannot run (make test-deploy installs it where apt-get works)")
    pytest.skip(what)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(argv: list[str], timeout: float, env: dict | None = None, check: bool = True,
         label: str | None = None) -> subprocess.CompletedProcess:
    start = time.time()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    if label:
        TIMES[label] = round(time.time() - start, 1)
    if check and res.returncode != 0:
        pytest.fail(f"{' '.join(argv[:4])}... exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}")
    return res


def _http(url: str, token: str | None = None, host: str | None = None, data: dict | None = None):
    req = urllib.request.Request(url, data=json.dumps(data).encode() if data is not None else None)
    if token:
        req.add_header("authorization", f"Bearer {token}")
    if host:
        req.add_header("Host", host)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=20) as r:
        body = r.read()
        return r.status, json.loads(body) if r.headers.get_content_type() == "application/json" else body


def _wait(what: str, probe, timeout: float, every: float = 3.0):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            got = probe()
            if got:
                return got
        except (OSError, urllib.error.URLError, ValueError) as err:
            last = err
        time.sleep(every)
    pytest.fail(f"{what}: not within {timeout:.0f} s (last error: {last})")


@pytest.fixture(scope="module")
def tools():
    for tool in ("podman", "runc", "debootstrap"):
        if shutil.which(tool) is None:
            _missing(f"{tool} is not installed")
    if not (BIN / "podman-compose").exists():
        _missing("podman-compose is not installed in this environment (pip install podman-compose)")
    if not (FMNIST / "train-images-idx3-ubyte.gz").exists():
        _missing(f"Fashion-MNIST is not in {FMNIST} (apt-get install dataset-fashion-mnist)")
    if os.geteuid() != 0:
        _missing("the stand-in base is built with debootstrap and chroot, which need root")
    conf = os.environ.get("CONTAINERS_CONF")
    assert conf and Path(conf).resolve() == (DOCKER / "standin" / "containers.conf").resolve(), (
        "run through `make test-deploy`: CONTAINERS_CONF must be docker/standin/containers.conf (ulimits, runc)")


@pytest.fixture(scope="module")
def image(tools):
    """The stand-in base (built once, cached) and docker/Dockerfile built on it."""
    res = _run(["bash", str(DOCKER / "standin" / "build-base.sh"), sys.executable], timeout=3600,
               label="stand-in base (cached after the first run)")
    base, postgres = res.stdout.split()
    _run(["podman", "build", "--isolation", "chroot", "--runtime", "runc", "-f", "docker/Dockerfile",
          "--build-arg", f"BASE={base}", "-t", IMAGE, "."], timeout=1800, label="podman build docker/Dockerfile")
    inspect = _run(["podman", "run", "--rm", "--runtime", "runc", IMAGE, "python", "-c",
                    "import mocolab, ray, torch, os; print(mocolab.__file__, ray.__version__, os.getuid(), "
                    "os.path.isfile('experiments/momentum_ablation.py'))"], timeout=300)
    where, ray_version, uid, study = inspect.stdout.split()
    # mocolab installed (not a checkout on a path), the study scripts in the working folder, a non-root user
    assert "/site-packages/mocolab/" in where and study == "True" and uid == "1000", inspect.stdout
    import ray

    assert ray_version == ray.__version__
    return postgres


class Stack:
    def __init__(self, postgres_image: str, tmp: Path):
        self.token = secrets.token_hex(32)
        self.dash, self.mlflow = _free_port(), _free_port()
        self.env = {**os.environ, "RAY_AUTH_TOKEN": self.token, "POSTGRES_PASSWORD": secrets.token_hex(16),
                    "MOCOLAB_IMAGE": IMAGE, "POSTGRES_IMAGE": postgres_image, "MOCOLAB_DATA_DIR": str(FMNIST),
                    "RAY_WORKERS": "2", "RAY_WORKER_CPUS": "2", "RAY_DASHBOARD_HOST_PORT": str(self.dash),
                    "MLFLOW_HOST_PORT": str(self.mlflow)}
        # the client, as README's `ray job submit` line: the token in the environment, no token file
        self.client_env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp), "RAY_AUTH_MODE": "token",
                           "RAY_AUTH_TOKEN": self.token}
        self.compose = [str(BIN / "podman-compose"), "-p", PROJECT, "-f", str(DOCKER / "compose.yaml")]

    def __call__(self, *args: str, timeout: float = 600, label: str | None = None):
        return _run(self.compose + list(args), timeout=timeout, env=self.env, label=label)

    def containers(self) -> dict[str, str]:
        out = _run(["podman", "ps", "-a", "--filter", f"label=io.podman.compose.project={PROJECT}",
                    "--format", "{{.Names}} {{.State}}"], timeout=60).stdout
        return dict(line.split(maxsplit=1) for line in out.splitlines() if line.strip())

    def up(self, label: str) -> None:
        self("up", "-d", timeout=900, label=label)
        _wait("Ray's job API (with the token)",
              lambda: _http(f"http://127.0.0.1:{self.dash}/api/jobs/", token=self.token)[0] == 200, 600)
        _wait("MLflow", lambda: _http(f"http://127.0.0.1:{self.mlflow}/health")[0] == 200, 600)
        _wait("two Ray workers", lambda: len([n for n in self.nodes() if n]) >= 3, 600)

    def nodes(self) -> list[bool]:
        _, body = _http(f"http://127.0.0.1:{self.dash}/nodes?view=summary", token=self.token)
        return [n["raylet"]["state"] == "ALIVE" for n in body["data"]["summary"]]

    def ray(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return _run([str(BIN / "ray"), "job", args[0], "--address", f"http://127.0.0.1:{self.dash}", *args[1:]],
                    timeout=timeout, env=self.client_env, check=False)

    def job_status(self) -> str:
        """The submitted job's status from the job API (the CLI prints it in words, not the state)."""
        return _http(f"http://127.0.0.1:{self.dash}/api/jobs/{JOB}", token=self.token)[1]["status"]

    def mlflow_api(self, path: str, data: dict):
        return _http(f"http://127.0.0.1:{self.mlflow}/api/2.0/mlflow/{path}", data=data)[1]

    def sql(self, query: str) -> list[list[str]]:
        name = next(n for n in self.containers() if "_postgres_" in n)
        out = _run(["podman", "exec", name, "psql", "-h", "/var/run/postgresql", "-U", "mlflow", "-d", "mlflow",
                    "-tAF", "\t", "-c", query], timeout=120).stdout
        return [line.split("\t") for line in out.splitlines() if line.strip()]


@pytest.fixture
def stack(image, tmp_path):
    s = Stack(image, tmp_path)
    _run(s.compose + ["down", "-v"], timeout=600, env=s.env, check=False)  # what an earlier run left
    try:
        yield s
    finally:
        logs = {n: _run(["podman", "logs", "--tail", "60", n], timeout=60, check=False) for n in s.containers()}
        (REPO / "runs").mkdir(exist_ok=True)
        with open(REPO / "runs" / "deploy-stack-containers.log", "w") as f:
            for n, r in logs.items():
                f.write(f"===== {n}\n{r.stdout}{r.stderr}\n")
        _run(s.compose + ["down", "-v"], timeout=600, env=s.env, check=False)


def test_compose_stack_runs_a_study_through_node_loss_and_keeps_its_runs(stack):
    start = time.time()
    stack.up(label="podman-compose up (first)")
    names = stack.containers()
    workers = sorted(n for n in names if "_ray-worker_" in n)
    assert len(workers) == 2 and any("_ray-head_" in n for n in names) and any("_mlflow_" in n for n in names)

    # token auth: the job API refuses a client without the token
    with pytest.raises(urllib.error.HTTPError) as refused:
        _http(f"http://127.0.0.1:{stack.dash}/api/jobs/")
    assert refused.value.code == 401

    submitted = time.time()
    sub = stack.ray("submit", "--no-wait", "--submission-id", JOB, "--", *STUDY)
    assert sub.returncode == 0, sub.stdout + sub.stderr

    def trial_training():
        exp = stack.mlflow_api("experiments/search", {"max_results": 100})
        ids = [e["experiment_id"] for e in exp.get("experiments", [])]
        runs = stack.mlflow_api("runs/search", {"experiment_ids": ids, "max_results": 100}).get("runs", [])
        for r in runs:
            metrics = {m["key"] for m in r["data"].get("metrics", [])}
            if "loss" in metrics and r["info"]["status"] == "RUNNING":
                return r
        status = stack.job_status()
        if status in ENDED:
            pytest.fail(f"the job ended before the kill: {status}\n{stack.ray('logs', JOB).stdout[-6000:]}")
        return None

    trial = _wait("the trial's first logged epoch", trial_training, 1800, every=5)
    TIMES["submit to the trial's first epoch"] = round(time.time() - submitted, 1)
    # the node that holds the trial's driver (Tune's actor, which owns the Ray Train run): the loss
    # that Ray Train's own restarts cannot mend, and the sweep must
    hosts = [w for w in workers if _run(["podman", "exec", w, "sh", "-c", "grep -qs '^ray::ImplicitFunc' "
                                         "/proc/[0-9]*/cmdline"], timeout=60, check=False).returncode == 0]
    assert len(hosts) == 1, f"the trial's driver is not on exactly one worker: {hosts}"
    victim = hosts[0]
    _run(["podman", "kill", victim], timeout=120)
    killed_at = time.time()
    # compose's restart policy brings the node back; a node that stays down is started as a fresh one
    time.sleep(20)
    if stack.containers().get(victim, "").split()[0] != "running":
        _run(["podman", "start", victim], timeout=300)

    def ended():
        status = stack.job_status()
        return status if status in ENDED else None

    final = _wait("the study's end", ended, 2400, every=10)
    TIMES["kill to study end"] = round(time.time() - killed_at, 1)
    job_logs = stack.ray("logs", JOB)
    logs = job_logs.stdout + job_logs.stderr
    assert final == "SUCCEEDED", logs[-8000:]
    assert "the trial's process was lost" in logs, logs[-8000:]  # the sweep ran it again, from its checkpoint

    # the runs are rows in PostgreSQL: the trial finished, its epochs logged once each across the restart
    rows = stack.sql("select run_uuid, status, name from runs order by start_time")
    by_id = {r[0]: r for r in rows}
    assert trial["info"]["run_id"] in by_id and by_id[trial["info"]["run_id"]][1] == "FINISHED", rows
    steps = [int(r[0]) for r in stack.sql(f"select step from metrics where run_uuid = '{trial['info']['run_id']}' "
                                          f"and key = 'loss' order by step")]
    assert steps == [16, 32, 48], steps  # 2048 images / batch 128 = 16 steps an epoch; no gap, no repeat
    linear = stack.sql(f"select value from latest_metrics where run_uuid = '{trial['info']['run_id']}' "
                       f"and key = 'linear_top1'")
    assert linear and 0.0 < float(linear[0][0]) <= 1.0, linear
    assert all(r[1] == "FINISHED" for r in rows), rows  # the sweep's parent too

    # down then up: PostgreSQL's volume keeps every run, and MLflow serves them again
    stack("down", timeout=600, label="podman-compose down")
    assert stack.containers() == {}
    stack.up(label="podman-compose up (second)")
    assert stack.sql("select run_uuid, status, name from runs order by start_time") == rows
    again = _http(f"http://127.0.0.1:{stack.mlflow}/api/2.0/mlflow/runs/get?run_id={trial['info']['run_id']}")[1]
    assert again["run"]["info"]["status"] == "FINISHED"
    TIMES["whole test"] = round(time.time() - start, 1)
    print("\ndeploy stack timings (s):", json.dumps(TIMES, indent=1))
    (REPO / "runs").mkdir(exist_ok=True)
    (REPO / "runs" / "deploy-stack-times.json").write_text(json.dumps(TIMES, indent=1) + "\n")
