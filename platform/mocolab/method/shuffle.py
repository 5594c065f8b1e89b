"""Shuffle BN: the key batch is encoded in another order than the queries', so BN cannot leak which
sub-batch a key came from (He et al. 2020, section 3.3).  Across ranks (``CrossRankShuffle``), within one
process over split BN's virtual groups (``LocalShuffle``), or not at all (``NoShuffle``); ``build_shuffler``
picks one for ``moco.bn``.  Notation: B the per-rank batch, W the world size.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mocolab.config.choices import BN_MODES
from mocolab.method.collectives import gather_no_grad, rank_and_world

__all__ = ["CrossRankShuffle", "LocalShuffle", "NoShuffle", "build_shuffler"]  # stable (docs/api.md)


class CrossRankShuffle:
    """MoCo's shuffle BN: keys are computed on a batch permuted across all ranks.

    Each rank's BN then normalises the keys with statistics of samples that
    (mostly) came from other ranks, while its queries used its own samples, so
    the pretext task cannot be solved by matching batch statistics.  One
    permutation of the G = B·W samples is drawn on rank 0, from a generator
    this object owns (seeded here, so runs are reproducible), and broadcast.
    Same interface as ``LocalShuffle``; keys are computed under no_grad,
    so nothing here carries autograd.
    """

    crosses_ranks = True  # images travel between ranks (MoCo.compute_keys sends them in the encoder's dtype)

    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def shuffle(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: B×… (this rank's key images) -> (B×… shuffled slice, restore indices B)."""
        rank, world = rank_and_world()
        b = x.shape[0]
        x_all = gather_no_grad(x)  # (B·W)×…, rank-major
        if rank == 0:
            perm = torch.randperm(b * world, generator=self.generator).to(x.device)
        else:
            perm = torch.empty(b * world, dtype=torch.long, device=x.device)
        if world > 1:
            dist.broadcast(perm, src=0)
        # gathered position j of the shuffled stream holds sample perm[j]; sample i sits at argsort(perm)[i]
        restore = torch.argsort(perm).view(world, b)[rank]  # B: where this rank's samples went
        return x_all[perm.view(world, b)[rank]], restore

    @torch.no_grad()
    def unshuffle(self, k: torch.Tensor, restore: torch.Tensor) -> torch.Tensor:
        """k: B×C keys of the shuffled slice -> B×C keys of this rank's original samples, in order."""
        return gather_no_grad(k)[restore]  # (B·W)×C -> B×C


def build_shuffler(bn_mode: str, generator_seed: int | None = None):
    """The key-batch shuffler for ``moco.bn``.

    shuffle -> CrossRankShuffle (seed ``generator_seed``, 0 if None); split ->
    LocalShuffle (own generator when a seed is given, else the global RNG);
    plain / groups / sync -> NoShuffle (groups: split's statistics with the keys left
    where their queries are, which isolates what the shuffle does; sync normalises
    over the global batch, so there is nothing to hide).
    """
    if bn_mode == "shuffle":
        return CrossRankShuffle(0 if generator_seed is None else generator_seed)
    if bn_mode == "split":
        gen = None if generator_seed is None else torch.Generator().manual_seed(generator_seed)
        return LocalShuffle(gen)
    if bn_mode in ("plain", "groups", "sync"):
        return NoShuffle()
    raise ValueError(f"moco.bn: unknown mode {bn_mode!r}; allowed {', '.join(BN_MODES)}")


class LocalShuffle:
    """Permute the key batch within this process; pairs with split BN.

    ``shuffle`` returns the permuted batch and the inverse permutation that
    ``unshuffle`` applies to the keys, so every key returns to its query.
    """

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator

    def shuffle(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        perm = torch.randperm(x.shape[0], generator=self.generator, device="cpu").to(x.device)
        return x[perm], torch.argsort(perm)

    def unshuffle(self, k: torch.Tensor, restore: torch.Tensor) -> torch.Tensor:
        return k[restore]


class NoShuffle:
    """Keys computed on the batch as it is (bn=plain: shows the pretext task cheating)."""

    def shuffle(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return x, None

    def unshuffle(self, k: torch.Tensor, restore: None) -> torch.Tensor:
        return k
