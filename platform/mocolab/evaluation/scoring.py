"""A run's encoder scored on its data: the features of un-augmented images (``extract_features``), the kNN
monitor each epoch and, at the end, kNN (k = ``eval.knn_k`` and ``eval.knn_k_small``), the linear probe and
the low-label probes (``Evaluation``).  knn.py, probe.py and low_label.py work on any features;
evaluation/transfer.py scores saved encoders with them.  Every entry point runs in full float32
(``precision.full_fp32``), whatever training set.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from mocolab.data.augment import Normalise, to_float
from mocolab.evaluation.knn import knn_accuracies, knn_accuracy
from mocolab.evaluation.low_label import low_label_metric, low_label_probes, mean
from mocolab.evaluation.precision import full_fp32
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
    with native bf16 that makes the features cheaper while the kNN and probe scores stay within a few test
    images (benchmarks/RESULTS.md, "Time to a result: what a trial spends besides training"). None: float32.
    ``batch_size``: 256 keeps a convnet's activations in cache, which larger batches overflow
    (benchmarks/RESULTS.md, "Time to a result, second part: the evaluation, and Ray Train against torchrun").
    In eval mode a sample's features do not depend on its batch.
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
    """The end of a run: kNN and the probe on the test split, and on the validation split where there is one;
    the second kNN (k = ``knn_k_small``) and the low-label probes on the test split."""
    knn: float
    probe: ProbeResult
    val_knn: float | None = None
    val_linear: float | None = None
    knn_small: dict[int, float] = field(default_factory=dict)  # {k: top-1}; empty: eval.knn_k_small = 0
    low_label: dict[float, list[float]] = field(default_factory=dict)  # {fraction: top-1 of each draw}
    low_label_seconds: float = 0.0  # what the low-label probes cost, all fractions and draws
    online: float | None = None  # the online probe's head (training/online_probe.py) on the probe's test images

    def extra_metrics(self) -> dict[str, float]:
        """The final metrics beyond ``linear_top1`` and ``knn_top1``, by the names MLflow logs them under:
        ``knn20_top1``, ``linear_top1_1pct``, ``linear_top1_10pct`` (the mean over draws)."""
        out = {f"knn{k}_top1": v for k, v in self.knn_small.items()}
        out.update({low_label_metric(f): mean(tops) for f, tops in self.low_label.items()})
        if self.online is not None:
            out["online_linear_top1"] = self.online
        return out

    def low_label_text(self) -> str:
        """The low-label probes for a console line: each fraction's mean and its draws, in %."""
        return "; ".join(f"{100 * f:g} % of the labels {100 * mean(t):.2f}% (draws "
                         f"{', '.join(f'{100 * v:.2f}' for v in t)})" for f, t in self.low_label.items())


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
        self.last_final: FinalScores | None = None  # the latest final_scores: what a run logs at its end
        # the online probe's scorer (training/online_probe.py), given the features the monitor and the final
        # evaluation embed anyway; set by the trainer where the probe is on
        self.online: Callable[[torch.Tensor, torch.Tensor], float | None] | None = None
        self.last_online: float | None = None  # its score at the latest kNN monitor, on ``monitor_split``

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

    @full_fp32()
    def knn(self) -> float:
        """The per-epoch kNN monitor on ``monitor_split``."""
        e = self.cfg
        f_bank, l_bank = self.split_features("train", e.knn_bank)
        f_test, l_test = self.split_features(self.monitor_split, e.knn_test)
        self.last_online = self.online(f_test, l_test) if self.online is not None else None
        return knn_accuracy(f_bank, l_bank, f_test, l_test, self.source.classes, e.knn_k, e.knn_t,
                            device=self.device)

    def final_eval(self, progress: Callable[[str], None] | None = None,
                   embed: Embed | None = None) -> tuple[float, ProbeResult]:
        """(kNN top-1, the linear probe) on the test split: ``final_scores`` without the validation split."""
        scores = self.final_scores(progress, embed, validation=False)
        return scores.knn, scores.probe

    @full_fp32()
    def final_scores(self, progress: Callable[[str], None] | None = None, embed: Embed | None = None, *,
                     validation: bool = True) -> FinalScores:
        """kNN top-1 (k = ``knn_k`` and ``knn_k_small``), the linear probe and the low-label probes at the end,
        from one extraction of the features all of them read.

        The kNN bank and the probe's training images are both prefixes of one
        list of training images, so the numbers equal ``knn()`` and a separate probe.  The low-label probes
        fit on fixed class-balanced subsets of the probe's training images (``low_label.py``) and are
        scored on the probe's test images.
        ``embed``: what makes the features, by default the encoder (training/baselines.py passes raw pixels): every
        encoder and baseline is scored on the same images by the same kNN and probes.
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
        ks = (e.knn_k, e.knn_k_small) if e.knn_k_small else (e.knn_k,)
        knns = knn_accuracies(f_train[:n_bank], l_train[:n_bank], f_test[:n_test], l_test[:n_test],
                              data.classes, ks, e.knn_t, device=self.device)
        res = linear_probe(f_train[:n_lin], l_train[:n_lin], f_test[:n_lin_test], l_test[:n_lin_test],
                           data.classes, weight_decay=e.linear_wd, steps=e.linear_steps, device=self.device)
        t0 = time.perf_counter()
        low = low_label_probes(f_train[:n_lin], l_train[:n_lin], f_test[:n_lin_test], l_test[:n_lin_test],
                               data.classes, e.low_label, e.low_label_draws, weight_decay=e.low_label_wd,
                               steps=e.low_label_steps, device=self.device)
        scores = FinalScores(knns[e.knn_k], res, knn_small={k: knns[k] for k in ks[1:]}, low_label=low,
                             low_label_seconds=time.perf_counter() - t0)
        if self.online is not None and embed is None:  # the encoder's features, not a baseline's
            scores.online = self.online(f_test[:n_lin_test], l_test[:n_lin_test])
        if validation and self.validation:  # the same kNN bank and probe, on the held-out images
            f_val, l_val = self.split_features("val", None, embed)
            scores.val_knn = knn_accuracy(f_train[:n_bank], l_train[:n_bank], f_val, l_val, data.classes,
                                          e.knn_k, e.knn_t, device=self.device)
            scores.val_linear = res.score(f_val, l_val)
        if progress is not None and (scores.low_label or scores.knn_small):
            small = "".join(f"kNN k={k} top-1 {100 * v:.2f}%; " for k, v in scores.knn_small.items())
            probes = (f"linear probe on {scores.low_label_text()}, in {scores.low_label_seconds:.1f}s"
                      if scores.low_label else "")
            progress(f"evaluation: {small}{probes}".rstrip("; "))
        self.last_final = scores
        return scores
