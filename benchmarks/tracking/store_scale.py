"""What a store of many runs costs its readers: the report, the leaderboard and a search by a param.

    nice -n 10 .venv/bin/python benchmarks/tracking/store_scale.py [--runs 1000] [--per-sweep 100] [--folder DIR]

Builds a sqlite MLflow store of ``--runs`` trial runs without training, shaped as trials log them: sweeps of
``--per-sweep`` children under a parent run, each child with the whole flattened config as params, the
trial's tags, per-epoch metrics, two per-step series and the final metrics, written with MLflow's batch
logging. Then times, each as a researcher runs it: ``mocolab report`` of one sweep and of the whole
experiment, ``mocolab report --leaderboard`` (commands in a fresh process, so their start-up counts), a
search by ``params.moco.m`` and a read of every run through ``Store``, and a live report's rebuild of one
sweep with and without the histories kept from the build before (``--watch``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from mocolab.config import build_config
from mocolab.tracking import store as store_module
from mocolab.tracking.store import PARENT_ID_TAG, PARENT_TAG, STATUS_TAG, SWEEP_TAG, HistoryCache, Store

EXPERIMENT = "momentum-ablation"
MOMENTA = (0.0, 0.9, 0.99, 0.999)
EPOCHS, STEPS_PER_EPOCH = 5, 20
PER_EPOCH = ("loss", "lr", "m", "knn_top1", "pretext_acc", "staleness_mean", "staleness_max", "images_per_s",
             "ema_half_life", "max_staleness_bound", "drift_cos", "stored_cos")
PER_STEP = ("m", "grad_norm_first_layer")
MAX_BATCH = 1000  # entities per log_batch: MLflow's limit


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return "unknown CPU"


def _log(client: MlflowClient, run_id: str, metrics: list[Metric], params: list[Param], tags: list[RunTag]) -> None:
    for i in range(0, len(params), 100):
        client.log_batch(run_id, params=params[i:i + 100])
    client.log_batch(run_id, tags=tags)
    for i in range(0, len(metrics), MAX_BATCH):
        client.log_batch(run_id, metrics=metrics[i:i + MAX_BATCH])


def build_store(uri: str, runs: int, per_sweep: int) -> list[str]:
    """The store: ``runs`` trials in sweeps of ``per_sweep``; the parent run ids."""
    client = MlflowClient(uri)
    exp = client.create_experiment(EXPERIMENT)
    parents = []
    for s in range(0, runs, per_sweep):
        name = f"sweep-{s // per_sweep:03d}"
        parent = client.create_run(exp, run_name=name, tags={PARENT_TAG: name, SWEEP_TAG: name}).info.run_id
        parents.append(parent)
        for i in range(min(per_sweep, runs - s)):
            m, seed = MOMENTA[i % len(MOMENTA)], i // len(MOMENTA)
            label = f"m={m:g} seed={seed}"
            cfg = build_config("smoke", {"moco.m": m, "run.seed": seed})
            run_id = client.create_run(exp, run_name=label).info.run_id
            now = int(time.time() * 1000)
            metrics = [Metric(k, 1.0 / (step + 1) + 0.01 * i, now, step)
                       for e in range(1, EPOCHS + 1) for step in range((e - 1) * STEPS_PER_EPOCH + 1,
                                                                        e * STEPS_PER_EPOCH + 1) for k in PER_STEP]
            metrics += [Metric(k, 7.0 - e * m + 0.001 * i, now, e * STEPS_PER_EPOCH)
                        for e in range(1, EPOCHS + 1) for k in PER_EPOCH]
            final = EPOCHS * STEPS_PER_EPOCH
            metrics += [Metric("linear_top1", 0.6 + 0.3 * m + 0.001 * seed, now, final),
                        Metric("knn_top1", 0.5 + 0.3 * m, now, final), Metric("final_loss", 7.0 - 3 * m, now, final)]
            params = [Param(k, str(v)[:6000]) for k, v in cfg.flatten().items()]
            tags = [RunTag(PARENT_ID_TAG, parent), RunTag(SWEEP_TAG, name), RunTag("trial", label),
                    RunTag(STATUS_TAG, "finished")]
            _log(client, run_id, metrics, params, tags)
            client.set_terminated(run_id, "FINISHED")
        client.set_terminated(parent, "FINISHED")
    return parents


def timed_command(argv: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {res.returncode}:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return took


class CountingClient(MlflowClient):
    history_reads = 0

    def get_metric_history(self, *args, **kwargs):
        type(self).history_reads += 1
        return super().get_metric_history(*args, **kwargs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--per-sweep", type=int, default=100)
    p.add_argument("--folder", default=None, help="where the store is built (default: a temporary folder)")
    args = p.parse_args()
    if args.runs < 1 or args.per_sweep < 1:
        raise SystemExit("--runs and --per-sweep: at least 1")
    folder = Path(args.folder or tempfile.mkdtemp(prefix="store-scale-")).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "mlflow.db"
    uri = f"sqlite:///{db}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    mocolab = str(Path(sys.executable).with_name("mocolab"))
    print(f"machine: {machine()}, {os.cpu_count()} CPUs (shared); store: {db}; load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")

    if db.exists():  # a store this script built before, with the same sizes: timed again as it is
        exp = MlflowClient(uri).get_experiment_by_name(EXPERIMENT)
        runs = Store(uri).runs(exp.experiment_id) if exp else []
        parents = [r.info.run_id for r in runs if PARENT_TAG in r.data.tags]
        if len(parents) != -(-args.runs // args.per_sweep):
            raise SystemExit(f"--folder: {db} holds another store; give an empty folder")
        print(f"reusing the store: {len(parents)} sweeps, {db.stat().st_size / 2**20:.0f} MB")
    else:
        t0 = time.perf_counter()
        parents = build_store(uri, args.runs, args.per_sweep)
        built = time.perf_counter() - t0
        print(f"built {args.runs} runs in {len(parents)} sweeps: {built:.0f} s, {db.stat().st_size / 2**20:.0f} MB")

    rows = []
    sweep = parents[-1]
    rows.append((f"`mocolab report --parent-run <a sweep of {args.per_sweep}>`",
                 timed_command([mocolab, "report", "--experiment", EXPERIMENT, "--parent-run", sweep,
                                "--out", str(folder / "sweep")], folder)))
    rows.append((f"`mocolab report` (the whole experiment, {args.runs} trials)",
                 timed_command([mocolab, "report", "--experiment", EXPERIMENT, "--out", str(folder / "all")], folder)))
    rows.append(("`mocolab report --leaderboard`",
                 timed_command([mocolab, "report", "--leaderboard", "--out", str(folder / "board")], folder)))
    rows.append(("importing what `mocolab report` imports, before any work",
                 timed_command([sys.executable, "-c", "import mocolab.analysis.report, mocolab.evaluation.leaderboard"],
                               folder)))

    store = Store(uri)
    exp = store.experiment_id(EXPERIMENT)
    assert exp is not None
    t0 = time.perf_counter()
    found = store.search_all([exp], "params.`moco.m` = '0.99'")
    rows.append((f"search by `params.moco.m = '0.99'` ({len(found)} runs, pages of {store_module.RUNS_PAGE_SIZE})",
                 time.perf_counter() - t0))
    t0 = time.perf_counter()
    every = store.runs(exp)
    rows.append((f"`Store.runs`: every run of the experiment ({len(every)})", time.perf_counter() - t0))
    assert len(every) == args.runs + len(parents), len(every)

    from mocolab.analysis.report import build_report

    store_module.MlflowClient = CountingClient  # type: ignore[misc] - counts the histories the builds read
    kept = HistoryCache()
    for what, cache in (("first build", kept), ("rebuild, histories kept (`--watch`)", kept),
                        ("rebuild, nothing kept", None)):
        CountingClient.history_reads = 0
        t0 = time.perf_counter()
        build_report(EXPERIMENT, folder / "live", parent_run=sweep, log_artifacts=False, refresh_s=30,
                     histories=cache)
        rows.append((f"live report of a sweep of {args.per_sweep}: {what}, {CountingClient.history_reads} history "
                     f"reads", time.perf_counter() - t0))

    print(f"\nload average (1, 5, 15 min) at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"command: nice -n 10 .venv/bin/python benchmarks/tracking/store_scale.py --runs {args.runs} "
          f"--per-sweep {args.per_sweep}\n")
    print("| what | wall time |\n|---|---|")
    for what, took in rows:
        print(f"| {what} | {took:.1f} s |")


if __name__ == "__main__":
    main()
