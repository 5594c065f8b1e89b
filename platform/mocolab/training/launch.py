"""Driver side of a training run: validate, open the MLflow run, start Ray Train, close the run.

``fit`` is what ``mocolab train`` and every sweep trial call.  W = 0 is Ray
Train's local mode (the loop runs in this process); W >= 1 are Ray workers
with a gloo (CPU) or NCCL (GPU) process group.  The run's name fixes its
storage folder, so running the same name again resumes from its latest
checkpoint and continues the same MLflow run. The folder's manifest
(config/manifest.py), written at the run's first start, is what every later attempt
is compared with, as is the MLflow run's record, before any work.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

from mocolab.config.addresses import check_ray_address
from mocolab.training.interrupts import reassert
from mocolab.config import Config, validate, with_absolute_paths
from mocolab.data.roots import check_data
from mocolab.config.hardware import resolve_device
from mocolab.training.lock import NameLock
from mocolab.training.code_fingerprint import UNKNOWN, code_fingerprint
from mocolab.method.plugins import method_modules, shipped_paths
from mocolab.config.manifest import (FINAL_ERROR, RunManifest, check_resume, read_manifest, write_manifest,
                                     write_outcome)
from mocolab.tracking import (RunTracker, TrackingUnreachable, check_tracking_uri, local_store_path, redact_text,
                              redact_uri, resolve_tracking_uri)
from mocolab.data.sources import FINAL_ERRORS, DamagedDataError
from mocolab.training.checkpoint import load_rank_state, local_checkpoints
from mocolab.training.rerun import (REUSE_FLAG, Ended, continued_segments, describe, ended_run,
                                         interrupted_by_other_code, other_code_name)
from mocolab.training.ray_output import quiet_driver_output
from mocolab.training.resources import check_placement, node_capacities, worker_gpus
from mocolab.training.session import WorkerArgs, last_metrics
from mocolab.training.shipping import check_job_paths, check_nodes, code_runtime_env, method_runtime_env
from mocolab.training.storage import Location, is_uri

CHECKPOINT_DIR_TAG = "mocolab.checkpoint_dir"  # the run's folder (or URI): its manifest and checkpoints
CHECKPOINT_TAG = "mocolab.checkpoint"  # the latest checkpoint at the run's end: from the UI to the files


@dataclass
class TrainOutcome:
    run_name: str
    mlflow_run_id: str | None
    status: str  # finished | diverged
    linear_top1: float | None
    knn_top1: float | None
    final_loss: float | None
    steps: int
    resumed: bool
    checkpoint_path: str | None
    val_linear_top1: float | None = None  # data.val_size: the validation split's, what selection reads
    val_knn_top1: float | None = None


# Ray settings a local Ray on one machine is better off without (ensure_ray): Ray Train's preemption
# watcher (nothing on one machine is preempted) and the workers Ray prestarts for the first driver, one per
# CPU, most of which sit idle until they exit (benchmarks/RESULTS.md, "Where the suite's CPU goes")
LOCAL_RAY_OFF = ("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "RAY_prestart_worker_first_driver")


def check_cluster() -> None:
    """A RAY_ADDRESS that does not answer is an error before any MLflow run is made (not a long hang)."""
    address = os.environ.get("RAY_ADDRESS")
    parsed = check_ray_address(address)
    if parsed is None:
        return

    host, port = parsed
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as err:
        raise ValueError(f"RAY_ADDRESS={address}: the cluster does not answer ({err}); start it "
                         f"(`ray start --head`) or unset RAY_ADDRESS to run on a local Ray") from None


def ensure_ray(num_cpus: int | None = None, say: Callable[[str], None] = print, log_to_driver: bool = True) -> None:
    """Join $RAY_ADDRESS when set (after checking it answers), else start a local Ray (no dashboard:
    nothing listens for strangers).

    Joining a cluster ships this mocolab to every trial (``py_modules``) and checks every node
    has the pinned dependencies, before any work: nodes need no mocolab of their own.
    ``log_to_driver=False``: the workers' and actors' output stays in Ray's log files (a quiet sweep).
    """
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        check_cluster()
        runtime_env, override = code_runtime_env()
        if override:  # the job ships py_modules of its own: ours is their list plus mocolab
            os.environ["RAY_OVERRIDE_JOB_RUNTIME_ENV"] = "1"
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=log_to_driver)
        reassert()
        check_nodes(say=say)
    else:
        for var in LOCAL_RAY_OFF:  # before ray.init: the raylet and its workers inherit them; a user's value stands
            os.environ.setdefault(var, "0")
        # "local": never attach to a `ray start` cluster (or a stale record of one) on this machine
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=log_to_driver)
    reassert()  # Ray installs its own SIGTERM handler; Ctrl-C/SIGTERM must still close our runs


def fit(cfg: Config, *, tracking_uri: str | None = None, parent_run_id: str | None = None,
        tags: dict[str, str] | None = None, display_name: str | None = None, log_to_mlflow: bool = True,
        progress: Callable[[str], None] = print, callbacks: list | None = None,
        ray_train_info: bool = True, tune_trial: bool = False, tune_metric: str | None = None,
        reuse_other_code: bool = False, continue_across_code: bool = False,
        neutral_changes: frozenset[tuple[str, str]] = frozenset()) -> TrainOutcome:
    """Train one model to the end (or resume it) and return its outcome.

    The same command is the same config trained by the same code (training/rerun.py): a run it has
    ended is reported without training; an ended run of other code stays, and this code trains the config
    as ``<name>-c<code>`` beside it (``reuse_other_code``: report that run instead); a run interrupted under
    other code is refused unless ``continue_across_code`` or the change is one of ``neutral_changes`` ((from,
    to) fingerprints a committed list declares neutral); either records the change as a segment.

    ``callbacks`` go to Ray Train's RunConfig: a sweep passes Tune's
    ``TuneReportCallback`` so each epoch's metrics reach the scheduler.
    ``ray_train_info=False`` drops Ray Train's INFO lines in the workers (a checkpoint written, a report
    sent, each epoch) and what its helper actors print (``ray_output``): ``mocolab train`` prints them only
    with ``--verbose``; Ray's log files keep them.
    ``tune_trial``: called in a Tune trial, whose W = 0 loop reports to Tune itself (training/session.py);
    ``tune_metric`` is the search's metric (reports without it are not sent), None for a grid.
    """
    cfg = with_absolute_paths(check_data(validate(cfg)))  # workers run in other folders
    # Ray Train's print patch sends each print of a worker both to stdout and to its logger, which
    # Ray then forwards too: every line twice. Plain prints reach the worker's log file and the driver once.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    uri = resolve_tracking_uri(tracking_uri)
    check_job_paths({"run.output_dir": None if is_uri(cfg.run.output_dir) else cfg.run.output_dir,
                     "tracking URI": local_store_path(uri) if log_to_mlflow else None})
    if log_to_mlflow:
        # a trial's server answered its sweep's driver moments ago: slow now means busy (trials starting at
        # once on a loaded machine), not gone, and a trial failed for it would be lost to the sweep
        check_tracking_uri(uri, timeout=60.0 if tune_trial else 5.0)
    name = cfg.run_name
    storage = Location(cfg.run.output_dir)  # a folder, or any URI Ray Train writes to (s3://, gs://, ...)
    storage.check()
    workers = cfg.run.num_workers
    gpus = 0.0
    if workers > 0:  # a request the cluster can never place is an error now, not a hang later
        ensure_ray()
        if not ray_train_info:
            quiet_driver_output()
        nodes = node_capacities()
        gpus = worker_gpus(cfg.run.device, cfg.run.gpus_per_worker, workers, nodes)
        check_placement(workers, cfg.run.cpus_per_worker, gpus, what=f"run '{name}'", placement=cfg.run.placement,
                        nodes=nodes)
    else:  # the loop runs in this process: a device it cannot see is refused before any run exists
        resolve_device(cfg.run.device)
    run_dir = storage.child(name)
    code = code_fingerprint(extra=method_modules(cfg))  # a plugin's method: its code is the run's too
    manifest = RunManifest.of(cfg, code)
    again = dict(tracking_uri=tracking_uri, parent_run_id=parent_run_id, tags=tags, display_name=display_name,
                 log_to_mlflow=log_to_mlflow, progress=progress, callbacks=callbacks, ray_train_info=ray_train_info,
                 tune_trial=tune_trial, tune_metric=tune_metric, reuse_other_code=reuse_other_code,
                 continue_across_code=continue_across_code, neutral_changes=neutral_changes)
    with NameLock(run_dir.lock_folder(), f"run '{name}'", say=progress):
        started = read_manifest(run_dir, name)
        fresh = f"--set run.name=<a new name>, or remove {run_dir} (and its MLflow run)"
        tracker = None
        if started is not None:  # the same name with other settings, or of another run format: refused now
            check_resume(started, manifest, f"run '{name}' ({run_dir})", fresh)
            tracker = RunTracker(uri, cfg.run.experiment) if log_to_mlflow else None  # _fit_locked's too
            ended = ended_run(run_dir, tracker, name, parent_run_id)
            made_here = started.code_fingerprint.digest == code.digest
            if ended is not None:
                ran_here = ended.code == code.digest
                # a sweep's trial without a fingerprint keeps its result; a run never does silently
                if ran_here or reuse_other_code or (tune_trial and ended.code == UNKNOWN):
                    progress(f"run '{name}' has ended ({describe(ended.code)}"
                             f"{', this checkout' if ran_here else ''}): {ended.result()}; nothing to train "
                             f"({fresh} trains it again)")
                    return _reported(ended)
                new = other_code_name(name, code)
                progress(f"run '{name}' of this config was made by {describe(ended.code)}, not this checkout's "
                         f"code {code.short}: {ended.result()}; training it with this code as '{new}' "
                         f"({REUSE_FLAG} reports that run instead)")
                return fit(cfg.replace(**{"run.name": new}), **again)
            if not made_here:
                declared = declared_neutral(started.code_fingerprint.digest, code.digest, neutral_changes)
                if not (continue_across_code or declared):
                    raise interrupted_by_other_code(name, f"run '{name}' ({run_dir})", started, code, fresh)
                segments = continued_segments(started, code, _checkpoint_step(run_dir))
                manifest = dataclasses.replace(manifest, segments=segments)
                write_manifest(run_dir, manifest)
                progress(f"run '{name}': continuing under this checkout's code {code.short} (was "
                         f"{describe(started.code_fingerprint.digest)}"
                         f"{'; a change declared neutral' if declared else ''}), recorded as segment {len(segments)}")
            else:
                manifest = dataclasses.replace(manifest, segments=started.segments)
        return _fit_locked(cfg, manifest, uri, run_dir, record=started is None, parent_run_id=parent_run_id,
                           tags=tags, display_name=display_name, log_to_mlflow=log_to_mlflow, progress=progress,
                           callbacks=callbacks, ray_train_info=ray_train_info,
                           tune_local=tune_trial and workers == 0, tune_metric=tune_metric, gpus=gpus,
                           tracker=tracker)


def declared_neutral(started: str, now: str, changes: frozenset[tuple[str, str]]) -> bool:
    """Whether the declared changes lead from the code ``started`` to the code ``now``, each step neutral: a run
    interrupted under A continues under C where A -> B and B -> C are declared, as under B it would have."""
    reached, frontier = {started}, [started]
    while frontier:
        here = frontier.pop()
        for a, b in changes:
            if a == here and b not in reached:
                reached.add(b)
                frontier.append(b)
    return now in reached and now != started


def tune_trial_session():
    """The Tune trial session this process runs in; None outside Tune (Ray 2.60: no public API returns it)."""
    import ray.train._internal.session as tune_session

    return tune_session.get_session()


def stopped_by_tune(session) -> bool:
    """Whether Tune has stopped the trial of ``session`` (its scheduler, ``--stop-after``).

    ``Trainable.stop`` sets the session's stop event, ends the session and returns without waiting for the
    trial's function; Tune then removes the trial's placement group, and with it the Train controller that
    ``trainer.fit`` may still be waiting on here (``ActorDiedError``). That error is the stop, not a failure
    of the run: the sweep closes the run as it closes every trial stopped mid-epoch."""
    if session is None:
        return False
    event = getattr(session, "stop_event", None)  # never an error of its own on the error path it serves
    return (event is not None and event.is_set()) or tune_trial_session() is not session


def _reported(ended: Ended) -> TrainOutcome:
    return TrainOutcome(ended.name, ended.mlflow_run_id, ended.status, ended.linear_top1, ended.knn_top1,
                        ended.final_loss, ended.steps, True, ended.checkpoint, ended.val_linear_top1,
                        ended.val_knn_top1)


def _checkpoint_step(run_dir: Location) -> int | None:
    """The step of the run's latest checkpoint in its folder (None where it cannot be read here)."""
    names = local_checkpoints(run_dir)
    if not names or run_dir.remote:
        return None
    try:
        state, _ = load_rank_state(Path(run_dir.root) / names[-1], 0, 1)
    except (OSError, ValueError, KeyError):
        return None
    return int(state.get("step", 0))


def _fit_locked(cfg: Config, manifest: RunManifest, uri: str, run_dir: Location, *, record: bool,
                parent_run_id: str | None, tags: dict[str, str] | None, display_name: str | None,
                log_to_mlflow: bool, progress: Callable[[str], None], callbacks: list | None,
                ray_train_info: bool = True, tune_local: bool = False,
                tune_metric: str | None = None, gpus: float = 0.0,
                tracker: RunTracker | None = None) -> TrainOutcome:
    """``record``: the folder holds no manifest yet; it is written once MLflow has accepted the run too,
    so a run refused there leaves no folder behind that claims it.  ``gpus``: each worker's, as
    ``worker_gpus`` resolved ``run.device``."""
    name, workers = cfg.run_name, cfg.run.num_workers
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    run_id, resumed = None, False
    if log_to_mlflow:
        tracker = tracker or RunTracker(uri, cfg.run.experiment)
        run_tags = {"preset": cfg.run.preset, CHECKPOINT_DIR_TAG: run_dir.location, **(tags or {})}
        run_id, resumed = tracker.start(manifest, tags=run_tags, parent_run_id=parent_run_id,
                                        display_name=display_name)
        progress(f"MLflow: {'resuming' if resumed else 'created'} run {run_id} in experiment "
                 f"'{cfg.run.experiment}' at {redact_uri(uri)}")
    if record:
        write_manifest(run_dir, manifest)
    args = WorkerArgs(manifest, run_dir.location, uri, mlflow_run_id=run_id, ray_train_info=ray_train_info,
                      tune_local=tune_local, tune_metric=tune_metric, gpus_per_worker=gpus)
    resources = {"CPU": cfg.run.cpus_per_worker}
    if gpus:
        resources["GPU"] = gpus

    def attempt():
        trainer = TorchTrainer(
            partial(_loop, args),  # typed, where train_loop_config would be a dict
            scaling_config=ScalingConfig(num_workers=workers, use_gpu=gpus > 0,
                                         resources_per_worker=resources if workers else None,
                                         placement_strategy=cfg.run.placement.upper()),
            torch_config=TorchConfig(timeout_s=int(cfg.run.collective_timeout_s)),
            run_config=RunConfig(name=name, storage_path=cfg.run.output_dir,
                                 failure_config=FailureConfig(max_failures=cfg.run.max_failures),
                                 checkpoint_config=CheckpointConfig(num_to_keep=cfg.run.keep_checkpoints),
                                 callbacks=None if tune_local else callbacks or None,
                                 # a method named by module:Class path: its module goes to the workers
                                 worker_runtime_env=method_runtime_env(shipped_paths(cfg)) if workers else None),
        )
        return trainer.fit()

    failures = 0
    trial_session = tune_trial_session()  # Tune ends it when it stops the trial, before the error below
    while True:
        try:
            result = attempt()
            if workers and run_dir.exists(FINAL_ERROR):  # a worker's user error ended the run: raised here, once
                found = json.loads(run_dir.read_text(FINAL_ERROR))
                run_dir.delete(FINAL_ERROR)
                raise DamagedDataError(found["message"])
            break
        except Exception as err:  # noqa: BLE001 - recorded on the MLflow run, then re-raised
            failures += 1
            final = isinstance(err, FINAL_ERRORS)  # the same on every attempt: not retried
            if workers == 0 and failures <= cfg.run.max_failures and not final:  # local mode: retried here
                progress(f"run '{name}' failed ({type(err).__name__}: {err}); restarting from its latest "
                         f"checkpoint ({failures}/{cfg.run.max_failures})")
                continue
            if stopped_by_tune(trial_session):
                raise  # Tune stopping its trial ended the Train controller under this fit: the sweep closes the run
            if tracker is not None:
                tracker.fail(redact_text(f"{type(err).__name__}: {err}", uri))
            raise
        except BaseException as err:  # Ctrl-C, SIGTERM: the run is closed as KILLED with the reason
            if tune_local and isinstance(err, SystemExit):
                raise  # Tune stopping its trial (ASHA, --stop-after): the sweep closes the run, as for W >= 1
            if tracker is not None:
                tracker.fail(f"interrupted ({type(err).__name__})", killed=True)
            raise
    m = (last_metrics(run_dir.location) if tune_local else result.metrics) or {}
    diverged = bool(m.get("diverged", 0.0))
    status = "diverged" if diverged else "finished"
    loss = m.get("final_loss")
    if workers == 0:  # local mode: Ray's result holds no checkpoint; the run's folder holds them
        names = local_checkpoints(run_dir)
        checkpoint = str(run_dir.child(names[-1])) if names else None
    else:
        checkpoint = result.checkpoint.path if result.checkpoint is not None else None
        if checkpoint and run_dir.remote:  # Ray gives the path inside the bucket: put the scheme back
            checkpoint = f"{run_dir.location.split('://', 1)[0]}://{checkpoint}"
    if tracker is not None:
        try:
            if checkpoint:
                tracker.tag(CHECKPOINT_TAG, checkpoint)
            tracker.finish(status)
        except Exception as err:  # noqa: BLE001 - any failure of the store; the training itself is done
            raise TrackingUnreachable(
                f"MLflow: the tracking store at {redact_uri(uri)} did not answer at the end of run '{name}' "
                f"({type(err).__name__}); the run {status} and its checkpoint keeps it, with the metrics the "
                f"store missed: run the same command once the store answers to send them and close the run") from err
    out = TrainOutcome(name, run_id, status, m.get("linear_top1"), m.get("knn_top1"),
                       None if loss is None or (isinstance(loss, float) and math.isnan(loss)) else loss,
                       int(m.get("steps", 0)), resumed, checkpoint, m.get("val_linear_top1"), m.get("val_knn_top1"))
    # how it ended, with the code that made it: the same command reports this instead of training again
    write_outcome(run_dir, Ended(name, status, run_id, out.linear_top1, out.knn_top1, out.final_loss, out.steps,
                                 checkpoint, out.val_linear_top1, out.val_knn_top1,
                                 manifest.code_fingerprint.digest).to_dict())
    return out


def _loop(args: WorkerArgs) -> None:
    from mocolab.training.worker import train_loop_per_worker# imported in the worker process

    train_loop_per_worker(args)
