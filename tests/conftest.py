"""Shared fixtures.  Tests use real components: real data files, real torch, no mocks."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DURATIONS = Path(__file__).with_name("durations.json")
# A test that took longer than this in tests/durations.json is slow whether or not it says so: `make test-fast`
# (-m "not slow") is the contributors' inner loop and keeps to tests of seconds; `make test` runs every test.
SLOW_SECONDS = 1.5
# Under pytest-xdist each worker is one of PYTEST_XDIST_WORKER_COUNT processes sharing the cores.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _thread_share() -> int | None:
    """This test worker's share of the cores, as a torch thread count for every process its tests start
    (studies, Ray and its workers inherit the environment; mocolab caps its threads by it).  Without it each
    worker's processes would size their OpenMP pools for every core, and threads that outnumber the cores
    spin against each other (benchmarks/trial/oversubscription.py: 0.43x the work done, against 1.30x)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if WORKER is None or WORKERS < 2:
        return None
    return max(1, cores // WORKERS)


if (_share := _thread_share()) is not None:  # before torch starts its thread pool
    os.environ["MOCOLAB_MAX_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(_share)

import torch  # noqa: E402


def thread_share_env() -> dict[str, str]:
    """The thread cap of this test worker, for tests that start a command in an otherwise fresh environment
    (a README line as a user types it): it is the suite's share of the machine, not a user's setting."""
    return {k: os.environ[k] for k in ("MOCOLAB_MAX_THREADS", "OMP_NUM_THREADS") if k in os.environ}

# Never let a test attach to a user's cluster; torch threads = this worker's share of the cores.
os.environ.pop("RAY_ADDRESS", None)
torch.set_num_threads(_share or (os.cpu_count() or 1))
if WORKER is not None:
    # Shared state per worker: Ray's sessions and sockets (short path: socket names stay < 108 chars) and
    # mocolab's run locks. Subprocesses the tests start inherit them; one that imports this module for its
    # helpers names the same folder (the same run's id), which its worker removes at the end.
    _own = Path(tempfile.gettempdir()) / f"mt-{WORKER}-{os.environ.get('PYTEST_XDIST_TESTRUNUID', os.getppid())!s:.8}"
    os.environ["RAY_TMPDIR"] = str(_own / "ray")
    os.environ["MOCOLAB_LOCKS"] = str(_own / "locks")
    Path(os.environ["RAY_TMPDIR"]).mkdir(parents=True, exist_ok=True)


def pytest_configure(config):
    if WORKER is None and not (Path.home() / ".ray" / "auth_token").exists():
        # The controller (or a serial run) writes Ray's token once, as any first ray.init() would, so parallel
        # workers starting their Ray at the same moment do not each write a different one.
        from ray._private.authentication.authentication_token_setup import generate_and_save_token

        generate_and_save_token()


def pytest_addoption(parser):
    parser.addoption("--write-durations", metavar="PATH", default=None,
                     help="write each test's setup+call+teardown seconds as JSON (make test-durations)")


@functools.cache
def _namespace_available() -> bool:
    """Whether this process may make a network namespace of its own (root, or user namespaces allowed)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    try:
        return subprocess.run(["unshare", "--net", "--", "ip", "link", "set", "lo", "up"],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def in_private_network(argv: list[str]) -> list[str]:
    """``argv`` run in a network namespace of its own with loopback up: Ray's default ports (6379, 8265,
    52365) are free there whatever other Ray the suite or the user runs, as on a fresh machine.

    Without the namespace the command runs as it is, which is right only when nothing else runs: ``make
    test-cluster`` runs these tests one at a time (``-m cluster -n 0``); in a parallel run that fails here,
    saying so, rather than meeting another Ray on those ports.
    """
    if _namespace_available():
        return ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]
    if WORKERS > 1:
        pytest.fail("no private network namespace here (unshare --net refused): a test on Ray's default ports "
                    "must run alone: make test-cluster (pytest -m cluster -n 0)")
    return argv


@pytest.fixture(autouse=True)
def _seed_and_threads():
    """Each test starts from seed 0 and this worker's thread share: a run in the test's process that sets
    ``run.threads`` (or any other ``torch.set_num_threads``) would otherwise leave every later test on this
    worker computing on more threads than its share, against the other worker's."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _stays_in_its_folder():
    """A test ends in the folder it started in. Code that moves its process (Tune's trainable goes into its
    trial's folder) would leave every later test on this worker in a folder pytest deletes: they then fail
    far from the cause, on ``os.getcwd()`` or a subprocess that cannot load torch."""
    before = os.getcwd()
    yield
    try:
        after = os.getcwd()
    except FileNotFoundError:
        after = "a deleted folder"
    if after != before:
        os.chdir(before)
        pytest.fail(f"the test left its process in {after}, not {before}: use monkeypatch.chdir")


@pytest.fixture(autouse=True)
def _mocolab_caches_empty_for_mutmut():
    """Under make mutate's stats run (tests/mutate.py: mutmut's MUTANT_UNDER_TEST is "stats") each test starts
    with mocolab's function caches empty: mutmut credits a test with the functions it calls, and a cached call
    (the code fingerprint, a plugin's load, the backbone catalogue) would call nothing after the first test
    that made it. Elsewhere this does nothing."""
    if os.environ.get("MUTANT_UNDER_TEST") == "stats":
        import gc

        for obj in gc.get_objects():
            if isinstance(obj, functools._lru_cache_wrapper) and obj.__module__.startswith("mocolab"):
                obj.cache_clear()
    yield


@pytest.fixture
def ray_session():
    """A local Ray in the test's process (never a user's cluster), started as mocolab starts one. The tests
    that use it run one after another on one worker (their own xdist group), so one Ray serves them all; it
    is shut down after the last of them (``pytest_runtest_teardown``), not left idle for the rest of the run."""
    import ray

    from mocolab.training.launch import ensure_ray

    os.environ.pop("RAY_ADDRESS", None)
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "60")
    ensure_ray(num_cpus=2, log_to_driver=False)
    return ray


def pytest_runtest_teardown(item, nextitem):
    if "ray_session" in item.fixturenames and (nextitem is None or "ray_session" not in nextitem.fixturenames):
        import ray

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


@functools.cache
def _empty_mlflow_db() -> Path:
    """An MLflow sqlite store with its tables made, once per test process: MLflow builds a new store by
    running every schema migration since its first (seconds each time), and the suite makes dozens."""
    from mlflow.tracking import MlflowClient

    folder = Path(tempfile.mkdtemp(prefix="mlflow-empty-"))
    atexit.register(shutil.rmtree, folder, True)
    MlflowClient(f"sqlite:///{folder / 'mlflow.db'}").search_experiments()
    return folder / "mlflow.db"


class _Stopped(Exception):
    def __init__(self, state: dict) -> None:
        super().__init__("stopped")
        self.state = state


def checkpoint_mid_epoch(cfg, step: int) -> dict:
    """The ``state_dict`` of a fresh Trainer of ``cfg`` stopped after ``step`` steps of its first epoch: what a
    mid-epoch checkpoint holds, for the tests that resume from one."""
    from mocolab.training.trainer import Trainer

    def stop(tr) -> None:
        if tr.step == step:
            raise _Stopped(tr.state_dict())

    with pytest.raises(_Stopped) as taken:
        Trainer(cfg).train_epoch(on_step=stop)
    return taken.value.state


def assert_same_method_state(a, b) -> None:
    """Two trainers' methods hold equal weights, buffers and dictionaries, to the bit (``_extra_state``, the
    generators' pickled states, left out)."""
    for (name, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        if not name.endswith("_extra_state"):
            assert torch.equal(x, y), name


def mlflow_store(folder: Path, name: str = "mlflow.db", artifacts: str | None = None) -> str:
    """The sqlite URI of an MLflow store at ``folder / name``; where none is there yet, an empty one as MLflow
    makes it on first use (a copy of ``_empty_mlflow_db``), its Default experiment's artifacts at
    ``artifacts``: by default under ``folder / "mlruns"``, as a process working in ``folder`` would have them."""
    import sqlite3

    path = Path(folder) / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_empty_mlflow_db(), path)
        with sqlite3.connect(path) as db:
            db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                       (artifacts or str(path.parent / "mlruns" / "0"),))
        db.close()
    return f"sqlite:///{path}"


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
             ["--backend-store-uri", mlflow_store(folder, "server.db", "mlflow-artifacts:/0"),
              "--artifacts-destination", str(folder / "artifacts")])
    proc = subprocess.Popen(
        [str(mlflow_bin), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1", *where],
        stdout=subprocess.DEVNULL, stderr=open(log, "a"), start_new_session=True, cwd=folder,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # its job runner: processes unused here
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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The longest tests first (from ``tests/durations.json``), so two workers finish together; a module
    whose tests share a module-scoped fixture stays on one worker (``--dist loadgroup``), which builds it once.
    A test measured over SLOW_SECONDS, or one that needs the session's Ray, is marked slow (before ``-m``
    selects): a measured fast test on that Ray was fast only because another test had started it.

    Tests missing from the file count as the median test. Every worker sorts the same way (xdist needs it).
    """
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    typical = sorted(known.values())[len(known) // 2] if known else 1.0
    groups: dict[str, float] = {}
    for item in items:
        if item.get_closest_marker("slow") is None and (
                known.get(item.nodeid, 0.0) > SLOW_SECONDS or "ray_session" in item.fixturenames):
            item.add_marker(pytest.mark.slow)  # the session's Ray: its start is paid by whichever test runs first
        shared = any(d.scope in ("module", "class") for defs in item._fixtureinfo.name2fixturedefs.values()
                     for d in defs)
        if shared and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
        elif "ray_session" in item.fixturenames and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group("ray_session"))  # one Ray for all of them (ray_session)
        group = item.get_closest_marker("xdist_group")
        key = group.args[0] if group and group.args else group.kwargs.get("name") if group else item.nodeid
        groups[key] = groups.get(key, 0.0) + known.get(item.nodeid, typical)
        item.stash[_GROUP] = key
    items.sort(key=lambda item: (-groups[item.stash[_GROUP]], item.stash[_GROUP], item.nodeid))


_GROUP = pytest.StashKey[str]()
_SPENT: dict[str, float] = {}


def pytest_runtest_logreport(report):
    base, at, group = report.nodeid.rpartition("@")  # xdist's loadgroup may append "@group" to an id
    test = base if at and not any(c in group for c in "]/:") else report.nodeid
    _SPENT[test] = _SPENT.get(test, 0.0) + report.duration


def pytest_sessionfinish(session):
    if WORKER is not None and session.testsfailed == 0:
        # this worker's Ray sessions (their logs) and locks: kept only where a test failed, to read why
        shutil.rmtree(_own, ignore_errors=True)
    path = session.config.getoption("--write-durations", None)
    if path and WORKER is None and _SPENT:
        merged = {**(json.loads(Path(path).read_text()) if Path(path).exists() else {}),
                  **{k: round(v, 2) for k, v in _SPENT.items()}}
        Path(path).write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true a skip is a failure: a real component the suite needs (PostgreSQL, Chromium, moto,
    a network namespace, the data) is missing, and CI must say so rather than pass without it."""
    outcome = yield
    report = outcome.get_result()
    if CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI=true: skipping is not allowed here: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """The same rule for a skip at collection (a module's ``pytest.importorskip``): under CI=true the module's
    tests would otherwise vanish from the run, which ends green beside the others."""
    outcome = yield
    report = outcome.get_result()
    if CI and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI=true: skipping is not allowed here: {reason}"


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


def repo_copy(dest: Path) -> Path:
    """The tracked files of this checkout (what a fresh clone has), with the set-up .venv beside them."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    (dest / ".venv").symlink_to(Path(sys.prefix))
    return dest


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


class S3Server:
    """``server(path)``: an ``s3://`` URI under the bucket that carries the endpoint and credentials in itself;
    ``server.env``: the same as the environment README recommends (``s3://mocolab/...`` then needs nothing)."""

    def __init__(self, query: str, env: dict[str, str]):
        self.query, self.env = query, env

    def __call__(self, path: str) -> str:
        return f"s3://testing:testing@mocolab/{path}?{self.query}"


@pytest.fixture
def s3_server(tmp_path, free_port):
    """A real S3-compatible server (moto) on 127.0.0.1 with an empty bucket ``mocolab`` (any credentials
    pass); yields an ``S3Server``."""
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
        yield S3Server(query, {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                               "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_DEFAULT_REGION": "us-east-1"})
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
