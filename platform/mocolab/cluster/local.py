"""``mocolab cluster up|down|status``: the cluster topology on one machine, without Docker.

A Ray head (no CPUs of its own by default, as on a real cluster), N Ray worker nodes, and an
``mlflow server`` whose store is a PostgreSQL server of the cluster's own (or sqlite), all bound to
127.0.0.1.  Ray runs with token authentication.  Everything the cluster starts carries the
environment variable ``MOCOLAB_CLUSTER=<its id>`` and is recorded in ``<dir>/cluster.json``, so
``down`` stops exactly that and nothing else (never ``ray stop``, which stops every Ray here).

It is the rehearsal of a multi-node run: separate raylets and object stores, workers SPREAD over
nodes, a node that can be killed (``remove-worker``) and replaced (``add-worker``).  The nodes share
this machine's disk, which stands in for the shared storage (NFS, S3) a real cluster needs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from mocolab.cluster.postgres import Postgres, find_bindir

JOIN_ATTEMPTS = 3  # starts of a worker node whose raylet exits before it joins (a port taken meanwhile)

STATE = "cluster.json"
MARKER = "MOCOLAB_CLUSTER"
BACKENDS = ("auto", "postgres", "sqlite")
DEFAULT_DIR = Path("~/.mocolab/cluster")


def has_postgres_driver() -> bool:
    """psycopg2 comes with the cluster extra (``pip install 'mocolab[cluster]'``), not with every install."""
    return importlib.util.find_spec("psycopg2") is not None


@dataclass
class Node:
    pid: int
    temp: str  # Ray's --temp-dir of this node (its own, as on its own machine)
    log: str
    cpus: float
    gpus: float = 0.0
    name: str = ""


@dataclass
class State:
    id: str
    dir: str
    backend: str  # postgres | sqlite
    gcs_port: int
    dashboard_port: int
    mlflow_port: int
    postgres_port: int | None
    postgres_data: str | None
    store_uri: str
    storage: str  # the nodes' shared storage_path (this machine's disk)
    object_store_mb: int
    token_file: str = ""  # Ray's auth token of the user who started it (~/.ray/auth_token)
    head: Node | None = None
    workers: list[Node] = field(default_factory=list)
    mlflow_pid: int | None = None
    next_worker: int = 1

    @property
    def nodes(self) -> list[Node]:
        """The head (once started) and the worker nodes."""
        return ([self.head] if self.head else []) + self.workers

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def tracking_uri(self) -> str:
        return f"http://127.0.0.1:{self.mlflow_port}"

    def save(self) -> None:
        path = Path(self.dir) / STATE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, folder: Path) -> "State | None":
        path = folder / STATE
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        raw["head"] = Node(**raw["head"]) if raw.get("head") else None
        raw["workers"] = [Node(**w) for w in raw.get("workers", [])]
        return cls(**raw)


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port(flag: str, wanted: int) -> int:
    """``wanted``, checked free on 127.0.0.1 (0: any free port)."""
    if not 0 <= wanted <= 65535:
        raise ValueError(f"{flag}: {wanted} is not a port (0-65535; 0 = any free port)")
    if wanted == 0:
        return _free_port()
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", wanted)) == 0:
            raise ValueError(f"{flag}: port {wanted} on 127.0.0.1 is in use (another Ray or MLflow?); "
                             f"choose another ({flag} 0 picks a free one)")
    return wanted


def _bin(name: str) -> str:
    """A console script of this Python's environment (ray, mlflow), found even when PATH lacks it."""
    here = Path(sys.executable).with_name(name)
    return str(here) if here.exists() else (shutil.which(name) or name)


def pids_with_env(key: str, value: str) -> list[int]:
    """Processes (other than this one) whose environment holds ``key=value``: how what a cluster (or a
    test) started is found again, whatever process group or parent it ended up under."""
    needle = f"{key}={value}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


class LocalCluster:
    """One cluster per folder (default ``~/.mocolab/cluster``)."""

    def __init__(self, folder: str | os.PathLike = DEFAULT_DIR, say: Callable[[str], None] = print) -> None:
        self.dir = Path(folder).expanduser().absolute()
        self.say = say
        self.state = State.load(self.dir)

    # ----- environment of what the cluster starts
    def _env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
        env.update({MARKER: self.state.id, "RAY_AUTH_MODE": "token", **extra})
        return env

    def _spawn(self, cmd: list[str], log: Path, env: dict[str, str]) -> int:
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    cwd=self.dir, start_new_session=True)
        return proc.pid

    def _node_ports(self) -> list[str]:
        """Every node-level port its own: several raylets share this machine's port space."""
        out: list[str] = []
        for flag in ("--node-manager-port", "--object-manager-port", "--metrics-export-port",
                     "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port"):
            out += [flag, str(self._spare_port())]
        return out

    def _spare_port(self) -> int:
        """A free port that none of the cluster's chosen ones may take later: MLflow binds its own while
        the head starts."""
        s = self.state
        chosen = {s.gcs_port, s.dashboard_port, s.mlflow_port, s.postgres_port}
        while (port := _free_port()) in chosen:
            pass
        return port

    def _ray_start(self, name: str, args: list[str], cpus: float, gpus: float) -> Node:
        temp = tempfile.mkdtemp(prefix=f"mc{name[:1]}", dir="/tmp")  # short: socket paths < 108 chars
        log = self.dir / "logs" / f"{name}.log"
        cmd = [_bin("ray"), "start", "--block", "--node-ip-address", "127.0.0.1", "--temp-dir", temp,
               "--num-cpus", f"{cpus:g}", "--num-gpus", f"{gpus:g}",
               "--object-store-memory", str(self.state.object_store_mb * 2**20), *self._node_ports(), *args]
        pid = self._spawn(cmd, log, self._env())
        return Node(pid=pid, temp=temp, log=str(log), cpus=cpus, gpus=gpus, name=name)

    # ----- up
    def up(self, *, workers: int = 2, cpus_per_worker: float = 1.0, gpus_per_worker: float = 0.0,
           head_cpus: float = 0.0, backend: str = "auto", port: int = 6379, dashboard_port: int = 8265,
           mlflow_port: int = 5000, postgres_port: int = 0, object_store_mb: int = 1024,
           timeout: float = 180.0) -> State:
        """Start the cluster, or raise ValueError (before starting anything) naming the field at fault."""
        if not 0 <= workers <= 64:
            raise ValueError(f"--workers: {workers} must be in 0..64")
        if not cpus_per_worker > 0:
            raise ValueError(f"--cpus-per-worker: {cpus_per_worker} must be > 0")
        if gpus_per_worker < 0 or head_cpus < 0:
            raise ValueError("--gpus-per-worker and --head-cpus must be >= 0")
        if backend not in BACKENDS:
            raise ValueError(f"--backend: '{backend}' is not one of {', '.join(BACKENDS)}")
        if not 128 <= object_store_mb <= 1 << 20:
            raise ValueError(f"--object-store-mb: {object_store_mb} must be in 128..{1 << 20}")
        if self.state is not None and self.running():
            raise ValueError(f"a cluster is already up in {self.dir} (mocolab cluster status --dir {self.dir}); "
                             f"stop it with: mocolab cluster down --dir {self.dir}")
        if backend == "auto":
            backend = "postgres" if find_bindir() is not None and has_postgres_driver() else "sqlite"
        elif backend == "postgres" and not has_postgres_driver():
            raise ValueError("--backend postgres: MLflow reaches PostgreSQL through psycopg2, which is not "
                             "installed here: pip install 'mocolab[cluster]' (or --backend sqlite)")
        if self.state is not None:  # the record of a cluster that no longer runs (a reboot): clear its remains
            self.say(f"cluster: {self.dir} records a cluster that is not running; clearing what is left of it")
            self.down()
        ports = {"--port": _port("--port", port), "--dashboard-port": _port("--dashboard-port", dashboard_port),
                 "--mlflow-port": _port("--mlflow-port", mlflow_port)}
        if len(set(ports.values())) < len(ports):
            raise ValueError(f"ports must differ: {ports}")
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        pg = None
        if backend == "postgres":
            pg = Postgres.locate(self.dir, _port("--postgres-port", postgres_port))
            store_uri = pg.uri()
        else:
            store_uri = f"sqlite:///{self.dir / 'mlflow.db'}"
        self.state = State(id=uuid.uuid4().hex[:12], dir=str(self.dir), backend=backend,
                           gcs_port=ports["--port"], dashboard_port=ports["--dashboard-port"],
                           mlflow_port=ports["--mlflow-port"], postgres_port=pg.port if pg else None,
                           postgres_data=str(pg.data) if pg else None, store_uri=store_uri,
                           storage=str(self.dir / "storage"), object_store_mb=object_store_mb,
                           token_file=str(Path.home() / ".ray" / "auth_token"))
        Path(self.state.storage).mkdir(exist_ok=True)
        self.state.save()
        started = time.time()
        try:
            self._start_store(pg)
            self._spawn_mlflow()  # starts while the head does: each takes seconds of its own
            self._start_head(head_cpus, timeout)
            self._wait_for_mlflow(timeout)
            for _ in range(workers):
                self.add_worker(cpus_per_worker, gpus_per_worker, wait=False)
            self.wait_for_nodes(1 + workers, timeout)
        except BaseException:
            self.say("cluster: start failed; stopping what was started")
            self.down()
            raise
        self.say(f"cluster: up in {time.time() - started:.0f} s ({self.dir})")
        for line in self.describe():
            self.say(line)
        return self.state

    def _start_store(self, pg: Postgres | None) -> None:
        if pg is None:
            return
        if pg.initialised():
            self.say(f"PostgreSQL: reusing {pg.data} on 127.0.0.1:{pg.port}")
            pg.start()
        else:
            self.say(f"PostgreSQL: new data folder {pg.data} on 127.0.0.1:{pg.port}")
            pg.init()

    def _postgres(self) -> Postgres | None:
        s = self.state
        if s is None or s.backend != "postgres" or not s.postgres_data:
            return None
        bindir = find_bindir()
        return Postgres(Path(s.postgres_data), s.postgres_port or 0, bindir, self.dir / "pgpass") if bindir else None

    def _spawn_mlflow(self) -> None:
        s = self.state
        pg = self._postgres()
        # MLflow's job runner (its GenAI evaluation jobs: half a dozen more processes) serves nothing here
        env = self._env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", **(pg.env() if pg else {}))
        workers = "2" if s.backend == "postgres" else "1"  # sqlite takes one writer at a time
        cmd = [_bin("mlflow"), "server", "--host", "127.0.0.1", "--port", str(s.mlflow_port), "--workers", workers,
               "--backend-store-uri", s.store_uri, "--artifacts-destination", str(self.dir / "mlflow-artifacts")]
        s.mlflow_pid = self._spawn(cmd, self.dir / "logs" / "mlflow.log", env)
        s.save()
        self.say(f"MLflow: starting on {s.tracking_uri} (store {s.store_uri})")

    def _wait_for_mlflow(self, timeout: float) -> None:
        s = self.state
        deadline = time.time() + timeout
        while not self._mlflow_healthy():
            if not _alive(s.mlflow_pid) or time.time() > deadline:
                raise RuntimeError(f"mlflow server did not answer /health: {self._tail('mlflow.log')}")
            time.sleep(0.5)

    def _start_head(self, cpus: float, timeout: float) -> None:
        s = self.state
        token = subprocess.run([_bin("ray"), "get-auth-token", "--generate"], capture_output=True, text=True,
                               env=self._env())
        if token.returncode != 0:
            raise RuntimeError(f"ray get-auth-token failed: {token.stderr[-1000:]}")
        s.head = self._ray_start("head", ["--head", "--port", str(s.gcs_port), "--dashboard-host", "127.0.0.1",
                                          "--dashboard-port", str(s.dashboard_port), "--include-dashboard", "true",
                                          "--ray-client-server-port", str(self._spare_port())], cpus, 0.0)
        s.save()
        deadline = time.time() + timeout
        while not self._dashboard_answers():
            if not _alive(s.head.pid) or time.time() > deadline:
                raise RuntimeError(f"ray start --head did not come up: {self._tail('head.log')}")
            time.sleep(1)

    def add_worker(self, cpus: float = 1.0, gpus: float = 0.0, *, wait: bool = True,
                   timeout: float = 120.0) -> Node:
        """One more Ray worker node (a fresh machine joining the cluster)."""
        s = self._need_state()
        if not cpus > 0:
            raise ValueError(f"--cpus: {cpus} must be > 0")
        name = f"worker{s.next_worker}"
        s.next_worker += 1
        for attempt in range(1, JOIN_ATTEMPTS + 1):
            node = self._ray_start(name, ["--address", f"127.0.0.1:{s.gcs_port}"], cpus, gpus)
            s.workers.append(node)
            s.save()
            if not wait or self._joined(node, timeout):
                break
            # its raylet exited before joining: most often a port chosen free that another process took
            # before the raylet bound it (this machine's port space is shared); start it on fresh ports
            s.workers.remove(node)
            s.save()
            self._reap(node.pid)
            shutil.rmtree(node.temp, ignore_errors=True)
            if attempt == JOIN_ATTEMPTS:
                raise RuntimeError(f"node {name} exited {JOIN_ATTEMPTS} times before joining: "
                                   f"{self._tail(f'{name}.log')}")
            self.say(f"cluster: node {name} exited before joining; starting it again on other ports")
        self.say(f"cluster: node {name} ({cpus:g} CPU) joined" if wait else f"cluster: starting node {name}")
        return node

    def _joined(self, node: Node, timeout: float) -> bool:
        """Whether this node's own raylet is ALIVE in the head's node table (False: its process exited).

        Counting alive nodes is not enough here: a node killed a moment ago still counts as alive until the
        head's health checks time out, so a new node that never came up would be taken for joined."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not _alive(node.pid):
                return False
            node_id = self.node_ids().get(node.name)
            table = self._node_table() or []
            if node_id and any(node_id in json.dumps(n) and n.get("raylet", {}).get("state") == "ALIVE"
                               for n in table):
                return True
            time.sleep(1)
        raise RuntimeError(f"node {node.name} did not join within {timeout:.0f} s: {self._tail(f'{node.name}.log')}")

    def remove_worker(self, name: str) -> Node:
        """Kill a worker node with everything on it, as a machine failure would (SIGKILL, no drain)."""
        s = self._need_state()
        for node in s.workers:
            if node.name == name:
                if _alive(node.pid):
                    try:
                        os.killpg(node.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                self._reap(node.pid)
                s.workers.remove(node)
                s.save()
                shutil.rmtree(node.temp, ignore_errors=True)
                self.say(f"cluster: node {name} killed")
                return node
        raise ValueError(f"no worker node '{name}' in {self.dir}; nodes: {[w.name for w in s.workers]}")

    # ----- what is up
    def _need_state(self) -> State:
        if self.state is None:
            raise ValueError(f"no cluster in {self.dir}: start one with `mocolab cluster up --dir {self.dir}`")
        return self.state

    def running(self) -> bool:
        s = self.state
        return s is not None and any(_alive(p) for p in self._pids())

    def _pids(self) -> list[int]:
        s = self.state
        return [n.pid for n in s.nodes] + ([s.mlflow_pid] if s.mlflow_pid else [])

    def _mlflow_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.state.tracking_uri}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def _dashboard_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.state.dashboard}/api/version", timeout=2):
                return True
        except urllib.error.HTTPError:  # 401: token authentication is on, and it answers
            return True
        except OSError:
            return False

    def alive_nodes(self) -> int | None:
        """Alive Ray nodes as the head's GCS sees them (None when it cannot be asked)."""
        summary = self._node_table()
        return None if summary is None else sum(1 for n in summary if n.get("raylet", {}).get("state") == "ALIVE")

    def node_ids(self) -> dict[str, str]:
        """Node name (head, worker1, ...) -> Ray node id, for this cluster's running nodes.  Read from the
        node's own session folder (Ray names files there after its node id): no lag, unlike the dashboard."""
        out = {}
        for node in self.state.nodes:
            if _alive(node.pid):
                found = sorted(Path(node.temp, "session_latest").glob("metrics_export_port_*"))
                if found:
                    out[node.name] = found[0].name.rsplit("_", 1)[-1]
        return out

    def _node_table(self) -> list[dict] | None:
        token_file = Path(self.state.token_file or Path.home() / ".ray" / "auth_token")
        req = urllib.request.Request(f"{self.state.dashboard}/nodes?view=summary")
        if token_file.exists():
            req.add_header("authorization", f"Bearer {token_file.read_text().strip()}")
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return json.loads(r.read())["data"]["summary"]
        except (OSError, ValueError, KeyError):
            return None

    def wait_for_nodes(self, n: int, timeout: float) -> None:
        deadline = time.time() + timeout
        while (self.alive_nodes() or 0) < n:
            dead = [w.name for w in self.state.workers if not _alive(w.pid)]
            if dead or time.time() > deadline:
                logs = " ".join(self._tail(f"{d}.log") for d in dead)
                raise RuntimeError(f"{n} Ray nodes did not come up within {timeout:.0f} s (alive: "
                                   f"{self.alive_nodes()}; exited: {dead}) {logs}")
            time.sleep(1)

    def _tail(self, log: str) -> str:
        path = self.dir / "logs" / log
        return path.read_text(errors="replace")[-3000:] if path.exists() else f"(no {path})"

    def submit_command(self) -> str:
        s = self._need_state()
        return (f"RAY_AUTH_MODE=token ray job submit --address {s.dashboard} --working-dir . -- "
                f"python experiments/momentum_ablation.py --tracking-uri {s.tracking_uri} "
                f"--storage {shlex.quote(s.storage)}")

    def describe(self) -> list[str]:
        s = self._need_state()
        nodes = self.alive_nodes()
        lines = [f"Ray dashboard and jobs: {s.dashboard} (token authentication; "
                 f"{'?' if nodes is None else nodes} node(s) alive)",
                 f"  head   pid {s.head.pid if s.head else '-'}  {'up' if s.head and _alive(s.head.pid) else 'DOWN'}"
                 f"  {s.head.cpus if s.head else 0:g} CPU  GCS 127.0.0.1:{s.gcs_port}"]
        for w in s.workers:
            lines.append(f"  {w.name:<6} pid {w.pid}  {'up' if _alive(w.pid) else 'DOWN'}  {w.cpus:g} CPU"
                         + (f" {w.gpus:g} GPU" if w.gpus else ""))
        lines.append(f"MLflow: {s.tracking_uri} {'up' if self._mlflow_healthy() else 'DOWN'} "
                     f"(store {s.store_uri})")
        pg = self._postgres()
        if pg is not None:
            lines.append(f"PostgreSQL: 127.0.0.1:{s.postgres_port} {'up' if pg.running() else 'DOWN'} ({pg.data})")
        lines += [f"Shared storage: {s.storage}", f"Logs: {self.dir / 'logs'}", "Submit the momentum ablation with:",
                  f"  {self.submit_command()}", "Open MLflow at " + s.tracking_uri,
                  f"Stop it all with: mocolab cluster down --dir {shlex.quote(str(self.dir))}"]
        return lines

    # ----- down
    @staticmethod
    def _reap(pid: int) -> None:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass

    def down(self, purge: bool = False, timeout: float = 30.0) -> int:
        """Stop what this cluster started (and only that); returns how many processes were still running.
        ``purge`` also deletes its MLflow store, artifacts, shared storage and logs."""
        s = self.state
        if s is None:
            self.say(f"no cluster in {self.dir}")
            return 0
        running = [p for p in self._pids() if _alive(p)]
        for node in s.workers:  # worker nodes: with their process group, no drain (they hold nothing)
            if _alive(node.pid):
                try:
                    os.killpg(node.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if s.head and _alive(s.head.pid):  # the head: SIGTERM to `ray start` alone stops its children cleanly
            os.kill(s.head.pid, signal.SIGTERM)
        if s.mlflow_pid and _alive(s.mlflow_pid):
            try:
                os.killpg(s.mlflow_pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + timeout
        while any(_alive(p) for p in self._pids()) and time.time() < deadline:
            for p in self._pids():
                self._reap(p)
            time.sleep(0.3)
        left = pids_with_env(MARKER, s.id)
        for pid in left:  # whatever outlived that (a stray Ray worker): killed
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pg = self._postgres()
        if pg is not None:
            pg.remove() if purge else pg.stop()
        for node in s.nodes:
            shutil.rmtree(node.temp, ignore_errors=True)
        if purge:
            for sub in ("storage", "mlflow-artifacts", "logs", "mlflow.db"):
                target = self.dir / sub
                shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
        (self.dir / STATE).unlink(missing_ok=True)
        self.state = None
        self.say(f"cluster: stopped {len(running)} process(es)" + (f" and {len(left)} stray" if left else "")
                 + (" and deleted its data" if purge else f"; MLflow data and checkpoints kept in {self.dir}"))
        return len(running)
