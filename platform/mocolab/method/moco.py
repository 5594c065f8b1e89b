"""Momentum Contrast, as in He et al. 2020 (Algorithm 1), one screen long; MoCo v3 beside it.

The query encoder f_q is trained by SGD; the key encoder f_k is its exponential moving average, updated under
``no_grad`` before the key forward pass, never in an optimizer.  Negatives
come from a FIFO queue of past keys.  ``forward`` reads as the paper's
pseudo-code; with ``symmetric`` (``moco.symmetric``) it also scores the second
view's queries against the first view's keys, against the same queue, and
averages the two directions.  ``MoCoV3`` (Chen, Xie, He 2021) keeps the key encoder and
drops the queue: the other view's keys of the whole global batch are the
dictionary, both views are queries, and a predictor sits on the query branch.

Both are ``Method``s (method/protocol.py): besides ``forward`` they say what they hold
(``key_encoder``, ``dictionary``, ``writer``, ``checkpoint_parts``) so the
trainer need not ask which one it has.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from mocolab.method import rng
from mocolab.config.choices import VERSIONS  # noqa: F401  (moco.version: config/choices.py)
from mocolab.method.queue_layouts import build_queue
from mocolab.method.shuffle import build_shuffler
from mocolab.method.collectives import gather_no_grad, rank_and_world
from mocolab.method.losses import v3_info_nce
from mocolab.method.shuffle import LocalShuffle, NoShuffle
from mocolab.method.key_queue import KeyQueue, KeySnapshot

from mocolab.method.protocol import MethodOutput, MethodParts, encoder_autocast

if TYPE_CHECKING:
    from mocolab.config import Config

__all__ = ["momentum_update"]  # stable (docs/api.md); MoCo and MoCoV3 are built by the platform from a config


def _ema_pairs(key_encoder: nn.Module, query_encoder: nn.Module) -> list[tuple[nn.Parameter, nn.Parameter]]:
    """(θ_k, θ_q) by name: the key encoder's parameters with the query encoder's of the same name (DDP's
    ``.module`` unwrapped)."""
    q_params = dict(getattr(query_encoder, "module", query_encoder).named_parameters())
    pairs = [(name, p_k, q_params.get(name)) for name, p_k in key_encoder.named_parameters()]
    missing = [name for name, _, p_q in pairs if p_q is None]
    if missing:
        raise ValueError(f"momentum_update: the query encoder has no parameter {missing[0]!r} "
                         f"({len(missing)} of the key encoder's {len(pairs)} are missing)")
    return [(p_k, p_q) for _, p_k, p_q in pairs]


@torch.no_grad()
def momentum_update(key_encoder: nn.Module, query_encoder: nn.Module, m: float) -> None:
    """θ_k ← m·θ_k + (1−m)·θ_q, in place, for every parameter of ``key_encoder``.

    Parameters pair by name, so the query encoder may hold more (MoCo v3's predictor) and may be wrapped
    in DDP; buffers (BN statistics) are left alone, the key encoder keeps its own as in the reference.  ``m`` comes in
    with each call: a schedule (m cosine to 1) lives in the loop.  One fused kernel per operation over all
    parameters.

    Args:
        key_encoder: the key encoder f_k, updated in place (no gradient flows).
        query_encoder: the query encoder f_q, read only.
        m: the momentum in [0, 1]: 0 copies f_q, 1 leaves f_k as it is.

    Raises:
        ValueError: ``m`` outside [0, 1], or a parameter of the key encoder that the query encoder has not.

    Example::

        encoder_k = copy.deepcopy(encoder_q).requires_grad_(False)
        ...  # each step, after f_q's forward and before the keys are computed:
        momentum_update(encoder_k, encoder_q, m=0.99)
    """
    if not 0.0 <= m <= 1.0:
        raise ValueError(f"momentum_update: m={m} is out of range; allowed [0, 1]")
    pairs = _ema_pairs(key_encoder, query_encoder)
    if not pairs:
        return
    keys = [p_k for p_k, _ in pairs]
    torch._foreach_mul_(keys, m)
    torch._foreach_add_(keys, [p_q.detach() for _, p_q in pairs], alpha=1.0 - m)


def _key_shuffler(cfg: Config):
    """The key batch's shuffle for ``moco.bn`` (shuffle: rank 0's own generator; split: the augment stream)."""
    mc = cfg.moco
    return build_shuffler(mc.bn, rng.stream_seed("shuffle", cfg.run.seed) if mc.bn == "shuffle" else None)


class MoCo(nn.Module):
    negatives = "queue"  # where the negatives come from, as the diagnostics name it

    def __init__(self, encoder_q: nn.Module, queue: KeyQueue | None, m: float = 0.999, tau: float = 0.2,
                 shuffler: LocalShuffle | NoShuffle | None = None, encoder_dtype: torch.dtype | None = None,
                 symmetric: bool = False) -> None:
        super().__init__()
        if not 0.0 <= m < 1.0:
            raise ValueError(f"moco.m: {m} is out of range; allowed [0, 1)")
        if tau <= 0:
            raise ValueError(f"moco.tau: {tau} must be > 0")
        self.encoder_q = encoder_q
        # v3's query encoder carries a predictor the key encoder has not
        self.encoder_k = encoder_q.without_predictor() if hasattr(encoder_q, "without_predictor") \
            else copy.deepcopy(encoder_q)
        for p in self.encoder_k.parameters():
            p.requires_grad_(False)
        self.queue = queue
        self.m, self.tau = m, tau
        self.symmetric = symmetric  # both views are queries (forward); v3 is symmetric in its own forward
        self.shuffler = shuffler if shuffler is not None else NoShuffle()
        # Encoders may run under bf16 autocast; embeddings, logits and the loss stay float32.
        self.encoder_dtype = encoder_dtype
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    @classmethod
    def from_config(cls, cfg: Config, parts: MethodParts) -> MoCo:
        """v1/v2: f_q with a K-key queue of its own ``queue.layout``, random keys from the dictionary's stream."""
        encoder = parts.encoder(predictor=False)
        q, seed = cfg.queue, cfg.run.seed
        queue = build_queue(q.layout, q.size, cfg.model.dim, parts.batch, generator=rng.generator("queue", seed),
                            policy=q.policy, seed=seed)
        return cls(encoder, queue, m=cfg.moco.m, tau=cfg.moco.tau, shuffler=_key_shuffler(cfg),
                   encoder_dtype=parts.encoder_dtype, symmetric=cfg.moco.symmetric)

    def _autocast(self, x: torch.Tensor):
        return encoder_autocast(x.device, self.encoder_dtype)

    def ema_pairs(self) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """(θ_k, θ_q) by name: the key encoder's parameters with the query encoder's of the same name (DDP
        unwrapped)."""
        return _ema_pairs(self.encoder_k, self.encoder_q)

    def momentum_update(self) -> None:
        """θ_k ← m·θ_k + (1−m)·θ_q over parameters (the module's ``momentum_update``, with this model's m)."""
        momentum_update(self.encoder_k, self.encoder_q, self.m)

    @torch.no_grad()
    def compute_keys(self, im_k: torch.Tensor) -> torch.Tensor:
        """Keys on a shuffled batch (BN sees other sub-batches than the queries), then unshuffled."""
        if self.encoder_dtype is not None and getattr(self.shuffler, "crosses_ranks", False):
            # the encoder's first layer casts its input to this dtype under autocast: gathering the images
            # in it sends half the bytes across ranks and gives the same keys
            im_k = im_k.to(self.encoder_dtype)
        x, restore = self.shuffler.shuffle(im_k)
        with self._autocast(x):
            k = self.encoder_k(x)
        k = F.normalize(k.float(), dim=1)  # keys: N×C
        return self.shuffler.unshuffle(k, restore)

    def compute_queries(self, im: torch.Tensor) -> torch.Tensor:
        """Unit queries of one view, N×C (float32 whatever the encoder computes in)."""
        with self._autocast(im):
            q = self.encoder_q(im)
        return F.normalize(q.float(), dim=1)

    def contrast(self, q: torch.Tensor, k: torch.Tensor,
                 negatives: KeySnapshot | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One direction: queries q with their positives k (N×C each) against the queue's K keys as
        ``negatives`` took them (``KeyQueue.snapshot``; by default as they are now).  Returns (loss, correct N)."""
        l_pos = (q * k).sum(dim=1, keepdim=True)  # N×1
        return self.queue.contrast(q, l_pos, self.tau, negatives)  # N×K negatives, wherever they live

    def forward(self, im_q: torch.Tensor, im_k: torch.Tensor, index: torch.Tensor | None = None) -> MethodOutput:
        """``index``: the batch's images in the training set, recorded with their keys (key drift)."""
        earlier = self.queue.snapshot()  # the keys of earlier steps: contrast fails if enqueue ran first
        q = self.compute_queries(im_q)  # queries: N×C
        # symmetric: the other view's queries in a forward of their own, so BN sees each view's batch alone
        # as in the one-way loss
        q2 = self.compute_queries(im_k) if self.symmetric else None
        self.momentum_update()
        k = self.compute_keys(im_k)  # keys: N×C, no gradient
        loss, correct = self.contrast(q, k, earlier)
        if self.symmetric:  # q2 against k1, the same queue; the mean keeps the one-way loss's scale, log(1+K)
            loss21, correct21 = self.contrast(q2, self.compute_keys(im_q), earlier)
            loss, correct = (loss + loss21) / 2, torch.cat([correct, correct21])
        # view 2's keys only, symmetric or not: B·W writes a step, ages bounded by K/(B·W) as in the one-way arm
        written = self.queue.enqueue(k, self.step, index)  # in place: backward does not read the keys
        self.step += 1
        return MethodOutput(loss, correct, k, written)

    # ------------------------------------------------------------ what the trainer asks (method/protocol.py)
    @property
    def key_encoder(self) -> nn.Module:
        return self.encoder_k

    @property
    def dictionary(self) -> KeyQueue | None:
        return self.queue

    @property
    def writer(self) -> nn.Module | None:
        """The key encoder writes the queue."""
        return self.encoder_k

    @property
    def shuffle_generator(self) -> torch.Generator | None:
        return getattr(self.shuffler, "generator", None)

    def checkpoint_parts(self) -> dict[str, nn.Module]:
        return {"encoder_k": self.encoder_k, "queue": self.queue}

    def describe(self, global_batch: int) -> str:
        return (f"K={self.queue.size}" + (" (random replacement)" if self.queue.policy == "random" else "")
                + (", symmetric loss" if self.symmetric else ""))

    def uniform_loss(self, global_batch: int) -> float:
        """log(1 + K): the positive against K negatives (symmetric: the mean of two such directions)."""
        return math.log(1 + self.queue.size)


class MoCoV3(MoCo):
    """MoCo v3: symmetric InfoNCE against the other view's keys of the global batch; no queue.

    Query i on rank r has its positive at r·B + i of the all-gathered keys;
    every other key of the global batch is a negative.  Each direction's
    cross-entropy is scaled by 2τ and the two directions are summed, as in the
    reference (``moco/builder.py`` of facebookresearch/moco-v3).
    """

    negatives = "global batch (v3)"

    def __init__(self, encoder_q: nn.Module, m: float = 0.99, tau: float = 0.2,
                 shuffler: LocalShuffle | NoShuffle | None = None, encoder_dtype: torch.dtype | None = None) -> None:
        super().__init__(encoder_q, None, m=m, tau=tau, shuffler=shuffler, encoder_dtype=encoder_dtype,
                         symmetric=True)

    @classmethod
    def from_config(cls, cfg: Config, parts: MethodParts) -> MoCoV3:
        """The query encoder with a predictor (the key encoder, its EMA, has none); no queue."""
        return cls(parts.encoder(predictor=True), m=cfg.moco.m, tau=cfg.moco.tau, shuffler=_key_shuffler(cfg),
                   encoder_dtype=parts.encoder_dtype)

    @property
    def writer(self) -> None:
        """Nothing stored: the keys are this step's."""
        return None

    def checkpoint_parts(self) -> dict[str, nn.Module]:
        return {"encoder_k": self.encoder_k}

    def describe(self, global_batch: int) -> str:
        return "no queue (v3)"

    def uniform_loss(self, global_batch: int) -> float:
        """2τ·log(B·W) per direction, two directions."""
        return 4 * self.tau * math.log(global_batch)

    def contrast(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One direction: q (B×C, normalised) against every rank's k; (2τ·CE, correct per query)."""
        return v3_info_nce(q, k, self.tau, rank=rank_and_world()[0], gather=gather_no_grad)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, index: torch.Tensor | None = None) -> MethodOutput:
        with self._autocast(x1):
            q1, q2 = self.encoder_q(x1), self.encoder_q(x2)
        q1, q2 = F.normalize(q1.float(), dim=1), F.normalize(q2.float(), dim=1)
        self.momentum_update()
        k1, k2 = self.compute_keys(x1), self.compute_keys(x2)  # no gradient
        loss12, c12 = self.contrast(q1, k2)
        loss21, c21 = self.contrast(q2, k1)
        self.step += 1
        return MethodOutput(loss12 + loss21, torch.cat([c12, c21]), k2)


class BatchKeysMoCo(MoCoV3):
    """``moco.negatives=batch_keys``: MoCo v2 without its queue, a one-change control.

    v2's encoder and head (no predictor) and its EMA key encoder, both views as queries, each query's positive
    the key of its image's other view and its negatives the other B·W − 1 keys of that view in the global batch;
    the two directions averaged, as the symmetric queue arm averages them (``moco.symmetric``).  Against that
    arm it changes only where the negatives come from (this step's keys, not the queue's K); against
    ``in_batch`` (NT-Xent) only the encoder that makes them (the EMA key encoder, no gradient, not the encoder
    being trained).  The loss is plain InfoNCE (v3 scales each direction by 2τ).
    """

    negatives = "batch_keys"

    @classmethod
    def from_config(cls, cfg: Config, parts: MethodParts) -> BatchKeysMoCo:
        return cls(parts.encoder(predictor=False), m=cfg.moco.m, tau=cfg.moco.tau, shuffler=_key_shuffler(cfg),
                   encoder_dtype=parts.encoder_dtype)

    def describe(self, global_batch: int) -> str:
        return f"no queue: the other {global_batch - 1} keys of the global batch, symmetric loss"

    def uniform_loss(self, global_batch: int) -> float:
        """log(B·W): the positive among the global batch's keys, each direction, averaged."""
        return math.log(global_batch)

    def contrast(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One direction: InfoNCE of q (B×C) against every rank's k, the own image's key the positive."""
        loss, correct = v3_info_nce(q, k, self.tau, rank=rank_and_world()[0], gather=gather_no_grad)
        return loss / (2 * self.tau), correct

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, index: torch.Tensor | None = None) -> MethodOutput:
        out = super().forward(x1, x2, index)
        return MethodOutput(out.loss / 2, out.correct, out.keys)
