"""A trained encoder scored on any supported data set: a transfer test, logged beside the run it came from.

The scoring is training's own final evaluation (``evaluation.extract_features``, ``knn_accuracy``,
``linear_probe``) under the source run's ``eval`` settings, so a transfer number and the run's own
``linear_top1`` are measured the same way. Only the data changes: the named set, resized to the encoder's
image size and converted to its channels (grey replicated to RGB, RGB to luma). The MLflow run is
created after the numbers exist, so an input that fails (a missing folder, data that cannot be read)
leaves no run behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from mocolab.config.choices import DATASETS, native_image_size
from mocolab.config import Config, apply_overrides, check_name, to_yaml, validate
from mocolab.data.roots import check_data

if TYPE_CHECKING:  # torch loads when an encoder is scored, not when a request is checked
    import torch

    from mocolab.evaluation.encoder_source import SavedEncoder, SourceRef

EXPERIMENT = "transfer"  # where evaluations are logged unless told otherwise
SOURCE_TAG = "mocolab.eval.source"  # what the user named: a run id, a models:/ URI or a folder
SOURCE_RUN_TAG = "mocolab.eval.source_run"  # the run that trained the encoder
SOURCE_EXPERIMENT_TAG = "mocolab.eval.source_experiment"  # ... and its experiment's name
SOURCE_MODEL_TAG = "mocolab.eval.source_model"
DATA_TAG = "mocolab.eval.data"
# What an evaluation reads from a config; every other field is the trained encoder's and stays as logged.
EVAL_FIELDS = ("data.", "eval.")
EVAL_RUN_FIELDS = ("run.seed", "run.device", "run.precision", "run.threads")
# validate() checks a training config. An evaluation trains nothing: its data, eval and run fields are checked
# under training fields that no data set can refuse (no queue to outgrow the set, a batch of two, plain BN).
_TRAINS_NOTHING = {"moco.version": "v3", "moco.bn": "plain", "moco.negatives": "queue", "queue.policy": "fifo",
                   "bank.negatives": 0, "bank.momentum": 0.5, "optim.batch_size": 2, "optim.warmup_epochs": 0.0,
                   "run.num_workers": 0, "data.loader": "memory"}
LUMA = (0.299, 0.587, 0.114)  # ITU-R BT.601: RGB images for an encoder trained on grey ones


@dataclass
class TransferResult:
    """A transfer test's scores (fractions, as training logs them) and what they were measured on."""

    knn_top1: float
    linear_top1: float
    linear_train_top1: float
    config: Config  # the evaluation's config: the encoder's, with the data and eval fields of this test
    encoder: SourceRef
    images: dict[str, int] = field(default_factory=dict)  # split -> images read
    run_id: str | None = None  # the MLflow run it is logged as (None: not logged)

    def metrics(self) -> dict[str, float]:
        return {"knn_top1": self.knn_top1, "linear_top1": self.linear_top1,
                "linear_train_top1": self.linear_train_top1}


def check_request(data: str, overrides: Mapping[str, Any]) -> None:
    """What an evaluation can be refused for before any source or data is read: the data set's name and
    fields it does not read."""
    if data not in DATASETS:
        raise ValueError(f"--data: unknown dataset {data!r}; choose one of {list(DATASETS)}")
    foreign = [k for k in overrides if not k.startswith(EVAL_FIELDS) and k not in EVAL_RUN_FIELDS]
    if foreign:
        raise ValueError(f"--set {foreign[0]}: an evaluation reads only data.*, eval.* and "
                         f"{', '.join(EVAL_RUN_FIELDS)}; the encoder's other fields are its training's")


def transfer_config(trained: Config, data: str, overrides: Mapping[str, Any] | None = None) -> Config:
    """The evaluation's config: ``trained`` with the data set ``data`` at the encoder's image size, then
    ``overrides`` (data.*, eval.* and run.seed/device/precision/threads only), validated and its data checked."""
    overrides = dict(overrides or {})
    check_request(data, overrides)
    fresh = Config().data  # no subset, root or size of the data the encoder trained on
    base = {f"data.{k}": v for k, v in vars(fresh).items()} | {"data.name": data}
    if native_image_size(data) != trained.image_size:  # the encoder's input size, unless overridden
        base["data.image_size"] = trained.image_size
    cfg = apply_overrides(trained, {**base, **overrides})
    check_data(validate(apply_overrides(cfg, _TRAINS_NOTHING)))
    return cfg


def load_eval_data(cfg: Config):
    """The data set of ``cfg`` decoded into memory (``sources.MemorySource``); data that cannot be read is
    a ValueError naming the data set, as bad input."""
    from mocolab.data.splits import load_data
    from mocolab.data.sources import MemorySource

    try:
        train, test, val = load_data(cfg)
    except (RuntimeError, OSError) as err:
        raise ValueError(f"--data {cfg.data.name}: {err}".replace("\n", " ")) from None
    return MemorySource(train, test, val=val)


def to_channels(images: torch.Tensor, channels: int) -> torch.Tensor:
    """uint8 N×C×H×W with ``channels`` channels: grey repeated, RGB weighted to luma."""
    import torch

    have = images.shape[1]
    if have == channels:
        return images
    if have == 1:
        return images.expand(-1, channels, -1, -1)
    if have == 3 and channels == 1:
        weights = torch.tensor(LUMA).view(1, 3, 1, 1)
        return (images.float() * weights).sum(1, keepdim=True).round_().clamp_(0, 255).to(torch.uint8)
    raise ValueError(f"--data: images with {have} channels cannot feed an encoder trained on {channels}")


def score(encoder: SavedEncoder, cfg: Config, source=None,
          progress: Callable[[str], None] | None = print) -> TransferResult:
    """kNN top-1 and the linear probe of ``encoder`` on the data of ``cfg``, as ``evaluation.Evaluation`` scores
    a run: one feature extraction, the kNN bank and the probe's training images prefixes of one list, in full
    float32 (``precision.full_fp32``)."""
    from mocolab.evaluation.precision import full_fp32

    with full_fp32():
        return _score(encoder, cfg, source, progress)


def _score(encoder: SavedEncoder, cfg: Config, source, progress: Callable[[str], None] | None) -> TransferResult:
    import torch

    from mocolab.evaluation.scoring import extract_features, scored_test_images
    from mocolab.evaluation.knn import knn_accuracy
    from mocolab.evaluation.probe import linear_probe
    from mocolab.config.hardware import resolve_device, resolve_precision
    from mocolab.config.hardware import usable_cores

    say = progress or (lambda _msg: None)
    torch.set_num_threads(cfg.run.threads or usable_cores())
    source = source or load_eval_data(cfg)
    device = resolve_device(cfg.run.device)
    dtype = resolve_precision(cfg.run.precision, device)
    backbone = encoder.backbone.to(device)

    def embed(images: torch.Tensor) -> torch.Tensor:
        return extract_features(backbone, to_channels(images, encoder.channels), device, dtype=dtype)

    def features(split: str, n: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        feats, labels = zip(*((embed(x), y) for x, y in source.eval_split(split, n)))
        return torch.cat(feats), torch.cat(labels)

    e = cfg.eval
    n_bank = min(e.knn_bank or source.size, source.size)
    n_lin = min(e.linear_train or source.size, source.size)
    f_train, l_train = features("train", max(n_bank, n_lin))
    f_test, l_test = features("test", scored_test_images(e))
    n_test = min(e.knn_test or len(l_test), len(l_test))
    n_lin_test = min(e.linear_test or len(l_test), len(l_test))
    say(f"evaluating {encoder.ref.label} on {cfg.data.name} ({source.size:,} train / {source.test_size:,} test "
        f"images at {source.image_size}px, {source.channels} -> {encoder.channels} channels): kNN bank "
        f"{source.describe_eval('train', n_bank)}, linear probe on {source.describe_eval('train', n_lin)}")
    knn = knn_accuracy(f_train[:n_bank], l_train[:n_bank], f_test[:n_test], l_test[:n_test], source.classes,
                       e.knn_k, e.knn_t)
    probe = linear_probe(f_train[:n_lin], l_train[:n_lin], f_test[:n_lin_test], l_test[:n_lin_test],
                         source.classes, weight_decay=e.linear_wd, steps=e.linear_steps)
    return TransferResult(knn, probe.test_top1, probe.train_top1, cfg, encoder.ref,
                          {"train": int(max(n_bank, n_lin)), "test": int(len(l_test))})


def log_transfer(result: TransferResult, records: list, *, experiment: str = EXPERIMENT,
                 tracking_uri: str | None = None) -> str:
    """One finished MLflow run in ``experiment``: the evaluation's config as params, the scores, tags naming
    the source run and its experiment. A run that cannot be logged whole is deleted."""
    from mocolab.tracking import STATUS_TAG, MetricsLogger, Store, source_tags

    check_name("--experiment", experiment)
    store = Store(tracking_uri)
    ref = result.encoder
    source_experiment = ref.experiment
    if source_experiment is None and ref.run_id and store.run_exists(ref.run_id):  # an export of this store's run
        source_experiment = store.client.get_experiment(store.client.get_run(ref.run_id).info.experiment_id).name
    tags = {STATUS_TAG: "finished", SOURCE_TAG: str(ref.path or ref.source), DATA_TAG: result.config.data.name,
            **source_tags(tracking_uri=store.uri),
            **({SOURCE_RUN_TAG: ref.run_id} if ref.run_id else {}),
            **({SOURCE_EXPERIMENT_TAG: source_experiment} if source_experiment else {}),
            **({SOURCE_MODEL_TAG: ref.model_uri} if ref.model_uri else {}),
            "mlflow.note.content": _note(ref, result.config.data.name, source_experiment)}
    exp_id = store.experiment_id(experiment, create=True)
    assert exp_id is not None
    run = store.client.create_run(exp_id, tags=tags, run_name=f"{ref.label} on {result.config.data.name}")
    rid = run.info.run_id
    try:
        store.log_params(rid, result.config.flatten())
        store.log_texts(rid, {"config.yaml": to_yaml(result.config)})
        for key, value in result.metrics().items():
            store.client.log_metric(rid, key, value)
        if records:
            MetricsLogger(store.uri, rid, say=lambda _m: None).log_datasets(records)
    except BaseException:
        store.client.delete_run(rid)  # no half-logged evaluation
        raise
    store.client.set_terminated(rid, "FINISHED")
    result.run_id = rid
    return rid


def _note(ref: SourceRef, data: str, experiment: str | None) -> str:
    where = f"run `{ref.run_id}`" + (f" of experiment `{experiment}`" if experiment else "") if ref.run_id \
        else f"`{ref.source}`"
    return (f"Transfer test: the encoder trained by {where}, scored on `{data}` by a kNN monitor and a linear "
            f"probe on its frozen features (the run's own eval settings).")


__all__ = ["EXPERIMENT", "SOURCE_RUN_TAG", "SOURCE_EXPERIMENT_TAG", "TransferResult", "check_request", "load_eval_data",
           "log_transfer", "score", "to_channels", "transfer_config"]
