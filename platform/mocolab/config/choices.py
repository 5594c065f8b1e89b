"""Every closed set of config values, and the data-set facts validation needs, in one module without torch.

Config validation and the command line's ``--help`` read these before
anything heavy loads: a mistyped value is refused in a fraction of a second
instead of after torch's start-up.  Each implementing module imports its list
from here (``models.BACKBONES is choices.BACKBONES``), so a value is still
defined once; add a value here and its code there together.
"""

from __future__ import annotations

# data/augment.py: the view recipes
AUGMENT_PRESETS = ("mocov1", "mocov2", "mocov3", "crop", "none")

# data/sets.py: the data sets, and what validation checks without loading them
DATASETS: tuple[str, ...] = ("fashion-mnist", "cifar10", "stl10", "imagefolder", "parquet", "synthetic")
# Training-set sizes of the named datasets, so that config validation checks K < N without loading data.
TRAIN_SIZES: dict[str, int] = {"fashion-mnist": 60_000, "cifar10": 50_000, "stl10": 5_000}
# Native image sides of the named datasets (a ViT's patch size must divide them).
IMAGE_SIZES: dict[str, int] = {"fashion-mnist": 28, "cifar10": 32, "stl10": 96}
DEFAULT_IMAGEFOLDER_SIZE = 64
SYNTHETIC_SIZE = 28

# method/collectives.py: queue.layout, and moco.bn (how key batch-norm is kept from cheating)
QUEUE_LAYOUTS = ("replicated", "sharded")
# groups: split's virtual groups with the keys unshuffled, the arm that tells the shuffle from the groups
BN_MODES = ("shuffle", "split", "groups", "sync", "plain")

# config/hardware.py: run.device and run.precision
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16", "fp16", "auto")

# models/vision_transformer.py: name -> (embedding width, depth, heads): timm's ViT-Tiny and MoCo v3's ViT-Small
# (12 heads)
VIT_SIZES: dict[str, tuple[int, int, int]] = {"vit_tiny": (192, 12, 3), "vit_small": (384, 12, 12)}

# models/backbones.py: backbones and projection heads.  MoCo v1: linear; v2: mlp; v3: mlp-bn (ResNet: 2 layers) and
# mlp3-bn (ViT: 3 layers), batch-norm after each layer and a non-affine one at the end, no biases
BACKBONES = ("convnet", "resnet18", "resnet50", *VIT_SIZES)
# models/named.py: any timm or torchvision classification model by name, model.backbone=timm:NAME or tv:NAME
# (config/validate.py checks the name against the library's list); images up to SMALL_IMAGE px get their
# family's small-image adaptation
NAMED_BACKBONE_SOURCES = ("timm", "tv")
SMALL_IMAGE = 96
# The smallest image side each backbone's forward pass accepts (the convnet's three 2x2 max-pools need
# 8 px; the ResNets end in an adaptive pool, and a ViT's patches divide the image, which vit.patch_size
# checks).
MIN_IMAGE_SIZE: dict[str, int] = {"convnet": 8}
HEADS = ("linear", "mlp", "mlp-bn", "mlp3-bn")


def named_backbone(value: object) -> tuple[str, str] | None:
    """``"timm:resnet18"`` -> ``("timm", "resnet18")``; None for a built-in backbone (or no backbone at all)."""
    if isinstance(value, str):
        source, sep, name = value.partition(":")
        if sep and source in NAMED_BACKBONE_SOURCES:
            return source, name
    return None

# method/moco.py: moco.version: v1 and v2 share the queue algorithm (their recipes differ), v3 has none
VERSIONS = ("v1", "v2", "v3")

# method/negative_sources.py: moco.negatives
NEGATIVE_SOURCES = ("queue", "memory_bank", "in_batch", "batch_keys")
# those without a key encoder (every negative and positive from f_q): no moco.m, no key batch to shuffle
WITHOUT_KEY_ENCODER = ("memory_bank", "in_batch")

# training/optimizers.py: optim.name
OPTIMIZERS = ("sgd", "adamw", "lars")

# method/key_queue.py: queue.policy: how an enqueued key chooses the slot it replaces
QUEUE_POLICIES = ("fifo", "random")

# training/schedule.py: optim.schedule and moco.m_schedule
LR_SCHEDULES = ("cosine", "constant")
M_SCHEDULES = ("constant", "cosine")

# data/sources.py: data.loader, and the sets that can be streamed
LOADERS = ("auto", "memory", "stream")
STREAMABLE = ("imagefolder", "parquet")


def native_image_size(name: str) -> int:
    """The side a data set's images have when ``data.image_size`` leaves them alone."""
    if name in IMAGE_SIZES:
        return IMAGE_SIZES[name]
    return SYNTHETIC_SIZE if name == "synthetic" else DEFAULT_IMAGEFOLDER_SIZE


# Config fields with a closed set of values -> the values (validation and the CLI's help read this).
PLACEMENTS = ("pack", "spread", "strict_spread")  # Ray placement of a run's workers over nodes


CHOICES: dict[str, tuple[str, ...]] = {
    "data.name": DATASETS, "augment.preset": AUGMENT_PRESETS,
    "model.backbone": (*BACKBONES, *(f"{s}:NAME" for s in NAMED_BACKBONE_SOURCES)), "model.head": HEADS,
    "moco.bn": BN_MODES, "moco.negatives": NEGATIVE_SOURCES, "queue.policy": QUEUE_POLICIES,
    "queue.layout": QUEUE_LAYOUTS, "optim.schedule": LR_SCHEDULES, "moco.version": VERSIONS,
    "moco.m_schedule": M_SCHEDULES, "optim.name": OPTIMIZERS, "run.device": DEVICES, "run.precision": PRECISIONS,
    "data.loader": LOADERS, "run.placement": PLACEMENTS,
}

# mocolab study NAME: the named studies (tune/studies/NAME.py)
STUDIES = ("momentum", "queue", "augmentation", "negatives", "vit")

# a sweep: how it picks trials (grid: the study lists them; the others sample its search space), whether it
# stops trials early, which way its metric is better, and what --register-metric may rank trials by
SEARCHERS = ("grid", "optuna", "random")
SCHEDULERS = ("fifo", "asha")  # fifo: every trial runs to the end; asha: early stopping on the metric
MODES = ("max", "min")
REGISTER_METRICS = {"linear_top1": "max", "knn_top1": "max", "val_linear_top1": "max", "val_knn_top1": "max",
                    "final_loss": "min"}  # final metrics of every trial, and which way is better
