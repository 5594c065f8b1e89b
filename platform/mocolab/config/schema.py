"""The config's shape: one typed section per concern, their defaults, and what a run derives from them
(its name, its global batch, the half-life of its key encoder).  Plain data, so a config flattens into
MLflow params, is saved beside a checkpoint and compares across runs."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from mocolab.config.choices import NEGATIVE_SOURCES, STREAMABLE, TRAIN_SIZES, VIT_SIZES, native_image_size
from mocolab.data.image_folders import count_images


@dataclass
class DataConfig:
    name: str = "fashion-mnist"
    root: str | None = None  # a folder for imagefolder; else overrides $MOCOLAB_DATA
    subset: int | None = None  # train on the first N training images (smoke tests)
    image_size: int | None = None  # resize (imagefolder, synthetic); None keeps the native size
    synthetic_size: int = 2048
    loader: str = "auto"  # memory | stream | auto: memory when the decoded set fits memory_budget_mb (data/sources.py)
    memory_budget_mb: int = 4096  # per worker, for data.loader=auto
    stream_tasks: int = 2  # streaming: decode tasks in flight per worker (Ray Data map tasks)
    max_bad_fraction: float = 0.01  # undecodable images a split may hold before a run refuses (data/sources.py)
    # training images held out as the validation split (the same ones for every seed and subset; in-memory
    # sets): never trained on; the per-epoch monitor and model selection read it, the test split only the end
    val_size: int = 0
    # imagefolder and parquet images are stored whole (data/canvas.py), so that the random-resized crop draws
    # from the whole image: shorter side at store_short_side, longer side at most store_max_side (aspect kept).
    # 0 = derived from the training size: the short side at image_size x 256/224 (the reference's Resize(256)
    # for 224 px crops), the cap at twice the short side
    store_short_side: int = 0
    store_max_side: int = 0

    def store_sides(self, image_size: int) -> tuple[int, int]:
        """(shorter side, cap on the longer side) the images of an indexed set are stored at, for crops of
        ``image_size`` px: the fields, or what 0 derives."""
        short = self.store_short_side or round(image_size * STORE_SHORT_RATIO)
        return short, self.store_max_side or round(short * STORE_MAX_RATIO)


STORE_SHORT_RATIO = 256 / 224  # data.store_short_side's default over the crop size: the reference's 256 px for 224
STORE_MAX_RATIO = 2.0  # data.store_max_side's default over the short side: panoramas are shrunk, not cut


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
    # where negatives come from: queue (MoCo), memory_bank (one entry per image, Wu et al. 2018), in_batch
    # (SimCLR's NT-Xent over the global batch) or batch_keys (the EMA key encoder's keys of the global batch);
    # memory_bank and in_batch have no key encoder, so moco.m is not used (choices.WITHOUT_KEY_ENCODER)
    negatives: str = "queue"
    # the queue arm (v1/v2) with a symmetric loss: q1 against k2 and q2 against k1, both against the queue,
    # averaged; one view's keys are enqueued (method/moco.py).  v3 and in_batch are symmetric always.
    symmetric: bool = False


@dataclass
class MethodConfig:
    """A method from outside the package (method/plugins.py; docs/methods.md, "Your own method"); the default,
    an empty name, is the built-in methods, picked by ``moco.version`` and ``moco.negatives``."""
    # an installed plugin's name (entry point group mocolab.methods, e.g. byol) or a module:Class path
    name: str = ""
    # the plugin's own fields, "<plugin>.<field>" -> value (--set method.byol.symmetric=false), flattened as
    # method.<plugin>.<field>; validation checks them against the fields the plugin declares and fills in
    # the rest at their defaults
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        """The plugin's own fields are ``method.<namespace>.<field>``: its entry point's name, or for a
        ``module:Class`` path the name after the colon."""
        return self.name.rpartition(":")[2]


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
    # The final evaluation's second kNN, from the same neighbours as the first (metric knn<k>_top1); 0 = none
    knn_k_small: int = 20
    # Linear probes on few labels at the end (evaluation/low_label.py): fractions of the probe's training images,
    # comma-separated ("" = none; metric linear_top1_<percent>pct), each the mean over low_label_draws fixed
    # class-balanced draws, the same for every arm and seed
    low_label_fractions: str = "0.01,0.1"
    low_label_draws: int = 3
    # the low-label probes' L-BFGS iterations and weight decay, chosen on a validation split
    # (benchmarks/evaluation/low_label.py --select, benchmarks/RESULTS.md)
    low_label_steps: int = 100
    low_label_wd: float = 0.001
    drift_probes: int = 256  # dictionary slots followed for the key-drift diagnostic (method/diagnostics.py); 0 = off
    # a linear head trained on the query's detached backbone features during training (training/online_probe.py),
    # scored with each kNN monitor (metric online_linear_top1, val_online_linear_top1) and at the end
    online_probe: bool = True
    # test images (class-balanced, fixed) whose features each run logs for its t-SNE map (analysis/feature_maps.py);
    # 0 = none
    feature_map_images: int = 2000

    @property
    def low_label(self) -> tuple[float, ...]:
        """``low_label_fractions`` as numbers ("0.01,0.1" or "[0.01, 0.1]" -> (0.01, 0.1); "" or "none" -> ())."""
        text = str(self.low_label_fractions).strip().strip("[]()")
        if text.lower() in ("", "none"):
            return ()
        out = []
        for part in text.split(","):
            try:
                out.append(float(part))
            except ValueError:
                raise ValueError(f"eval.low_label_fractions: {part.strip()!r} is not a number; allowed fractions "
                                 f"of the probe's training images in (0, 1), comma-separated (e.g. 0.01,0.1), "
                                 f"or none") from None
        return tuple(out)


@dataclass
class RunConfig:
    seed: int = 0
    num_workers: int = 0  # Ray Train workers W; 0 = Ray Train's local mode (this process)
    device: str = "auto"
    precision: str = "fp32"  # encoder compute: fp32, bf16 (autocast), fp16 (autocast, scaled loss), auto = bf16
    #                          where the hardware has it
    # the encoders' weights and the views in channels_last: faster convolutions on GPUs with tensor cores,
    # slower on this CPU (benchmarks/RESULTS.md)
    channels_last: bool = False
    # torch.compile of both encoders (the first steps pay the compilation: benchmarks/RESULTS.md)
    compile: bool = False
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
    step_metrics_every: int = 0  # per-step metrics (m, first-layer gradient norm) at every N-th step; 0: <= 250 points
    # MLflow system metrics (CPU, memory, GPU) from every worker node, every N s; 0 = off
    system_metrics_s: float = 10.0
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
    method: MethodConfig = field(default_factory=MethodConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    bank: BankConfig = field(default_factory=BankConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)

    # ----------------------------------------------------------------- views
    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def flatten(self) -> dict[str, Any]:
        """``{"moco.m": 0.999, ...}``: the form MLflow params and ``--set`` use. A plugin's own fields are keys
        of their own (``method.byol.symmetric``), not one ``method.options``."""
        flat = {f"{s}.{k}": v for s, sec in self.to_dict().items() for k, v in sec.items()
                if (s, k) != ("method", "options")}
        return {**flat, **{f"method.{k}": v for k, v in sorted(self.method.options.items())}}

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
        reads the fields that differ from their defaults (``departures``), so a field left at its default
        leaves the name unchanged."""
        if self.run.name:
            return self.run.name
        flat = {k: v for k, v in departures(self.flatten()).items() if not k.startswith("run.") or k == "run.seed"}
        digest = hashlib.sha1(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:8]
        version = "" if self.moco.version == "v2" else f"{self.moco.version}-"  # v2, the default, adds nothing
        source = {"queue": "", "memory_bank": "bank-", "in_batch": "inbatch-",
                  "batch_keys": "batchkeys-"}[self.moco.negatives] \
            if self.moco.negatives in NEGATIVE_SOURCES else f"{self.moco.negatives}-"
        if self.method.name:  # a plugin's method: its name (a module:Class path's class), not the built-ins'
            source = f"{self.method.namespace}-"
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
        """MoCo's queue (v1, v2): not v3, not another source of negatives, not a plugin's method."""
        return not self.method.name and self.moco.version != "v3" and self.moco.negatives == "queue"


_SECTION_TYPES = {
    "data": DataConfig, "augment": AugmentConfig, "model": ModelConfig, "vit": VitConfig, "moco": MocoConfig,
    "method": MethodConfig, "queue": QueueConfig, "bank": BankConfig, "optim": OptimConfig, "eval": EvalConfig,
    "run": RunConfig,
}


def departures(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a flattened config that differ from their defaults: what the config says.

    Derived run names and fingerprints read only these, so a field at its default (which computes what the
    code does without the field) leaves every name and fingerprint unchanged.
    """
    defaults = Config().flatten()
    return {k: v for k, v in flat.items() if k not in defaults or str(v) != str(defaults[k])}


def apply_overrides(cfg: Config, overrides: Mapping[str, Any]) -> Config:
    new = copy.deepcopy(cfg)
    for key, value in overrides.items():
        _set(new, key, value)
    return new


def _set(cfg: Config, dotted: str, value: Any) -> None:
    section, _, key = dotted.partition(".")
    if section not in _SECTION_TYPES or not key:
        raise ValueError(f"unknown config key {dotted!r}; keys look like section.field with sections "
                         f"{list(_SECTION_TYPES)}")
    sec = getattr(cfg, section)
    if section == "method" and "." in key:  # a plugin's own field, method.<plugin>.<field>: checked when loaded
        cfg.method.options[key] = value
        return
    if (section, key) == ("method", "options"):  # all of them at once (a config file, a record)
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise ValueError(f"{dotted}: {value!r} is not a mapping of a plugin's fields "
                             f"(<plugin>.<field>: value)")
        cfg.method.options = dict(value)
        return
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
