"""Every random stream a run owns, and the one rule that derives each from ``run.seed``.

| stream    | seed                   | same on every rank?                     | drawn by                          |
|-----------|------------------------|-----------------------------------------|-----------------------------------|
| `init`    | seed                   | yes: DDP starts from identical weights  | encoder construction (global RNG) |
| `queue`   | seed                   | yes: both layouts slice one K×C draw    | the queue's random initial keys   |
| `data`    | seed·1_000_003 + epoch | yes: every rank slices one global order | ``Trainer.epoch_order``           |
| `augment` | seed·1000 + 17 + rank  | no: each rank augments its own images   | kornia and split-BN's key shuffle |
| `shuffle` | seed + 1               | drawn on rank 0 only, then broadcast    | ``CrossRankShuffle`` (bn=shuffle) |

``augment`` is torch's global generator: kornia draws from it, so the trainer
keeps that stream's state itself and swaps it in while it trains (two
trainers in one process, or a resumed run, draw alike).  Every stream's state
is in the checkpoint (or, for ``data``, is a function of the epoch), so a run
resumed mid-epoch continues bit for bit.  The formulas are the ones runs have
always used: changing one changes every result.
"""

from __future__ import annotations

import torch

STREAMS: dict[str, str] = {
    "init": "seed",
    "queue": "seed",
    "data": "seed * 1_000_003 + epoch",
    "augment": "seed * 1000 + 17 + rank",
    "shuffle": "seed + 1",
}


def stream_seed(stream: str, seed: int, *, rank: int = 0, epoch: int = 0) -> int:
    """The seed of ``stream`` for this run, rank and epoch (see the table above)."""
    if stream in ("init", "queue"):
        return seed
    if stream == "data":
        return seed * 1_000_003 + epoch
    if stream == "augment":
        return seed * 1000 + 17 + rank
    if stream == "shuffle":
        return seed + 1
    raise ValueError(f"unknown random stream {stream!r}; streams are {list(STREAMS)}")


def generator(stream: str, seed: int, *, rank: int = 0, epoch: int = 0) -> torch.Generator:
    """A CPU generator seeded for ``stream``."""
    return torch.Generator().manual_seed(stream_seed(stream, seed, rank=rank, epoch=epoch))


def global_state(stream: str, seed: int, *, rank: int = 0, epoch: int = 0) -> torch.Tensor:
    """The state torch's global generator has after seeding it for ``stream`` (the global RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed(stream, seed, rank=rank, epoch=epoch))
        return torch.get_rng_state()
