"""Shuffle BN: the key batch is encoded in another order than the queries', so BN cannot leak which
sub-batch a key came from (He et al. 2020, section 3.3).  Across ranks (``CrossRankShuffle``), within one
process over split BN's virtual groups (``LocalShuffle``), or not at all (``NoShuffle``); ``build_shuffler``
picks one for ``moco.bn``.  Notation: B the per-rank batch, W the world size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from mocolab.config.choices import BN_MODES
from mocolab.method.collectives import rank_and_world
from mocolab.method.async_copy import to_device

__all__ = ["CrossRankShuffle", "LocalShuffle", "NoShuffle", "build_shuffler"]  # stable (docs/api.md)


@dataclass
class Exchange:
    """How one step's key batch travels (all host-side, from a permutation every rank draws alike): this rank
    sends ``send`` (its local rows, grouped by destination rank, ``send_counts`` to each) and receives
    ``recv_counts`` rows from each rank, which ``order`` puts in the shuffled slice's order; the keys go back
    the same way reversed, landing on ``send``'s rows."""
    send: torch.Tensor
    send_counts: list[int]
    recv_counts: list[int]
    order: torch.Tensor  # position in the shuffled slice of each received row


class CrossRankShuffle:
    """MoCo's shuffle BN: keys are computed on a batch permuted across all ranks.

    Each rank's BN then normalises the keys with statistics of samples that
    (mostly) came from other ranks, while its queries used its own samples, so
    the pretext task cannot be solved by matching batch statistics.  One
    permutation of the G = B·W samples is drawn from a generator this object
    owns, seeded alike on every rank, so every rank draws the same one on the
    host: nothing is broadcast, and where each sample goes is known without
    reading the device.  Each rank then sends each other rank only the images
    that rank's slice holds (``all_to_all``: (W−1)/W of a batch out and in per
    rank, where gathering the whole global batch would move W−1 batches in), and
    the keys return the same way.  Keys are computed under no_grad, so nothing
    here carries autograd.
    """

    crosses_ranks = True  # images travel between ranks (MoCo.compute_keys sends them in the encoder's dtype)

    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def shuffle(self, x: torch.Tensor) -> tuple[torch.Tensor, Exchange | torch.Tensor]:
        """x: B×… (this rank's key images) -> (B×… shuffled slice, what ``unshuffle`` needs)."""
        rank, world = rank_and_world()
        b = x.shape[0]
        perm = torch.randperm(b * world, generator=self.generator)  # slot j of the shuffled stream: sample perm[j]
        if world == 1:
            at = to_device(perm, x.device)
            return x[at], torch.argsort(at)
        mine = perm.view(world, b)[rank]  # the samples this rank's slice holds, in slice order
        order = torch.argsort(torch.div(mine, b, rounding_mode="floor"), stable=True)  # grouped by owner rank
        recv_counts = torch.bincount(mine // b, minlength=world).tolist()
        # what this rank sends: its samples in each rank's slice, in that slice's order
        owner = perm // b
        send = torch.cat([perm.view(world, b)[r][owner.view(world, b)[r] == rank] % b for r in range(world)])
        send_counts = [int((owner.view(world, b)[r] == rank).sum()) for r in range(world)]
        plan = Exchange(to_device(send, x.device), send_counts, recv_counts, to_device(order, x.device))
        received = _exchange(x[plan.send], send_counts, recv_counts)
        slice_ = torch.empty_like(x)
        slice_[plan.order] = received
        return slice_, plan

    @torch.no_grad()
    def unshuffle(self, k: torch.Tensor, plan: Exchange | torch.Tensor) -> torch.Tensor:
        """k: B×C keys of the shuffled slice -> B×C keys of this rank's original samples, in order."""
        if not isinstance(plan, Exchange):  # one process: the inverse permutation
            return k[plan]
        back = _exchange(k[plan.order], plan.recv_counts, plan.send_counts)
        out = torch.empty_like(back)
        out[plan.send] = back
        return out


def _exchange(rows: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
    """``rows`` (grouped by destination rank, ``send_counts`` each) -> the rows every rank sent here, grouped by
    source rank (``recv_counts`` each)."""
    rows = rows.contiguous()
    out = rows.new_empty((sum(recv_counts), *rows.shape[1:]))
    dist.all_to_all_single(out, rows, output_split_sizes=recv_counts, input_split_sizes=send_counts)
    return out


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
        perm = to_device(torch.randperm(x.shape[0], generator=self.generator, device="cpu"), x.device)
        return x[perm], torch.argsort(perm)

    def unshuffle(self, k: torch.Tensor, restore: torch.Tensor) -> torch.Tensor:
        return k[restore]


class NoShuffle:
    """Keys computed on the batch as it is (bn=plain: shows the pretext task cheating)."""

    def shuffle(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return x, None

    def unshuffle(self, k: torch.Tensor, restore: None) -> torch.Tensor:
        return k
