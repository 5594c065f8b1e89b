"""InfoNCE, the contrastive loss of MoCo: its own module so the queue layouts can share it."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def info_nce(l_pos: torch.Tensor, l_neg: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy over [l_pos, l_neg] / tau with the positive at index 0.

    l_pos: N×1, l_neg: N×K.  Returns (loss, logits N×(1+K)).
    """
    logits = torch.cat([l_pos, l_neg], dim=1) / tau
    labels = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits, labels), logits
