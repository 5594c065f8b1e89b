"""What the trainer asks of a method: the interface every method implements (method/registry.py picks one).

A ``Method`` is an ``nn.Module`` whose ``forward(x1, x2, index)`` takes two
augmented views of the batch and returns a ``MethodOutput``; beyond that it
answers what the trainer would otherwise learn by asking which class it holds:
is there a key encoder (whose momentum the schedule sets), a dictionary (whose
ages and drift the diagnostics follow), which encoder writes it, what goes in
a checkpoint, and how to describe it in one line.  The built-in methods:

    name          class                                   key encoder   dictionary
    queue         moco.MoCo (v1, v2)                      EMA of f_q    the queue of K keys
    v3            moco.MoCoV3                             EMA of f_q    none: the global batch's keys
    memory_bank   negative_sources.MemoryBankContrast     none          one entry per training image
    in_batch      negative_sources.InBatchContrast        none          none: the global batch's views

``method.name=supervised`` (supervised.Supervised, the reproduction's supervised bound: the labels, no
negatives) goes the plugins' way, as mocolab's own.  Methods from outside the package implement it too:
method/plugins.py checks a plugin against it when it is loaded (docs/methods.md, "Your own method";
examples/plugins/mocolab-byol is BYOL).

This module imports no method, so each method's module imports it and the
registry (method/registry.py) imports them: the arrows run one way.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Protocol

import torch
from torch import nn

__all__ = ["Dictionary", "Method", "MethodOutput", "MethodParts"]


@dataclass
class MethodOutput:
    """What every method's ``forward`` returns: the loss and what the monitors read."""
    loss: torch.Tensor
    correct: torch.Tensor  # N bools: the query's own key beat every negative
    keys: torch.Tensor  # N×C, already enqueued (a bank: the queries written; in-batch, v3: one view's)
    # the dictionary slots this step wrote, in the order of the gathered global batch (a sharded queue:
    # this rank's slots for its own batch); None where nothing is stored (v3, in-batch negatives)
    written: torch.Tensor | None = None

    @property
    def pretext_accuracy(self) -> float:
        """Fraction of queries whose own key beats every negative (instance discrimination)."""
        return float(self.correct.float().mean())


class Dictionary(Protocol):
    """Stored negatives (queue.KeyQueue and its layouts, negatives.MemoryBank), as the diagnostics read them."""

    slots: int  # entries this process holds: the drift probes spread over them

    @property
    def keys(self) -> torch.Tensor: ...  # slots×C, the stored embeddings (a probe's stored_cos)

    def ages(self, step: int) -> torch.Tensor: ...  # steps since each written entry was written


class Method(Protocol):
    """A self-supervised method as training/trainer.py drives it (an ``nn.Module``: ``to``, ``train``, ``state_dict``).

    Members, and who needs them:

    - ``encoder_q``: the encoder trained by the optimizer, evaluated and exported; the trainer wraps it
      in DDP in place (the state-dict keys ``encoder_q.*`` are a checkpoint's).
    - ``step``: a buffer counting forwards (the checkpoint's ``moco_step``; queue and bank writes are
      stamped with it).
    - ``negatives``: where the negatives come from, as the diagnostics name it.
    - ``key_encoder``: the key encoder (the EMA of the query encoder), or None.  A method that has one reads its EMA
      momentum from an attribute ``m``, which the trainer sets before each step (``moco.m_schedule``).
    - ``dictionary``: the stored negatives (a ``Dictionary``), or None where every negative is this step's.
    - ``writer``: the encoder whose embeddings the dictionary stores (the key drift is measured on it): the
      key encoder for MoCo's queue, the query encoder for the memory bank; None with no dictionary.
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
    # the training set's labels by position, as ``forward``'s index counts (after data.val_size and data.subset;
    # negative in an unreadable file's row), for a method trained with them (supervised.py); None where the
    # source holds none in memory (a streamed set)
    labels: torch.Tensor | None = None
    classes: int | None = None  # the training set's classes


def encoder_autocast(device: torch.device, dtype: torch.dtype | None) -> ContextManager:
    """The encoders' autocast to ``dtype`` (``run.precision``); no context at all for float32, so a step also
    runs on devices autocast does not know (``meta``, where the device rules are tested)."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
