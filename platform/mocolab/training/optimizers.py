"""The optimisers a MoCo recipe names (``optim.name``): SGD (v1/v2), AdamW (v3 with a ViT), LARS (v3 with a
ResNet at large batch).

Only parameters that train are handed over: a frozen patch projection
(``vit.freeze_patch_embed``) is invisible to the optimiser, so neither weight
decay nor moment estimates can move it.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from mocolab.config.choices import OPTIMIZERS  # noqa: F401  (optim.name: config/choices.py)


class LARS(torch.optim.Optimizer):
    """SGD with momentum whose step for each weight matrix is rescaled by η·‖w‖/‖g + λw‖ (You et al. 2017).

    As in MoCo v3: weight decay and the trust ratio apply to parameters with more than one dimension
    (weights of linear and convolution layers); biases and normalisation scales take plain momentum steps.
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: float, weight_decay: float = 0.0,
                 momentum: float = 0.9, trust_coefficient: float = 0.001) -> None:
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum,
                                      trust_coefficient=trust_coefficient))

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 - torch's signature
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                update = p.grad
                if p.ndim > 1:
                    update = update.add(p, alpha=group["weight_decay"])
                    w_norm, u_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(update)
                    ratio = group["trust_coefficient"] * w_norm / u_norm
                    # a zero weight or a zero update: no rescaling (ratio 1)
                    update = update * torch.where((w_norm > 0) & (u_norm > 0), ratio, torch.ones_like(ratio))
                state = self.state[p]
                if "mu" not in state:
                    state["mu"] = torch.zeros_like(p)
                mu = state["mu"]
                mu.mul_(group["momentum"]).add_(update)
                p.add_(mu, alpha=-group["lr"])
        return loss


def build_optimizer(name: str, module: nn.Module, lr: float, *, momentum: float = 0.9,
                    weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """``optim.name`` over the module's trainable parameters; ``momentum`` is SGD's and LARS's (AdamW keeps
    its default betas, as the MoCo v3 reference does)."""
    params = [p for p in module.parameters() if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "lars":
        return LARS(params, lr=lr, weight_decay=weight_decay, momentum=momentum)
    raise ValueError(f"optim.name: unknown value {name!r}; choose one of {list(OPTIMIZERS)}")
