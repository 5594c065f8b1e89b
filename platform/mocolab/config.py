"""Typed experiment configuration: defaults, YAML presets, ``--set`` overrides, validation.

A config is plain data so that it can be flattened into MLflow params, saved
beside a checkpoint and compared across runs.  Every mistake in a config is
caught here, before data is loaded or a process is started, as a
``ValueError`` that names the field, the value and what is allowed.  The
checks read the config alone; whether the data it names is on this disk, and
holds enough images, is ``data_root.check_data``'s question.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

# Every list of allowed values is defined once, in choices.py, which the implementing modules import too:
# config (and with it --help and every refusal of bad input) loads no torch.
from .choices import (AUGMENT_PRESETS, BACKBONES, BN_MODES, DATASETS, DEVICES, HEADS, LOADERS, LR_SCHEDULES,
                      M_SCHEDULES, NEGATIVE_SOURCES, OPTIMIZERS, PRECISIONS, QUEUE_LAYOUTS, QUEUE_POLICIES,
                      MIN_IMAGE_SIZE, STREAMABLE, TRAIN_SIZES, VERSIONS, VIT_SIZES, native_image_size)
from .image_files import count_images
from .storage import is_uri

PRESET_DIR = Path(__file__).with_name("presets")

# Config fields with a closed set of values -> the values (validation and the CLI's help read this).
PLACEMENTS = ("pack", "spread", "strict_spread")  # Ray placement of a run's workers over nodes

CHOICES: dict[str, tuple[str, ...]] = {
    "data.name": DATASETS, "augment.preset": AUGMENT_PRESETS, "model.backbone": BACKBONES, "model.head": HEADS,
    "moco.bn": BN_MODES, "moco.negatives": NEGATIVE_SOURCES, "queue.policy": QUEUE_POLICIES, "queue.layout": QUEUE_LAYOUTS,
    "optim.schedule": LR_SCHEDULES, "moco.version": VERSIONS, "moco.m_schedule": M_SCHEDULES, "optim.name": OPTIMIZERS, "run.device": DEVICES, "run.precision": PRECISIONS, "data.loader": LOADERS,
    "run.placement": PLACEMENTS,
}


@dataclass
class DataConfig:
    name: str = "fashion-mnist"
    root: str | None = None  # a folder for imagefolder; else overrides $MOCOLAB_DATA
    subset: int | None = None  # train on the first N training images (smoke tests)
    image_size: int | None = None  # resize (imagefolder, synthetic); None keeps the native size
    synthetic_size: int = 2048
    loader: str = "auto"  # memory | stream | auto: memory when the decoded set fits memory_budget_mb (sources.py)
    memory_budget_mb: int = 4096  # per worker, for data.loader=auto
    stream_tasks: int = 2  # streaming: decode tasks in flight per worker (Ray Data map tasks)
    max_bad_fraction: float = 0.01  # undecodable images a split may hold before a run refuses (sources.py)
    # training images held out as the validation split (the same ones for every seed and subset; in-memory
    # sets): never trained on; the per-epoch monitor and model selection read it, the test split only the end
    val_size: int = 0


@dataclass
class AugmentConfig:
    preset: str = "mocov2"
    crop_min: float = 0.2  # lower bound of the random-resized-crop area fraction
    jitter: float = 0.4  # colour-jitter strength (brightness/contrast only on grayscale)
    blur_sigma_max: float = 2.0


@dataclass
class ModelConfig:
    backbone: str = "convnet"
    width: int = 32  # convnet: channels of the first block, doubled per block
    head: str = "mlp"  # v1: linear, v2: mlp
    dim: int = 128  # embedding dimension C of queries, keys and queue
    hidden: int = 0  # MLP hidden width (projector and v3's predictor); 0 = the backbone's feature width


@dataclass
class VitConfig:
    """The ViT backbones (model.backbone=vit_tiny|vit_small); refused with any other backbone."""
    patch_size: int = 0  # 0 = sized for the data: 4 up to 32 px, 8 up to 96, 16 above
    depth: int = 0  # transformer blocks; 0 = the named size's 12
    freeze_patch_embed: bool = False  # MoCo v3's stability fix: the random patch projection never trains


@dataclass
class MocoConfig:
    version: str = "v2"  # v1 and v2: the queue (their recipes differ in head, tau, augmentation); v3: no queue
    m: float = 0.999  # key-encoder momentum (the base value under m_schedule=cosine)
    m_schedule: str = "constant"  # cosine: m rises from moco.m to 1 over training (MoCo v3)
    tau: float = 0.2  # softmax temperature (v1: 0.07, v2: 0.2)
    bn: str = "split"
    bn_groups: int = 4  # virtual devices for bn=split
    # where negatives come from: queue (MoCo), memory_bank (one entry per image, Wu et al. 2018) or in_batch
    # (SimCLR's NT-Xent over the global batch); the last two have no key encoder, so moco.m is not used
    negatives: str = "queue"


@dataclass
class QueueConfig:
    size: int = 16384  # K negatives
    policy: str = "fifo"  # fifo: the oldest keys leave; random: random slots are replaced (ages unbounded)
    layout: str = "replicated"  # with several ranks: every rank holds all K keys, or K/W each


@dataclass
class BankConfig:
    """The memory bank (moco.negatives=memory_bank); refused with the other sources."""
    negatives: int = 0  # K entries drawn as negatives each step; 0 = queue.size (the queue's K, to compare)
    momentum: float = 0.5  # entry <- normalise(a * entry + (1 - a) * embedding): a, Wu et al.'s 0.5


@dataclass
class OptimConfig:
    name: str = "sgd"  # sgd (v1/v2), adamw (v3 ViT), lars (v3 ResNet)
    batch_size: int = 256  # global batch (all ranks together)
    epochs: int = 3
    max_steps: int | None = None  # stop early after this many steps (smoke runs)
    lr: float = 0.06
    scale_lr: bool = False  # true: the rate used is lr × batch_size / 256 (MoCo v3's rule)
    warmup_epochs: float = 0.0  # linear warm-up from 0 before the schedule (MoCo v3: 40 of 300 for ViT)
    momentum: float = 0.9  # SGD's and LARS's
    weight_decay: float = 5e-4
    schedule: str = "cosine"


@dataclass
class EvalConfig:
    knn_k: int = 200
    knn_t: float = 0.1
    knn_every: int = 1  # epochs between kNN monitors; 0 = only at the end
    knn_bank: int | None = 10_000  # training images in the kNN memory bank; None = all
    knn_test: int | None = None  # test images the kNN is scored on (the monitor and the end); None = all
    linear_train: int | None = None  # training images for the linear probe; None = all
    linear_test: int | None = None  # test images the final linear probe is scored on; None = all
    linear_steps: int = 200  # L-BFGS iterations of the probe
    linear_wd: float = 1e-4
    drift_probes: int = 256  # dictionary slots followed for the key-drift diagnostic (diagnostics.py); 0 = off


@dataclass
class RunConfig:
    seed: int = 0
    num_workers: int = 0  # Ray Train workers W; 0 = Ray Train's local mode (this process)
    device: str = "auto"
    precision: str = "fp32"  # encoder compute: fp32, bf16 (autocast), auto = bf16 where the hardware has it
    threads: int = 0  # torch threads per worker; 0 = its CPU share
    cpus_per_worker: float = 1.0  # Ray CPU resources per worker (fractions let trials share cores)
    gpus_per_worker: float = 0.0
    # pack: fill a node first (fewest network hops); spread: one worker per node where it can (a node's
    # loss takes one rank, not all); strict_spread: never two on one node (waits for enough nodes)
    placement: str = "pack"
    name: str | None = None  # the run's name: the same name resumes it; None = derived from the config
    preset: str = "default"
    output_dir: str = "runs"  # Ray Train storage: checkpoints live in <output_dir>/<name>/
    experiment: str = "mocolab"  # MLflow experiment
    checkpoint_every: int = 0  # also checkpoint every N steps (0 = at epoch ends only)
    keep_checkpoints: int = 2
    step_metrics_every: int = 1  # per-step metrics (m, first-layer gradient norm) at every N-th step
    system_metrics_s: float = 10.0  # MLflow system metrics (CPU, memory, GPU) from every worker node, every N s; 0 = off
    # a finished run logs its encoder and probe as MLflow models (a torch.export each, seconds on a CPU); a
    # sweep of many trials may leave them out and keep only its checkpoints
    log_models: bool = True
    max_failures: int = 2  # restarts from the latest checkpoint (of its workers, or a lost trial) before it fails
    # seconds a rank waits in a collective (gloo, NCCL) before its process group gives up: Ray Train's default
    collective_timeout_s: float = 1800.0
    fault_step: int = 0  # testing: one worker exits at this step on the first attempt (0 = never)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    vit: VitConfig = field(default_factory=VitConfig)
    moco: MocoConfig = field(default_factory=MocoConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    bank: BankConfig = field(default_factory=BankConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)

    # ----------------------------------------------------------------- views
    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def flatten(self) -> dict[str, Any]:
        """``{"moco.m": 0.999, ...}``: the form MLflow params and ``--set`` use."""
        return {f"{s}.{k}": v for s, sec in self.to_dict().items() for k, v in sec.items()}

    def replace(self, **dotted: Any) -> "Config":
        """A copy with ``{"moco.m": 0.9}``-style changes; unknown keys are errors."""
        return apply_overrides(self, dotted)

    @property
    def train_size(self) -> int | None:
        """Training images a run trains on: the set less ``data.val_size``, at most ``data.subset``; None where
        the set's size cannot be known. A folder of images (imagefolder, parquet) is counted on disk, which is
        why ``validate`` reads ``known_train_size`` instead and ``data_root.check_data`` checks the count."""
        d = self.data
        if d.name == "synthetic":
            n: int | None = d.synthetic_size
        elif d.name in STREAMABLE:
            n = count_images(d.root, "train", d.name)
        else:
            n = TRAIN_SIZES.get(d.name)
        if n is not None:
            n = max(n - d.val_size, 0)
            if d.subset is not None:
                n = min(n, d.subset)
        return n

    @property
    def known_train_size(self) -> int | None:
        """``train_size`` where the config alone gives it; None for a folder of images, counted only on disk."""
        return None if self.data.name in STREAMABLE else self.train_size

    @property
    def world_size(self) -> int:
        return max(1, self.run.num_workers)

    @property
    def per_rank_batch(self) -> int:
        return self.optim.batch_size // self.world_size

    @property
    def run_name(self) -> str:
        """The given name, else one derived from the config: the same config resumes the same run. The digest
        reads the fields that differ from their defaults (``departures``), so a newly added field at its
        default names a run as before."""
        if self.run.name:
            return self.run.name
        flat = {k: v for k, v in departures(self.flatten()).items() if not k.startswith("run.") or k == "run.seed"}
        digest = hashlib.sha1(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:8]
        version = "" if self.moco.version == "v2" else f"{self.moco.version}-"  # v2, the default, adds nothing
        source = {"queue": "", "memory_bank": "bank-", "in_batch": "inbatch-"}[self.moco.negatives] \
            if self.moco.negatives in NEGATIVE_SOURCES else f"{self.moco.negatives}-"
        return f"{self.run.preset}-{version}{source}m{self.moco.m}-s{self.run.seed}-{digest}"

    @property
    def image_size(self) -> int:
        """Side of the training images: ``data.image_size``, else the data set's own."""
        return self.data.image_size or native_image_size(self.data.name)

    @property
    def is_vit(self) -> bool:
        return self.model.backbone in VIT_SIZES

    @property
    def effective_lr(self) -> float:
        """The peak learning rate used: ``optim.lr``, times batch/256 under ``optim.scale_lr``."""
        o = self.optim
        return o.lr * o.batch_size / 256 if o.scale_lr else o.lr

    @property
    def ema_half_life(self) -> float:
        """Steps until a query-encoder change has half its weight in the key encoder: ln 0.5 / ln m."""
        m = self.moco.m
        return 0.0 if m == 0 else math.log(0.5) / math.log(m)

    @property
    def max_staleness(self) -> float:
        """Oldest negative in a full FIFO queue, in steps: K / global batch."""
        return self.queue.size / self.optim.batch_size

    @property
    def bank_negatives(self) -> int:
        """K negatives a memory bank draws per step: ``bank.negatives``, else ``queue.size``."""
        return self.bank.negatives or self.queue.size

    @property
    def uses_queue(self) -> bool:
        return self.moco.version != "v3" and self.moco.negatives == "queue"


_SECTION_TYPES = {
    "data": DataConfig, "augment": AugmentConfig, "model": ModelConfig, "vit": VitConfig, "moco": MocoConfig,
    "queue": QueueConfig, "bank": BankConfig, "optim": OptimConfig, "eval": EvalConfig, "run": RunConfig,
}


# ----------------------------------------------------------------------- building
def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_summary(name: str) -> str:
    """What a preset is for: the start of its leading comment, up to its first colon (or, where that is too
    short to say anything, its first full stop)."""
    lines = []
    for line in (PRESET_DIR / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(lines)
    head = text.split(": ", 1)[0]
    return head if len(head) >= 25 else text.split(". ", 1)[0].rstrip(".")


def load_preset(name: str) -> Config:
    """Defaults updated by ``presets/<name>.yaml``; a preset is data, never a code branch."""
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"run.preset: unknown preset {name!r}; choose one of {list_presets()}")
    with open(path) as fh:
        raw = yaml.safe_load(fh) or {}
    cfg = from_dict(raw, where=f"preset {name!r}")
    cfg.run.preset = name
    return cfg


def from_dict(raw: Mapping[str, Any], where: str = "config") -> Config:
    """Nested mapping -> Config, with unknown sections or keys reported by name."""
    cfg = Config()
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a mapping of sections, got {type(raw).__name__}")
    for section, values in raw.items():
        if section not in _SECTION_TYPES:
            raise ValueError(f"{where}: unknown section {section!r}; sections are {list(_SECTION_TYPES)}")
        if not isinstance(values, Mapping):
            raise ValueError(f"{where}: section {section!r} must be a mapping")
        for key, value in values.items():
            _set(cfg, f"{section}.{key}", value)
    return cfg


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``["moco.m=0.9", "queue.size=4096"]`` -> dict, values parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected section.key=value, e.g. moco.m=0.9")
        key, text = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(text) if text.strip() else None
    return out


def config_file_overrides(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A YAML config of the user's (``--config my.yaml``), in the presets' form (sections of fields), as
    ``--set``-style overrides: applied over the preset and under ``--set``.  What ``--print-config`` prints
    loads back unchanged."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"--config: {str(path)!r} is not a file")
    try:
        raw = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"--config: {str(path)!r} is not valid YAML ({err})".replace("\n", " ")) from None
    if not isinstance(raw, Mapping) or not all(isinstance(v, Mapping) for v in raw.values()):
        raise ValueError(f"--config: {str(path)!r} must map sections to fields, as the presets do "
                         f"(sections: {list(_SECTION_TYPES)})")
    out = {f"{section}.{key}": value for section, values in raw.items() for key, value in values.items()}
    for key in out:  # unknown sections or fields, named with the file
        section, _, name = key.partition(".")
        if section not in _SECTION_TYPES or name not in {f.name for f in fields(_SECTION_TYPES[section])}:
            raise ValueError(f"--config: {str(path)!r}: unknown config key {key!r}")
    return out


def to_yaml(cfg: Config) -> str:
    """Every resolved field, as YAML that ``--config`` reads back to the same config."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def apply_overrides(cfg: Config, overrides: Mapping[str, Any]) -> Config:
    new = copy.deepcopy(cfg)
    for key, value in overrides.items():
        _set(new, key, value)
    return new


def _set(cfg: Config, dotted: str, value: Any) -> None:
    section, _, key = dotted.partition(".")
    if section not in _SECTION_TYPES or not key:
        raise ValueError(f"unknown config key {dotted!r}; keys look like section.field with sections {list(_SECTION_TYPES)}")
    sec = getattr(cfg, section)
    names = {f.name: f for f in fields(sec)}
    if key not in names:
        raise ValueError(f"unknown config key {dotted!r}; {section} has {sorted(names)}")
    setattr(sec, key, _coerce(dotted, value, names[key].type))


def _coerce(dotted: str, value: Any, typ: Any) -> Any:
    """YAML gives ints for ``1`` and strings for ``1e-3``; accept what the field means."""
    text = str(typ)
    optional = "None" in text
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        if value is None or text != "str":  # a string field may hold the word: augment.preset=none
            raise ValueError(f"{dotted}: may not be empty")
    if text.startswith("bool"):
        word = str(value).lower()
        if word in ("1", "true", "yes", "0", "false", "no"):
            return word in ("1", "true", "yes")
        raise ValueError(f"{dotted}: {value!r} is not a bool (true or false)")
    try:
        if text.startswith("float"):
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if text.startswith("int"):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise TypeError
            return int(value)
        if text.startswith("str"):
            return str(value)
    except (TypeError, ValueError):
        raise ValueError(f"{dotted}: {value!r} is not a valid {text}") from None
    return value


def build_config(preset: str = "cpu-quick", overrides: Iterable[str] | Mapping[str, Any] = ()) -> Config:
    """Preset + overrides, validated: the one entry point for the CLI and the experiments."""
    cfg = load_preset(preset)
    ov = dict(overrides) if isinstance(overrides, Mapping) else parse_overrides(overrides)
    cfg = apply_overrides(cfg, ov)
    validate(cfg)
    return cfg


# ----------------------------------------------------------------------- validation
def _choice(name: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name}: unknown value {value!r}; choose one of {list(allowed)}")


def _range(name: str, value: float, lo: float | None = None, hi: float | None = None, *,
           lo_open: bool = False, hi_open: bool = False, allowed: str | None = None) -> None:
    # No field of a config means anything at infinity (or NaN): a non-finite number is always out of range.
    bad = isinstance(value, float) and not math.isfinite(value)
    if lo is not None:
        bad |= value <= lo if lo_open else value < lo
    if hi is not None:
        bad |= value >= hi if hi_open else value > hi
    if bad:
        if allowed is None:
            left = "(" if lo_open else "["
            right = ")" if hi_open else "]"
            allowed = f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"
        raise ValueError(f"{name}: {value!r} is out of range; allowed {allowed}")


def validate(cfg: Config) -> Config:
    """Every check of the config alone: a function of its fields that reads no file and no environment, so it
    answers the same wherever it runs. What needs the disk (the data is there, and a folder holds enough
    images) is ``data_root.check_data``, which every command runs where it uses the data, before any work."""
    d, a, mo, mc, q, o, e, r = cfg.data, cfg.augment, cfg.model, cfg.moco, cfg.queue, cfg.optim, cfg.eval, cfg.run
    flat = cfg.flatten()
    for key, allowed in CHOICES.items():
        _choice(key, flat[key], allowed)

    _range("moco.m", mc.m, 0.0, 1.0, hi_open=True, allowed="[0, 1)")
    # tau below 1e-3 puts logits of 1/tau beyond what a bf16 encoder's embeddings resolve; above 10 the
    # softmax is flat and nothing is learned.  lr has no useful upper bound (large-batch recipes scale it
    # with the batch; a diverging run is an outcome the platform records), only finiteness.
    _range("moco.tau", mc.tau, 1e-3, 10.0, allowed="[0.001, 10]")
    _range("optim.lr", o.lr, 0.0, lo_open=True, allowed="lr > 0 and finite")
    _range("optim.batch_size", o.batch_size, 2, allowed="batch_size >= 2")
    _range("optim.epochs", o.epochs, 1, allowed="epochs >= 1")
    if o.max_steps is not None:
        _range("optim.max_steps", o.max_steps, 1, allowed="max_steps >= 1 or None")
    _range("optim.momentum", o.momentum, 0.0, 1.0, hi_open=True)
    _range("optim.warmup_epochs", o.warmup_epochs, 0.0, float(o.epochs), hi_open=True,
           allowed=f"[0, optim.epochs={o.epochs})")
    # the data's size first: the ViT's patch checks divide it
    for key in ("subset", "image_size"):
        val = getattr(d, key)
        if val is not None:
            _range(f"data.{key}", val, 1)
    smallest = MIN_IMAGE_SIZE.get(cfg.model.backbone, 1)
    if d.image_size is not None and d.image_size < smallest:
        raise ValueError(f"data.image_size: {d.image_size} is below the {smallest} px model.backbone "
                         f"{cfg.model.backbone!r} accepts; allowed >= {smallest} (or another backbone)")
    _check_vit(cfg)
    _range("optim.weight_decay", o.weight_decay, 0.0, 1.0)
    _range("augment.crop_min", a.crop_min, 0.0, 1.0, lo_open=True, allowed="(0, 1]")
    _range("augment.jitter", a.jitter, 0.0, 1.0)
    _range("augment.blur_sigma_max", a.blur_sigma_max, 0.1, 100.0)
    # Upper bounds where a larger value can only fail later (an allocation, a thread pool, a seed stream):
    # past them the error is this one line, not a traceback minutes in.
    _range("model.width", mo.width, 1, 8192)
    _range("model.dim", mo.dim, 1, 65536)
    _range("model.hidden", mo.hidden, 0, 65536)
    _range("eval.knn_k", e.knn_k, 1)
    _range("eval.knn_t", e.knn_t, 0.0, 100.0, lo_open=True)  # any t > 0: the kNN weights are computed stably
    _range("eval.knn_every", e.knn_every, 0)
    _range("eval.linear_steps", e.linear_steps, 1, 100_000)
    _range("eval.linear_wd", e.linear_wd, 0.0, 100.0)
    _range("run.num_workers", r.num_workers, 0)
    _range("run.threads", r.threads, 0, 1024)
    _range("run.seed", r.seed, 0, 2**32 - 1)
    _range("run.cpus_per_worker", r.cpus_per_worker, 0.0, 4096.0, lo_open=True, allowed="(0, 4096]")
    if r.name is not None:
        check_name("run.name", r.name)
    _range("run.gpus_per_worker", r.gpus_per_worker, 0.0, 64.0)
    _range("run.collective_timeout_s", r.collective_timeout_s, 1.0, 7 * 86400.0)
    _range("run.checkpoint_every", r.checkpoint_every, 0)
    _range("run.keep_checkpoints", r.keep_checkpoints, 1)
    _range("run.system_metrics_s", r.system_metrics_s, 0, 86400)
    _range("run.step_metrics_every", r.step_metrics_every, 1, allowed="an integer >= 1")
    _range("run.max_failures", r.max_failures, 0)
    _range("run.fault_step", r.fault_step, 0)
    _range("data.synthetic_size", d.synthetic_size, 2, 1_000_000)
    _range("data.memory_budget_mb", d.memory_budget_mb, 1)
    _range("data.stream_tasks", d.stream_tasks, 1, 64)
    _range("data.max_bad_fraction", d.max_bad_fraction, 0.0, 1.0)
    _range("data.val_size", d.val_size, 0, 10_000_000)
    if d.name == "imagefolder" and not d.root:
        raise ValueError("data.root: imagefolder needs a folder path (root/train/<class>/*.jpg)")
    if d.name == "parquet" and not d.root:
        raise ValueError("data.root: parquet needs a folder path (root/train/*.parquet, root/val/*.parquet)")
    if d.loader == "stream" and d.name not in STREAMABLE:
        raise ValueError(f"data.loader: 'stream' reads {' or '.join(STREAMABLE)} sets, not {d.name!r} "
                         f"(which is decoded into memory): use data.loader=memory or auto")
    for key in ("knn_bank", "knn_test", "linear_train", "linear_test"):
        val = getattr(e, key)
        if val is not None:
            _range(f"eval.{key}", val, 1)

    # checked even where the method does not read them (v3 has no queue, plain BN no groups): a nonsense
    # value in a config is refused, not kept until someone switches the method
    _range("queue.size", q.size, 0)
    _range("moco.bn_groups", mc.bn_groups, 1, 4096)
    ws = cfg.world_size
    if o.batch_size % ws:
        raise ValueError(f"optim.batch_size: {o.batch_size} must be a multiple of run.num_workers={ws}")
    if mc.bn in ("split", "groups"):
        g = mc.bn_groups
        _range("moco.bn_groups", g, 1)
        if cfg.per_rank_batch % g:
            raise ValueError(
                f"moco.bn_groups: {g} must divide the per-rank batch {cfg.per_rank_batch} "
                f"(optim.batch_size={o.batch_size} / {ws} workers)")
        if cfg.per_rank_batch // g < 2:
            raise ValueError(f"moco.bn_groups: {g} groups leave fewer than 2 samples per group "
                             f"in a per-rank batch of {cfg.per_rank_batch}")
    if mc.bn == "shuffle" and ws < 2:
        raise ValueError("moco.bn: 'shuffle' needs run.num_workers >= 2 ranks to shuffle across; "
                         "in one process use 'split' (virtual groups + in-process shuffle)")
    if mc.bn == "sync" and ws < 2:
        raise ValueError("moco.bn: 'sync' (batch-norm over the global batch) needs run.num_workers >= 2 ranks; "
                         "in one process use 'split' or 'plain'")

    _check_negatives(cfg)
    if cfg.uses_queue:  # the queue's own bounds (v3, a memory bank and in-batch read no queue.size)
        if q.size <= 0:
            raise ValueError(f"queue.size: {q.size} must be > 0")
        if q.size % o.batch_size:
            raise ValueError(f"queue.size: {q.size} must be a multiple of the global batch "
                             f"optim.batch_size={o.batch_size} (so the FIFO ring wraps on a batch boundary)")
    check_train_size(cfg, cfg.known_train_size)
    return cfg


def check_train_size(cfg: Config, n: int | None) -> None:
    """The fields bounded by the training set's size ``n`` (images a run trains on; None: unknown, nothing
    checked): ``validate`` checks them where the config gives n, ``data_root.check_data`` where the disk does."""
    if n is None:
        return
    d, q, o = cfg.data, cfg.queue, cfg.optim
    if d.val_size and n == 0:
        raise ValueError(f"data.val_size: {d.val_size} holds out every training image; allowed: fewer than the "
                         f"training set")
    if cfg.moco.negatives == "memory_bank" and cfg.bank_negatives >= n:
        raise ValueError(f"bank.negatives: {cfg.bank_negatives} negatives per step must be below the "
                         f"training-set size {n}" + (" (bank.negatives=0 takes queue.size)" if not cfg.bank.negatives
                                                     else ""))
    if cfg.uses_queue and q.size >= n:
        raise ValueError(f"queue.size: {q.size} must be below the training-set size {n} "
                         f"(else an image's own older key is one of its negatives)")
    if o.batch_size > n:
        raise ValueError(f"optim.batch_size: {o.batch_size} is larger than the training set ({n} images)")


def _check_negatives(cfg: Config) -> None:
    mc, q, b = cfg.moco, cfg.queue, cfg.bank
    _range("eval.drift_probes", cfg.eval.drift_probes, 0, allowed="an integer >= 0 (0: no key-drift probes)")
    if mc.negatives != "queue" and mc.version == "v3":
        raise ValueError(f"moco.negatives: {mc.negatives!r} applies to the v1/v2 algorithm; moco.version=v3 "
                         f"takes its negatives from the global batch (use moco.version=v2)")
    if mc.negatives != "queue" and mc.bn == "shuffle":
        raise ValueError(f"moco.bn: 'shuffle' shuffles the key encoder's batch, and moco.negatives="
                         f"{mc.negatives} has no key encoder; use split, plain or sync")
    if q.policy != "fifo" and q.layout == "sharded" and cfg.world_size > 1:
        raise ValueError(f"queue.policy: {q.policy!r} needs queue.layout=replicated with run.num_workers > 1 "
                         f"(every rank draws the same slots); the sharded layout is FIFO only")
    if not cfg.uses_queue and q.policy != "fifo":
        raise ValueError(f"queue.policy: {q.policy!r} applies to MoCo's queue, and there is none "
                         f"(moco.version={mc.version}, moco.negatives={mc.negatives})")
    if mc.negatives != "memory_bank":
        changed = [k for k, default in (("negatives", 0), ("momentum", 0.5)) if getattr(b, k) != default]
        if changed:
            raise ValueError(f"bank.{changed[0]}: applies to moco.negatives=memory_bank only, and "
                             f"moco.negatives is {mc.negatives!r}")
        return
    _range("bank.momentum", b.momentum, 0.0, 1.0, hi_open=True, allowed="[0, 1)")
    _range("bank.negatives", b.negatives, 0, allowed="0 (queue.size) or an integer >= 1")


def _check_vit(cfg: Config) -> None:
    v = cfg.vit
    _range("vit.patch_size", v.patch_size, 0, allowed="0 (sized for the data) or a divisor of the image size")
    _range("vit.depth", v.depth, 0, 64, allowed="0 (the named size's 12) to 64")
    if not cfg.is_vit:
        changed = [k for k, default in (("patch_size", 0), ("depth", 0), ("freeze_patch_embed", False))
                   if getattr(v, k) != default]
        if changed:
            raise ValueError(f"vit.{changed[0]}: applies to the ViT backbones {list(VIT_SIZES)} only, and "
                             f"model.backbone is {cfg.model.backbone!r}")
        return
    size = cfg.image_size
    if v.patch_size and size % v.patch_size:
        divisors = [p for p in range(2, size // 2 + 1) if size % p == 0]
        raise ValueError(f"vit.patch_size: {v.patch_size} does not divide the image size {size}; "
                         f"allowed 0 (sized for the data) or one of {divisors}")


# Fields that may change between attempts of one run without changing what it computes: a resume
# ignores them.  Every other field is part of the run's identity (``fingerprint``).
RESUMABLE_FIELDS = ("run.max_failures", "run.threads", "run.cpus_per_worker", "run.placement", "run.output_dir",
                    "run.keep_checkpoints", "run.checkpoint_every", "run.system_metrics_s", "run.step_metrics_every",
                    "run.fault_step", "run.preset", "run.name", "run.log_models",
                    "data.loader", "data.memory_budget_mb", "data.stream_tasks",
                    "data.max_bad_fraction")  # how, not what, is read


def identity(flat: Mapping[str, Any]) -> dict[str, str]:
    """The flattened fields that define a run (RESUMABLE_FIELDS left out), as the strings MLflow stores."""
    return {k: str(v) for k, v in sorted(flat.items()) if k not in RESUMABLE_FIELDS}


def departures(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a flattened config that differ from their defaults: what the config says.

    Derived run names and fingerprints read only these, so a new field, whose default computes what the
    code computed before the field existed, leaves every name and fingerprint as it was.
    """
    defaults = Config().flatten()
    return {k: v for k, v in flat.items() if k not in defaults or str(v) != str(defaults[k])}


def fingerprint(cfg: Config) -> str:
    """A short digest of what the run computes: equal for every attempt of one run, and only then."""
    return hashlib.sha1(json.dumps(identity(departures(cfg.flatten())), sort_keys=True).encode()).hexdigest()[:16]


def config_diff(old: Mapping[str, Any], new: Mapping[str, Any],
                new_field: Callable[[str], bool] = lambda _key: True) -> list[str]:
    """``["moco.m: 0.99 -> 0.9", ...]`` over the identity fields of two flattened configs.

    A key absent from ``old`` for which ``new_field(key)`` holds is a field that did not exist when the
    run started (a newer mocolab), not a change, and is left out.
    """
    a, b = identity(old), identity(new)
    keys = sorted(k for k in set(a) | set(b) if k in a or not new_field(k))
    return [f"{k}: {a.get(k, '(absent)')} -> {b.get(k, '(absent)')}" for k in keys if a.get(k) != b.get(k)]


class ConfigMismatchError(ValueError):
    """A run or sweep name asked to resume with settings other than the ones it started with."""


def check_same_config(what: str, old: Mapping[str, Any], new: Mapping[str, Any], fresh: str,
                      new_field: Callable[[str], bool] = lambda _key: True) -> None:
    """Refuse to resume ``what`` when its identity fields changed; the error lists them and how to start fresh."""
    diff = config_diff(old, new, new_field)
    if diff:
        raise ConfigMismatchError(f"{what} was started with other settings; resuming would mix them. Changed: "
                                  f"{'; '.join(diff)}. Resume with the original settings, or start fresh: {fresh}")


NAME_RULE = ("1 to 200 characters from letters, digits and . _ = -, starting with a letter, digit or _ "
             "(it names a folder and an MLflow filter value)")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._=-]{0,199}")


def check_name(field: str, name: str) -> str:
    """Run and sweep names become folder names and MLflow filter values: a safe set, nothing that escapes."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{field}: {name!r} is not a valid name; use {NAME_RULE}")
    return name


PATH_FIELDS = ("data.root", "run.output_dir")  # resolved against the caller's folder before Ray moves processes


def absolute_paths(overrides: Mapping[str, Any], cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """``overrides`` with relative path fields made absolute against ``cwd`` (default: this folder)."""
    base = Path(cwd) if cwd is not None else Path.cwd()
    out = dict(overrides)
    for key in PATH_FIELDS:
        value = out.get(key)
        if isinstance(value, str) and value and not is_uri(value):  # a URI is never a local path
            p = Path(value).expanduser()
            out[key] = str(p if p.is_absolute() else (base / p).resolve())
    return out


def with_absolute_paths(cfg: Config, cwd: str | os.PathLike[str] | None = None) -> Config:
    """The config with ``data.root`` and ``run.output_dir`` absolute: Ray's workers and trials run elsewhere."""
    flat = cfg.flatten()
    return apply_overrides(cfg, absolute_paths({k: flat[k] for k in PATH_FIELDS}, cwd))
