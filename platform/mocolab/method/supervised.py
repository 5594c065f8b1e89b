"""The supervised bound: the same backbone, augmentation and budget as a MoCo run, trained with the labels.

Not a MoCo variant: no key encoder, no dictionary, no negatives. It is the top of the scale a reproduction
reads its claims against (docs/methods.md, "The supervised bound"): how much there is to learn about the
labels at a budget, scored by the same kNN monitor and linear probe on the frozen backbone as every run.

f_q is the config's backbone with a linear classifier on its features where the projection head would be
(``model.head``, ``model.dim`` and ``model.hidden`` are not read). The trainer drives it as any method: two
augmented views of each image, its position in the training set, the run's optimiser, schedule and steps.

    y = labels[index]                                 N   (a stand-in image takes the stand-in's label)
    loss = (CE(f_q(x1), y) + CE(f_q(x2), y)) / 2      f_q(x): N×classes logits

Both views, each in a forward of its own: the step draws two views of every image, and a bound that used one
would leave half of what it was given unread; a forward per view keeps batch norm on batches of B, as
MoCo's query encoder has them; the mean keeps a uniform guess at ln(classes), as for one view.

``method.name=supervised`` names it as it names an installed plugin (method/plugins.py, ``OWN``), and its
module joins the code fingerprint of the runs it trains only.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from mocolab.config.choices import STREAMABLE
from mocolab.data.batching import fill_unreadable
from mocolab.method.protocol import MethodOutput, MethodParts, encoder_autocast

if TYPE_CHECKING:
    from mocolab.config.schema import Config

__all__ = ["Supervised"]


class Supervised(nn.Module):
    """Cross-entropy of both views against the labels, as a ``Method`` (method/protocol.py)."""

    negatives = "none (supervised: labels)"
    key_encoder = dictionary = writer = shuffle_generator = None  # one encoder, nothing stored or shuffled

    def __init__(self, encoder: nn.Module, labels: torch.Tensor, encoder_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        classes = encoder.head.out_features
        if classes < 2:
            raise ValueError(f"supervised: {classes} classes; a classifier needs at least 2")
        if labels.ndim != 1 or labels.dtype != torch.int64 or bool((labels >= classes).any()):
            raise ValueError(f"supervised: labels must be int64, one per training image, below {classes} "
                             f"(negative: an unreadable file); got {labels.dtype} of shape {tuple(labels.shape)}, "
                             f"max {int(labels.max()) if labels.numel() else None}")
        self.encoder_q = encoder  # backbone + classifier: trained; its backbone evaluated and exported
        self.classes, self.encoder_dtype = classes, encoder_dtype
        self.damaged = bool((labels < 0).any())  # rows whose images the batches replace (data.batching.fill_unreadable)
        self.register_buffer("labels", labels, persistent=False)  # the data's, not the run's: never checkpointed
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    @classmethod
    def from_config(cls, cfg: Config, parts: MethodParts, options: None) -> Supervised:
        """The config's backbone (batch norm as ``moco.bn`` has it) under a linear classifier of its features."""
        if parts.labels is None or parts.classes is None:
            raise ValueError("data.loader: method.name=supervised reads the training labels from the set decoded "
                             "in memory, and this run's set is streamed; use data.loader=memory")
        if len(parts.labels) != parts.train_size:
            raise ValueError(f"supervised: {len(parts.labels)} labels for {parts.train_size} training images")
        built = parts.encoder()  # the trainer's encoder (backbone + head): the same kind, a classifier for a head
        classifier = type(built)(built.backbone, nn.Linear(built.backbone.out_dim, parts.classes))
        return cls(classifier, parts.labels, parts.encoder_dtype)

    @classmethod
    def check_config(cls, cfg: Config, options: None) -> None:
        """At the door (config.validate): a set that may stream has no labels for the method, and a shuffle of
        a key batch there is none of is refused, naming the field."""
        d = cfg.data
        if d.loader == "stream" or (d.loader == "auto" and d.name in STREAMABLE):
            streams = "streams" if d.loader == "stream" else f"may stream {d.name} sets (data.memory_budget_mb)"
            raise ValueError(f"data.loader: {d.loader!r} {streams}, and method.name=supervised reads the training "
                             f"labels from the set decoded in memory; use data.loader=memory")
        if cfg.moco.bn == "shuffle":
            raise ValueError("moco.bn: 'shuffle' shuffles MoCo's key batch across ranks, and the supervised bound "
                             "has no key encoder; use split, groups, sync or plain")

    def targets(self, index: torch.Tensor) -> torch.Tensor:
        """N labels of the images at ``index``; an unreadable file's row holds its batch's stand-in image, and
        takes the stand-in's label (the rule of ``fill_unreadable``, applied to the labels)."""
        y = self.labels[index]
        if self.damaged:
            y = fill_unreadable(y.cpu(), y.cpu() < 0).to(y.device)
        return y

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, index: torch.Tensor | None = None) -> MethodOutput:
        """Two views (N×C×H×W each) of the images at ``index``, their positions in the training set."""
        if index is None:
            raise ValueError("supervised: forward needs index, the images' positions in the training set (the "
                             "trainer passes it from the source's epoch_indexed)")
        y = self.targets(index)  # N
        with encoder_autocast(x1.device, self.encoder_dtype):
            z1, z2 = self.encoder_q(x1), self.encoder_q(x2)  # N×classes each
        z1, z2 = z1.float(), z2.float()
        loss = (F.cross_entropy(z1, y) + F.cross_entropy(z2, y)) / 2
        correct = torch.cat([z1.argmax(dim=1) == y, z2.argmax(dim=1) == y])  # 2N: top-1 of each view
        self.step += 1
        return MethodOutput(loss, correct, F.normalize(z1.detach(), dim=1))

    # ------------------------------------------------------------ what the trainer asks (method/protocol.py)
    def checkpoint_parts(self) -> dict[str, nn.Module]:
        return {}  # encoder_q and the step counter are all there is

    def describe(self, global_batch: int) -> str:
        return f"supervised bound: cross-entropy over {self.classes} classes on both views, no negatives"

    def uniform_loss(self, global_batch: int) -> float:
        """ln(classes): the cross-entropy of a uniform guess."""
        return math.log(self.classes)
