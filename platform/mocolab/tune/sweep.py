"""A sweep: Ray Tune trials, each one Ray Train run, recorded as MLflow child runs of one parent.

Train inside Tune (Ray 2.x, Train V2): every trial is a small Tune function
that calls ``mocolab.training.fit`` with Tune's ``TuneReportCallback``, so the
epoch metrics of rank 0 reach Tune's scheduler while the workers run in their
own placement group.  Names are deterministic (sweep name + what varies), so
re-running the same command resumes: Tune restores the sweep, a restarted
trial resumes its Train run from its checkpoint, and MLflow runs are found by
name instead of created twice.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from functools import partial
from pathlib import Path
from typing import Any, Callable

import ray
from ray import tune
from ray.tune import Stopper
from ray.tune.integration.ray_train import TuneReportCallback

from mocolab.config import absolute_paths, build_config
from mocolab.training.lock import NameLock
from mocolab.training.code_fingerprint import code_fingerprint
from mocolab.method.plugins import method_modules
from mocolab.training.storage import is_uri
from mocolab.tracking import (SWEEP_TAG, HistoryCache, Store, SweepRun, check_tracking_uri, local_store_path,
                              redact_uri, resolve_tracking_uri, source_tags)
from mocolab.training import fit
from mocolab.training.launch import ensure_ray
from mocolab.training.resources import TRIAL_DRIVER_CPUS, check_placement, node_capacities, threads_for, worker_gpus
from mocolab.training.shipping import check_job_paths
from mocolab.tune.lost import lost_trials
from mocolab.tune.progress import SweepProgress
from mocolab.tune.release import ReleaseEndedTrials
from mocolab.tune.search import build_scheduler, build_searcher, tune_space
from mocolab.tune.spec import (NO_GPU, REGISTER_METRICS, Launch, Sweep, SweepPlace, Trial,  # noqa: F401
                               check_sweep, trial_overrides)  # (Launch, Sweep, Trial re-exported)


def resolve_resources(launch: Launch, cluster_cpus: float) -> tuple[int, float]:
    """(max concurrent trials, CPUs per worker): by default two single-worker trials share two cores.

    Each trial reserves its workers' CPUs and TRIAL_DRIVER_CPUS for its own function.  Where those slivers
    would cost whole trials (``--cpus-per-worker 2`` on two cores: 2 + 0.05 does not fit), each worker
    reserves a sliver less (1.95), and still computes on as many threads (``train.resources.threads_for``).
    """
    w = max(1, launch.workers_per_trial)
    driver = TRIAL_DRIVER_CPUS
    cpus = launch.cpus_per_worker
    if cpus is None:  # the cluster shared among the concurrent trials, less their drivers
        conc = launch.max_concurrent or max(1, int(cluster_cpus // w))
        return conc, math.floor(max(0.1, (cluster_cpus / conc - driver) / w) * 100) / 100
    fit = int(cluster_cpus // (w * cpus + driver))  # trials that fit with their drivers
    want = int(cluster_cpus / (w * cpus) + 1e-9)  # ... and without them
    if launch.max_concurrent is not None:
        want = min(want, launch.max_concurrent)
    if launch.workers_per_trial > 0 and want > fit:
        shaved = math.floor((cluster_cpus / want - driver) / w * 100 + 1e-6) / 100
        if shaved > 0 and threads_for(shaved) == threads_for(cpus):
            fit, cpus = want, shaved
    return launch.max_concurrent or max(1, fit), cpus


def validate_sweep(sweep: Sweep, launch: Launch) -> None:
    """Every trial's config is built and validated, the tracking store answers: before any trial starts."""
    check_sweep(sweep, launch)
    check_tracking_uri(resolve_tracking_uri(launch.tracking_uri))


# ------------------------------------------------------------------ MLflow parent
# The rest of the parent run's description (the MLflow UI shows it on the run's page)
PARENT_GUIDE = ("This run is a sweep: each child run is one trial, named by what varies (e.g. `m=0.9 seed=0`), "
                "trained by Ray Train with the config in its params. Every trial logs `linear_top1` (a linear probe "
                "on frozen features), `knn_top1` and `final_loss` at its last step, and `loss`, `knn_top1`, "
                "`pretext_acc` per epoch. To compare: tick the child runs, press Compare, open Scatter Plot with "
                "the varied param on X and `linear_top1` on Y. This run's artifacts hold the summary table "
                "(`summary.csv`), the study's plot and `report/report.html`.")


def open_parent(sweep: Sweep, launch: Launch) -> SweepRun:
    """The sweep's MLflow parent run, found again by the sweep's name (a resumed sweep has one parent)."""
    params = {"sweep.preset": sweep.preset, "sweep.workers_per_trial": launch.workers_per_trial,
              "sweep.trials": len(sweep.trials) or sweep.num_samples, "sweep.search": sweep.search,
              "sweep.search_space": str(sweep.search_space or [t.label for t in sweep.trials])[:6000],
              **{f"sweep.set.{k}": v for k, v in sweep.base_overrides.items()}}
    if sweep.search != "grid":
        params.update({"sweep.scheduler": sweep.scheduler, "sweep.metric": f"{sweep.metric} ({sweep.mode})"})
    return SweepRun.open(Store(launch.tracking_uri), sweep.study, sweep.name,
                         description=f"{sweep.description}\n\n{PARENT_GUIDE}",
                         params=params, tags={"preset": sweep.preset, "study": sweep.study, **launch.source})


# ------------------------------------------------------------------ the trial
def _report_callback(metric: str | None):
    """Tune's TuneReportCallback; for a search, only reports that carry the searched metric get through
    (Optuna reads it from every result; the last epoch's kNN arrives with the final report)."""
    class _Callback(TuneReportCallback):
        def after_report(self, run_context, metrics, checkpoint):
            if metric is not None and metric not in metrics[0]:
                return
            super().after_report(run_context, metrics, checkpoint)

    return _Callback()


def _trial_fn(config: dict, *, sweep: Sweep, launch: Launch, place: SweepPlace, parent_run_id: str,
              cpus_per_worker: float) -> None:
    label, over = trial_overrides(sweep, launch, place, config, cpus_per_worker, tune.get_context().get_trial_id())
    cfg = build_config(sweep.preset, over)
    metric = sweep.metric if sweep.search != "grid" else None  # a search's; a grid sends every report
    # Ray Train workers report to Tune through the callback; a W = 0 loop reports itself (training/session.py),
    # and the callback would only start its queue actor, a process that is never read
    out = fit(cfg, tracking_uri=resolve_tracking_uri(launch.tracking_uri), parent_run_id=parent_run_id,
              tags={SWEEP_TAG: sweep.name, "trial": label, **launch.source}, display_name=label,
              callbacks=[_report_callback(metric)] if cfg.run.num_workers else None,
              tune_trial=True, tune_metric=metric, progress=print, reuse_other_code=launch.reuse_other_code,
              continue_across_code=launch.continue_across_code, neutral_changes=frozenset(launch.neutral_changes))
    nan = float("nan")
    tune.report({"final": 1.0, "status": out.status, "label": label, "epoch": cfg.optim.epochs,
                 "linear_top1": out.linear_top1 if out.linear_top1 is not None else nan,
                 "knn_top1": out.knn_top1 if out.knn_top1 is not None else nan,
                 "final_loss": out.final_loss if out.final_loss is not None else nan,
                 **({"val_linear_top1": out.val_linear_top1, "val_knn_top1": out.val_knn_top1}
                    if out.val_linear_top1 is not None else {}),
                 "mlflow_run_id": out.mlflow_run_id or ""})


def resolve_sweep(sweep: Sweep, launch: Launch) -> tuple[Sweep, Launch]:
    """The sweep's data paths, and the launch's store and storage, made absolute: trials run in other working
    folders."""
    return (dataclasses.replace(sweep, base_overrides=absolute_paths(sweep.base_overrides)),
            dataclasses.replace(launch, tracking_uri=resolve_tracking_uri(launch.tracking_uri),
                                storage=launch.storage if is_uri(launch.storage)
                                else str(Path(launch.storage).expanduser().resolve())))


def publish_report(place: SweepPlace) -> str | None:
    """With URI storage, copy the study's plot and report beside its Tune and Train state; returns where."""
    if not place.storage.remote:
        return None
    remote, local = place.root, place.local
    for png in local.glob("*.png"):  # the study's own plot
        remote.put_file(png, png.name)
    if (local / "report").is_dir():
        remote.put_dir(local / "report", "report")
    return str(remote.child("report"))


def run_sweep(sweep: Sweep, launch: Launch, progress: Callable[[str], None] = print) -> tuple[SweepRun, Any]:
    """Validate, open (or find) the parent run, run (or resume) the trials; returns (parent, Tune results).

    Everything that can be refused is refused before the parent run exists: bad input, a request the
    cluster can never place, another live invocation of the same sweep, a resume with other settings.
    """
    sweep, launch = resolve_sweep(sweep, launch)
    validate_sweep(sweep, launch)
    place = launch.place(sweep.name)

    check_job_paths({"--storage": None if is_uri(launch.storage) else launch.storage,
                     "--tracking-uri": local_store_path(launch.tracking_uri)})
    place.storage.check("--storage")

    ensure_ray(log_to_driver=launch.verbose)
    # MLflow's source tags, once, in this driver (a trial's argv and folder are Ray's), Ray's job id included
    launch = dataclasses.replace(launch, source=launch.source or source_tags(tracking_uri=launch.tracking_uri))
    if not launch.verbose:
        quiet_tune()
        progress(f"Ray's own output (Tune's tables, the workers' logs) is in {ray_logs_dir()}; --verbose prints it "
                 f"here too")
    nodes = node_capacities()
    cluster_cpus = sum(n["CPU"] for n in nodes) or float(os.cpu_count() or 1)
    conc, cpus = resolve_resources(launch, cluster_cpus)
    if launch.cpus_per_worker is not None and cpus != launch.cpus_per_worker:
        threads = "run.threads" if "run.threads" in sweep.base_overrides else f"{threads_for(cpus)} thread(s)"
        progress(f"--cpus-per-worker {launch.cpus_per_worker:g}: each worker reserves {cpus:g} CPU, so that "
                 f"{conc} trial(s) and their drivers ({TRIAL_DRIVER_CPUS:g} CPU each) fit in the cluster's "
                 f"{cluster_cpus:g} CPU; it computes on {threads}")
    base = build_config(sweep.preset, sweep.base_overrides)  # what every trial shares
    # what run.device means on this cluster (a trial with workers resolves its own the same way)
    gpus = worker_gpus(base.run.device, launch.gpus_per_worker, launch.workers_per_trial, nodes)
    if launch.workers_per_trial > 0:
        check_placement(launch.workers_per_trial, cpus, gpus, extra_cpus=TRIAL_DRIVER_CPUS,
                        nodes=nodes, what="each trial", no_gpu=NO_GPU)
    else:
        check_placement(1, _local_cpus(launch, cpus), gpus, nodes=nodes, what="each trial (local mode)",
                        no_gpu=NO_GPU)
    slots = _Slots(conc, cpus, base.optim.epochs, base.run.device)
    with NameLock(place.local, f"sweep '{sweep.name}'", say=progress):
        parent = open_parent(sweep, launch)
        progress(f"sweep '{sweep.name}' ({sweep.study}): {len(sweep.trials) or sweep.num_samples} trial(s), "
                 f"{conc} at a time, {launch.workers_per_trial} worker(s) x {cpus} CPU each; MLflow parent run "
                 f"{parent.run_id}{' (resumed)' if parent.resumed else ''} at {redact_uri(parent.uri)}")
        stop = _StopAfter(launch.stop_after) if launch.stop_after else None
        total = len(sweep.trials) if sweep.search == "grid" else sweep.num_samples * len(sweep.seeds)
        lines = SweepProgress(total, slots.epochs, progress,
                              on_change=_live_report(sweep, launch, place, parent, progress),
                              change_every_s=launch.watch_s or 30)
        run = _Invocation(sweep, launch, place, parent, slots, stop, lines, progress)
        try:
            tuner = _tuner(run)
            grid = tuner.fit() if tuner is not None else None
            grid = _rerun_lost(grid, run, base.run.max_failures)
        except BaseException as err:  # Ctrl-C, SIGTERM, an error: close every run, keep the sweep resumable
            _close_interrupted(parent, err)
            raise
        finally:
            lines.close()
        # Trials Tune ended without their own close: paused by --stop-after, stopped by the scheduler, or died.
        if stop is not None and stop.stop_all():
            leftovers = "stopped"
        else:
            leftovers = "stopped_early" if sweep.scheduler != "fifo" else "failed"
        for run_id in parent.close_running_children(leftovers, reason=_LEFTOVER_REASON[leftovers]):
            if leftovers == "stopped_early":
                parent.record_stopped_epoch(run_id)
    return parent, grid


def _trial_resources(launch: Launch, cpus: float, device: str) -> dict[str, float]:
    """What each trial's own process asks Ray for: a sliver beside its workers, or in local mode (no workers)
    what it trains on, GPUs as the cluster has them now (a rerun after a node died asks again).
    ``device``: the trials' run.device."""
    if launch.workers_per_trial > 0:
        return {"CPU": TRIAL_DRIVER_CPUS}
    resources = {"CPU": _local_cpus(launch, cpus)}
    if gpus := worker_gpus(device, launch.gpus_per_worker, 0, node_capacities()):
        resources["GPU"] = gpus
    return resources


def _local_cpus(launch: Launch, cpus: float) -> float:
    """The CPUs a trial that trains in its own process (no workers) reserves: --cpus-per-worker as asked
    (a local trial has no driver beside it to make room for), else its share from ``resolve_resources``."""
    return cpus if launch.cpus_per_worker is None else launch.cpus_per_worker


@dataclasses.dataclass
class _Slots:
    """What Ray gives the trials: how many at once, each worker's CPUs; the trials' epochs and run.device."""

    concurrent: int
    cpus: float
    epochs: int
    device: str


@dataclasses.dataclass
class _Invocation:
    """One invocation of a sweep, as its Tune runs (the first and any rerun of lost trials) need it."""

    sweep: Sweep
    launch: Launch
    place: SweepPlace
    parent: SweepRun
    slots: _Slots
    stop: Stopper | None
    lines: SweepProgress
    progress: Callable[[str], None]


_LEFTOVER_REASON = {
    "stopped": "paused by --stop-after; the same command resumes it from its checkpoint",
    "stopped_early": "stopped by the scheduler (ASHA) after too weak a start: a normal outcome of a search",
    "failed": "the trial's process ended without closing its run (see Tune's error for the trial)",
}


def quiet_tune() -> None:
    """Tune's console output off in this driver: its new output engine prints the experiment box and paths
    even at verbose=0, the old one prints nothing at 0; its INFO lines (state written, ...) go too."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    logging.getLogger("ray.tune").setLevel(logging.WARNING)


def ray_logs_dir() -> str:
    """The log folder of this driver's Ray session (on a cluster: the head's; each node keeps its own)."""
    try:
        return ray._private.worker._global_node.get_logs_dir_path()  # no public API names it
    except Exception:  # noqa: BLE001
        return "/tmp/ray/session_latest/logs"


def ending(err: BaseException) -> tuple[str, str]:
    """(mocolab status, MLflow status) of runs an exception ends: the user's Ctrl-C/SIGTERM, or a failure."""
    return ("interrupted", "KILLED") if isinstance(err, KeyboardInterrupt) else ("failed", "FAILED")


def _close_interrupted(parent: SweepRun, err: BaseException) -> None:
    """Stop the trials (a Ray this driver started ends with it), then close every open run: interrupted
    (KILLED) after Ctrl-C/SIGTERM, failed (FAILED) after an error."""
    reason = f"{type(err).__name__}: {err}".rstrip(": ")
    try:
        ray.shutdown()  # the trials' actors end with this driver: nothing writes after we close
    except Exception:  # noqa: BLE001 - closing the runs matters more than a clean disconnect
        pass
    status, mlflow_status = ending(err)
    parent.close_running_children(status, mlflow_status=mlflow_status, reason=f"the sweep ended: {reason}")
    parent.set_status(status, mlflow_status=mlflow_status, reason=f"{reason}; run the same command again to resume")


def _rerun_lost(grid: Any, run: _Invocation, limit: int) -> Any:
    """Run a grid's trials whose process was lost (a node died) again, from their checkpoints and into
    their MLflow runs, as the same command would: up to ``run.max_failures`` times. Trials that failed
    by raising are left failed. Tune's results of the last round are returned."""
    if run.sweep.search != "grid":
        return grid
    for round_ in range(1, limit + 1):
        lost = lost_trials(grid)
        if not lost or (run.stop is not None and run.stop.stop_all()):
            break
        run.progress(f"{'; '.join(lost)}: the trial's process was lost (its node died, or it was killed); running "
                     f"it again from its latest checkpoint ({round_}/{limit}, run.max_failures)")
        run.lines.retrying(set(lost))
        tuner = _tuner(run, only=set(lost))
        grid = tuner.fit() if tuner is not None else None
    return grid


def sweep_code(sweep: Sweep):
    """The code fingerprint the sweep's trials are trained by: the package's, with the modules of any plugin
    method a trial names (as ``fit`` keys each run), so a plugin sweep run again finds its done trials."""
    modules: set[str] = set()
    for t in sweep.trials or [Trial("", {})]:
        modules.update(method_modules(build_config(sweep.preset, {**sweep.base_overrides, **t.overrides})))
    return code_fingerprint(extra=tuple(sorted(modules)))


def _tuner(run: _Invocation, only: set[str] | None = None):
    """Tune's Tuner for this invocation (a resumed search, or the grid's remaining trials, or of those
    the ``only`` ones); None if all done."""
    sweep, place, slots, progress = run.sweep, run.place, run.slots, run.progress
    callbacks = [run.lines, ReleaseEndedTrials(progress)]
    verbose = 1 if run.launch.verbose else 0
    trainable = tune.with_resources(
        tune.with_parameters(partial(_trial_fn, sweep=sweep, launch=run.launch, place=place,
                                     parent_run_id=run.parent.run_id, cpus_per_worker=slots.cpus)),
        _trial_resources(run.launch, slots.cpus, slots.device))
    tune_path = place.tune
    if sweep.search != "grid":
        # Not every report carries the search metric (the last epoch's kNN comes with the final
        # report; checkpoint-only reports have none): ASHA skips those, Optuna reads the last one.
        os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
        # A search's state lives in its searcher: resume it through Tune.
        path = place.tune_at.child("search")
        if tune.Tuner.can_restore(path.location):
            progress(f"resuming the search from {path}")
            return tune.Tuner.restore(path.location, trainable=trainable, resume_errored=True)
        space = tune_space(sweep.search_space or {})
        space["run.seed"] = tune.grid_search(sweep.seeds) if len(sweep.seeds) > 1 else sweep.seeds[0]
        return tune.Tuner(
            trainable, param_space=space,
            tune_config=tune.TuneConfig(
                max_concurrent_trials=slots.concurrent, num_samples=sweep.num_samples,
                search_alg=build_searcher(sweep.search, sweep.metric, sweep.mode, sweep.seeds[0]),
                scheduler=build_scheduler(sweep.scheduler, sweep.metric, sweep.mode, slots.epochs)),
            run_config=tune.RunConfig(name="search", storage_path=tune_path, verbose=verbose, stop=run.stop,
                                      callbacks=callbacks))
    # A grid resumes from MLflow: trials that finished (or diverged) are not run again; the rest
    # start over in a new Tune run, and each resumes its own Train run from its checkpoint.
    # a trial made by other code runs again, unless the sweep reuses whatever code made it
    done = run.parent.done_labels(code=None if run.launch.reuse_other_code else sweep_code(sweep).digest)
    remaining = [t for t in sweep.trials if t.label not in done and (only is None or t.label in only)]
    if done and only is None:
        progress(f"{len(done)} trial(s) already done, {len(remaining)} to run")
    if not remaining:
        return None
    attempt = 1 + sum(1 for n in place.tune_at.children() if n.startswith("attempt-"))
    space = {"trial": tune.grid_search([{"label": t.label, "overrides": t.overrides} for t in remaining])}
    if only is None:
        run.lines.total = len(remaining)
    # reuse_actors: a trial's process spends seconds importing torch, MLflow and mocolab; the next trial
    # starts in the process of one that returned instead (its own config, seed, data, model and MLflow run
    # all the same). Only a grid: there a trial's actor is kept only once its function has returned (Tune
    # keeps no errored one). A search's scheduler stops trials mid-epoch, and Tune fails the next trial
    # when a reused actor's training thread has not ended within seconds.
    return tune.Tuner(
        trainable, param_space=space,
        tune_config=tune.TuneConfig(max_concurrent_trials=slots.concurrent, reuse_actors=True),
        run_config=tune.RunConfig(name=f"attempt-{attempt}", storage_path=tune_path, verbose=verbose, stop=run.stop,
                                  callbacks=callbacks))


def _live_report(sweep: Sweep, launch: Launch, place: SweepPlace, parent: SweepRun,
                 progress: Callable[[str], None]) -> Callable[[], None] | None:
    """``--watch``: the report rewritten as trials progress (the study writes the final one at the end)."""
    if not launch.watch_s:
        return None
    from mocolab.analysis.report import build_report

    page = place.local / "report" / "report.html"
    progress(f"live report: {page} (reloads itself every {launch.watch_s} s while trials run)")
    histories = HistoryCache()  # an ended trial's curves are read once, not at every rebuild

    def write() -> None:
        build_report(sweep.study, page.parent, parent_run=parent.run_id, tracking_uri=launch.tracking_uri,
                     log_artifacts=False, refresh_s=launch.watch_s, histories=histories)
        publish_report(place)

    return write


class _StopAfter(Stopper):
    """Ends the whole sweep once ``n`` trials have reported their final result (a budget per invocation)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.done: set[str] = set()

    def __call__(self, trial_id: str, result: dict) -> bool:
        if result.get("final"):
            self.done.add(trial_id)
        return False

    def stop_all(self) -> bool:
        return len(self.done) >= self.n


__all__ = ["Launch", "Sweep", "Trial", "open_parent", "resolve_sweep", "run_sweep", "validate_sweep"]
