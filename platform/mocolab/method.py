"""What the trainer asks of a method, and the one place that picks a method for a config.

A ``Method`` is an ``nn.Module`` whose ``forward(x1, x2, index)`` takes two
augmented views of the batch and returns a ``MethodOutput``; beyond that it
answers the questions loop.py used to answer by asking which class it held:
is there a key encoder (whose momentum the schedule sets), a dictionary (whose
ages and drift the diagnostics follow), which encoder writes it, what goes in
a checkpoint, and how to describe it in one line.  Four methods implement it:

    name          class                            key encoder   dictionary
    queue         moco.MoCo (v1, v2)               f_k (EMA)     the queue of K keys
    v3            moco.MoCoV3                      f_k (EMA)     none: the global batch's keys
    memory_bank   negatives.MemoryBankContrast     none          one entry per training image
    in_batch      negatives.InBatchContrast        none          none: the global batch's views

``build_method`` picks by ``moco.version`` where the version names a method of
its own (v3), else by ``moco.negatives``.  Adding a method (BYOL, say) is one
file with its module and a ``from_config(cfg, parts)``, one line in
``METHODS`` and its name in choices.py; tests/method/test_method_contract.py then checks it
with the other four.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch import nn

from .config import Config
from .moco import MethodOutput, MoCo, MoCoV3
from .negatives import InBatchContrast, MemoryBankContrast

__all__ = ["METHODS", "Dictionary", "Method", "MethodOutput", "MethodParts", "build_method", "method_name"]


class Dictionary(Protocol):
    """Stored negatives (queue.KeyQueue and its layouts, negatives.MemoryBank), as the diagnostics read them."""

    slots: int  # entries this process holds: the drift probes spread over them

    @property
    def keys(self) -> torch.Tensor: ...  # slots×C, the stored embeddings (a probe's stored_cos)

    def ages(self, step: int) -> torch.Tensor: ...  # steps since each written entry was written


class Method(Protocol):
    """A self-supervised method as loop.py drives it (an ``nn.Module``: ``to``, ``train``, ``state_dict``).

    Members, and who needs them:

    - ``encoder_q``: the encoder trained by the optimizer, evaluated and exported; the trainer wraps it
      in DDP in place (the state-dict keys ``encoder_q.*`` are a checkpoint's).
    - ``step``: a buffer counting forwards (the checkpoint's ``moco_step``; queue and bank writes are
      stamped with it).
    - ``negatives``: where the negatives come from, as the diagnostics name it.
    - ``key_encoder``: the momentum encoder, or None.  A method that has one reads its EMA momentum from
      an attribute ``m``, which the trainer sets before each step (``moco.m_schedule``).
    - ``dictionary``: the stored negatives (a ``Dictionary``), or None where every negative is this step's.
    - ``writer``: the encoder whose embeddings the dictionary stores (the key drift is measured on it),
      or None with no dictionary.
    - ``shuffle_generator``: the key batch's own shuffle generator (``moco.bn=shuffle``), checkpointed as
      ``shuffle_rng``; None where the method draws none of its own.
    - ``checkpoint_parts()``: the stateful parts besides ``encoder_q``, by their names in a trainer
      checkpoint (``encoder_k``, ``queue``, ``bank``): saved and restored one by one, unwrapped from DDP.
    - ``describe(global_batch)``: the dictionary in a few words, for the run's first console line.
    - ``uniform_loss(global_batch)``: the loss of a uniform guess; ten times it is divergence.
    """

    encoder_q: nn.Module
    step: torch.Tensor
    negatives: str

    @property
    def key_encoder(self) -> nn.Module | None: ...

    @property
    def dictionary(self) -> Dictionary | None: ...

    @property
    def writer(self) -> nn.Module | None: ...

    @property
    def shuffle_generator(self) -> torch.Generator | None: ...

    def checkpoint_parts(self) -> dict[str, nn.Module]: ...

    def describe(self, global_batch: int) -> str: ...

    def uniform_loss(self, global_batch: int) -> float: ...

    def __call__(self, x1: torch.Tensor, x2: torch.Tensor, index: torch.Tensor | None = None) -> MethodOutput: ...


@dataclass
class MethodParts:
    """What a method's ``from_config`` takes besides the config: what only the trainer knows."""

    # predictor -> a fresh f_q drawing its initial weights from the global generator (the trainer seeds it);
    # batch norm already converted for moco.bn=sync on the run's device
    encoder: Callable[..., nn.Module]
    train_size: int  # images in the training set (a memory bank holds one entry each)
    batch: int  # this rank's batch B (a queue is built for the global batch B·W)
    encoder_dtype: torch.dtype | None = None  # bf16 autocast for the encoders; None: float32


# name -> builder; one line a method
METHODS: dict[str, Callable[[Config, MethodParts], Method]] = {
    "queue": MoCo.from_config,  # moco.py: v1 and v2
    "v3": MoCoV3.from_config,  # moco.py
    "memory_bank": MemoryBankContrast.from_config,  # negatives.py
    "in_batch": InBatchContrast.from_config,  # negatives.py
}


def method_name(cfg: Config) -> str:
    """The registry's name for a config: ``moco.version`` where it names a method (v3), else ``moco.negatives``
    (v1 and v2 differ in their recipe, not their algorithm)."""
    return cfg.moco.version if cfg.moco.version in METHODS else cfg.moco.negatives


def build_method(cfg: Config, parts: MethodParts) -> Method:
    """The method the config asks for, on the CPU (the trainer moves it)."""
    name = method_name(cfg)
    if name not in METHODS:
        raise ValueError(f"moco.negatives: {name!r} names no method; allowed {', '.join(METHODS)}")
    return METHODS[name](cfg, parts)
