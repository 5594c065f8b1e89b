"""Shared fixtures.  Tests use real components: real data files, real torch, no mocks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

# Two cores here: keep each test process to them, and never let a test attach to a user's cluster.
os.environ.pop("RAY_ADDRESS", None)
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole session (never a user's cluster), shut down at the end."""
    import ray

    os.environ.pop("RAY_ADDRESS", None)
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "60")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_concurrently(commands: list[list[str]], per_command: list[dict] | None = None,
                     **kwargs) -> list[subprocess.CompletedProcess]:
    """``subprocess.run`` of each command (output captured as text), as many at once as there are cores.

    A fresh interpreter spends its first seconds importing torch on one core: tests that start several
    (import checks, README lines run as written, bad input refused by a study) wait for the slowest
    batch, not for the sum.  ``per_command``: more ``subprocess.run`` arguments for each command
    (``env``, ``cwd``), over ``kwargs``.
    """
    from concurrent.futures import ThreadPoolExecutor

    extra = per_command or [{}] * len(commands)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(lambda argv, own: subprocess.run(argv, capture_output=True, text=True,
                                                              **{**kwargs, **own}), commands, extra))


@pytest.fixture
def free_port():
    """A function returning a free TCP port on 127.0.0.1 (for servers a test starts)."""
    return _free_port


def start_mlflow_server(folder: Path, port: int, timeout: float = 120.0,
                        store: str | None = None) -> subprocess.Popen:
    """A real ``mlflow server`` on 127.0.0.1 (sqlite store and artifacts under ``folder``), once /health answers.

    ``store``: serve an existing backend store instead (as ``mlflow ui --backend-store-uri`` does; its runs
    keep the artifact locations they were logged with). Started in its own session so
    ``stop_mlflow_server`` ends it and its workers, and nothing else. Starting it again on the same
    folder and port brings back the same store.
    """
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    log = folder / "server.log"
    where = (["--backend-store-uri", store] if store else
             ["--backend-store-uri", f"sqlite:///{folder / 'server.db'}", "--artifacts-destination",
              str(folder / "artifacts")])
    proc = subprocess.Popen(
        [str(mlflow_bin), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1", *where],
        stdout=subprocess.DEVNULL, stderr=open(log, "a"), start_new_session=True, cwd=folder)
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
        if proc.poll() is not None:
            pytest.fail(f"mlflow server exited: {log.read_text()[-2000:]}")
    stop_mlflow_server(proc)
    pytest.fail(f"mlflow server did not answer /health within {timeout:.0f} s")


def stop_mlflow_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its workers, started by the test only
    proc.wait(timeout=30)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``default_ports`` run first: they start a Ray on its default ports (as README does),
    which must not meet the session's Ray or any other Ray a test started."""
    items.sort(key=lambda item: item.get_closest_marker("default_ports") is None)


def kill_processes_with_env(key: str, value: str, timeout: float = 30.0) -> int:
    """SIGTERM, then SIGKILL, every process whose environment holds ``key=value``; returns how many.

    How a test stops a daemonised ``ray start`` it made (its own RAY_TMPDIR) without ``ray stop``,
    which would stop every Ray on the machine.
    """
    from mocolab.cluster.local import pids_with_env

    def matching() -> list[int]:
        return pids_with_env(key, value)

    found = matching()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in matching():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + timeout
        while matching() and time.time() < deadline:
            time.sleep(0.5)
    return len(found)


def python_without_mocolab(folder: Path) -> Path:
    """A Python like this one (same interpreter, same packages) that cannot import mocolab.

    A venv whose only site folder lists this environment's site-packages: the packages are
    importable, but that folder's ``.pth`` files (mocolab's editable install is one) are not run.
    Stands for a cluster node whose image has the dependencies and no mocolab.
    """
    import site

    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    Path(own, "node_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    probe = subprocess.run([str(python), "-c", "import ray, torch\ntry:\n import mocolab\nexcept ImportError:\n"
                            " print('no mocolab')"], capture_output=True, text=True, cwd=folder,
                           env={"PATH": "/usr/bin:/bin", "HOME": str(folder)})
    assert probe.stdout.strip() == "no mocolab", probe
    return python


@pytest.fixture
def s3_server(tmp_path, free_port):
    """A real S3-compatible server (moto) on 127.0.0.1 with an empty bucket ``mocolab``; yields a function
    giving an ``s3://`` URI under the bucket that carries its endpoint and credentials (any pass)."""
    import pyarrow.fs

    port = free_port()
    log = tmp_path / "moto.log"
    proc = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"), start_new_session=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail(f"moto_server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.3)
        query = f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
        fs = pyarrow.fs.S3FileSystem(access_key="testing", secret_key="testing", endpoint_override=f"127.0.0.1:{port}",
                                     scheme="http", region="us-east-1", allow_bucket_creation=True)
        fs.create_dir("mocolab")
        yield lambda path: f"s3://testing:testing@mocolab/{path}?{query}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
