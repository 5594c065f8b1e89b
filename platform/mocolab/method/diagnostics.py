"""Is the dictionary consistent?  Ages of stored negatives and key drift, measured on the run itself.

MoCo's claim is that a slowly moving key encoder keeps the queue's keys
comparable although they were written over many steps, where a memory bank's
entries, written up to an epoch ago by a fast-moving encoder, are not.  Two
measurements make that visible for any dictionary (queue or memory bank):

* **Age** of every stored negative: steps since it was written (mean, max, a
  histogram).  A full FIFO queue's oldest key is K / (B·W) steps old.
* **Key drift** on a fixed probe set of P dictionary slots.  Whenever a probe
  slot is written, the image it came from and the writing encoder's embedding
  of that image are kept (``ref``).  At each epoch's end the current encoder
  (the key encoder for a queue, the encoder for a bank) embeds the same images
  again, and the cosine to ``ref`` says how far the encoder that wrote the
  entry has drifted from the one that now scores against it, as a function of
  the entry's age.  Both embeddings are of the un-augmented image in eval mode
  (BN on running statistics), so a frozen encoder scores exactly 1 and any
  drop is the encoder moving.  ``stored_cos`` compares the fresh embedding with
  the entry itself (an augmented view's key under training-mode BN; for a bank
  a mixture of past embeddings): what a query is really scored against.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from mocolab.method.collectives import rank_and_world
from mocolab.method.async_copy import to_device

Embed = Callable[[torch.Tensor], torch.Tensor]  # the loader's uint8 images -> unit embeddings (eval mode)
AGE_BINS = 20  # the age histogram's bins, from 0 to the oldest entry


class DriftProbes(nn.Module):
    """P dictionary slots, spread evenly over the ``slots`` the dictionary has, followed as they are written.

    Buffers (part of the checkpoint): ``slots`` P, ``image`` P (the training image last written there,
    -1 never), ``write_step`` P and ``ref`` P×C (the writing encoder's embedding of that image).  ``slots``
    and ``write_step`` live on the host, where a step already knows which slots it wrote; ``image`` and
    ``ref`` live on the training ``device``, where the embeddings and the other ranks' images arrive: a
    step that writes a probe queues its work on the device and reads nothing back.
    """

    def __init__(self, slots: int, probes: int, dim: int, device: torch.device | str = "cpu") -> None:
        super().__init__()
        if probes < 1 or slots < 1:
            raise ValueError(f"eval.drift_probes: {probes} probes over {slots} slots; both must be >= 1")
        pos = torch.unique(torch.linspace(0, slots - 1, min(probes, slots)).round().long())
        self.register_buffer("slots", pos)
        self.register_buffer("image", torch.full((len(pos),), -1, dtype=torch.long, device=device))
        self.register_buffer("write_step", torch.full((len(pos),), -1, dtype=torch.long))
        self.register_buffer("ref", torch.zeros(len(pos), dim, device=device))

    @torch.no_grad()
    def observe(self, written: torch.Tensor, offset: int, index: torch.Tensor, images: torch.Tensor,
                embed: Embed, step: int, collective: bool = True) -> int:
        """After a step wrote slots ``written`` (G, the gathered global batch's order; this rank's B images
        ``images``/``index``, as the loader handed them, sit at ``offset``..``offset``+B): record the probe
        slots among them.

        A queue's ``written`` is on the host (its slots are decided there), so the hits are found without
        waiting for the device; a memory bank's is its gathered image indices on the device, read once.
        Each rank embeds its own images that hit a probe (``embed`` returns them on the device); with
        ``collective`` the rows are summed across ranks (every rank sees the same ``written``, so every
        rank takes part or none does).  Returns the number of probes written.
        """
        written = written.detach().cpu()
        j = torch.searchsorted(self.slots, written).clamp(max=len(self.slots) - 1)
        pos = (self.slots[j] == written).nonzero().squeeze(1)  # positions in the batch that hit a probe
        if pos.numel() == 0:
            return 0
        device = self.ref.device
        ref = torch.zeros(len(pos), self.ref.shape[1], device=device)
        img = torch.zeros(len(pos), dtype=torch.long, device=device)
        mine = ((pos >= offset) & (pos < offset + images.shape[0])).nonzero().squeeze(1)  # this rank's hits
        if mine.numel():
            local = pos[mine] - offset
            at = to_device(mine, device)
            ref.index_copy_(0, at, embed(images[local]).to(torch.float32))
            img.index_copy_(0, at, to_device(index[local], device))
        if collective and rank_and_world()[1] > 1:
            dist.all_reduce(ref)
            dist.all_reduce(img)
        probe = j[pos]
        at = to_device(probe, device)
        self.ref[at] = ref
        self.image[at] = img
        self.write_step[probe] = step
        return len(pos)

    @torch.no_grad()
    def measure(self, step: int, images_of: Callable[[torch.Tensor], torch.Tensor], embed: Embed,
                stored: torch.Tensor | None = None) -> dict[str, list[float]] | None:
        """Per probe written so far: its age at ``step``, the cosine of the current encoder's embedding of
        its image with ``ref`` (drift) and, given the dictionary's ``stored`` entries of the probe slots
        (P×C), with the entry itself.  None while no probe has been written.  Once an epoch: it reads the
        device."""
        image = self.image.cpu()
        known = (self.write_step >= 0) & (image >= 0)
        if not bool(known.any()):
            return None
        fresh = embed(images_of(image[known])).float().cpu()
        out = {"age": (step - self.write_step[known]).float().tolist(),
               "drift_cos": (fresh * self.ref.cpu()[known]).sum(dim=1).tolist()}
        if stored is not None:
            out["stored_cos"] = (fresh * stored.float().cpu()[known]).sum(dim=1).tolist()
        return out


def age_histogram(ages: torch.Tensor, bins: int = AGE_BINS) -> dict[str, list[float]]:
    """Counts of ``ages`` in ``bins`` equal bins from 0 to the oldest (edges has bins + 1 values)."""
    if ages.numel() == 0:
        return {"edges": [], "counts": []}
    top = max(float(ages.max()), 1.0)
    counts = torch.histc(ages.float(), bins=bins, min=0.0, max=top)
    edges = torch.linspace(0.0, top, bins + 1)
    return {"edges": edges.tolist(), "counts": counts.tolist()}

