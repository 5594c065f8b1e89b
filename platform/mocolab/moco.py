"""Momentum Contrast, as in He et al. 2020 (Algorithm 1), one screen long.

f_q is trained by SGD; f_k is its exponential moving average, updated under
``no_grad`` before the key forward pass, never in an optimizer.  Negatives
come from a FIFO queue of past keys.  ``forward`` reads as the paper's
pseudo-code.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .moco_loss import info_nce  # noqa: F401  (re-exported: the loss belongs to the method)
from .norm import LocalShuffle, NoShuffle
from .queue import KeyQueue


@dataclass
class MoCoOutput:
    loss: torch.Tensor
    correct: torch.Tensor  # N bools: the query's own key beat every negative
    keys: torch.Tensor  # N×C, already enqueued

    @property
    def pretext_accuracy(self) -> float:
        """Fraction of queries whose own key beats every negative (instance discrimination)."""
        return float(self.correct.float().mean())


class MoCo(nn.Module):
    def __init__(self, encoder_q: nn.Module, queue: KeyQueue, m: float = 0.999, tau: float = 0.2,
                 shuffler: LocalShuffle | NoShuffle | None = None, encoder_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not 0.0 <= m < 1.0:
            raise ValueError(f"moco.m: {m} is out of range; allowed [0, 1)")
        if tau <= 0:
            raise ValueError(f"moco.tau: {tau} must be > 0")
        self.encoder_q = encoder_q
        self.encoder_k = copy.deepcopy(encoder_q)
        for p in self.encoder_k.parameters():
            p.requires_grad_(False)
        self.queue = queue
        self.m, self.tau = m, tau
        self.shuffler = shuffler if shuffler is not None else NoShuffle()
        # Encoders may run under bf16 autocast; embeddings, logits and the loss stay float32.
        self.encoder_dtype = encoder_dtype
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    def _autocast(self, x: torch.Tensor):
        return torch.autocast(x.device.type, dtype=self.encoder_dtype or torch.float32,
                              enabled=self.encoder_dtype is not None)

    @torch.no_grad()
    def momentum_update(self) -> None:
        """θ_k ← m·θ_k + (1−m)·θ_q over parameters; f_k's BN statistics stay its own, as in the reference."""
        for p_k, p_q in zip(self.encoder_k.parameters(), self.encoder_q.parameters()):
            p_k.mul_(self.m).add_(p_q.detach(), alpha=1.0 - self.m)

    @torch.no_grad()
    def compute_keys(self, im_k: torch.Tensor) -> torch.Tensor:
        """Keys on a shuffled batch (BN sees other sub-batches than the queries), then unshuffled."""
        x, restore = self.shuffler.shuffle(im_k)
        with self._autocast(x):
            k = self.encoder_k(x)
        k = F.normalize(k.float(), dim=1)  # keys: N×C
        return self.shuffler.unshuffle(k, restore)

    def forward(self, im_q: torch.Tensor, im_k: torch.Tensor) -> MoCoOutput:
        with self._autocast(im_q):
            q = self.encoder_q(im_q)
        q = F.normalize(q.float(), dim=1)  # queries: N×C
        self.momentum_update()
        k = self.compute_keys(im_k)  # keys: N×C, no gradient
        l_pos = (q * k).sum(dim=1, keepdim=True)  # N×1
        loss, correct = self.queue.contrast(q, l_pos, self.tau)  # against N×K negatives, wherever they live
        self.queue.enqueue(k, int(self.step))
        self.step += 1
        return MoCoOutput(loss, correct, k)
