"""``train_loop_per_worker``: the plain training loop with Ray at its edges.

Ray enters in four places only, all through a ``Session`` (session.py): the
rank, the device, the checkpoint on start, and a report with a checkpoint at
every epoch end (and every ``run.checkpoint_every`` steps).
Rank 0 logs to MLflow by run id; the driver owns the run's life. What the driver hands every rank is
a ``WorkerArgs`` (session.py): this attempt's manifest, the run's folder and the MLflow run.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import tempfile
from pathlib import Path

import torch
import torch.distributed as tdist

from mocolab.method import collectives as mdist
from mocolab.config import Config
from mocolab.data.sets import DEFAULT_IMAGEFOLDER_SIZE
from mocolab.models.exported import FeatureExtractor, ProbeClassifier
from mocolab.config.hardware import provenance
from mocolab.data.canvas import StoreLayout
from mocolab.data.sources import FINAL_ERRORS, TrainSource, choose_loader
from mocolab.training.trainer import EpochRecord, Trainer, run_constants, run_training
from mocolab.config.manifest import FINAL_ERROR, RunManifest, check_resume
from mocolab.tracking import MetricsLogger
from mocolab.tracking.logged_models import CLASSIFIER, ENCODER, log_models
from mocolab.tracking.run_keys import constant_tags, for_mlflow
from mocolab.tracking.system import node_labels, start_monitor, stop_monitor
from mocolab.training.storage import Location
from mocolab.training.checkpoint import load_rank_state, local_checkpoints, save_local, save_rank_state
from mocolab.config.hardware import usable_cores
from mocolab.training.resources import PG_KEY, current_placement_group, threads_for
from mocolab.training.session import Session, WorkerArgs, session_for
from mocolab.training.stream import StreamSource


def _report(session: Session, trainer: Trainer, manifest: RunManifest, metrics: dict,
            keep: tuple[Location, int] | None = None) -> None:
    """Report metrics with a checkpoint. Ray's local mode (W = 0) persists no checkpoint, so there the run's
    folder keeps them (``keep``: the folder, how many) in Ray's layout, and the report carries none."""
    if keep is not None:
        save_local(keep[0], trainer.state_dict(), manifest, keep[1])
        session.report(metrics, None)
        return
    with tempfile.TemporaryDirectory() as tmp:
        save_rank_state(trainer.state_dict(), manifest, tmp, trainer.rank, trainer.world_size)
        # Ray Train workers: their placement group, which a sweep removes if Tune stops the trial (tune/release.py)
        session.report({**metrics, PG_KEY: current_placement_group()}, tmp)


def _maybe_inject_fault(trainer: Trainer, fault_step: int, run_dir: Location, local: bool) -> None:
    """Testing aid: the last rank dies hard at ``fault_step``, once per run (a marker file remembers).
    In local mode (W = 0) the loop runs in the driver, so the fault is an exception, not an exit."""
    marker = ".fault-injected"
    if fault_step and trainer.step == fault_step and trainer.rank == trainer.world_size - 1 \
            and not run_dir.exists(marker):
        run_dir.write_text(marker, f"worker exited at step {fault_step}\n")
        if local:
            raise RuntimeError(f"injected fault at step {fault_step} (run.fault_step)")
        os._exit(17)


WARM_STEPS = 8


class MemoryWatch:
    """Peak private memory of this worker (Linux ``RssAnon``: its own heap, sampled every step).

    Plain RSS also counts the object-store pages a worker maps while it reads streamed blocks: that
    store is Ray's, shared by the node and bounded by its own cap, so it is left out here.
    """

    def __init__(self) -> None:
        self.start = self.peak = self.private_mb()
        self.warm: float | None = None  # the peak after WARM_STEPS steps
        self.training_peak: float | None = None  # the peak at the last training step since then

    @staticmethod
    def private_mb() -> float:
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # elsewhere: the peak of plain RSS

    def sample(self) -> None:
        self.peak = max(self.peak, self.private_mb())


def worker_nodes() -> list[str]:
    """Every rank's Ray node id (first 12 hex digits), in rank order: what SPREAD placement did."""
    import ray

    if not ray.is_initialized():  # Ray Train's local mode (W = 0) may run without Ray
        return ["this process"]
    mine = ray.get_runtime_context().get_node_id()[:12]
    if not (tdist.is_available() and tdist.is_initialized()) or tdist.get_world_size() == 1:
        return [mine]
    every: list = [None] * tdist.get_world_size()
    tdist.all_gather_object(every, mine)
    return every


def log_trained_models(trainer: Trainer, result, args: WorkerArgs) -> None:
    """The encoder (images -> features) and the probe (images -> logits) as pt2 MLflow models of the run."""

    images, _ = next(iter(trainer.data.eval_split("test", 4)))
    example = images[:4].float().div(255.0)
    features = FeatureExtractor(trainer.evaluation.backbone_copy(), trainer.data.channels)
    uris = log_models(args.tracking_uri, args.mlflow_run_id,
                      {ENCODER: features, CLASSIFIER: ProbeClassifier(features, result.probe)}, example,
                      step=result.steps)
    if uris:
        print(f"MLflow: encoder logged as {uris[ENCODER]} (mocolab export {args.mlflow_run_id} --out DIR)")


# the epoch monitors a run's best_<key> is taken over (the final_<key> keys are the end values)
BEST_OF = ("knn_top1", "online_linear_top1", "val_knn_top1", "val_online_linear_top1")
# the final scores and measures a run logs at its end, beside the evaluation's extra metrics and best_/final_ keys
FINAL_LOGGED = ("linear_top1", "knn_top1", "val_linear_top1", "val_knn_top1", "final_loss", "worker_rss_growth_mb",
                "worker_rss_growth_after_warmup_mb")
# metrics the tracking store did not take by the end of an attempt, beside the checkpoints, sent by the next
UNSENT_METRICS = "unsent_metrics.json"
DIAGNOSTICS_DIR = "negatives"  # the run's artifacts: epoch_NNNN.json per epoch, dictionary.png at the end


def log_dictionary_plot(logger: MetricsLogger, diagnostics: dict, drift: dict, cfg: Config) -> None:
    """The last epoch's age histogram and key drift against age over the epochs, in the run's artifacts."""
    from mocolab.analysis import dictionary_plot

    with tempfile.TemporaryDirectory() as tmp:
        title = f"{diagnostics.get('negatives')} (m={cfg.moco.m}), epoch {diagnostics.get('epoch')}"
        path = dictionary_plot(diagnostics, drift, Path(tmp) / "dictionary.png", title,
                               fifo_bound=cfg.max_staleness if cfg.uses_queue else None)
        logger.log_figure(path, DIAGNOSTICS_DIR)


def log_feature_map(trainer: Trainer, logger: MetricsLogger, cfg: Config) -> None:
    """The features of a fixed class-balanced set of test images (analysis/feature_maps.py) in the run's
    artifacts, float16: ``mocolab report`` maps them (t-SNE, seconds of CPU per run: too slow beside training on
    a loaded two-core machine, benchmarks/RESULTS.md) and lays the arms' maps side by side."""
    from mocolab.analysis import feature_maps as fm

    n = cfg.eval.feature_map_images
    sample = fm.balanced_sample(trainer.data.eval_split("test", None), n, trainer.data.classes) if n else None
    if sample is None or len(sample[1]) < fm.MIN_IMAGES:
        if n:
            print(f"feature map: none (fewer than {fm.MIN_IMAGES} labelled test images)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = fm.save_features(Path(tmp) / fm.FEATURES_NAME, trainer.evaluation.features(sample[0]).numpy(),
                                sample[1], fm.CLASS_NAMES.get(cfg.data.name, ()))
        logger.log_figure(path, fm.MAP_DIR)


def open_source(cfg: Config, say=None, device: torch.device | None = None) -> TrainSource | None:
    """The streaming source when ``data.loader`` resolves to stream; None lets the Trainer decode into memory.
    ``device``: the trainer's (a CUDA one gets its batches in pinned memory)."""
    d = cfg.data
    size = d.image_size or DEFAULT_IMAGEFOLDER_SIZE
    choice = choose_loader(d.name, d.loader, cfg.train_size, size, 3, d.memory_budget_mb,
                           StoreLayout.derived(size, d.store_short_side, d.store_max_side))
    if say is not None:
        say(choice.reason)
    if choice.loader == "stream":
        return StreamSource.from_config(cfg, device)
    return None


def train_loop_per_worker(args: WorkerArgs) -> None:
    cfg = args.config()
    if cfg.run.num_workers == 0:  # in the calling process: the driver's own handler ends the run with the error
        return _loop(args, cfg)
    try:
        return _loop(args, cfg)
    except FINAL_ERRORS as err:  # a user's error, the same on every attempt: the run's end, not Ray's to retry
        Location(args.run_dir).write_text(FINAL_ERROR, json.dumps({"type": type(err).__name__, "message": str(err)}))
        print(f"{type(err).__name__}: {err}")  # ending normally: Ray restarts no worker for it


def _loop(args: WorkerArgs, cfg: Config) -> None:
    if not args.ray_train_info:  # `mocolab train` without --verbose: Ray Train's INFO
        logging.getLogger("ray.train").setLevel(logging.WARNING)  # lines per report are dropped
    # Metric logging is best-effort (tracking.MetricsLogger buffers what a dead server refuses): fail a
    # request in seconds rather than after MLflow's default minutes of retries, unless the user chose.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    if cfg.run.threads or cfg.run.num_workers > 0 or args.tune_local:
        # Ray sets OMP threads, not torch's: use the CPU share (a W = 0 trial's is its Tune process's),
        # never more threads than the cores this process may run on
        torch.set_num_threads(cfg.run.threads or min(threads_for(cfg.run.cpus_per_worker), usable_cores()))
    session = session_for(args)
    memory = MemoryWatch()
    device = session.device(cfg.run.device, args.gpus_per_worker, local=cfg.run.num_workers == 0)
    trainer = Trainer(cfg, device=device, source=open_source(cfg, say=print if session.world_rank() == 0 else None,
                                                             device=device))
    run_dir = Location(args.run_dir)  # a folder or a URI (training/storage.py)
    state = _resume_state(session, trainer, run_dir, args.manifest, local=cfg.run.num_workers == 0)
    if state is not None:
        trainer.load_state_dict(state)

    logger = None
    if trainer.is_main and args.mlflow_run_id:
        logger = MetricsLogger(args.tracking_uri, args.mlflow_run_id)
    if logger is not None and run_dir.exists(UNSENT_METRICS):  # what the store missed last time, first
        if logger.take_back(run_dir.read_text(UNSENT_METRICS)):
            run_dir.delete(UNSENT_METRICS)
            print(f"MLflow: sent the metrics an earlier attempt kept in {run_dir.child(UNSENT_METRICS).location}")
    if logger is not None:  # which data, by content digest: the UI's Dataset column, the report's data column
        logger.log_datasets(trainer.data.records())
        for key, value in provenance(trainer.device, trainer.precision).items():  # torch, device, precision
            logger.set_tag(key, value)
        for key, value in constant_tags(run_constants(cfg)).items():  # once a run, not a series per epoch
            logger.set_tag(key, value)
    nodes = worker_nodes()
    if trainer.is_main:
        print(f"workers on Ray nodes (rank order): {','.join(nodes)}"
              + (f"; resuming at step {trainer.step}" if state else ""))
        if logger is not None:  # where this attempt's ranks ran (after a node loss: where they run now)
            logger.set_tag("mocolab.worker_nodes", ",".join(nodes))
    labels, leaders = node_labels(nodes)
    monitor = None
    if args.mlflow_run_id and leaders[trainer.rank]:  # one monitor per node, on its first rank
        monitor = start_monitor(args.tracking_uri, args.mlflow_run_id, cfg.run.system_metrics_s, labels[trainer.rank])
    try:
        _train(cfg, trainer, args, logger, run_dir, memory, session)
    finally:
        stop_monitor(monitor)


def _resume_state(session: Session, trainer: Trainer, run_dir: Location, manifest: RunManifest,
                  local: bool) -> dict | None:
    """The trainer state this rank resumes from (None: a fresh start): Ray's checkpoint, else in local mode
    the run folder's latest. The driver compared the run's records before any work; the checkpoint is
    compared too, by the same rule, since it is what the state comes from."""
    checkpoint = session.checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state, saved = load_rank_state(folder, trainer.rank, trainer.world_size)
            where = f"run '{manifest.name}' (checkpoint {folder})"
    elif local and (names := local_checkpoints(run_dir)):
        where = f"run '{manifest.name}' (checkpoint {run_dir.child(names[-1])})"
        if not run_dir.remote:
            state, saved = load_rank_state(Path(run_dir.root) / names[-1], 0, 1)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                run_dir.get_dir(names[-1], tmp)
                state, saved = load_rank_state(tmp, 0, 1)
    else:
        return None
    check_resume(saved, manifest, where, "--set run.name=<a new name>")
    return state


def _train(cfg: Config, trainer: Trainer, args: WorkerArgs, logger: MetricsLogger | None, run_dir: Location,
           memory: MemoryWatch, session: Session) -> None:
    """From the first step (or the restored one) to the final report."""
    every = cfg.run.checkpoint_every
    keep = (run_dir, cfg.run.keep_checkpoints) if cfg.run.num_workers == 0 else None

    memory.sample()
    warm_step = trainer.step + WARM_STEPS

    def on_step(tr: Trainer) -> None:
        memory.sample()
        if tr.step == warm_step:  # past the first batches: what the loader holds in steady state
            memory.warm = memory.peak
        if memory.warm is not None:
            memory.training_peak = memory.peak
        _maybe_inject_fault(tr, cfg.run.fault_step, run_dir, local=cfg.run.num_workers == 0)
        sched = tr.schedule
        if every and tr.step % every == 0 and tr.step % sched.steps_per_epoch and tr.step < sched.total_steps:
            _report(session, tr, args.manifest, {"step": tr.step, "epoch": tr.epoch}, keep)

    last_diagnostics: dict = {}
    drift: dict[int, tuple[list, list]] = {}  # epoch -> its probes' ages and drift cosines, for the run's plot

    def on_epoch(rec: EpochRecord) -> None:
        metrics = rec.metrics()
        for key in BEST_OF:
            if key in metrics:
                monitor_best[key] = max(metrics[key], monitor_best.get(key, metrics[key]))
        if logger is not None:  # MLflow keeps the step itself: a "step" metric would only be noise in its UI
            # m comes once per step in the series (the epoch's value is its last point); the unreadable
            # images found so far beside the epoch's numbers, and named on the run's page
            logger.log({**for_mlflow({k: v for k, v in metrics.items() if k != "step" and k not in rec.per_step}),
                        **trainer.data.unreadable.metrics()}, rec.step, series=rec.per_step)
            for key, value in trainer.data.unreadable.tags().items():
                logger.set_tag(key, value)
            if rec.diagnostics:  # the dictionary's ages and the drift probes, whole: the plots read these
                logger.log_dict(rec.diagnostics, f"{DIAGNOSTICS_DIR}/epoch_{rec.epoch:04d}.json")
                last_diagnostics.update(rec.diagnostics, epoch=rec.epoch)
                probes = rec.diagnostics.get("probes")
                if probes:
                    drift[rec.epoch] = (probes["age"], probes["drift_cos"])
        _report(session, trainer, args.manifest, {**metrics, "epoch": rec.epoch}, keep)

    # the largest value of each epoch monitor so far (kNN, the online probe): the run's best_* keys at its end
    monitor_best: dict[str, float] = {}
    over_ranks: dict[str, float] = {}

    def before_evaluation(tr: Trainer) -> None:
        """Every rank, once training ends: the run's last collectives, so that no rank waits in one while
        rank 0 evaluates alone (at ImageNet scale that outlasts the process group's timeout)."""
        memory.sample()
        # the largest growth of any rank's peak memory over the run: what the data loader costs
        over_ranks["worker_rss_growth_mb"] = mdist.max_over_ranks(memory.peak - memory.start)
        # ... and from WARM_STEPS steps in to the last step: flat when the data streams, whatever its size
        over_ranks["worker_rss_growth_after_warmup_mb"] = mdist.max_over_ranks(
            memory.training_peak - memory.warm if memory.warm is not None else float("nan"))

    memory.sample()
    result = run_training(cfg, trainer=trainer, on_epoch=on_epoch, on_step=on_step,
                          progress=print if trainer.is_main else None, before_evaluation=before_evaluation)
    memory.sample()  # the final evaluation's features count too (rank 0's: the ranks were released before it)
    final = {"final": 1.0, "steps": float(result.steps), "diverged": float(result.diverged),
             "final_loss": result.final_loss, **over_ranks}
    final["worker_rss_growth_mb"] = max(final["worker_rss_growth_mb"], memory.peak - memory.start)
    scored = trainer.evaluation.last_final if result.linear_top1 is not None else None
    extra = scored.extra_metrics() if scored is not None else {}  # knn20_top1, linear_top1_1pct, ...
    if result.linear_top1 is not None:
        final.update(linear_top1=result.linear_top1, knn_top1=result.knn_top1, **extra)
    if result.val_linear_top1 is not None:  # data.val_size: what model selection reads
        final.update(val_linear_top1=result.val_linear_top1, val_knn_top1=result.val_knn_top1)
    if logger is not None and scored is not None:  # best over the epochs beside the end values (final_*)
        final.update(logger.best_of(monitor_best), final_knn_top1=scored.knn,
                     **({"final_online_linear_top1": scored.online} if scored.online is not None else {}))
    if logger is not None:
        logger.log_final({**for_mlflow({k: v for k, v in final.items()
                                        if k in (*FINAL_LOGGED, *extra)
                                        or k.startswith(("best_", "final_"))}),
                          **trainer.data.unreadable.metrics()},  # the evaluation's findings included
                         result.steps)
        for key, value in trainer.data.unreadable.tags().items():
            logger.set_tag(key, value)
        if scored is not None and scored.low_label:  # each draw's low-label probe, beside the logged means
            logger.set_tag("mocolab.low_label_draws", scored.low_label_text())
        if result.diverged:
            logger.set_tag("mocolab.diverged_at_step", str(result.steps))
        if last_diagnostics.get("age_histogram", {}).get("counts"):
            log_dictionary_plot(logger, last_diagnostics, drift, cfg)
        if scored is not None:  # a finished run with labels: a picture of its features
            log_feature_map(trainer, logger, cfg)
        if logger.close():
            run_dir.write_text(UNSENT_METRICS, logger.unsent())
            print(f"MLflow: the tracking store did not take {logger.lost} batch(es) of metrics; they are kept in "
                  f"{run_dir.child(UNSENT_METRICS).location} and the same command sends them")
        if result.probe is not None and cfg.run.log_models:  # a finished run: its encoder and probe as models
            log_trained_models(trainer, result, args)
    _report(session, trainer, args.manifest, final, keep)
