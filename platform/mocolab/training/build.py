"""What a run is made of, from its config and its data source: the method (DDP-wrapped over several ranks),
the augmentation, the optimiser and the schedule.

One function builds them so that ``Trainer.__init__`` reads as a list of what a run holds, and so that the
order they are built in, which fixes the random streams they draw from, is written down once: the method's
initial weights come from the ``init`` stream inside a fork of torch's global generator (method/rng.py), so
building a run leaves the caller's generator as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from mocolab.data import sets as datasets
from mocolab.method import rng
from mocolab.data.augment import build_augmentation
from mocolab.config import Config
from mocolab.config.hardware import configure_device, resolve_precision
from mocolab.method.protocol import Method, MethodParts
from mocolab.method.registry import build_method
from mocolab.models.backbones import build_encoder
from mocolab.method.batchnorm import convert_global_bn
from mocolab.training.optimizers import build_optimizer
from mocolab.training.schedule import lr_at, momentum_at
from mocolab.data.sources import MemorySource, TrainSource
from mocolab.data.splits import hold_out, load_data


# ------------------------------------------------------------------------------------------------ the data


def training_source(cfg: Config, *, source: TrainSource | None = None, train: datasets.ImageDataset | None = None,
                    test: datasets.ImageDataset | None = None) -> TrainSource:
    """``source`` where one is given (the streaming source needs Ray Data: training/worker.py opens it), else
    the sets decoded into memory: ``train`` and ``test`` where given (tests, benchmarks), loaded as the
    config says otherwise, with the validation split held out of the training set."""
    if source is not None:
        if cfg.data.val_size:
            raise ValueError("data.val_size: a validation split is held out of in-memory sets only; with "
                             "data.loader=stream, set data.val_size=0 (or data.loader=memory where the set fits)")
        return source
    if cfg.data.loader == "stream" and (train is None or test is None):
        raise ValueError("data.loader: 'stream' reads through Ray Data, which a run without Ray "
                         "(--in-process) does not start; drop --in-process, or use data.loader=memory")
    val = None
    if train is None or test is None:
        train, test, val = load_data(cfg)
    elif cfg.data.val_size:
        train, val = hold_out(train, cfg.data.val_size)
    return MemorySource(train, test, max_bad_fraction=cfg.data.max_bad_fraction, val=val)


def training_labels(source: TrainSource) -> torch.Tensor | None:
    """``MethodParts.labels``: the training set's labels by position, as its epochs index the images (after
    ``data.val_size`` and ``data.subset``), negative in an unreadable file's row; None for a streamed set,
    whose file index holds labels but whose stand-ins for unreadable files only its loader knows."""
    return source.train.labels if isinstance(source, MemorySource) else None


# ------------------------------------------------------------------------------------------- the schedule
@dataclass
class Schedule:
    """How many steps a run takes and, at each step, its learning rate and its key encoder's momentum.

    The counts depend on the training set's size and the world, so they are fixed here once, where both
    are known; the epoch loop ends on ``total_steps`` and passes ``momentum(step)`` to each step.
    """

    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    lr_schedule: str  # optim.schedule
    base_lr: float  # the effective lr (optim.lr scaled for the batch)
    m_schedule: str  # moco.m_schedule
    base_m: float  # moco.m

    @classmethod
    def from_config(cls, cfg: Config, train_size: int, batch: int, world_size: int) -> Schedule:
        o = cfg.optim
        per_epoch = datasets.batches_per_epoch(train_size, batch, world_size)
        planned = o.epochs * per_epoch
        return cls(steps_per_epoch=per_epoch, total_steps=min(planned, o.max_steps) if o.max_steps else planned,
                   warmup_steps=round(o.warmup_epochs * per_epoch), lr_schedule=o.schedule, base_lr=cfg.effective_lr,
                   m_schedule=cfg.moco.m_schedule, base_m=cfg.moco.m)

    def lr(self, step: int) -> float:
        """The learning rate of the step after ``step`` steps: warm-up, then ``optim.schedule``."""
        return lr_at(self.lr_schedule, self.base_lr, step, self.total_steps, self.warmup_steps)

    def momentum(self, step: int) -> float:
        """The key encoder's momentum for the step after ``step`` steps (``moco.m_schedule``)."""
        return momentum_at(self.m_schedule, self.base_m, step, self.total_steps)


# -------------------------------------------------------------------------------------- the method and more
def encoder_factory(cfg: Config, channels: int, image_size: int,
                    device: torch.device) -> Callable[..., nn.Module]:
    """``MethodParts.encoder``: ``predictor`` -> a fresh f_q as the config has it, its batch norm converted for
    ``moco.bn`` (groups for split and groups; sync: NCCL's SyncBatchNorm on CUDA, else ours over gloo).
    Its initial weights come from torch's global generator."""
    mc, mo, vit = cfg.moco, cfg.model, cfg.vit

    def encoder(predictor: bool = False) -> nn.Module:
        groups = mc.bn_groups if mc.bn in ("split", "groups") else 1
        enc = build_encoder(mo.backbone, channels, width=mo.width, head=mo.head, dim=mo.dim, hidden=mo.hidden,
                            bn_groups=groups, predictor=predictor, image_size=image_size, patch_size=vit.patch_size,
                            depth=vit.depth, freeze_patch_embed=vit.freeze_patch_embed)
        if mc.bn == "sync":  # statistics over the global batch: NCCL's SyncBatchNorm, else ours (gloo)
            enc = (nn.SyncBatchNorm.convert_sync_batchnorm(enc) if device.type == "cuda"
                   else convert_global_bn(enc))
        return enc

    return encoder


@dataclass
class RunParts:
    """What ``build_run`` makes: everything a step touches besides the data and the monitors."""

    model: Method  # on the device; its encoder_q wrapped in DDP when there are several ranks
    encoder: nn.Module  # the query encoder unwrapped: what is evaluated, checkpointed and exported
    augment: nn.Module  # uint8 batch -> two views, drawing from torch's global generator
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    batch: int  # this rank's share of optim.batch_size
    precision: torch.dtype | None  # bf16 autocast for the encoders; None: float32


def build_run(cfg: Config, source: TrainSource, device: torch.device, world_size: int) -> RunParts:
    """The method, its DDP wrap, the augmentation, the optimiser and the schedule for ``source`` on ``device``."""
    batch = cfg.optim.batch_size // world_size
    if source.size < cfg.optim.batch_size:
        raise ValueError(f"optim.batch_size: {cfg.optim.batch_size} is larger than the training set "
                         f"({source.size} images)")
    precision = resolve_precision(cfg.run.precision, device)
    configure_device(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(rng.stream_seed("init", cfg.run.seed))  # the same initial weights on every rank
        # moco.version / moco.negatives -> MoCo v1/v2, v3, memory bank or in-batch; method.name -> a plugin or
        # mocolab's own (supervised) (method/registry.py)
        parts = MethodParts(encoder_factory(cfg, source.channels, source.image_size, device), source.size, batch,
                            precision, labels=training_labels(source), classes=source.classes)
        model = build_method(cfg, parts).to(device)
    encoder = model.encoder_q
    if cfg.run.channels_last:  # 4-D weights in NHWC; the trainer hands the views over in the same layout
        model.to(memory_format=torch.channels_last)
    if cfg.run.compile:  # in place: the modules, their names and their checkpoints stay as they are
        for module in (encoder, model.key_encoder):
            if module is not None:
                module.compile()
    if world_size > 1:  # DDP over the query encoder only: the queue and the key encoder stay out of its broadcasts
        ids = [device.index] if device.type == "cuda" else None
        model.encoder_q = nn.parallel.DistributedDataParallel(encoder, device_ids=ids)
    augment = build_augmentation(cfg.augment, source.image_size, source.channels).to(device)
    o = cfg.optim
    optimizer = build_optimizer(o.name, encoder, cfg.effective_lr, momentum=o.momentum, weight_decay=o.weight_decay)
    return RunParts(model, encoder, augment, optimizer, Schedule.from_config(cfg, source.size, batch, world_size),
                    batch, precision)
