"""A trial's records without its training: the keys, steps and tags a smoke trial logs, sent the way it sends them.

The names come from the code that logs them (the epoch record's fields, the trainer's per-step series, the
worker's final keys, run_keys' routing of constants to tags and of process measures to ``system/``, MLflow's
own system monitors), and the calls are the trial's own (``RunTracker.start``, ``MetricsLogger``,
``Store.set_status``), so a store built here has the shape a sweep of real trials leaves, and keeps it when
those names change. Only the values are made up, and no artifact beyond the run's config is logged (the
report reads none but the feature maps; a run without them is tried as a real run without them is).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from mocolab.config import build_config
from mocolab.config.manifest import RunManifest
from mocolab.data.sources import DatasetRecord
from mocolab.evaluation.low_label import low_label_metric
from mocolab.tracking.mlflow_log import MetricsLogger, RunTracker
from mocolab.tracking.run_keys import SYSTEM_PREFIX, constant_tags, for_mlflow
from mocolab.training.code_fingerprint import CodeFingerprint
from mocolab.training.launch import CHECKPOINT_DIR_TAG
from mocolab.training.monitors import GRAD_NORM_FIRST
from mocolab.training.step_metrics import step_metrics_interval
from mocolab.training.trainer import STEP_SERIES, EpochRecord, run_constants
from mocolab.training.worker import BEST_OF, FINAL_LOGGED
from mocolab.tracking.store import SWEEP_TAG
from mocolab.tune.spec import _slug

# MLflow's monitor samples every run.system_metrics_s (10 s): four samples for a trial of about 40 s, an
# assumption (eight keys a sample, against some 570 points of the trial's own: it barely moves the store)
SYSTEM_SAMPLES = 4
PROVENANCE = {"mocolab.torch": "2.14.1", "mocolab.device": "AMD EPYC", "mocolab.precision": "fp32"}


def _system_keys() -> tuple[str, ...]:
    """What MLflow's system monitor logs on a machine without GPUs (its CPU, disk and network monitors)."""
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
    from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
    from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor

    keys = []
    for monitor in (CPUMonitor(), DiskMonitor(), NetworkMonitor()):
        monitor.collect_metrics()
        keys += [SYSTEM_PREFIX + k for k in monitor.aggregate_metrics()]
    return tuple(keys)


@dataclass(frozen=True)
class TrialShape:
    preset: str
    epochs: int
    steps_per_epoch: int
    step_interval: int  # per-step series: every step_interval-th step
    epoch_keys: tuple[str, ...]  # every epoch
    monitor_keys: tuple[str, ...]  # every epoch but the last (the kNN monitor and online probe; the last is final)
    step_series: tuple[str, ...]
    final_keys: tuple[str, ...]
    system_keys: tuple[str, ...]

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch


def trial_shape(preset: str = "smoke") -> TrialShape:
    """The keys a trial of ``preset`` logs, on data without unreadable images."""
    cfg = build_config(preset, {})
    e = cfg.eval
    off = set(run_constants(cfg))  # tags, not metrics (run_keys.CONSTANTS) ...
    off |= set(STEP_SERIES)  # ... the momentum comes once per step in its series
    if not cfg.data.val_size:
        off |= {"val_knn_top1", "val_online_linear_top1", "val_linear_top1"}
    if not e.online_probe:
        off |= {"online_linear_top1", "val_online_linear_top1"}
    if not e.drift_probes:
        off |= {"drift_cos", "stored_cos"}
    record = [f.name for f in fields(EpochRecord) if f.name not in ("epoch", "step", "per_step", "diagnostics")]
    monitors = {"knn_top1", "online_linear_top1", "val_knn_top1", "val_online_linear_top1"} if e.knn_every else set()
    epoch_keys = [k for k in record if k not in off and k not in monitors]
    monitor_keys = [k for k in record if k not in off and k in monitors]
    final = [k for k in FINAL_LOGGED if k not in off]
    final += [f"knn{e.knn_k_small}_top1"] * bool(e.knn_k_small)
    final += [low_label_metric(float(f)) for f in str(e.low_label_fractions).split(",") if f.strip()]
    final += ["online_linear_top1"] * bool(e.online_probe)
    final += [f"best_{k}" for k in BEST_OF if k in monitor_keys]
    final += ["final_knn_top1"] + ["final_online_linear_top1"] * bool(e.online_probe)
    steps_per_epoch = cfg.data.subset // cfg.optim.batch_size
    total = cfg.optim.epochs * steps_per_epoch
    return TrialShape(preset, cfg.optim.epochs, steps_per_epoch,
                      step_metrics_interval(cfg.run.step_metrics_every, total),
                      tuple(for_mlflow(dict.fromkeys(epoch_keys, 0.0))), tuple(monitor_keys),
                      (*STEP_SERIES, GRAD_NORM_FIRST), tuple(for_mlflow(dict.fromkeys(final, 0.0))), _system_keys())


def _value(key: str, i: int, m: float, step: int, total: int) -> float:
    """A plausible number: losses fall, accuracies rise with m, the rest a function of the trial."""
    t = step / max(total, 1)
    if "loss" in key:
        return 7.0 - 2.0 * t * (0.5 + m) + 0.001 * i
    if "top1" in key or "acc" in key or "cos" in key:
        return min(0.99, 0.3 + 0.4 * t + 0.2 * m + 0.0001 * i)
    if key == "m":
        return m
    return 1.0 + (i % 7) + t


def log_trial(tracker: RunTracker, uri: str, sweep: str, parent_run_id: str, label: str, overrides: dict,
              shape: TrialShape, code: CodeFingerprint, index: int) -> str:
    """One trial run under its sweep's parent, logged by the calls a trial makes; its run id."""
    cfg = build_config(shape.preset, {**overrides, "run.name": f"{sweep}--{_slug(label)}", "run.experiment": "x"})
    manifest = RunManifest.of(cfg, code)
    tags = {"preset": shape.preset, CHECKPOINT_DIR_TAG: f"/tmp/sweeps/{sweep}/{label}", SWEEP_TAG: sweep,
            "trial": label, "mlflow.source.name": "benchmarks/tracking/store_scale.py",
            "mlflow.source.type": "LOCAL"}
    run_id, _ = tracker.start(manifest, tags=tags, parent_run_id=parent_run_id, display_name=label)
    logger = MetricsLogger(uri, run_id, say=lambda _: None)
    logger.log_datasets([DatasetRecord(cfg.data.name, split, size, f"{index % 2:016x}", "decoded images and labels",
                                       28, 1) for split, size in (("train", cfg.data.subset), ("test", 10000))])
    for key, value in {**PROVENANCE, **constant_tags(run_constants(cfg)), "mocolab.worker_nodes": "head"}.items():
        logger.set_tag(key, value)
    m, total = float(overrides.get("moco.m", cfg.moco.m)), shape.total_steps
    for epoch in range(1, shape.epochs + 1):
        end = epoch * shape.steps_per_epoch
        steps = [s for s in range((epoch - 1) * shape.steps_per_epoch + 1, end + 1) if s % shape.step_interval == 0]
        series = {k: [[s, _value(k, index, m, s, total)] for s in steps] for k in shape.step_series}
        keys = shape.epoch_keys + (shape.monitor_keys if epoch < shape.epochs else ())
        logger.log({k: _value(k, index, m, end, total) for k in keys}, end, series=series)
    samples = {k: [[s, _value(k, index, m, s, SYSTEM_SAMPLES)] for s in range(SYSTEM_SAMPLES)]
               for k in shape.system_keys}  # the monitor's own batches, by sample
    for s in range(SYSTEM_SAMPLES):
        logger.log_final({k: v[s][1] for k, v in samples.items()}, s)
    logger.log_final({k: _value(k, index, m, total, total) for k in shape.final_keys}, total)
    if logger.close():
        raise RuntimeError(f"the store did not take {logger.lost} metric batch(es) of trial {label}")
    tracker.run_id = run_id
    tracker.finish()
    return run_id
