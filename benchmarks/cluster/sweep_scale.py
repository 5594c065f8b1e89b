"""Real sweeps of N tiny trials on a ``mocolab cluster``: how each cost of a sweep grows with N.

    .venv/bin/python benchmarks/cluster/sweep_scale.py --trials 10 30 100 [--kinds grid asha] [--results FILE]
    .venv/bin/python benchmarks/cluster/sweep_scale.py --plot [--results FILE] [--figure FILE.png]

A cluster is started as ``mocolab cluster up`` starts it (``LocalCluster``: a Ray head without CPUs, two
worker nodes of one CPU, an ``mlflow server`` on a PostgreSQL server of its own) and stopped with its
``down`` at the end.  Each (N, kind) is one ``mocolab sweep`` of N trials of the smoke preset on
synthetic data (two epochs of four steps), run in a driver process of its own so that its peak RSS is
its own: ``grid`` is a grid of N momenta, ``asha`` a random search of N samples under ASHA on the
kNN score.  Per (N, kind) one JSON line is appended to the results file as soon as it is measured,
and what the file already holds is skipped: the same command continues a run stopped between cells,
and a larger N can be added later.

What a line holds, and where each figure comes from:

- ``wall_s``: the sweep command's wall time; ``per_trial_s`` that over N.
- per trial, from its MLflow run (timestamps are the logging client's clock): ``startup_s`` from the
  run's creation to the start of its first epoch (Ray Train's controller, worker group and placement
  group, the worker's imports, data and model), ``train_s`` from there to the last epoch's metrics,
  ``eval_s`` from there to the final ``linear_top1`` (kNN and linear probe; this and what follows over
  the finished trials only: the sweep closes a stopped trial's run at its own end), ``close_s`` (logging and
  close) from there to the run's end: the run's plots, feature map and models logged, the last report
  and checkpoint, Ray Train's shutdown, the run's status; from Tune's ``result.json``: ``tune_s``, the trial function's
  time (``time_total_s``) less the MLflow run's (sorted and paired: both are spreads), i.e. the trial
  actor's own work before and after.
  Each as median, 10th and 90th percentile.
- ``driver_peak_rss_mb``: the sweep driver's peak resident memory (``getrusage``).
- ``actors_alive``, ``pgs_alive``: Ray actors and placement groups not dead, counted with Ray's state
  API on the running cluster, in the driver once the sweep returned (``*_in_driver``) and from outside
  once the driver has exited; both must be 0.
- ``tune_state_bytes``: the sweep's Tune folder (``<storage>/<name>/tune``); ``train_state_bytes`` its
  trials' Train folders (checkpoints); ``store_bytes``: the growth of MLflow's PostgreSQL database over
  the sweep (``pg_database_size``), and ``store_total_bytes`` its size after it.
- ``report_s``, ``leaderboard_s``: ``mocolab report`` of the sweep and ``mocolab report --leaderboard``
  of its experiment, each a fresh process as a user types it; ``watch_first_s``, ``watch_next_s``: one
  ``--watch`` rebuild of the report with an empty history cache, and the next with the cache filled.
- ``load``: the load averages (1, 5, 15 min) before and after the cell: this machine may be shared.

``--plot`` reads the results file alone: it fits the slope of log(cost) against log(N) for each cost and
kind, prints them, and draws them on log-log axes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "platform"))  # this checkout's mocolab, whatever the environment installed
RESULTS = REPO / "benchmarks" / "cluster" / "sweep_scale.jsonl"
FIGURE = REPO / "docs" / "figures" / "sweep-scale.png"
KINDS = ("grid", "asha")
RAY_SINGLETONS = {("AutoscalingCoordinator", "AutoscalingCoordinator")}  # (actor name, namespace)
# Each trial trains two epochs of four steps on generated images and evaluates on a few hundred: its cost
# is the sweep's fixed cost per trial, not training.
TINY = {"data.name": "synthetic", "data.synthetic_size": 512, "optim.epochs": 2, "queue.size": 256,
        "eval.knn_bank": 512, "eval.knn_test": 128, "eval.linear_train": 512, "eval.linear_test": 128,
        "eval.linear_steps": 20, "eval.feature_map_images": 64}
# ASHA selects on the validation split's kNN (a search may not select on the test split)
SEARCH = {"data.val_size": 128}
# the costs --plot fits against N: (key in a results line, what it is, unit)
COSTS = (("per_trial_s", "sweep wall per trial", "s"),
         ("startup_s.median", "Train start-up per trial", "s"),
         ("train_s.median", "training per trial", "s"),
         ("eval_s.median", "evaluation per trial", "s"),
         ("close_s.median", "logging and close per trial", "s"),
         ("tune_s.median", "Tune's own time per trial", "s"),
         ("driver_peak_rss_mb", "driver peak RSS", "MB"),
         ("tune_state_bytes", "Tune state", "bytes"),
         ("store_bytes", "MLflow store growth", "bytes"),
         ("report_s", "mocolab report", "s"),
         ("leaderboard_s", "mocolab report --leaderboard", "s"),
         ("watch_first_s", "--watch rebuild, cold", "s"),
         ("watch_next_s", "--watch rebuild, warm", "s"))


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def momenta(n: int) -> list[str]:
    """N distinct momenta in [0.5, 0.999]: the grid's points, and the search's choices."""
    return [f"{0.5 + 0.499 * i / max(1, n - 1):.6f}" for i in range(n)]


def sweep_argv(n: int, kind: str, name: str, uri: str, storage: str) -> list[str]:
    argv = ["sweep", "--grid", f"moco.m={','.join(momenta(n))}", "--preset", "smoke", "--name", name,
            "--experiment", name, "--tracking-uri", uri, "--storage", storage, "--workers-per-trial", "1"]
    if kind == "asha":
        argv += ["--search", "random", "--samples", str(n), "--scheduler", "asha", "--metric", "val_knn_top1"]
    for key, value in {**TINY, **(SEARCH if kind == "asha" else {})}.items():
        argv += ["--set", f"{key}={value}"]
    return argv


def alive_on_cluster(address: str | None = None) -> tuple[list[str], list[str], list[str]]:
    """(actors, placement groups, Ray's own singletons) that Ray holds and that are not dead or removed.

    Ray's singletons are detached actors of Ray itself, one per cluster whatever the number of trials
    (Ray Data's ``AutoscalingCoordinator``, which Train V2 asks for its workers' resources, holding no CPU):
    kept apart, as no sweep can end them and none grows with N."""
    from ray.util.state import list_actors, list_placement_groups

    kwargs = {"address": address} if address else {}
    actors, singletons = [], []
    for a in list_actors(limit=10000, raise_on_missing_output=False, detail=True, **kwargs):
        if a.state == "DEAD":
            continue
        named = f"{a.class_name} ({a.state})"
        (singletons if (a.name, a.ray_namespace) in RAY_SINGLETONS else actors).append(named)
    groups = [f"{g.placement_group_id[:12]} ({g.state})"
              for g in list_placement_groups(limit=10000, raise_on_missing_output=False, **kwargs)
              if g.state != "REMOVED"]
    return actors, groups, singletons


# ------------------------------------------------------------------ one cell, in its own driver process
def run_cell(n: int, kind: str, name: str, uri: str, storage: str, out: Path) -> dict[str, Any]:
    """The sweep, then what only its driver can see: peak RSS, what is alive while it is connected, and
    the ``--watch`` rebuilds (in this process, as the sweep's own --watch runs them)."""
    from mocolab.cli.commands import main

    t0 = time.perf_counter()
    code = main(sweep_argv(n, kind, name, uri, storage))
    wall = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"mocolab sweep exited {code}")
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    actors, groups, _ = alive_on_cluster()
    import ray

    ray.shutdown()
    from mocolab.analysis.report import build_report
    from mocolab.tracking import HistoryCache, Store

    parent = Store(uri).client.search_runs(
        [Store(uri).client.get_experiment_by_name(name).experiment_id],
        filter_string=f"tags.`mlflow.runName` = '{name}'")[0].info.run_id
    cache = HistoryCache()
    rebuilds = []
    for _ in range(2):
        t = time.perf_counter()
        build_report(name, out / "watch", parent_run=parent, tracking_uri=uri, log_artifacts=False, refresh_s=30,
                     histories=cache)
        rebuilds.append(time.perf_counter() - t)
    return {"exit_code": code, "wall_s": wall, "driver_peak_rss_mb": rss_mb, "actors_in_driver": actors,
            "pgs_in_driver": groups, "parent_run": parent, "watch_first_s": rebuilds[0], "watch_next_s": rebuilds[1]}


# ------------------------------------------------------------------ what the parent measures around a cell
def spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {"median": math.nan, "p10": math.nan, "p90": math.nan, "n": 0}
    v = sorted(values)

    def q(p: float) -> float:
        i = p * (len(v) - 1)
        lo, hi = math.floor(i), math.ceil(i)
        return v[lo] + (v[hi] - v[lo]) * (i - lo)

    return {"median": round(q(0.5), 3), "p10": round(q(0.1), 3), "p90": round(q(0.9), 3), "n": len(v)}


def trial_phases(uri: str, name: str, parent: str, tune_dir: Path) -> dict[str, Any]:
    """Each trial's parts, from its MLflow run's timestamps and Tune's record of the trial function."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(name)
    children = client.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'",
                                  max_results=10000)
    startup, train, evaluate, close, run_s = [], [], [], [], []
    statuses: dict[str, int] = {}
    for r in children:
        status = r.data.tags.get("mocolab.status", r.info.status)
        statuses[status] = statuses.get(status, 0) + 1
        losses = sorted(client.get_metric_history(r.info.run_id, "loss"), key=lambda m: m.step)
        seconds = sorted(client.get_metric_history(r.info.run_id, "system/seconds"), key=lambda m: m.step)
        if not losses or not seconds:
            continue
        began = losses[0].timestamp / 1e3 - seconds[0].value  # the first epoch's start
        startup.append(began - r.info.start_time / 1e3)
        train.append(losses[-1].timestamp / 1e3 - began)
        final = client.get_metric_history(r.info.run_id, "linear_top1")
        if status == "finished" and final and r.info.end_time:  # a stopped run is closed at the sweep's end
            run_s.append((r.info.end_time - r.info.start_time) / 1e3)
            evaluate.append(final[-1].timestamp / 1e3 - losses[-1].timestamp / 1e3)
            close.append((r.info.end_time - final[-1].timestamp) / 1e3)
    tune_total = []  # the trial functions that returned (their final report), as the finished runs above
    for result in tune_dir.rglob("result.json"):
        lines = [json.loads(ln) for ln in result.read_text().splitlines() if ln.strip()]
        if lines and lines[-1].get("final"):
            tune_total.append(lines[-1].get("time_total_s", math.nan))
    tune_own = [t - r for t, r in zip(sorted(tune_total), sorted(run_s))] if len(tune_total) == len(run_s) else []
    return {"runs": len(children), "statuses": statuses, "startup_s": spread(startup), "train_s": spread(train),
            "eval_s": spread(evaluate), "close_s": spread(close), "run_s": spread(run_s),
            "tune_s": spread(tune_own), "tune_trials": sum(1 for _ in tune_dir.rglob("result.json"))}


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def store_bytes(cluster) -> int:
    """The MLflow database's size on its PostgreSQL server."""
    import psycopg2

    pg = cluster._postgres()
    os.environ.update(pg.env())
    with psycopg2.connect(pg.uri().replace("postgresql+psycopg2://", "postgresql://")) as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_database_size(current_database())")
            return int(cur.fetchone()[0])


def timed_command(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return took


def measure(n: int, kind: str, cluster, work: Path, log: Path) -> dict[str, Any]:
    """One (N, kind): its driver in a process of its own, then what is left on the cluster and its costs."""
    s = cluster.state
    name = f"scale-{kind}-{n}"
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{s.gcs_port}", "RAY_AUTH_MODE": "token",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "platform"), os.environ.get("PYTHONPATH")]))}
    before = {"load": load(), "store": store_bytes(cluster)}
    out = work / name
    out.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as sink:
        sink.write(f"\n===== {name}\n")
        sink.flush()
        res = subprocess.run([sys.executable, __file__, "--cell", str(n), kind, "--name", name, "--uri", s.tracking_uri,
                              "--storage", s.storage, "--out", str(out)],
                             env=env, stdout=sink, stderr=subprocess.STDOUT)
    printed = log.read_text().split(f"\n===== {name}\n")[-1]
    lines = [ln for ln in printed.splitlines() if ln.startswith("CELL ")]
    if res.returncode != 0 or not lines:
        tail = "\n".join(printed.splitlines()[-60:])  # the cause, where CI keeps only this process's output
        raise SystemExit(f"{name}: the sweep's driver exited {res.returncode}; its output is in {log}; "
                         f"it ended:\n{tail}")
    cell = json.loads(lines[-1][len("CELL "):])
    actors, groups, singletons = alive_on_cluster(s.dashboard)  # the driver has exited; the cluster still runs
    sweep_dir = Path(s.storage) / name
    row = {"n": n, "kind": kind, "machine": machine(), **cell, "per_trial_s": cell["wall_s"] / n,
           "actors_alive": actors, "pgs_alive": groups, "ray_singletons": singletons,
           **trial_phases(s.tracking_uri, name, cell["parent_run"], sweep_dir / "tune"),
           "tune_state_bytes": folder_bytes(sweep_dir / "tune"), "train_state_bytes": folder_bytes(sweep_dir / "train"),
           "store_total_bytes": store_bytes(cluster)}
    row["store_bytes"] = row["store_total_bytes"] - before["store"]
    mocolab = [sys.executable, "-m", "mocolab", "report", "--tracking-uri", s.tracking_uri]
    row["report_s"] = timed_command(mocolab + ["--experiment", name, "--parent-run", cell["parent_run"], "--out",
                                               str(out / "report")], env)
    row["leaderboard_s"] = timed_command(mocolab + ["--leaderboard", "--experiment", name], env)
    row["load"] = {"before": before["load"], "after": load()}
    return row


def machine() -> str:
    model = ""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{model or platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"


def done_cells(results: Path) -> set[tuple[int, str]]:
    if not results.exists():
        return set()
    return {(r["n"], r["kind"]) for r in map(json.loads, filter(str.strip, results.read_text().splitlines()))}


def run(trials: list[int], kinds: list[str], results: Path, say=print) -> list[dict[str, Any]]:
    """Every (N, kind) not yet in ``results``, on one cluster started and stopped here; returns the new lines."""
    from mocolab.cluster import LocalCluster

    todo = [(n, k) for n in trials for k in kinds if (n, k) not in done_cells(results)]
    if not todo:
        say(f"{results}: every cell is there already")
        return []
    os.environ["RAY_AUTH_MODE"] = "token"  # the cluster's: Ray's state API asks its dashboard with the token
    work = Path(tempfile.mkdtemp(prefix="mcs", dir="/tmp"))  # short: Ray's socket paths stay < 108 chars
    work.chmod(0o755)  # PostgreSQL's system user enters it where we are root
    log = work.with_name(f"{work.name}-drivers.log")  # kept: what each sweep printed
    say(f"the sweeps' output: {log}")
    cluster = LocalCluster(work / "cluster", say=say)
    rows = []
    try:
        cluster.up(workers=2, cpus_per_worker=1.0, backend="postgres", port=0, dashboard_port=0, mlflow_port=0)
        for n, kind in todo:
            say(f"sweep of {n} trials ({kind}), load {load()}")
            row = measure(n, kind, cluster, work, log)
            results.parent.mkdir(parents=True, exist_ok=True)
            with open(results, "a") as f:
                f.write(json.dumps(row) + "\n")
            rows.append(row)
            say(f"  {row['wall_s']:.0f} s, {row['per_trial_s']:.2f} s a trial; "
                f"driver {row['driver_peak_rss_mb']:.0f} MB; "
                f"alive after: {len(row['actors_alive'])} actors, {len(row['pgs_alive'])} placement groups; "
                f"report {row['report_s']:.1f} s, leaderboard {row['leaderboard_s']:.1f} s")
    finally:
        cluster.down(purge=True)
        shutil.rmtree(work, ignore_errors=True)
    return rows


# ------------------------------------------------------------------ --plot
def value(row: dict[str, Any], key: str) -> float:
    v: Any = row
    for part in key.split("."):
        v = v.get(part, math.nan) if isinstance(v, dict) else math.nan
    return math.nan if v is None else float(v)


def slopes(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """kind -> cost -> the least-squares slope of log(cost) on log(N) (NaN with fewer than two Ns)."""
    out: dict[str, dict[str, float]] = {}
    for kind in sorted({r["kind"] for r in rows}):
        mine = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["n"])
        out[kind] = {}
        for key, _, _ in COSTS:
            pts = [(math.log(r["n"]), math.log(value(r, key))) for r in mine if value(r, key) > 0]
            if len(pts) < 2:
                out[kind][key] = math.nan
                continue
            mx = sum(x for x, _ in pts) / len(pts)
            my = sum(y for _, y in pts) / len(pts)
            out[kind][key] = round(sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts), 2)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """The figures of each line as a Markdown table (RESULTS.md's), one column per (kind, N)."""
    rows = sorted(rows, key=lambda r: (r["kind"], r["n"]))

    def part(r: dict[str, Any], key: str) -> str:
        p = r[key]
        return f"{p['median']:.1f} ({p['p10']:.1f}-{p['p90']:.1f})" if p["n"] else "-"

    lines = {
        "sweep wall, s": lambda r: f"{r['wall_s']:.0f}",
        "per trial (wall / N), s": lambda r: f"{r['per_trial_s']:.1f}",
        "trials finished / stopped by ASHA": lambda r: " / ".join(
            str(r["statuses"].get(k, 0)) for k in ("finished", "stopped_early")),
        "Train start-up, s (p10-p90)": lambda r: part(r, "startup_s"),
        "training, s": lambda r: part(r, "train_s"),
        "evaluation, s": lambda r: part(r, "eval_s"),
        "logging and close, s": lambda r: part(r, "close_s"),
        "Tune's own, s": lambda r: part(r, "tune_s"),
        "driver peak RSS, MB": lambda r: f"{r['driver_peak_rss_mb']:.0f}",
        "actors / placement groups alive after": lambda r: f"{len(r['actors_alive'])} / {len(r['pgs_alive'])}",
        "... in the driver, before it exits": lambda r: f"{len(r['actors_in_driver'])} / {len(r['pgs_in_driver'])}",
        "Tune state, KB": lambda r: f"{r['tune_state_bytes'] / 1e3:.0f}",
        "Train state (checkpoints), MB": lambda r: f"{r['train_state_bytes'] / 1e6:.1f}",
        "MLflow store growth, MB": lambda r: f"{r['store_bytes'] / 1e6:.2f}",
        "`mocolab report`, s": lambda r: f"{r['report_s']:.1f}",
        "`mocolab report --leaderboard`, s": lambda r: f"{r['leaderboard_s']:.1f}",
        "`--watch` rebuild, cold / warm, s": lambda r: f"{r['watch_first_s']:.1f} / {r['watch_next_s']:.1f}",
        "load average before / after (1 min)": lambda r: f"{r['load']['before'][0]:.0f} / {r['load']['after'][0]:.0f}",
    }
    out = ["| | " + " | ".join(f"{r['kind']} N={r['n']}" for r in rows) + " |",
           "|---|" + "---:|" * len(rows)]
    out += [f"| {label} | " + " | ".join(cell(r) for r in rows) + " |" for label, cell in lines.items()]
    return "\n".join(out)


STYLES = {"grid": ("s-", "tab:orange"), "asha": ("o--", "tab:blue")}  # one look per kind in every panel


def plot(results: Path, figure: Path) -> dict[str, dict[str, float]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    rows = [json.loads(ln) for ln in results.read_text().splitlines() if ln.strip()]
    print(table(rows))
    fitted = slopes(rows)
    print(f"{'cost':34s} " + " ".join(f"{k:>8s}" for k in fitted))
    for key, label, _ in COSTS:
        print(f"{label:34s} " + " ".join(f"{fitted[k][key]:8.2f}" for k in fitted))
    fig, axes = plt.subplots(3, 5, figsize=(15, 8.5))
    for ax, (key, label, unit) in zip(axes.flat, COSTS):
        for kind in sorted(fitted):
            mine = sorted((r for r in rows if r["kind"] == kind and value(r, key) > 0), key=lambda r: r["n"])
            if mine:
                style, colour = STYLES.get(kind, ("^:", "tab:green"))
                ax.plot([r["n"] for r in mine], [value(r, key) for r in mine], style, color=colour,
                        label=f"{kind} (slope {fitted[kind][key]:.2f})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ys = [value(r, key) for r in rows if value(r, key) > 0]
        ax.set_xticks(sorted({r["n"] for r in rows}))
        if ys:  # a decade around the figures at least: a flat cost looks flat
            ax.set_ylim(min(ys) / 3, max(ys) * 3)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(ticker.NullFormatter())
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("trials N", fontsize=8)
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(COSTS):]:
        ax.axis("off")
    fig.suptitle("A sweep's costs against its number of trials (log-log, fitted slopes)", fontsize=11)
    fig.tight_layout()
    figure.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(figure, dpi=70)
    print(f"figure: {figure}")
    return fitted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, nargs="+", default=[10, 30, 100, 200])
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--plot", action="store_true", help="fit and draw the results file; run nothing")
    ap.add_argument("--figure", type=Path, default=FIGURE)
    ap.add_argument("--cell", nargs=2, metavar=("N", "KIND"), help=argparse.SUPPRESS)  # one driver (internal)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    ap.add_argument("--uri", help=argparse.SUPPRESS)
    ap.add_argument("--storage", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cell:
        cell = run_cell(int(args.cell[0]), args.cell[1], args.name, args.uri, args.storage, args.out)
        print("CELL " + json.dumps(cell), flush=True)
        return
    if args.plot:
        plot(args.results, args.figure)
        return
    if any(n < 2 for n in args.trials):
        ap.error("--trials: each N must be >= 2")
    run(args.trials, args.kinds, args.results)


if __name__ == "__main__":
    main()
