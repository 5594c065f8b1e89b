"""Where negatives come from, besides MoCo's queue: a memory bank of every image, or the batch itself.

MoCo's argument (He et al. 2020, section 3.2 and Fig. 3) compares three
dictionaries.  ``in_batch`` (SimCLR's NT-Xent): each of the 2·B·W views is a
query whose positive is the other view of its image and whose 2·B·W − 2
negatives are every other view of the global batch, all from the one encoder
being trained; the dictionary is as consistent as can be, and as small as the
batch.  ``memory_bank`` (Wu et al. 2018): one stored embedding per training
image; a query's positive is its own image's entry and its K negatives are
entries drawn at random, then the batch's entries move towards the new
embeddings, v ← normalise(a·v + (1 − a)·q).  The dictionary is as large as the
data set, but an entry was written when its image was last seen, up to an
epoch of encoder updates ago.  MoCo's queue (key_queue.py) sits between: large, and
written by a slowly moving key encoder.

Both classes here are ``Method``s (method/protocol.py), as MoCo is, and say so
honestly: neither has a key encoder (``key_encoder`` is None, and there is no
momentum ``m``); the bank is the memory bank's ``dictionary``, written by the
encoder being trained, and in-batch negatives store nothing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from mocolab.method import rng
from mocolab.config.choices import NEGATIVE_SOURCES as SOURCES  # noqa: F401  (moco.negatives: config/choices.py)
from mocolab.method.collectives import gather_no_grad, gather_with_grad, rank_and_world
from mocolab.method.losses import info_nce, nt_xent
from mocolab.method.protocol import MethodOutput, MethodParts, encoder_autocast
from mocolab.method.key_queue import WrittenAges
from mocolab.method.async_copy import to_device

if TYPE_CHECKING:
    from mocolab.config import Config

BANK_SEED = 0x8A4C  # the bank's negative draws: one stream, the same on every rank (replicated banks agree)


class InBatchContrast(nn.Module):
    """``moco.negatives=in_batch``: both views through the one encoder, NT-Xent over the global batch."""

    negatives = "in_batch"
    # no key encoder, nothing stored (every negative is this step's), no key batch to shuffle
    key_encoder = dictionary = writer = shuffle_generator = None

    def __init__(self, encoder_q: nn.Module, tau: float = 0.2, encoder_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.encoder_q = encoder_q
        self.tau = tau
        self.encoder_dtype = encoder_dtype
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    @classmethod
    def from_config(cls, cfg: Config, parts: MethodParts) -> InBatchContrast:
        return cls(parts.encoder(predictor=False), tau=cfg.moco.tau, encoder_dtype=parts.encoder_dtype)

    def checkpoint_parts(self) -> dict[str, nn.Module]:
        return {}

    def describe(self, global_batch: int) -> str:
        return f"in-batch negatives (2·{global_batch}−2), no key encoder"

    def uniform_loss(self, global_batch: int) -> float:
        """log(2·B·W − 1): each view against every other view of the global batch."""
        return math.log(2 * global_batch - 1)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, index: torch.Tensor | None = None) -> MethodOutput:
        b = x1.shape[0]
        with encoder_autocast(x1.device, self.encoder_dtype):
            z = self.encoder_q(torch.cat([x1, x2]))  # one pass: DDP sees one forward per backward
        z = F.normalize(z.float(), dim=1)
        loss, correct = nt_xent(z[:b], z[b:], self.tau, rank=rank_and_world()[0], gather=gather_with_grad)
        self.step += 1
        return MethodOutput(loss, correct, z[b:].detach())


class MemoryBank(WrittenAges, nn.Module):
    """One unit embedding per training image, replicated on every rank.

    ``negatives`` K entries are drawn uniformly (with replacement) once per
    step from a generator of its own, seeded alike on every rank, and shared by
    the step's queries; an entry that is the query's own image is masked out of
    its negatives.  ``write_step`` is when each entry was last written (-1: the
    random initialisation), so an entry's age is measured.
    """

    def __init__(self, size: int, dim: int, negatives: int, momentum: float = 0.5,
                 generator: torch.Generator | None = None, seed: int = 0) -> None:
        super().__init__()
        if size < 2:
            raise ValueError(f"memory bank: {size} entries; it needs the training set (>= 2 images)")
        if negatives < 1:
            raise ValueError(f"bank.negatives: {negatives} must be >= 1")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"bank.momentum: {momentum} is out of range; allowed [0, 1)")
        self.size, self.dim, self.negatives, self.momentum = size, dim, negatives, momentum
        self.register_buffer("entries", F.normalize(torch.randn(size, dim, generator=generator), dim=1))
        self.register_buffer("write_step", torch.full((size,), -1, dtype=torch.long))
        self.sampler = torch.Generator().manual_seed(BANK_SEED + seed)

    @property
    def slots(self) -> int:
        """Entries held here: one per training image (every rank holds them all)."""
        return self.size

    @property
    def keys(self) -> torch.Tensor:
        """The entries, by the name a dictionary's stored embeddings have (the queue's ``keys``)."""
        return self.entries

    def get_extra_state(self) -> dict:
        return {"sampler": self.sampler.get_state()}

    def set_extra_state(self, state: dict) -> None:
        if state.get("sampler") is not None:
            self.sampler.set_state(state["sampler"])

    def sample(self) -> torch.Tensor:
        """K entry indices for this step's negatives (the same on every rank)."""
        return to_device(torch.randint(self.size, (self.negatives,), generator=self.sampler), self.entries.device)

    def contrast(self, q: torch.Tensor, index: torch.Tensor, tau: float,
                 negatives: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """InfoNCE of queries q (B×C, normalised) of images ``index`` (B): positive their own entry,
        negatives the entries ``negatives`` (K; drawn by ``sample`` when None).  Returns (loss, correct B)."""
        neg = self.sample() if negatives is None else negatives
        index = to_device(index, self.entries.device)
        l_pos = (q * self.entries[index]).sum(dim=1, keepdim=True)  # B×1 (indexing copies: no later in-place)
        l_neg = q @ self.entries[neg].T  # B×K
        l_neg = l_neg.masked_fill(neg[None, :] == index[:, None], float("-inf"))  # never its own entry
        loss, logits = info_nce(l_pos, l_neg, tau)
        return loss, logits.detach().argmax(dim=1) == 0

    @torch.no_grad()
    def update(self, q: torch.Tensor, index: torch.Tensor, step: int | torch.Tensor) -> None:
        """Entries ``index`` (distinct) ← normalise(a·entry + (1 − a)·q), written at ``step``."""
        index = to_device(index, self.entries.device)
        a = self.momentum
        mixed = a * self.entries[index] + (1.0 - a) * q.detach().to(self.entries.dtype)
        self.entries[index] = F.normalize(mixed, dim=1)
        self.write_step[index] = step


class MemoryBankContrast(nn.Module):
    """``moco.negatives=memory_bank``: one view per image through the encoder, scored against the bank;
    no key encoder.  The global batch's embeddings and image indices are gathered so every rank writes
    the same entries and the replicated banks stay equal."""

    negatives = "memory_bank"
    key_encoder = shuffle_generator = None  # no key encoder, no key batch to shuffle

    def __init__(self, encoder_q: nn.Module, bank: MemoryBank, tau: float = 0.2,
                 encoder_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.encoder_q, self.bank = encoder_q, bank
        self.tau = tau
        self.encoder_dtype = encoder_dtype
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    @classmethod
    def from_config(cls, cfg: Config, parts: MethodParts) -> MemoryBankContrast:
        """One entry per training image; its random initial entries come from the dictionary's stream,
        as a queue's do."""
        encoder, seed = parts.encoder(predictor=False), cfg.run.seed
        bank = MemoryBank(parts.train_size, cfg.model.dim, cfg.bank_negatives, cfg.bank.momentum,
                          generator=rng.generator("queue", seed), seed=seed)
        return cls(encoder, bank, tau=cfg.moco.tau, encoder_dtype=parts.encoder_dtype)

    @property
    def dictionary(self) -> MemoryBank:
        return self.bank

    @property
    def writer(self) -> nn.Module:
        """The encoder being trained writes the bank (unwrapped from DDP)."""
        return getattr(self.encoder_q, "module", self.encoder_q)

    def checkpoint_parts(self) -> dict[str, nn.Module]:
        return {"bank": self.bank}

    def describe(self, global_batch: int) -> str:
        b = self.bank
        return f"memory bank of {b.size} (K={b.negatives} drawn per step, a={b.momentum}), no key encoder"

    def uniform_loss(self, global_batch: int) -> float:
        """log(1 + K): the own entry against the K drawn."""
        return math.log(1 + self.bank.negatives)

    def forward(self, im_q: torch.Tensor, im_k: torch.Tensor, index: torch.Tensor | None = None) -> MethodOutput:
        if index is None:
            raise ValueError("moco.negatives=memory_bank needs each image's index in the training set")
        with encoder_autocast(im_q.device, self.encoder_dtype):
            q = self.encoder_q(im_q)
        q = F.normalize(q.float(), dim=1)
        loss, correct = self.bank.contrast(q, index, self.tau)
        written = gather_no_grad(to_device(index, q.device))  # the global batch's images: the entries written
        self.bank.update(gather_no_grad(q), written, self.step)
        self.step += 1
        return MethodOutput(loss, correct, q.detach(), written)
