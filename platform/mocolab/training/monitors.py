"""What a run watches besides its loss.

A monitor measures; the trainer records.  ``Trainer.train_step`` calls every monitor's step hooks and
keeps what ``after_backward`` returns in the epoch's per-step series; at an epoch's end ``run_training``
asks each for its fields of the ``EpochRecord``.  A new measurement is a new monitor, not a change to the
step.  The hooks, in the order a step calls them:

    before_step(record)                         record: this step's per-step metrics are kept
    after_forward(step, out, images, index)     the method has run; nothing is updated yet
    after_backward(record) -> {series: value}   gradients present (DDP-averaged), before the update
    end_epoch(step, main) -> {field: value}     after the epoch's last step and its kNN monitor

Monitors draw from no random stream and leave the encoders' modes as they were, so a run trains the same
with or without them.  The lines a run prints are not a monitor: ``loop.ConsoleProgress`` reads the
trainer, which holds the monitors.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from mocolab.method import collectives as mdist
from mocolab.method.queue_layouts import ShardedKeyQueue
from mocolab.config import Config
from mocolab.method.diagnostics import DriftProbes, age_histogram
from mocolab.evaluation.scoring import extract_features
from mocolab.data.augment import Normalise, centre_views, to_float
from mocolab.method.async_copy import to_device
from mocolab.method.protocol import Method, MethodOutput
from mocolab.data.sources import TrainSource
from mocolab.models.vision_transformer import PatchGradNorm

GRAD_NORM_FIRST = "grad_norm_first_layer"  # the per-step series of the first layer's gradient norm


class Monitor:
    """The hooks, each doing nothing: a monitor overrides those it needs."""

    def before_step(self, record: bool) -> None:
        pass

    def after_forward(self, step: int, out: MethodOutput, images: torch.Tensor, index: torch.Tensor | None) -> None:
        pass

    def after_backward(self, record: bool) -> dict[str, float | None]:
        return {}

    def end_epoch(self, step: int, main: bool) -> dict:
        return {}


class DriftMonitor(Monitor):
    """The dictionary's consistency (method/diagnostics.py): ages of the stored negatives, and key drift on probe
    slots, which are observed as each step writes them and measured at each epoch's end.

    The probes are part of a checkpoint (``state_dict``), so a resumed run measures what it would have.
    """

    def __init__(self, model: Method, source: TrainSource, cfg: Config, device: torch.device, *, rank: int,
                 batch: int) -> None:
        self.model, self.source, self.device = model, source, device
        store = model.dictionary
        self.probes = DriftProbes(store.slots, cfg.eval.drift_probes, cfg.model.dim, device=device) \
            if store is not None and cfg.eval.drift_probes else None
        self.normalise = Normalise(source.channels).to(device)  # for the probes' embeddings, on the device
        self.size = source.image_size  # the probes embed the evaluation's view of each image
        # a sharded queue's slots are this rank's own keys: each rank follows its own, without collectives
        self.local = isinstance(store, ShardedKeyQueue)
        self.offset = 0 if self.local else rank * batch  # this rank's images in a step's written slots

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Unit embeddings of un-augmented uint8 images by the encoder that writes the dictionary (the method's
        ``writer``: MoCo's key encoder), in eval mode (no RNG), on the host: an epoch's measurement."""
        return F.normalize(extract_features(self.model.writer, centre_views(images, self.size), self.device), dim=1)

    @torch.no_grad()
    def embed_on_device(self, images: torch.Tensor) -> torch.Tensor:
        """``embed`` left on the device (the same operations, so the same values): a step's probe hits,
        which must not wait for the device."""
        writer = self.model.writer
        was_training = writer.training
        writer.eval()
        try:
            x = centre_views(to_device(images, self.device), self.size)  # a whole-image canvas: its centre crop
            return F.normalize(writer(self.normalise(to_float(x))).float(), dim=1)
        finally:
            writer.train(was_training)

    def after_forward(self, step: int, out: MethodOutput, images: torch.Tensor, index: torch.Tensor | None) -> None:
        if self.probes is None or out.written is None or index is None:
            return
        self.probes.observe(out.written, self.offset, index, images, self.embed_on_device, step,
                            collective=not self.local)

    def ages(self, step: int) -> torch.Tensor:
        """Ages in steps of this rank's stored negatives as the next step sees them (empty: no store)."""
        store = self.model.dictionary
        return store.ages(step) if store is not None else torch.zeros(0)

    def diagnostics(self, step: int) -> dict:
        """The dictionary at ``step`` (this rank's copy): its age histogram and, per probe, age and cosines."""
        out: dict = {"step": step, "negatives": self.model.negatives, "age_histogram": age_histogram(self.ages(step))}
        if self.probes is not None:
            keys = self.model.dictionary.keys
            probes = self.probes.measure(step, self.source.images_at, self.embed,
                                         stored=keys[to_device(self.probes.slots, keys.device)])
            if probes is not None:
                out["probes"] = probes
        return out

    def end_epoch(self, step: int, main: bool) -> dict:
        """Staleness on every rank; the diagnostics and the drift they give on rank 0 only."""
        # v3 and in-batch negatives store nothing: every negative is this step's, so nothing is stale
        ages = self.ages(step)
        s_mean, s_max = (float(ages.mean()), float(ages.max())) if ages.numel() else (0.0, 0.0)
        diag = self.diagnostics(step) if main else {}
        drift, stored = mean_cosines(diag, self.model.dictionary is None)
        return {"staleness_mean": s_mean, "staleness_max": s_max, "drift_cos": drift, "stored_cos": stored,
                "diagnostics": diag}

    def state_dict(self) -> dict:
        return self.probes.state_dict() if self.probes is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.probes is not None and state:  # empty in a checkpoint of a run without probes
            self.probes.load_state_dict(state)


def mean_cosines(diag: dict, fresh_negatives: bool) -> tuple[float | None, float | None]:
    """(drift_cos, stored_cos) means over the probes.  Negatives computed by this step's encoder (in-batch,
    v3) are 1 by construction; a store whose probes were never written has no value yet."""
    if fresh_negatives:
        return (1.0, 1.0) if diag else (None, None)
    probes = diag.get("probes")
    if not probes:
        return None, None
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return mean(probes["drift_cos"]), (mean(probes["stored_cos"]) if "stored_cos" in probes else None)


def first_layer(backbone: nn.Module) -> nn.Module | None:
    """The first convolution or linear layer the images meet (a ViT's patch projection, a ResNet's conv1)."""
    if hasattr(backbone, "patch_embed"):
        return backbone.patch_embed
    return next((m for m in backbone.modules() if isinstance(m, (nn.Conv2d, nn.Linear))), None)


class FirstLayerGradNorm(Monitor):
    """‖∂loss/∂W‖ of the backbone's first layer on every step whose metrics are kept, averaged over ranks
    as DDP averages gradients: where instability starts (MoCo v3 freezes a ViT's patch projection for it).

    Most backbones' first layer is read from its ``.grad`` after backward.  A ViT's patch projection may be
    frozen, with no ``.grad`` to read, so ``PatchGradNorm`` computes it from hooks; they are attached only
    while a kept step's forward runs, so evaluation, checkpoints and export see a plain module.
    """

    def __init__(self, backbone: nn.Module) -> None:
        self.layer = first_layer(backbone)
        self.patch = PatchGradNorm(self.layer) if hasattr(backbone, "patch_embed") else None
        if self.patch is not None:
            self.patch.remove()

    def before_step(self, record: bool) -> None:
        if self.patch is not None:
            self.patch.grad = None
            if record:
                self.patch.attach()

    def after_forward(self, step: int, out: MethodOutput, images: torch.Tensor, index: torch.Tensor | None) -> None:
        if self.patch is not None:  # the forward's tensor hooks stay: backward still reaches them
            self.patch.remove()

    def after_backward(self, record: bool) -> dict[str, float | None]:
        return {GRAD_NORM_FIRST: self.norm()} if record else {}

    def norm(self) -> float | None:
        if self.patch is not None:
            g, self.patch.grad = self.patch.grad, None
            return None if g is None else float(mdist.mean_over_ranks(g).norm())
        w = getattr(self.layer, "weight", None)
        return float(w.grad.norm()) if w is not None and w.grad is not None else None
