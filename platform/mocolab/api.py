"""The Python API, and what the ``mocolab`` command calls: build a config, train, sweep, load, evaluate.

A notebook or a script gets the command line's behaviour, checks and records without building argv:
``train`` is ``mocolab train``, ``sweep`` is ``mocolab sweep``, ``evaluate`` is ``mocolab eval``. Each
refuses bad input with a ValueError that names the field, before it starts anything. Heavy modules
(torch, Ray, MLflow) load inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from mocolab import config as _config
from mocolab.evaluation import transfer as _transfer
from mocolab.config.addresses import check_addresses
from mocolab.config import Config
from mocolab.data.roots import check_data
from mocolab.config.flags import check_seeds
from mocolab.config.launch_fields import config_file_requests

if TYPE_CHECKING:
    import pandas as pd
    from torch import nn

    from mocolab.training import TrainOutcome
    from mocolab.evaluation.transfer import TransferResult

Overrides = Mapping[str, Any] | Iterable[str] | None  # {"moco.m": 0.9} or ["moco.m=0.9"]


def _overrides(overrides: Overrides) -> dict[str, Any]:
    if overrides is None:
        return {}
    if isinstance(overrides, Mapping):
        return dict(overrides)
    if isinstance(overrides, str):
        raise ValueError(f"overrides: give a mapping or a list of 'section.field=value' strings, not {overrides!r}")
    return _config.parse_overrides(overrides)


def build_config(preset: str = "cpu-quick", overrides: Overrides = None, *,
                 config_file: str | os.PathLike[str] | None = None) -> Config:
    """A validated config: ``preset``, then the fields of ``config_file`` (YAML in the presets' form), then
    ``overrides``; the order ``--preset``, ``--config`` and ``--set`` apply in."""
    fields = _config.config_file_overrides(config_file) if config_file else {}
    return _config.build_config(preset, {**fields, **_overrides(overrides)})


def train(config: Config | str = "cpu-quick", overrides: Overrides = None, *, tracking_uri: str | None = None,
          in_process: bool = False, measure_init: bool = False, ray_train_info: bool = True,
          progress: Callable[[str], None] = print, reuse_other_code: bool = False,
          continue_across_code: bool = False) -> TrainOutcome:
    """Train one model (or resume it: the same config continues the same run) and return its outcome.

    ``config``: a Config (``build_config``) or a preset's name, with ``overrides`` over either. By default it
    runs as ``mocolab train`` does: Ray Train with ``run.num_workers`` workers (0 = this process), logged to
    MLflow (``tracking_uri``, else $MLFLOW_TRACKING_URI, else ./mlflow.db), checkpointed, the encoder logged
    as a model (``load_encoder(outcome.mlflow_run_id)``). ``in_process``: the bare loop, without Ray, MLflow or
    checkpoints (``measure_init`` also scores the encoder before training). The same config trained by other
    code is a new run beside the old one (``reuse_other_code``: report the old one); a run interrupted under
    other code is refused unless ``continue_across_code`` (training/rerun.py).
    """
    cfg = config if isinstance(config, Config) else build_config(config)
    if overrides:
        cfg = _config.apply_overrides(cfg, _overrides(overrides))
    check_data(_config.validate(cfg))
    if in_process:
        from mocolab.training.trainer import run_training
        from mocolab.training import TrainOutcome as _Outcome

        res = run_training(cfg, measure_init=measure_init, progress=progress)
        return _Outcome(cfg.run_name, None, "diverged" if res.diverged else "finished", res.linear_top1,
                        res.knn_top1, res.final_loss, res.steps, False, None)
    from mocolab.training import fit

    check_addresses(tracking_uri)
    return fit(cfg, tracking_uri=tracking_uri, ray_train_info=ray_train_info, progress=progress,
               reuse_other_code=reuse_other_code, continue_across_code=continue_across_code)


@dataclass
class SweepResult:
    """How a sweep ended (``code``: 0 every trial has an outcome, 1 a trial failed, 2 bad input, 128+N a
    signal) and where it is in MLflow: the parent run and its trials table."""

    code: int
    experiment: str
    name: str
    parent_run_id: str | None
    trials: pd.DataFrame | None


def sweep(grid: Mapping[str, Sequence[Any]] | Sequence[str], *, preset: str = "cpu-quick", seeds: int = 1,
          first_seed: int = 0, overrides: Overrides = None, config_file: str | os.PathLike[str] | None = None,
          name: str | None = None, experiment: str | None = None, search: str = "grid", samples: int = 1,
          **flags: Any) -> SweepResult:
    """A Ray Tune sweep over any config fields, as ``mocolab sweep`` runs it.

    ``grid``: ``{"moco.tau": [0.07, 0.2], "queue.size": [1024, 4096]}`` (or ``["moco.tau=0.07,0.2", ...]``);
    every point for each of ``seeds`` seeds from ``first_seed`` is a trial, or, with ``search="optuna"`` or
    ``"random"``, ``samples`` trials per seed sample the grid's values. ``name`` (default from the fields,
    preset and first seed) resumes: the same call again runs only what is not done. ``flags``: the
    studies' other settings (``workers_per_trial``, ``max_concurrent``, ``tracking_uri``, ``storage``,
    ``stop_after``, ``register``, ``watch_s``, ``scheduler``, ``metric``). A worker count, CPU or GPU share or
    ``experiment`` not given here is taken from ``overrides``' ``run.*`` field where it has one; given in both,
    they must agree. Bad input raises ValueError.
    """
    from mocolab.tune.grid import EXPERIMENT, check_grid, grid_report, grid_sweep, parse_grid
    from mocolab.tune.spec import LAUNCH_FIELDS, Launch, check_sweep, settle_launch

    _check_flags(flags, LAUNCH_FIELDS)
    given = {k: flags.pop(k) for k in LAUNCH_FIELDS if k in flags}
    given = {k: v for k, v in given.items() if v is not None}  # None: not given (a --set value, else the default)
    launch = Launch(**given)
    points = parse_grid(grid) if not isinstance(grid, Mapping) else check_grid(grid)
    check_seeds(first_seed, seeds)
    fields = config_file_requests(preset, _config.config_file_overrides(config_file)) if config_file else {}
    spec = grid_sweep(points, preset=preset, seeds=range(first_seed, first_seed + seeds),
                      overrides={**fields, **_overrides(overrides)}, name=name, experiment=experiment or EXPERIMENT,
                      search=search, samples=samples, **flags)
    spec, launch = settle_launch(spec, launch, {*given, *(["study"] if experiment is not None else [])})
    check_sweep(spec, launch)  # bad input raises here: run_study takes a checked sweep
    from mocolab.tune.study import run_study

    code = run_study(spec, launch, grid_report(list(points)))
    parent, trials = _parent_and_trials(spec.study, spec.name, launch.tracking_uri)
    return SweepResult(code, spec.study, spec.name, parent, trials)


# what ``sweep``'s keyword flags may set besides the Launch's fields (``source`` is the driver's own)
SWEEP_FLAGS = ("scheduler", "metric", "register", "register_metric")


def _check_flags(flags: Mapping[str, Any], launch_fields: Sequence[str]) -> None:
    """An unknown keyword of ``sweep`` is bad input: refused by name, with the closest settings."""
    allowed = sorted([*SWEEP_FLAGS, *(f for f in launch_fields if f != "source")])
    for key in flags:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=2)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise ValueError(f"sweep: {key!r} is not a sweep setting{hint}; the settings: {', '.join(allowed)}")


def _parent_and_trials(experiment: str, name: str, tracking_uri: str | None):
    from mocolab.tracking import PARENT_TAG, Store, trials_frame

    store = Store(tracking_uri)
    exp_id = store.experiment_id(experiment)
    found = store.client.search_runs([exp_id], f"tags.`{PARENT_TAG}` = '{name}'", max_results=1) if exp_id else []
    if not found:
        return None, None
    parent = found[0].info.run_id
    return parent, trials_frame(store.runs(exp_id, parent_run_id=parent))


def load_encoder(source: str | os.PathLike[str], tracking_uri: str | None = None, name: str = "encoder") -> nn.Module:
    """A trained encoder as a torch module: float images in [0, 1] (N×C×H×W) -> the features kNN and the
    linear probe read (normalised inside, as in training).

    ``source``: an MLflow run id, a ``models:/`` URI (a logged model or a registered version) or a folder
    ``mocolab export`` wrote. ``name="classifier"`` (run ids only) gives the linear probe's logits instead.
    """
    if name == "encoder":
        from mocolab.evaluation.encoder_source import load_saved_encoder

        return load_saved_encoder(source, tracking_uri).module()
    from mocolab.tracking.logged_models import load_encoder as _logged

    return _logged(str(source), tracking_uri, name)


def evaluate(encoder: Any, data: str, overrides: Overrides = None, *, tracking_uri: str | None = None,
             experiment: str | None = None, log: bool = True,
             progress: Callable[[str], None] | None = print) -> TransferResult:
    """kNN and linear probe of a trained encoder on the data set ``data`` (a transfer test), scored with
    the source run's eval settings; logged (``log``) as a run of ``experiment`` (default ``transfer``)
    tagged with the source run and its experiment. ``encoder``: what ``load_encoder`` takes, or a
    ``encoders.SavedEncoder``; ``overrides``: data.*, eval.* and run.seed/device/precision/threads fields
    (``{"data.root": "/data/imgs"}``). Returns the scores, with ``run_id`` set when logged.
    """
    from mocolab.evaluation.encoder_source import SavedEncoder, load_saved_encoder, resolve_source

    over = _overrides(overrides)
    experiment = experiment or _transfer.EXPERIMENT
    _transfer.check_request(data, over)  # the cheap refusals first: before a store is asked or a file read
    if log:
        from mocolab.tracking import check_tracking_uri, resolve_tracking_uri

        _config.check_name("--experiment", experiment)
        check_addresses(tracking_uri)
        check_tracking_uri(resolve_tracking_uri(tracking_uri))
    saved = encoder if isinstance(encoder, SavedEncoder) else load_saved_encoder(
        resolve_source(encoder, tracking_uri), tracking_uri)
    cfg = _transfer.transfer_config(saved.config, data, over)
    source = _transfer.load_eval_data(cfg)
    result = _transfer.score(saved, cfg, source, progress)
    if log:
        _transfer.log_transfer(result, source.records(), experiment=experiment, tracking_uri=tracking_uri)
    return result


__all__ = ["SweepResult", "build_config", "evaluate", "load_encoder", "sweep", "train"]
