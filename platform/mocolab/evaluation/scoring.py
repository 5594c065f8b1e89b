"""A run's encoder scored on its data: the features of un-augmented images (``extract_features``), the kNN
monitor each epoch and kNN with the linear probe at the end (``Evaluation``).  knn.py and probe.py work on
any features; evaluation/transfer.py scores saved encoders with them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from mocolab.data.augment import Normalise, to_float
from mocolab.evaluation.knn import knn_accuracy
from mocolab.evaluation.probe import ProbeResult, linear_probe
from mocolab.method.protocol import encoder_autocast

if TYPE_CHECKING:
    from mocolab.config import EvalConfig
    from mocolab.data.sources import TrainSource

Embed = Callable[[torch.Tensor], torch.Tensor]  # uint8 images -> features


@torch.no_grad()
def extract_features(backbone: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor,
                     device: torch.device | str = "cpu", batch_size: int = 256,
                     dtype: torch.dtype | None = None) -> torch.Tensor:
    """uint8 N×C×H×W -> float32 N×D features in eval mode (BN uses running statistics).

    ``dtype``: the backbone runs under autocast to it, as training does (``run.precision``). On a CPU
    with native bf16 that makes a cpu-quick evaluation's features 2.3x faster, and its kNN and probe move
    by at most 8 of 10,000 test images over six encoders (benchmarks/eval_precision.py). None: float32.
    ``batch_size``: 256 keeps a convnet's activations in cache; 1024 ran 2.7x slower on one CPU thread
    (benchmarks/trial_overhead.py). In eval mode a sample's features do not depend on its batch.
    """
    module = backbone if isinstance(backbone, nn.Module) else None
    was_training = module.training if module is not None else False
    if module is not None:
        module.eval()
    norm = Normalise(images.shape[1]).to(device)
    out = []
    try:
        for i in range(0, images.shape[0], batch_size):
            x = norm(to_float(images[i:i + batch_size].to(device)))
            with encoder_autocast(torch.device(device), dtype):
                out.append(backbone(x).float().cpu())
    finally:
        if module is not None:
            module.train(was_training)
    return torch.cat(out) if out else torch.empty(0)










@dataclass
class FinalScores:
    """The end of a run: kNN and the probe on the test split, and on the validation split where there is one."""
    knn: float
    probe: ProbeResult
    val_knn: float | None = None
    val_linear: float | None = None


def scored_test_images(e: EvalConfig) -> int | None:
    """How many test images the final kNN and probe read (None: all). Both score prefixes of one list of
    test images, so only the longer prefix is embedded: a preset that scores on fewer images than the
    split holds (smoke) skips the rest of the split's forward passes."""
    if e.knn_test is None or e.linear_test is None:
        return None
    return max(e.knn_test, e.linear_test)


class Evaluation:
    """A run's encoder scored on its data source's evaluation images: the kNN monitor after an epoch, and kNN
    with the linear probe at the end.

    ``validation``: a validation split is held out (``data.val_size``); the monitor then reads it, so the
    test split is scored once, at the end.  ``dtype``: the run's precision, so the features are the ones
    training sees (``extract_features``).
    """

    def __init__(self, encoder: nn.Module, source: TrainSource, cfg: EvalConfig, *, device: torch.device,
                 dtype: torch.dtype | None = None, validation: bool = False) -> None:
        self.encoder, self.source, self.cfg = encoder, source, cfg
        self.device, self.dtype, self.validation = device, dtype, validation

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Backbone features of uint8 images, in eval mode at the run's precision."""
        return extract_features(self.encoder.backbone, images, self.device, dtype=self.dtype)

    def backbone_copy(self) -> nn.Module:
        """A float32 CPU copy of the backbone: what is exported, detached from the training run."""
        return copy.deepcopy(self.encoder.backbone).float().cpu()

    def split_features(self, split: str, n: int | None,
                       embed: Embed | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Features and labels of a split's evaluation images, batch by batch: only features are kept.
        ``embed``: uint8 images to features, by default the encoder's (a baseline passes its own)."""
        embed = embed or self.features
        feats, labels = [], []
        for images, lab in self.source.eval_split(split, n):
            feats.append(embed(images))
            labels.append(lab)
        return torch.cat(feats), torch.cat(labels)

    @property
    def monitor_split(self) -> str:
        """The split the per-epoch monitor reads: the validation split where one is held out, else the test."""
        return "val" if self.validation else "test"

    def knn(self) -> float:
        """The per-epoch kNN monitor on ``monitor_split``."""
        e = self.cfg
        f_bank, l_bank = self.split_features("train", e.knn_bank)
        f_test, l_test = self.split_features(self.monitor_split, e.knn_test)
        return knn_accuracy(f_bank, l_bank, f_test, l_test, self.source.classes, e.knn_k, e.knn_t,
                            device=self.device)

    def final_eval(self, progress: Callable[[str], None] | None = None,
                   embed: Embed | None = None) -> tuple[float, ProbeResult]:
        """(kNN top-1, the linear probe) on the test split: ``final_scores`` without the validation split."""
        scores = self.final_scores(progress, embed, validation=False)
        return scores.knn, scores.probe

    def final_scores(self, progress: Callable[[str], None] | None = None, embed: Embed | None = None, *,
                     validation: bool = True) -> FinalScores:
        """kNN top-1 and the linear probe at the end, from one extraction of the features both read.

        The kNN bank and the probe's training images are both prefixes of one
        list of training images, so the numbers equal ``knn()`` and a separate probe.
        ``embed``: what makes the features, by default the encoder (baselines.py passes raw pixels): every
        encoder and baseline is scored on the same images by the same kNN and probe.
        """
        e, data = self.cfg, self.source
        n_bank = min(e.knn_bank or data.size, data.size)
        n_lin = min(e.linear_train or data.size, data.size)
        f_train, l_train = self.split_features("train", max(n_bank, n_lin), embed)
        f_test, l_test = self.split_features("test", scored_test_images(e), embed)
        n_test = min(e.knn_test or len(l_test), len(l_test))
        n_lin_test = min(e.linear_test or len(l_test), len(l_test))
        if progress is not None:
            progress(f"evaluation: kNN bank {data.describe_eval('train', n_bank)} training images, "
                     f"linear probe trained on {data.describe_eval('train', n_lin)}, tested on "
                     f"{data.describe_eval('test', n_lin_test)} test images (kNN on "
                     f"{data.describe_eval('test', n_test)})")
        knn = knn_accuracy(f_train[:n_bank], l_train[:n_bank], f_test[:n_test], l_test[:n_test],
                           data.classes, e.knn_k, e.knn_t, device=self.device)
        res = linear_probe(f_train[:n_lin], l_train[:n_lin], f_test[:n_lin_test], l_test[:n_lin_test],
                           data.classes, weight_decay=e.linear_wd, steps=e.linear_steps, device=self.device)
        scores = FinalScores(knn, res)
        if validation and self.validation:  # the same kNN bank and probe, on the held-out images
            f_val, l_val = self.split_features("val", None, embed)
            scores.val_knn = knn_accuracy(f_train[:n_bank], l_train[:n_bank], f_val, l_val, data.classes,
                                          e.knn_k, e.knn_t, device=self.device)
            scores.val_linear = res.score(f_val, l_val)
        return scores
