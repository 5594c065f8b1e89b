"""A linear probe trained during pre-training: the curve of linear accuracy a run draws epoch by epoch.

The offline probe (evaluation/probe.py) scores an encoder once, at the end; a researcher watching a run
wants to see it learn.  The online probe is a linear head on the query's backbone features (before the
projection head), detached, so no gradient reaches the encoder; trained on each training batch's labels
with an optimizer of its own, and scored on the features the epoch's kNN monitor has already embedded
(the validation split where one is held out, else the monitor's test images: a curve only, nothing is
chosen by it).  The same seed trains the same encoder with the probe on or off: it draws from no random
stream (its head starts at zero) and reads no device value during a step.

It trains on rank 0's batches only (the other ranks' features stay where they are: no collective), which
are a 1/W sample of the global batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mocolab.method.protocol import MethodOutput
from mocolab.method.async_copy import to_device
from mocolab.training.monitors import Monitor

ONLINE_LR = 1e-3  # Adam: its steps do not depend on the features' scale, which differs between backbones


class OnlineProbe(Monitor):
    """A linear head on the query encoder's backbone features, trained step by step beside the encoder.

    ``backbone``: the query encoder's backbone, whose output a forward hook keeps (its first call in a
    step: the query view); ``labels_at``: training labels by position (below 0: an unreadable image, ignored).
    """

    def __init__(self, backbone: nn.Module, labels_at, classes: int, device: torch.device) -> None:
        self.backbone, self.labels_at, self.device = backbone, labels_at, device
        self.head: nn.Linear | None = None  # made at the first step, when the features' width is known
        self.optimizer: torch.optim.Optimizer | None = None
        self.classes = classes
        self.features: torch.Tensor | None = None
        self.hook = None  # a forward hook on the backbone, held only from a step's start to its first call

    def _keep(self, module: nn.Module, args, output: torch.Tensor) -> None:
        """The step's first backbone call is the query's: its features kept, and the hook removed (so the
        module carries no hook into a copy, an export or an evaluation)."""
        self.features = output.detach().to(torch.float32, copy=True).flatten(1)
        self._unhook()

    def _unhook(self) -> None:
        if self.hook is not None:
            self.hook.remove()
            self.hook = None

    def _build(self, width: int) -> None:
        # zeros, not torch's random init, which would draw from the global generator: the run's augment stream
        self.head = nn.utils.skip_init(nn.Linear, width, self.classes, device=self.device)
        with torch.no_grad():
            self.head.weight.zero_()
            self.head.bias.zero_()
        self.optimizer = torch.optim.Adam(self.head.parameters(), lr=ONLINE_LR)

    def before_step(self, record: bool) -> None:
        self._unhook()
        self.features = None
        self.hook = self.backbone.register_forward_hook(self._keep)

    def after_forward(self, step: int, out: MethodOutput, images: torch.Tensor, index: torch.Tensor | None) -> None:
        self._unhook()
        feats, self.features = self.features, None
        if feats is None or index is None:
            return
        if self.head is None:
            self._build(feats.shape[1])
        labels = to_device(self.labels_at(index).clamp(min=-1), self.device)  # an unreadable image's: < 0
        feats = feats[:len(labels)]  # a method that encodes both views in one call (in-batch) puts the query's first
        with torch.enable_grad():  # the step's autocast ended with the method's forward: the head runs in fp32
            loss = F.cross_entropy(self.head(feats), labels, ignore_index=-1)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        self.optimizer.step()

    @torch.no_grad()
    def score(self, features: torch.Tensor, labels: torch.Tensor) -> float | None:
        """Top-1 of the head on evaluation features (N×D, on the host) and their labels; None before the
        head has trained a step."""
        if self.head is None or len(labels) == 0:
            return None
        logits = self.head(to_device(features.float(), self.device))
        return float((logits.argmax(dim=1).cpu() == labels).float().mean())

    def state_dict(self) -> dict:
        if self.head is None:
            return {}
        return {"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if not state:  # the probe had not trained a step, or a checkpoint of a run without it
            return
        self._build(state["head"]["weight"].shape[1])
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
