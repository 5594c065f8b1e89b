"""What a sweep is, and what it can be refused for before any server is asked: no Ray, MLflow or torch here.

A study builds a ``Sweep`` (what its trials train and how they are compared) and a ``Launch`` (where and on
what this invocation runs them: the same Sweep runs on a laptop and on a cluster); ``check_sweep`` refuses bad
input in a fraction of a second, and ``sweep.py`` then loads Ray and MLflow to run it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Collection

from mocolab.config.addresses import check_addresses
from mocolab.config.choices import REGISTER_METRICS
from mocolab.config import Config, build_config, check_name
from mocolab.config.launch_fields import LAUNCH_SETTINGS, launch_requests
from mocolab.data.roots import check_data
from mocolab.config.flags import check_number
from mocolab.training.storage import Location
from mocolab.tune.search import check_search


REGISTER_METRIC = "val_linear_top1"  # what --register ranks trials by unless told: the validation split's probe
TEST_METRICS = ("linear_top1", "knn_top1")  # the test split's: ranking by them is selection on the test split


@dataclass(frozen=True)
class SweepPlace:
    """Where a sweep keeps its state, from ``--storage`` and its name, built once per sweep: ``root`` is
    ``<storage>/<name>`` (a folder or a URI); ``local`` this machine's folder for its lock, plot and report
    (with URI storage a folder named by the URI, which ``publish_report`` copies to the storage)."""

    storage: Location
    root: Location
    local: Path

    @classmethod
    def of(cls, storage: str, name: str) -> SweepPlace:
        top = Location(storage)
        root = top.child(name)
        return cls(top, root, root.lock_folder() if top.remote else Path(storage) / name)

    @property
    def tune_at(self) -> Location:
        """Tune's state of the sweep: ``<storage>/<name>/tune``."""
        return self.root.child("tune")

    @property
    def tune(self) -> str:
        return self.tune_at.location

    @property
    def train(self) -> str:
        """Every trial's Ray Train run (``run.output_dir``): ``<storage>/<name>/train``."""
        return self.root.child("train").location


@dataclass
class Trial:
    """One point of a grid: a label a person reads (``m=0.9 seed=1``) and the config overrides."""

    label: str
    overrides: dict[str, Any]


@dataclass
class Sweep:
    """The experiment: what every trial trains (``preset``, ``base_overrides``, each trial's overrides, or a
    search over ``search_space``) and how the trials are compared and chosen. Its ``name`` resumes it."""

    study: str  # the MLflow experiment, e.g. momentum-ablation
    name: str  # the sweep's name: the same name resumes it
    preset: str
    description: str
    base_overrides: dict[str, Any] = field(default_factory=dict)
    trials: list[Trial] = field(default_factory=list)  # grid mode
    search: str = "grid"  # grid: run ``trials``; optuna / random: sample ``search_space`` (see tune/search.py)
    search_space: dict[str, list[Any]] | None = None  # search mode: dotted config key -> values to choose from
    scheduler: str = "fifo"  # fifo: every trial runs to its end; asha: early stopping on ``metric``
    metric: str = "val_knn_top1"  # what a search optimises: the validation split's, reported every epoch
    mode: str = "max"
    num_samples: int = 1
    seeds: list[int] = field(default_factory=lambda: [0])  # search mode: seeds per sampled point
    register: str | None = None  # register the best trial's encoder under this Model Registry name
    register_metric: str = REGISTER_METRIC  # ... best by this final metric (max; min for a loss)


@dataclass
class Launch:
    """Where and on what one invocation runs a Sweep: its workers and their share of the cluster, the stores,
    this invocation's budget and output, and what a trial made by other code counts as."""

    workers_per_trial: int = 1
    cpus_per_worker: float | None = None  # None: share the cluster's CPUs among concurrent trials
    gpus_per_worker: float = 0.0
    max_concurrent: int | None = None
    tracking_uri: str | None = None
    storage: str = "runs/sweeps"
    stop_after: int | None = None  # end this invocation after N trials finish; the same name continues
    source: dict[str, str] = field(default_factory=dict)  # MLflow source tags, computed in the driver
    verbose: bool = False  # also print Ray's own output (Tune's tables, workers' logs); always in Ray's log files
    watch_s: int | None = None  # keep <sweep folder>/report/report.html current while trials run, every N s
    reuse_other_code: bool = False  # a trial's run made by other code is reported, not trained again
    continue_across_code: bool = False  # a trial interrupted under other code continues, the change recorded
    neutral_changes: tuple[tuple[str, str], ...] = ()  # (from, to) code fingerprints declared neutral

    def place(self, name: str) -> SweepPlace:
        """Where the sweep ``name`` keeps its state under this launch's storage."""
        return SweepPlace.of(self.storage, name)


LAUNCH_FIELDS = tuple(f.name for f in fields(Launch))

# How a sweep asks for no GPU (the refusal of a GPU on a cluster without one advises it)
NO_GPU = "--gpus-per-worker 0 (the default) and no --set run.gpus_per_worker (with run.device auto or cpu)"
# The Launch's field of the three launch fields that size a trial's workers (run.experiment is the Sweep's
# ``study``; config/launch_fields.py names all six)
_LAUNCH_FIELD = {"run.num_workers": "workers_per_trial", "run.cpus_per_worker": "cpus_per_worker",
                 "run.gpus_per_worker": "gpus_per_worker"}


# ------------------------------------------------------------------ validation
def selects(sweep: Sweep) -> bool:
    """A search, or a scheduler that stops trials early: either picks models by its metric."""
    return sweep.search != "grid" or sweep.scheduler != "fifo"


VAL_SHARE = 12  # a selecting sweep holds out 1/12 of the training set (5,000 of Fashion-MNIST's 60,000)


def with_validation_split(preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` with ``data.val_size`` for a sweep that selects: the user's, else 1/12 of the whole
    training set (before ``data.subset``), held out of training so that selection never reads the test split."""
    if overrides.get("data.val_size"):
        return dict(overrides)
    full = build_config(preset, {**overrides, "data.subset": None, "data.val_size": 0}).train_size or 0
    return {**overrides, "data.val_size": max(1, full // VAL_SHARE)}


def check_selection(sweep: Sweep) -> None:
    """Model selection reads a validation split held out of the training set; the test split gives only the
    final numbers. A selecting sweep must say ``val_...`` and hold one out (``data.val_size``) in every trial."""
    if not selects(sweep):
        return
    fix = "--metric val_knn_top1 (or val_linear_top1) with --set data.val_size=N, e.g. 5000"
    if not sweep.metric.startswith("val_"):
        raise ValueError(f"metric: {sweep.metric!r} is a test-split number, and a {sweep.search} search / "
                         f"{sweep.scheduler} scheduler selects models by it; selection reads the validation "
                         f"split: {fix}")
    if not build_config(sweep.preset, {**sweep.base_overrides}).data.val_size:
        raise ValueError(f"data.val_size: 0 holds out no validation split for the {sweep.metric!r} a "
                         f"{sweep.search} search / {sweep.scheduler} scheduler selects by: {fix}")


def check_register(sweep: Sweep) -> None:
    """``--register`` ranks the finished trials by ``register_metric``: a validation metric needs a validation
    split held out of training (``data.val_size``), which a grid does not hold out unless told."""
    metric = sweep.register_metric
    if not metric.startswith("val_"):
        return
    if not build_config(sweep.preset, {**sweep.base_overrides}).data.val_size:
        default = " (the default)" if metric == REGISTER_METRIC else ""
        raise ValueError(
            f"--register-metric: {metric}{default} ranks the trials on a validation split, and "
            f"data.val_size is 0: this sweep holds none out. Hold one out of training with --set data.val_size=N "
            f"(e.g. 5000; every trial then trains on N images fewer), or rank by a test-split score with "
            f"--register-metric linear_top1 (selection on the test split: the registered model's test score is "
            f"then optimistic)")


def register_warning(sweep: Sweep) -> str:
    """What a sweep that registers its best trial by a test-split score prints before it runs ('' otherwise)."""
    if sweep.register is None or sweep.register_metric not in TEST_METRICS:
        return ""
    return (f"warning: --register-metric {sweep.register_metric} picks the best trial by its test-split score: that "
            f"is model selection on the test split, so the registered model's {sweep.register_metric} is optimistic "
            f"and not a held-out result (rank by val_linear_top1 or val_knn_top1, with --set data.val_size=N, to "
            f"keep the test split out of the choice)")


def trial_overrides(sweep: Sweep, launch: Launch, place: SweepPlace, trial_cfg: dict[str, Any],
                    cpus_per_worker: float, trial_id: str = "") -> tuple[str, dict[str, Any]]:
    """(label, overrides) for one trial from Tune's config (grid: a Trial dict; search: dotted keys).

    A search may sample the same point twice; its labels carry Tune's trial id so that two trials never
    share a Train run or an MLflow run.
    """
    if "trial" in trial_cfg:
        label, over = trial_cfg["trial"]["label"], dict(trial_cfg["trial"]["overrides"])
    else:
        over = {k: v for k, v in trial_cfg.items() if "." in k}
        label = " ".join(f"{k.split('.')[-1]}={v}" for k, v in over.items()) + f" [{trial_id}]"
    over = {**sweep.base_overrides, **over,
            "run.num_workers": launch.workers_per_trial, "run.cpus_per_worker": cpus_per_worker,
            "run.gpus_per_worker": launch.gpus_per_worker, "run.experiment": sweep.study,
            "run.output_dir": place.train, "run.name": f"{sweep.name}--{_slug(label)}"}
    if launch.workers_per_trial == 0:
        over.pop("run.cpus_per_worker")
    return label, over


def settle_launch(sweep: Sweep, launch: Launch, given: Collection[str] = ()) -> tuple[Sweep, Launch]:
    """The sweep and its launch with what its --set / --config values ask of the launch: a worker count, CPU or
    GPU share (``run.num_workers``, ...) or experiment that no flag in ``given`` sets is taken from them.
    ``given`` names the Launch fields their flags set, and ``"study"`` for --experiment. A value a flag also
    sets, and run.output_dir and run.name, are left for ``check_sweep`` to compare with what the sweep sets."""
    asked = launch_requests(sweep.base_overrides)
    taken = {f: asked[k] for k, f in _LAUNCH_FIELD.items() if k in asked and f not in given}
    if "run.experiment" in asked and "study" not in given:
        sweep = replace(sweep, study=asked["run.experiment"])
    return sweep, replace(launch, **taken)


def check_launch_settings(sweep: Sweep, launch: Launch) -> None:
    """A launch field that --set or --config gives (or a trial's overrides) is what the sweep runs its trials
    with, or the sweep is refused naming it and the flag that sets it: never replaced without a word."""
    sets = {"run.num_workers": launch.workers_per_trial, "run.cpus_per_worker": launch.cpus_per_worker,
            "run.gpus_per_worker": launch.gpus_per_worker, "run.experiment": sweep.study}
    for over in (sweep.base_overrides, *(t.overrides for t in sweep.trials)):
        for key, value in launch_requests(over).items():
            flag = LAUNCH_SETTINGS[key]
            if key == "run.output_dir":
                train = launch.place(sweep.name).train
                if value != train:
                    raise ValueError(f"run.output_dir: {value!r} (--set or --config), but a sweep keeps its "
                                     f"trials' checkpoints in <storage>/<name>/train ({train}): choose the "
                                     f"storage with {flag} and drop run.output_dir")
            elif key == "run.name":
                raise ValueError(f"run.name: {value!r} (--set or --config), but a sweep names each trial's run "
                                 f"<sweep name>--<trial> ({sweep.name}--...): name the sweep with {flag} and "
                                 f"drop run.name")
            elif value != sets[key]:
                has = "not given (the cluster's CPUs shared)" if sets[key] is None else f"{sets[key]}"
                raise ValueError(f"{key}: {value!r} (--set or --config) and {flag} {has} disagree: give one "
                                 f"of them, or the same value to both")


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.=" else "_" for c in label)


def check_launch(launch: Launch) -> None:
    """The launch's flags in the command line's ranges (for a Launch built in code too) and its store's address."""
    check_addresses(launch.tracking_uri)
    for flag, value in (("--workers-per-trial", launch.workers_per_trial),
                        ("--cpus-per-worker", launch.cpus_per_worker), ("--gpus-per-worker", launch.gpus_per_worker),
                        ("--max-concurrent", launch.max_concurrent), ("--stop-after", launch.stop_after),
                        ("--watch", launch.watch_s)):
        check_number(flag, value)
    if launch.gpus_per_worker > 1:  # the flag's range is also `mocolab cluster up`'s, whose nodes hold several
        raise ValueError(f"--gpus-per-worker (run.gpus_per_worker): {launch.gpus_per_worker:g} is out of range; "
                         f"allowed [0, 1]: one rank computes on one GPU (a fraction shares one), so more GPUs per "
                         f"trial are more workers: --workers-per-trial N")


def check_sweep(sweep: Sweep, launch: Launch) -> None:
    """Every flag in range, every trial's config built as ``launch`` runs it, validated and its data checked:
    all a sweep can be refused for without asking a server, so a study refuses it before Ray, MLflow or torch
    is loaded."""
    check_name("--name", sweep.name)
    check_number("--samples", sweep.num_samples)
    check_launch(launch)
    check_search(sweep.search, sweep.scheduler, sweep.metric, sweep.mode)
    check_launch_settings(sweep, launch)
    if sweep.search == "grid" and not sweep.trials:
        raise ValueError("the grid is empty: no trial to run (check the values given to the study)")
    if sweep.search != "grid":
        if not sweep.search_space or any(not list(v) for v in sweep.search_space.values()):
            raise ValueError(f"search_space: a {sweep.search} search needs at least one key with values to "
                             f"choose from, got {sweep.search_space!r}")
        for key, values in sweep.search_space.items():
            for value in values:
                _trial_config(sweep, {**sweep.base_overrides, key: value})
    labels = [t.label for t in sweep.trials]
    if len(set(labels)) != len(labels):
        raise ValueError(f"trial labels must be unique: {labels}")
    place = launch.place(sweep.name) if sweep.trials else None
    for t in sweep.trials:
        _, over = trial_overrides(sweep, launch, place, {"trial": {"label": t.label, "overrides": t.overrides}}, 1.0)
        _trial_config(sweep, over)
    if sweep.search != "grid":
        _trial_config(sweep, {**sweep.base_overrides})
    check_selection(sweep)
    if sweep.register is not None:
        check_name("--register", sweep.register)
        if sweep.register_metric not in REGISTER_METRICS:
            raise ValueError(f"--register-metric: {sweep.register_metric!r} is not one of {list(REGISTER_METRICS)}")
        if not build_config(sweep.preset, {**sweep.base_overrides}).run.log_models:
            raise ValueError("--register: run.log_models=false leaves no trial a model to register; drop one")
        check_register(sweep)


def _trial_config(sweep: Sweep, overrides: dict[str, Any]) -> Config:
    """A config the sweep's trials build, refused here if it or its data is bad."""
    return check_data(build_config(sweep.preset, overrides))

