"""Every closed set of config values, and the data-set facts validation needs, in one module without torch.

Config validation and the command line's ``--help`` read these before
anything heavy loads: a mistyped value is refused in a fraction of a second
instead of after torch's start-up.  Each implementing module imports its list
from here (``models.BACKBONES is choices.BACKBONES``), so a value is still
defined once; add a value here and its code there together.
"""

from __future__ import annotations

# augment.py: the view recipes
AUGMENT_PRESETS = ("mocov1", "mocov2", "mocov3", "crop", "none")

# data.py: the data sets, and what validation checks without loading them
DATASETS: tuple[str, ...] = ("fashion-mnist", "cifar10", "stl10", "imagefolder", "parquet", "synthetic")
# Training-set sizes of the named datasets, so that config validation checks K < N without loading data.
TRAIN_SIZES: dict[str, int] = {"fashion-mnist": 60_000, "cifar10": 50_000, "stl10": 5_000}
# Native image sides of the named datasets (a ViT's patch size must divide them).
IMAGE_SIZES: dict[str, int] = {"fashion-mnist": 28, "cifar10": 32, "stl10": 96}
DEFAULT_IMAGEFOLDER_SIZE = 64
SYNTHETIC_SIZE = 28

# dist.py: queue.layout, and moco.bn (how key batch-norm is kept from cheating)
QUEUE_LAYOUTS = ("replicated", "sharded")
# groups: split's virtual groups with the keys unshuffled, the arm that tells the shuffle from the groups
BN_MODES = ("shuffle", "split", "groups", "sync", "plain")

# hardware.py: run.device and run.precision
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16", "auto")

# vit.py: name -> (embedding width, depth, heads): timm's ViT-Tiny and MoCo v3's ViT-Small (12 heads)
VIT_SIZES: dict[str, tuple[int, int, int]] = {"vit_tiny": (192, 12, 3), "vit_small": (384, 12, 12)}

# models.py: backbones and projection heads.  MoCo v1: linear; v2: mlp; v3: mlp-bn (ResNet: 2 layers) and
# mlp3-bn (ViT: 3 layers), batch-norm after each layer and a non-affine one at the end, no biases
BACKBONES = ("convnet", "resnet18", "resnet50", *VIT_SIZES)
# The smallest image side each backbone's forward pass accepts (the convnet's three 2x2 max-pools need
# 8 px; the ResNets end in an adaptive pool, and a ViT's patches divide the image, which vit.patch_size
# checks).
MIN_IMAGE_SIZE: dict[str, int] = {"convnet": 8}
HEADS = ("linear", "mlp", "mlp-bn", "mlp3-bn")

# moco.py: moco.version: v1 and v2 share the queue algorithm (their recipes differ), v3 has none
VERSIONS = ("v1", "v2", "v3")

# negatives.py: moco.negatives
NEGATIVE_SOURCES = ("queue", "memory_bank", "in_batch")

# optimizers.py: optim.name
OPTIMIZERS = ("sgd", "adamw", "lars")

# queue.py: queue.policy: how an enqueued key chooses the slot it replaces
QUEUE_POLICIES = ("fifo", "random")

# schedule.py: optim.schedule and moco.m_schedule
LR_SCHEDULES = ("cosine", "constant")
M_SCHEDULES = ("constant", "cosine")

# sources.py: data.loader, and the sets that can be streamed
LOADERS = ("auto", "memory", "stream")
STREAMABLE = ("imagefolder", "parquet")


def native_image_size(name: str) -> int:
    """The side a data set's images have when ``data.image_size`` leaves them alone."""
    if name in IMAGE_SIZES:
        return IMAGE_SIZES[name]
    return SYNTHETIC_SIZE if name == "synthetic" else DEFAULT_IMAGEFOLDER_SIZE
