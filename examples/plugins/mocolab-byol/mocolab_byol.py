"""BYOL, Bootstrap Your Own Latent (Grill et al. 2020), as a mocolab method from outside the package.

The online network f_θ (backbone, projector, predictor q_θ) is trained; the target network f_ξ (backbone,
projector) is its exponential moving average, ξ ← m·ξ + (1 − m)·θ, never in an optimizer.  The online
network predicts the target's projection of the other view; the loss is the normalised squared error
2 − 2·cos, both ways round.  No negatives: what keeps it from collapsing is the predictor and the slow target.

mocolab builds the encoders from ``model.*`` (its two-layer predictor, batch norm and ReLU between, is
BYOL's), sets m each step from ``moco.m`` and ``moco.m_schedule`` (BYOL's τ: base 0.996, ``cosine`` to 1),
and scores the backbone by kNN and linear probe as for every method.  ``moco.tau`` and ``queue.*`` are not
read.  Its own fields, ``method.byol.*`` (``Options``):

- ``symmetric`` (true): each view predicts the other's target and the two losses are summed, as the paper;
  false: view 1 predicts view 2 only, half the forward passes.
- ``predictor`` (true): false drops q_θ, the ablation in which the paper reports collapse.

Installed (``pip install -e examples/plugins/mocolab-byol``), ``mocolab train --set method.name=byol``
trains it: its pyproject.toml declares the entry point ``byol`` in the group ``mocolab.methods``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from mocolab.method.protocol import MethodOutput, MethodParts, encoder_autocast

if TYPE_CHECKING:
    from mocolab.config import Config


@dataclass
class Options:
    """BYOL's own fields, ``method.byol.<field>`` (``method.BYOL.<field>`` when named as mocolab_byol:BYOL)."""

    symmetric: bool = True  # both views predict the other's target (the paper); false: view 1 -> view 2 only
    predictor: bool = True  # false: no q_θ on the online network (the collapse ablation)


def regression_loss(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """BYOL's loss of predictions ``p`` against targets ``z`` (N×C each, unit rows): mean ‖p − z‖² = 2 − 2·cos."""
    return (2 - 2 * (p * z).sum(dim=1)).mean()


def nearest_is_own(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """N bools: prediction i is at least as close to its own target as to any other image's in the batch."""
    sim = p @ z.T  # N×N
    return sim.diagonal() >= sim.max(dim=1).values


class BYOL(nn.Module):
    """BYOL as a mocolab ``Method``: ``encoder_q`` is f_θ, ``encoder_k`` (``key_encoder``) is f_ξ."""

    Options = Options
    negatives = "none (BYOL)"
    dictionary = writer = shuffle_generator = None  # nothing stored, no key batch shuffled

    def __init__(self, online: nn.Module, target: nn.Module, m: float = 0.99, symmetric: bool = True,
                 encoder_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not 0.0 <= m < 1.0:
            raise ValueError(f"moco.m: {m} is out of range; allowed [0, 1)")
        self.encoder_q = online  # f_θ: trained, evaluated and exported
        self.encoder_k = target  # f_ξ: the EMA of f_θ's backbone and projector
        for p in self.encoder_k.parameters():
            p.requires_grad_(False)
        self.m, self.symmetric, self.encoder_dtype = m, symmetric, encoder_dtype
        self.predicts = getattr(online, "predictor", None) is not None  # mocolab's Encoder: q_θ or None
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    @classmethod
    def from_config(cls, cfg: Config, parts: MethodParts, options: Options) -> BYOL:
        """f_θ with the predictor, f_ξ a copy of it without (then its EMA)."""
        online = parts.encoder(predictor=options.predictor)
        return cls(online, online.without_predictor(), m=cfg.moco.m, symmetric=options.symmetric,
                   encoder_dtype=parts.encoder_dtype)

    @classmethod
    def check_config(cls, cfg: Config, options: Options) -> None:
        if cfg.moco.bn == "shuffle":
            raise ValueError("moco.bn: 'shuffle' shuffles MoCo's key batch across ranks, and BYOL's target has no "
                             "negatives for batch norm to leak into; use split, groups, sync or plain")

    @torch.no_grad()
    def momentum_update(self) -> None:
        """ξ ← m·ξ + (1 − m)·θ, parameters paired by name (f_θ's predictor has no partner; DDP unwrapped)."""
        online = dict(getattr(self.encoder_q, "module", self.encoder_q).named_parameters())
        for name, xi in self.encoder_k.named_parameters():
            xi.mul_(self.m).add_(online[name].detach(), alpha=1.0 - self.m)

    @torch.no_grad()
    def targets(self, x: torch.Tensor) -> torch.Tensor:
        """f_ξ's projections of a view: N×C, unit rows, no gradient."""
        with encoder_autocast(x.device, self.encoder_dtype):
            z = self.encoder_k(x)
        return F.normalize(z.float(), dim=1)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, index: torch.Tensor | None = None) -> MethodOutput:
        """Two views (N×C×H×W each); ``index`` is not read (nothing is stored)."""
        views = (x1, x2) if self.symmetric else (x1,)
        with encoder_autocast(x1.device, self.encoder_dtype):
            p = [F.normalize(self.encoder_q(x).float(), dim=1) for x in views]  # predictions q_θ(z_θ): N×C
        self.momentum_update()  # as after the previous step's optimizer step, before the targets
        z2 = self.targets(x2)
        loss, correct = regression_loss(p[0], z2), nearest_is_own(p[0], z2)
        if self.symmetric:
            z1 = self.targets(x1)
            loss = loss + regression_loss(p[1], z1)
            correct = torch.cat([correct, nearest_is_own(p[1], z1)])
        self.step += 1
        return MethodOutput(loss, correct, z2)

    # ------------------------------------------------------------ what the trainer asks (method/protocol.py)
    @property
    def key_encoder(self) -> nn.Module:
        return self.encoder_k

    def checkpoint_parts(self) -> dict[str, nn.Module]:
        return {"encoder_k": self.encoder_k}

    def describe(self, global_batch: int) -> str:
        return (f"BYOL: no negatives, an EMA target, {'symmetric' if self.symmetric else 'one-way'} loss"
                + ("" if self.predicts else ", no predictor"))

    def uniform_loss(self, global_batch: int) -> float:
        """2 per direction: 2 − 2·cos of unrelated directions. The loss is at most 4 a direction, so only a
        non-finite loss reaches ten times this (the trainer's divergence)."""
        return 2.0 * (2 if self.symmetric else 1)
