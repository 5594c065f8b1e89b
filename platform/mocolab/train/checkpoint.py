"""Checkpoint files: one per rank (each holds its own queue shard and RNG), written atomically.

A checkpoint directory holds ``rank<r>.pt`` for every rank; Ray Train merges
the files the workers report into one directory.  Files are plain tensors,
numbers and strings, so they load with ``torch.load(weights_only=True)``:
nothing in a checkpoint can run code.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

FORMAT_VERSION = 1


def rank_file(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.pt"


def save_rank_state(state: dict, config: dict, directory: str | Path, rank: int, world_size: int) -> Path:
    """Write via a temporary file and rename, so a crash never leaves half a checkpoint."""
    path = rank_file(directory, rank)
    tmp = path.with_suffix(".tmp")
    torch.save({"format": FORMAT_VERSION, "rank": rank, "world_size": world_size, "config": config,
                "state": state}, tmp)
    os.replace(tmp, path)
    return path


def load_rank_state(directory: str | Path, rank: int, world_size: int) -> tuple[dict, dict]:
    """(trainer state, config dict) of ``rank``; a checkpoint from another world size is an error."""
    path = rank_file(directory, rank)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {directory} has no file for rank {rank}")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if blob.get("format") != FORMAT_VERSION:
        raise ValueError(f"checkpoint {path}: format {blob.get('format')!r}, expected {FORMAT_VERSION}")
    if blob["world_size"] != world_size:
        raise ValueError(f"checkpoint {path} was written by {blob['world_size']} workers; this run has "
                         f"{world_size} (run.num_workers must match to resume; use a new run.name)")
    return blob["state"], blob["config"]
