"""What the step benchmarks share: a Trainer's first batches held in memory, and timing its real steps."""

from __future__ import annotations

import time
import types

import torch
from torch import nn

from mocolab.config.hardware import keep_freed_memory
from mocolab.training.trainer import Trainer
from mocolab.models.pooling import MaxPool2x2


def held_batches(tr: Trainer, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``n`` (images, index) batches of the data order (over several epochs where one holds fewer),
    decoded ahead so the timing is the step alone; the schedule is moved out of reach so no benchmark step
    is the run's last.  The process's allocator is set as a training process sets it (``keep_freed_memory``),
    for everything the benchmark runs."""
    keep_freed_memory()
    tr.schedule.total_steps = 10**9
    held: list[tuple[torch.Tensor, torch.Tensor]] = []
    for epoch in range(n):
        for batch in tr.data.epoch_indexed(torch.Generator().manual_seed(epoch), tr.batch, 0, 1, 0):
            if len(held) == n:
                return held
            held.append(batch)
    return held


def timed_steps(tr: Trainer, data: list, warmup: int, sync=lambda: None) -> float:
    """Images/s of ``Trainer.train_step`` over ``data`` after its first ``warmup`` batches (the augment
    stream is the trainer's own; ``sync`` waits for a GPU)."""
    with torch.random.fork_rng(devices=[]):
        for images, index in data[:warmup]:
            tr.train_step(images, index, tr.schedule.momentum(tr.step))
        sync()
        t0 = time.perf_counter()
        for images, index in data[warmup:]:
            tr.train_step(images, index, tr.schedule.momentum(tr.step))
        sync()
        return (len(data) - warmup) * tr.batch / (time.perf_counter() - t0)


def with_torch_pool(net: nn.Module) -> nn.Module:
    """The convnet with torch's nn.MaxPool2d(2) in place of mocolab's MaxPool2x2 (in place; returned)."""
    for module in list(net.modules()):
        for name, child in module.named_children():
            if isinstance(child, MaxPool2x2):
                setattr(module, name, nn.MaxPool2d(2))
    return net


def with_relu_before_pool(net: nn.Module) -> nn.Module:
    """The convnet's blocks as conv, BN, ReLU, pool (mocolab pools first: the same values on fewer elements)."""
    for seq in [m for m in net.modules() if isinstance(m, nn.Sequential)]:
        layers = list(seq)
        for i in range(len(layers) - 1):
            if isinstance(layers[i], (MaxPool2x2, nn.MaxPool2d)) and isinstance(layers[i + 1], nn.ReLU):
                layers[i], layers[i + 1] = layers[i + 1], layers[i]
        for i, layer in enumerate(layers):
            seq[i] = layer
    return net


def with_kornia_crop(augment: nn.Module) -> nn.Module:
    """The augmentation with kornia's own RandomResizedCrop, which crops image by image (in place; returned):
    mocolab's batched crop is a subclass, so its method is put back to kornia's."""
    import kornia.augmentation as K

    for module in augment.modules():
        if isinstance(module, K.RandomResizedCrop):
            module.apply_transform = types.MethodType(K.RandomResizedCrop.apply_transform, module)
    return augment
