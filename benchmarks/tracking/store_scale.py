"""What a store of many runs costs its readers: the report, the leaderboard, a search by a param, MLflow's pages.

    nice -n 10 .venv/bin/python benchmarks/tracking/store_scale.py [--runs 1000] [--per-sweep 100]
        [--server postgres --writers 4] [--copies 10] [--pages] [--folder DIR]

Builds an MLflow store of ``--runs`` trial runs without training, in sweeps of ``--per-sweep`` under their
parent runs, each logged by the calls a smoke trial makes and with the keys it logs (``trial_shape.py``).
``--server postgres``: through an ``mlflow server`` on a PostgreSQL server of the benchmark's own (as
``mocolab cluster --backend postgres`` runs them), by ``--writers`` processes at once as concurrent trials
log; else into a sqlite file, one writer. ``--copies K`` then multiplies the store K times by copying its
rows in SQL (sqlite only): the 10,000-run store from the 1,000-run one in seconds. Then times, each as a
researcher runs it: ``mocolab report`` of one sweep and of the whole experiment, ``mocolab report
--leaderboard`` (commands in a fresh process, so their start-up counts), a search by ``params.moco.m``, a
read of every run through ``Store``, a live report's rebuilds (``--watch``) with the store reads each
makes, and with ``--pages`` MLflow's experiment page and compare page of 100 runs in headless Chromium
until their charts are drawn (``store_pages.py``). A store already in ``--folder`` is timed again as it is.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# MLflow's usage telemetry (it reaches nothing here) sets and drops an environment variable from a thread of
# its own, which can break a request of a process reading the environment at that moment (seen here)
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

EXPERIMENT = "momentum-ablation"
MOMENTA = (0.0, 0.9, 0.99, 0.999)
SWEEP_PREFIX = "sweep-"


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return "unknown CPU"


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


# ------------------------------------------------------------------ writers: one process each, as trials are
_writer: dict = {}


def _start_writer(uri: str) -> None:
    from mocolab.tracking.mlflow_log import RunTracker
    from mocolab.training.code_fingerprint import code_fingerprint
    from trial_shape import trial_shape

    os.environ["MLFLOW_TRACKING_URI"] = uri
    _writer.update(uri=uri, tracker=RunTracker(uri, EXPERIMENT), shape=trial_shape(), code=code_fingerprint())


def _log_one(job: tuple[str, str, int, int]) -> str:
    from trial_shape import log_trial

    sweep, parent, i, index = job
    m, seed = MOMENTA[i % len(MOMENTA)], i // len(MOMENTA)
    return log_trial(_writer["tracker"], _writer["uri"], sweep, parent, f"moco.m={m:g} seed={seed}",
                     {"moco.m": m, "run.seed": seed}, _writer["shape"], _writer["code"], index)


def build_store(uri: str, runs: int, per_sweep: int, writers: int) -> list[str]:
    """The store: ``runs`` trials in sweeps of ``per_sweep``, logged by ``writers`` processes; the parent ids."""
    from mocolab.tracking.store import Store, SweepRun

    store = Store(uri)
    jobs, parents = [], []
    for s in range(0, runs, per_sweep):
        name = f"{SWEEP_PREFIX}{s // per_sweep:03d}"
        sweep = SweepRun.open(store, EXPERIMENT, name, description=f"{name}: momentum", params={"sweep.set.moco.m":
                              ",".join(map(str, MOMENTA))}, tags={"preset": "smoke", "study": "momentum"})
        parents.append(sweep.run_id)
        jobs += [(name, sweep.run_id, i, s + i) for i in range(min(per_sweep, runs - s))]
    with multiprocessing.get_context("spawn").Pool(writers, _start_writer, (uri,)) as pool:
        done = 0
        for _ in pool.imap_unordered(_log_one, jobs, chunksize=4):
            done += 1
            if done % 100 == 0:
                print(f"  {done} trials logged, load {load()}", flush=True)
    for parent in parents:
        store.set_status(parent, "finished")
    return parents


def copy_store(db: Path, copies: int) -> None:
    """The experiment's runs ``copies`` times over, by copying their rows in SQL: copy k's run ids end in k,
    its sweeps' names and run names too, and it starts later, so each copy is sweeps of their own."""
    con = sqlite3.connect(db)
    columns = {t: [r[1] for r in con.execute(f"pragma table_info({t})")] for t in
               ("runs", "params", "tags", "metrics", "latest_metrics", "inputs", "input_tags")}
    con.execute("create temp table base as select run_uuid from runs")
    span = con.execute("select max(start_time) - min(start_time) + 1000 from runs").fetchone()[0]
    new = "substr({c}, 1, 28) || printf('%04d', :k)"
    renamed = ("'mocolab.sweep_name'", "'mocolab.sweep_parent'", "'mocolab.run_name'", "'mlflow.runName'")
    override = {
        "runs": {"run_uuid": new.format(c="run_uuid"), "start_time": "start_time + :k * :span",
                 "end_time": "end_time + :k * :span", "name": "name || '-c' || :k",
                 "artifact_uri": f"replace(artifact_uri, run_uuid, {new.format(c='run_uuid')})"},
        "tags": {"run_uuid": new.format(c="run_uuid"),
                 "value": f"case when key = 'mlflow.parentRunId' then {new.format(c='value')} "
                          f"when key in ({', '.join(renamed)}) then value || '-c' || :k else value end"},
        "inputs": {"input_uuid": new.format(c="input_uuid"), "source_id": new.format(c="source_id")},
        "input_tags": {"input_uuid": new.format(c="input_uuid")},
    }
    of_base = "source_id in (select run_uuid from base)"
    where = {"inputs": of_base, "input_tags": f"input_uuid in (select input_uuid from inputs where {of_base})"}
    with con:
        for k in range(1, copies):
            for table, cols in columns.items():
                exprs = [override.get(table, {}).get(c, new.format(c=c) if c == "run_uuid" else c) for c in cols]
                con.execute(f"insert into {table} ({', '.join(cols)}) select {', '.join(exprs)} from {table} "
                            f"where {where.get(table, 'run_uuid in (select run_uuid from base)')}",
                            {"k": k, "span": span})
    con.close()


# ------------------------------------------------------------------ a PostgreSQL store behind an mlflow server
class Server:
    """PostgreSQL and ``mlflow server`` of the benchmark's own, as ``mocolab cluster --backend postgres`` runs
    them (mocolab.cluster.postgres), under ``folder``; ``stop`` ends both."""

    def __init__(self, folder: Path) -> None:
        from mocolab.cluster.postgres import Postgres

        self.folder = folder
        self.pg = Postgres.locate(folder, _free_port())
        if not self.pg.initialised():
            self.pg.init()
        elif not self.pg.running():
            self.pg.start()
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port",
             str(self.port), "--workers", "2", "--backend-store-uri", self.pg.uri(), "--artifacts-destination",
             str(folder / "artifacts")], stdout=subprocess.DEVNULL, stderr=open(folder / "mlflow.log", "a"),
            start_new_session=True, env={**os.environ, **self.pg.env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(1)
        self.stop()
        raise SystemExit(f"mlflow server did not answer: {(folder / 'mlflow.log').read_text()[-2000:]}")

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def dump(self, path: Path) -> None:
        subprocess.run([str(self.pg.bindir / "pg_dump"), "-h", "127.0.0.1", "-p", str(self.pg.port), "-U", "mocolab",
                        "-Fc", "-f", str(path), "mlflow"], check=True, env={**os.environ, **self.pg.env()})

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server and its workers, started here only
            self.proc.wait(timeout=60)
        self.pg.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ timings
def timed_command(argv: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {res.returncode}:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return took


def store_reads(fn) -> tuple[float, dict[str, int]]:
    """(seconds, requests by kind) of ``fn()``: the histories and runs it asks the store for."""
    from mlflow.store.tracking.rest_store import RestStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    calls: dict[str, int] = {}
    saved = []
    for cls in (SqlAlchemyStore, RestStore):
        for name in ("get_metric_history", "get_metric_history_bulk", "get_run", "search_runs"):
            real = getattr(cls, name, None)
            if real is None:
                continue

            def counted(self, *a, _real=real, _name=name, **kw):
                calls[_name] = calls.get(_name, 0) + 1
                return _real(self, *a, **kw)

            saved.append((cls, name, real))
            setattr(cls, name, counted)
    import mocolab.tracking.store as store_module

    real_bulk = store_module._bulk_over_http

    def bulk(*a, **kw):
        calls["get-history-bulk-interval"] = calls.get("get-history-bulk-interval", 0) + 1
        return real_bulk(*a, **kw)

    store_module._bulk_over_http = bulk
    try:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0, calls
    finally:
        for cls, name, real in saved:
            setattr(cls, name, real)
        store_module._bulk_over_http = real_bulk


def time_store(uri: str, folder: Path, runs: int, per_sweep: int) -> list[tuple[str, str]]:
    from mocolab.analysis.report import build_report
    from mocolab.tracking import store as store_module
    from mocolab.tracking.store import PARENT_TAG, HistoryCache, Store

    os.environ["MLFLOW_TRACKING_URI"] = uri
    store = Store(uri)
    exp = store.experiment_id(EXPERIMENT)
    assert exp is not None
    parents = sorted(store.search_all([exp], f"tags.`{PARENT_TAG}` != ''"), key=lambda r: r.info.start_time)
    sweep = parents[-1].info.run_id
    mocolab = str(Path(sys.executable).with_name("mocolab"))
    rows = []

    def row(what: str, seconds: float, extra: str = "") -> None:
        rows.append((what + extra, f"{seconds:.1f} s"))
        print(f"  {what}{extra}: {seconds:.1f} s (load {load()})", flush=True)

    row(f"`mocolab report --parent-run <a sweep of {per_sweep}>`",
        timed_command([mocolab, "report", "--experiment", EXPERIMENT, "--parent-run", sweep,
                       "--out", str(folder / "sweep")], folder))
    row(f"`mocolab report` (the whole experiment, {runs:,} trials)",
        timed_command([mocolab, "report", "--experiment", EXPERIMENT, "--out", str(folder / "all")], folder))
    row("`mocolab report --leaderboard`",
        timed_command([mocolab, "report", "--leaderboard", "--out", str(folder / "board")], folder))
    row("importing what `mocolab report` imports, before any work",
        timed_command([sys.executable, "-c", "import mocolab.analysis.report, mocolab.evaluation.leaderboard"], folder))
    found: list = []
    took = store_reads(lambda: found.extend(store.search_all([exp], "params.`moco.m` = '0.99'")))[0]
    row(f"search by `params.moco.m = '0.99'` ({len(found):,} runs, pages of {store_module.RUNS_PAGE_SIZE:,})", took)
    every: list = []
    took = store_reads(lambda: every.extend(store.runs(exp)))[0]
    row(f"`Store.runs`: every run of the experiment ({len(every):,})", took)
    kept = HistoryCache()
    for what, cache in (("first build", kept), ("rebuild, histories kept (`--watch`)", kept),
                        ("rebuild, nothing kept", None)):
        took, calls = store_reads(lambda c=cache: build_report(EXPERIMENT, folder / "live", parent_run=sweep,
                                                               log_artifacts=False, refresh_s=30, histories=c))
        reads = ", ".join(f"{n} {k}" for k, n in sorted(calls.items()))
        row(f"live report of a sweep of {per_sweep}: {what}", took, f" ({reads})")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--per-sweep", type=int, default=100)
    p.add_argument("--server", choices=("postgres",), default=None,
                   help="log and read through an mlflow server on PostgreSQL (default: a sqlite file)")
    p.add_argument("--writers", type=int, default=1, help="processes logging trials at once (a server's store)")
    p.add_argument("--copies", type=int, default=1, help="then copy the store's runs in SQL to K times as many")
    p.add_argument("--pages", action="store_true", help="also time MLflow's pages in headless Chromium")
    p.add_argument("--folder", default=None, help="where the store is built (default: a temporary folder)")
    args = p.parse_args()
    # stopped (SIGTERM): the writers go with the driver and the servers are stopped, as on Ctrl-C
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.runs < 1 or args.per_sweep < 1 or args.writers < 1 or args.copies < 1:
        raise SystemExit("--runs, --per-sweep, --writers and --copies: at least 1")
    if args.server and args.copies > 1:
        raise SystemExit("--copies: a sqlite store only (copy a PostgreSQL store with its own tools)")
    if not args.server and args.writers > 1:
        raise SystemExit("--writers: a sqlite file takes one writer at a time; give --server postgres")
    folder = Path(args.folder or tempfile.mkdtemp(prefix="store-scale-")).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    total = args.runs * args.copies
    print(f"machine: {machine()}, {os.cpu_count()} CPUs (shared); folder {folder}; load average {load()}", flush=True)
    server = Server(folder) if args.server else None
    try:
        uri = server.uri if server else f"sqlite:///{folder / 'mlflow.db'}"
        os.environ["MLFLOW_TRACKING_URI"] = uri
        from mocolab.tracking.store import Store

        built = (folder / "built").exists()
        if built:
            print("reusing the store built before in this folder", flush=True)
        else:
            if Store(uri).experiment_id(EXPERIMENT) is not None:
                raise SystemExit(f"--folder: {folder} holds a store this script did not finish; give an empty folder")
            t0 = time.perf_counter()
            build_store(uri, args.runs, args.per_sweep, args.writers)
            took = time.perf_counter() - t0
            print(f"built {args.runs:,} runs by {args.writers} writer(s): {took:.0f} s, load {load()}", flush=True)
            if args.copies > 1:
                t0 = time.perf_counter()
                copy_store(folder / "mlflow.db", args.copies)
                print(f"copied to {total:,} runs: {time.perf_counter() - t0:.0f} s", flush=True)
            (folder / "built").write_text(f"{total} runs\n")
        size = (f"{(folder / 'mlflow.db').stat().st_size / 2**20:.0f} MB of sqlite" if not server else
                _pg_size(server))
        print(f"store: {size}", flush=True)
        rows = time_store(uri, folder, total, args.per_sweep)
        if args.pages:
            from store_pages import time_pages

            page_server = server.uri if server else None
            rows += time_pages(page_server, folder, f"sqlite:///{folder / 'mlflow.db'}", EXPERIMENT)
        if server:
            server.dump(folder / "mlflow.pgdump")
            print(f"dump: {folder / 'mlflow.pgdump'}, {(folder / 'mlflow.pgdump').stat().st_size / 2**20:.0f} MB")
    finally:
        if server:
            server.stop()
    print(f"\nload average (1, 5, 15 min) at the end: {load()}")
    print(f"command: nice -n 10 .venv/bin/python benchmarks/tracking/store_scale.py --runs {args.runs} --per-sweep "
          f"{args.per_sweep}" + (f" --server {args.server} --writers {args.writers}" if args.server else "")
          + (f" --copies {args.copies}" if args.copies > 1 else "") + (" --pages" if args.pages else "") + "\n")
    print(f"| what ({total:,} runs) | wall time |\n|---|---|")
    for what, took in rows:
        print(f"| {what} | {took} |")


def _pg_size(server: Server) -> str:
    res = subprocess.run([str(server.pg.bindir / "psql"), "-h", "127.0.0.1", "-p", str(server.pg.port), "-U",
                          "mocolab", "-d", "mlflow", "-tAc", "select pg_database_size('mlflow')"],
                         capture_output=True, text=True, env={**os.environ, **server.pg.env()})
    return f"{int(res.stdout.strip()) / 2**20:.0f} MB of PostgreSQL" if res.returncode == 0 else "PostgreSQL"


if __name__ == "__main__":
    main()
