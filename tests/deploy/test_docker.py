"""docker/: what is checked on every `make test`, without a container engine.

The files parse; every file, script, volume and variable they name exists; the Ray image tag is this
Ray and this Python; ports are published on 127.0.0.1 only; and the two entrypoint scripts the images
run are run here for real (MLflow with basic authentication, a Ray head with token auth). The image
built and the compose stack run are tests/deploy/deploy_stack.py (`make test-deploy`); kuberay/ is
tests/deploy/test_kuberay.py.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

import psutil
import pytest
import ray
import yaml

from conftest import kill_processes_with_env

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
BIN = Path(sys.executable).parent
PY_TAG = f"py{sys.version_info.major}{sys.version_info.minor}"


def dockerfile() -> str:
    return (DOCKER / "Dockerfile").read_text()


def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_dockerfile_builds_on_the_ray_image_of_this_ray_and_python_and_runs_as_non_root():
    text = dockerfile()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    assert args["RAY_VERSION"] == ray.__version__, "docker/Dockerfile's RAY_VERSION is not the installed Ray"
    assert args["PYTHON"] == PY_TAG, f"docker/Dockerfile's PYTHON is not this Python ({PY_TAG})"
    # the base is a build argument whose default is the official Ray image of these three
    assert args["BASE"] == "rayproject/ray:${RAY_VERSION}-${PYTHON}-${VARIANT}"
    assert re.findall(r"^FROM (.+)$", text, re.M) == ["${BASE}"]
    assert args["VARIANT"] == "cpu" and "VARIANT=gpu" in text
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1] not in ("root", "0"), "the image must end on a non-root user"
    # every COPY source exists in the repository (the build context), and the install names a real extra
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        parts = [p for p in shlex.split(line) if not p.startswith("--")]
        for src in parts[:-1]:
            assert (REPO / src).exists(), f"docker/Dockerfile copies {src}, which is not in the repository"
    extras = re.findall(r'"\.\[(\w+)\]"', text)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert extras and all(re.search(rf"^{e} = \[", pyproject, re.M) for e in extras), extras
    assert "ray[default,train,tune]==${RAY_VERSION}" in text
    # no data baked in: the context leaves data, runs and environments out
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {"data", "runs", ".venv", "mlflow.db", "mlruns"} <= set(ignored)
    assert "ENV MOCOLAB_DATA=/data" in text


def test_compose_services_ports_volumes_and_scripts():
    c = compose()
    services = c["services"]
    assert set(services) == {"ray-head", "ray-worker", "mlflow", "postgres"}
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond 127.0.0.1"
        build = svc.get("build")
        if build:
            assert (DOCKER / build["context"] / build["dockerfile"]).resolve() == DOCKER / "Dockerfile"
        command = svc.get("command") or []
        for word in command:
            if word.startswith("docker/"):
                assert (REPO / word).is_file() and os.access(REPO / word, os.X_OK), word
                assert "COPY --chown=ray:users docker/mlflow-server.sh docker/ray-node.sh docker/" in dockerfile()
    assert services["ray-head"]["ports"] == ["127.0.0.1:${RAY_DASHBOARD_HOST_PORT:-8265}:8265"]
    assert services["mlflow"]["ports"] == ["127.0.0.1:${MLFLOW_HOST_PORT:-5000}:5000"]
    assert services["ray-head"]["command"][-1] == "head" and services["ray-worker"]["command"][-1] == "worker"
    # podman-compose starts the replicas only where the mode is said, though it is the default
    assert "replicas" in services["ray-worker"]["deploy"] and services["ray-worker"]["deploy"]["mode"] == "replicated"
    # MLflow on the postgres service, with basic auth behind a switch; the nodes log to it
    env = services["mlflow"]["environment"]
    assert env["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg2://mlflow:")
    assert "@postgres:5432/mlflow" in env["MLFLOW_BACKEND_STORE_URI"]
    assert "MLFLOW_AUTH" in env and "postgres" in services["mlflow"]["depends_on"]
    assert "mlartifacts:/mlartifacts" in services["mlflow"]["volumes"]
    assert any("pgdata:" in v for v in services["postgres"]["volumes"])
    for node in ("ray-head", "ray-worker"):
        svc = services[node]
        assert "shared:/shared" in svc["volumes"], f"{node} lacks the shared checkpoint volume"
        assert svc["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        assert svc["environment"]["MOCOLAB_STORAGE"].startswith("/shared/")
        assert svc["environment"]["RAY_AUTH_MODE"] == "token"
    assert set(c["volumes"]) == {"pgdata", "mlartifacts", "shared"}
    # every variable compose requires (${VAR:?...}) or reads is in env.example
    text = (DOCKER / "compose.yaml").read_text() + (DOCKER / "compose.gpu.yaml").read_text()
    used = set(re.findall(r"\$\{(\w+)", text))
    example = set(re.findall(r"^(\w+)=", (DOCKER / "env.example").read_text(), re.M))
    assert used - {"GPUS_PER_WORKER"} <= example, used - example
    gpu = yaml.safe_load((DOCKER / "compose.gpu.yaml").read_text())["services"]["ray-worker"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120.0, auth: str | None = None) -> int:
    deadline = time.time() + timeout
    while True:
        req = urllib.request.Request(url)
        if auth:
            req.add_header("Authorization", "Basic " + b64encode(auth.encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=3) as r:
                return r.status
        except urllib.error.HTTPError as err:
            return err.code
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"{url} did not answer: {log.read_text()[-3000:]}")
            time.sleep(0.5)


def test_entrypoints_refuse_bad_settings_with_the_fix(tmp_path):
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path)}
    res = subprocess.run(["bash", str(DOCKER / "mlflow-server.sh")], env=env, capture_output=True, text=True)
    assert res.returncode != 0 and "set MLFLOW_BACKEND_STORE_URI" in res.stderr
    bad = {**env, "MLFLOW_BACKEND_STORE_URI": "sqlite:///x.db", "MLFLOW_AUTH": "ldap"}
    res = subprocess.run(["bash", str(DOCKER / "mlflow-server.sh")], env=bad, capture_output=True, text=True)
    assert res.returncode == 2 and "not one of: none, basic" in res.stderr
    res = subprocess.run(["bash", str(DOCKER / "mlflow-server.sh")], env={**bad, "MLFLOW_AUTH": "basic"},
                         capture_output=True, text=True)
    assert res.returncode != 0 and "needs MLFLOW_ADMIN_PASSWORD" in res.stderr
    res = subprocess.run(["bash", str(DOCKER / "ray-node.sh"), "head"], env=env, capture_output=True, text=True)
    assert res.returncode == 2 and "RAY_AUTH_TOKEN is not set" in res.stderr
    res = subprocess.run(["bash", str(DOCKER / "ray-node.sh"), "leader"], env={**env, "RAY_AUTH_TOKEN": "x"},
                         capture_output=True, text=True)
    assert res.returncode == 2 and "usage: ray-node.sh head|worker" in res.stderr


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:  # gone meanwhile
        return None


@pytest.mark.slow
def test_mlflow_entrypoint_serves_with_basic_auth(tmp_path, free_port):
    port = free_port()
    log = tmp_path / "mlflow.log"
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path), "MLFLOW_HOST": "127.0.0.1",
           "MLFLOW_PORT": str(port), "MLFLOW_WORKERS": "1", "MLFLOW_AUTH": "basic",
           "MLFLOW_ADMIN_PASSWORD": "a-long-admin-password", "MLFLOW_ALLOWED_HOSTS": f"mlflow:{port},127.0.0.1:{port}",
           "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
           "MLFLOW_AUTH_DATABASE_URI": f"sqlite:///{tmp_path / 'auth.db'}",
           "MLFLOW_ARTIFACTS_DESTINATION": str(tmp_path / "artifacts")}
    proc = subprocess.Popen(["bash", str(DOCKER / "mlflow-server.sh")], env=env, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        api = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=1"
        assert _wait_http(api, proc, log) == 401  # no login: refused
        assert _wait_http(api, proc, log, auth="admin:wrong") == 401
        assert _wait_http(api, proc, log, auth="admin:a-long-admin-password") == 200
        # compose's nodes reach it as http://mlflow:5000: that Host is allowed, a stranger's is not
        for host, code in ((f"mlflow:{port}", 200), ("attacker.example", 403)):
            req = urllib.request.Request(api, headers={"Host": host, "Authorization": "Basic " + b64encode(
                b"admin:a-long-admin-password").decode()})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    got = r.status
            except urllib.error.HTTPError as err:
                got = err.code
            assert got == code, (host, got)
        assert "auth basic" in log.read_text()
        # and no job runner beside the server: MLflow's GenAI evaluation consumers serve nothing here
        runners = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                   if "huey" in " ".join(p.info["cmdline"] or []) and _session(p.pid) == proc.pid]
        assert not runners, runners
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.slow
def test_ray_node_entrypoint_starts_a_head_with_token_auth(tmp_path, free_port):
    temp = tempfile.mkdtemp(prefix="rn", dir="/tmp")
    dash = free_port()
    node_ports = " ".join(f"{flag} {free_port()}" for flag in (
        "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--metrics-export-port",
        "--runtime-env-agent-port", "--node-manager-port", "--object-manager-port", "--ray-client-server-port"))
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path), "RAY_AUTH_TOKEN": "t" * 32,
           "RAY_GCS_PORT": str(free_port()), "RAY_DASHBOARD_PORT": str(dash), "RAY_DASHBOARD_HOST": "127.0.0.1",
           "RAY_START_ARGS": f"--temp-dir {temp} --node-ip-address 127.0.0.1 {node_ports}"}
    log = tmp_path / "head.log"
    proc = subprocess.Popen(["bash", str(DOCKER / "ray-node.sh"), "head"], env=env, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # token authentication on: the job API refuses a client without the token, answers one with it
        assert _wait_http(f"http://127.0.0.1:{dash}/api/jobs/", proc, log) == 401
        req = urllib.request.Request(f"http://127.0.0.1:{dash}/api/jobs/",
                                     headers={"authorization": "Bearer " + "t" * 32})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
        assert "--num-cpus 0" in log.read_text()  # the head only coordinates
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the node and everything it started: nothing to keep
        proc.wait(timeout=60)
        kill_processes_with_env("RAY_AUTH_TOKEN", "t" * 32)  # whatever left the group
        shutil.rmtree(temp, ignore_errors=True)
