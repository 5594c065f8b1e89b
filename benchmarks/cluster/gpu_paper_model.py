"""What one MoCo step moves between W ranks, what a run stores, and how long each takes, on paper.

    PYTHONPATH=platform .venv/bin/python benchmarks/cluster/gpu_paper_model.py [--preset imagenet-resnet50]

The shapes come from the code: the preset through ``build_config``, the parameter and buffer counts from the
encoder mocolab builds for it, the checkpoint's parts from the MoCo it builds (one process, CPU; no image is
read). The collectives are the ones the method calls (``method/shuffle.py``, ``method/queue_layouts.py``,
``method/losses.py``) and DDP's; tests/method/test_collective_bytes.py runs them on gloo at W = 2 and 4,
records every call's tensor, and compares it with ``step_calls``. Times divide bytes by a stated bandwidth:
a lower bound that ignores latency, overlap with compute, and contention.

The model holds the per-rank batch B fixed (the preset's at its documented W = 8) and lets the global batch
grow as B·W: the preset's global batch of 256 leaves 4 images a rank at W = 64, and ``config.validate``
refuses it at W = 512.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

# ---------------------------------------------------------------------------------------------------------
# The model: pure arithmetic, no torch (the test imports it beside gloo ranks)

GPUS_PER_NODE = 8  # DGX/HGX H100: eight GPUs on one NVSwitch fabric
# H100 SXM NVLink 4: 900 GB/s per GPU, both directions together; 450 GB/s each way
NVLINK_BYTES_PER_S = 450e9
# one ConnectX-7 InfiniBand NDR port per GPU, 400 Gb/s each way
IB_BYTES_PER_S = 400e9 / 8
# a MoCo step per image is about 4/3 of a supervised ResNet-50 step; 7,500 supervised images/s per H100
# (benchmarks/RESULTS.md, "How many CPU cores per GPU", from MLPerf Training): about 5,600 MoCo images/s
TRAIN_IMAGES_PER_S = 7_500 * 3 / 4
# rank 0 embeds the evaluation images alone: its loader decodes them, about 16 cores' worth of JPEGs per
# GPU at 469 images per core-second (RESULTS.md, same section), so about 7,500 images/s
EVAL_IMAGES_PER_S = 7_500
IMAGENET_TRAIN, IMAGENET_VAL = 1_281_167, 50_000


@dataclass(frozen=True)
class Shapes:
    """A step's tensors, per rank: B images of ``image`` values crossing ranks at ``image_itemsize`` bytes
    each (the encoder's dtype: MoCo.compute_keys casts before the shuffle), keys of ``dim`` fp32 values, a
    queue of ``queue`` keys, and ``params`` trainable parameters whose fp32 gradients DDP all-reduces."""
    batch: int
    dim: int
    queue: int
    image_values: int
    image_itemsize: int
    params: int
    bn_buffer_bytes: int = 0  # encoder_q's BN buffers: DDP broadcasts them from rank 0 before each forward
    key_itemsize: int = 4  # keys are float32 (F.normalize(k.float()))
    index_itemsize: int = 8  # int64: each key's training image, enqueued beside it
    grad_itemsize: int = 4  # float32 gradients, whatever autocast computes in


@dataclass(frozen=True)
class Call:
    """One collective a rank joins: ``payload`` is the tensor it hands in (for all_gather its own part,
    for all_reduce and reduce_scatter the whole input, for all_to_all all its rows, its own included)."""
    what: str
    op: str
    payload: int

    def wire(self, world: int) -> float:
        """Bytes this rank sends (and, the patterns being symmetric, receives): ring all-gather and
        reduce-scatter move (W−1)/W of the gathered or reduced size, ring all-reduce twice that (NCCL tests'
        "bus bandwidth" factors); all_to_all sends the rows bound for other ranks, (W−1)/W of them in
        expectation under a uniform permutation; a broadcast reaches every rank once."""
        w = world
        if self.op == "all_to_all":
            return self.payload * (w - 1) / w
        if self.op == "all_gather":
            return self.payload * (w - 1)
        if self.op == "reduce_scatter":
            return self.payload * (w - 1) / w
        if self.op == "all_reduce":
            return self.payload * 2 * (w - 1) / w
        if self.op == "broadcast":
            return float(self.payload)
        raise ValueError(f"unknown collective {self.op!r}")


def shuffle_calls(s: Shapes, world: int, variant: str = "all_to_all") -> list[Call]:
    """Shuffle BN's collectives a step. ``all_to_all``: mocolab's CrossRankShuffle (the images there, the
    keys back). ``all_gather``: the MoCo reference's (every rank gathers the global batch of images, rank 0
    broadcasts the permutation of G int64, the keys are gathered back); mocolab does not offer it."""
    image, keys = s.batch * s.image_values * s.image_itemsize, s.batch * s.dim * s.key_itemsize
    if variant == "all_to_all":
        return [Call("shuffle: key images", "all_to_all", image), Call("shuffle: keys back", "all_to_all", keys)]
    if variant == "all_gather":
        return [Call("shuffle: key images", "all_gather", image),
                Call("shuffle: permutation", "broadcast", s.batch * world * 8),
                Call("shuffle: keys back", "all_gather", keys)]
    raise ValueError(f"unknown shuffle {variant!r}")


def queue_calls(s: Shapes, world: int, layout: str = "replicated") -> list[Call]:
    """The queue's collectives a step. Replicated: enqueue all-gathers the B keys' indices and the keys.
    Sharded: contrast all-gathers the B queries, takes the max over ranks of G logits, reduce-scatters G
    partial denominators; backward all-gathers the B denominators' gradients, then reduce-scatters the G
    queries' gradients to their owners; enqueue is local."""
    b, g, c = s.batch, s.batch * world, s.dim
    if layout == "replicated":
        return [Call("queue: key indices", "all_gather", b * s.index_itemsize),
                Call("queue: keys", "all_gather", b * c * s.key_itemsize)]
    if layout == "sharded":
        return [Call("queue: queries", "all_gather", b * c * 4),
                Call("queue: max logit", "all_reduce", g * 4),
                Call("queue: denominators", "reduce_scatter", g * 4),
                Call("queue: denominator grads", "all_gather", b * 4),
                Call("queue: query grads", "reduce_scatter", g * c * 4)]
    raise ValueError(f"unknown layout {layout!r}")


def ddp_calls(s: Shapes) -> list[Call]:
    """DDP over the query encoder: its BN buffers broadcast before the forward, its gradients all-reduced
    (in buckets; their sizes add up to this)."""
    out = [Call("DDP: BN buffers", "broadcast", s.bn_buffer_bytes)] if s.bn_buffer_bytes else []
    return out + [Call("DDP: gradients", "all_reduce", s.params * s.grad_itemsize)]


def step_calls(s: Shapes, world: int, *, shuffle: str = "all_to_all", layout: str = "replicated") -> list[Call]:
    """Every sizeable collective of one MoCo v2 step (one-way loss, moco.bn=shuffle) at W = ``world``; a
    few scalars (the divergence flag) are left out."""
    return ddp_calls(s)[:-1] + shuffle_calls(s, world, shuffle) + queue_calls(s, world, layout) + ddp_calls(s)[-1:]


def seconds(nbytes: float, world: int) -> float:
    """Time to move ``nbytes`` per rank: NVLink within one node, InfiniBand once the ranks span nodes
    (a ring crosses a node boundary at every node, so each GPU's NIC carries its wire bytes)."""
    return nbytes / (NVLINK_BYTES_PER_S if world <= GPUS_PER_NODE else IB_BYTES_PER_S)


def slot_bytes(queue) -> int:
    """Bytes of one slot of a queue (method/key_queue.py): every buffer with a row a slot (key, write step,
    source image)."""
    return sum(t[0].numel() * t.element_size() for t in queue.buffers() if t.dim() and len(t) == queue.slots)


def queue_memory(slot_bytes: int, s: Shapes, world: int, layout: str) -> int:
    """Bytes of queue buffers a rank holds: K slots replicated, K/W sharded."""
    return slot_bytes * (s.queue if layout == "replicated" else s.queue // world)


# ---------------------------------------------------------------------------------------------------------
# The code's own numbers, and the table


@dataclass(frozen=True)
class Measured:
    """What the built model says: the step's shapes and the checkpoint's parts, in bytes."""
    shapes: Shapes
    weights: int  # encoder_q + encoder_k state dicts
    momentum: int  # SGD's momentum buffer: one fp32 value per trainable parameter
    slot: int  # bytes of one queue slot: its key, write step and source image
    epochs: int
    knn_every: int
    monitor_images: int  # the kNN monitor's bank + test images
    final_images: int  # the final evaluation's training + test images


def measure(preset: str, per_rank_batch: int | None = None) -> Measured:
    """Build the preset's MoCo in this process and count what it holds."""
    import torch

    from mocolab.config import build_config
    from mocolab.method.protocol import MethodParts
    from mocolab.method.registry import build_method
    from mocolab.training.build import encoder_factory

    # a folder name only to pass validation: nothing is read; shuffle BN over 8 ranks, as the preset says
    cfg = build_config(preset, ["data.root=/imagenet", "moco.bn=shuffle", f"run.num_workers={GPUS_PER_NODE}"])
    b = per_rank_batch or cfg.per_rank_batch
    size = cfg.data.image_size
    dtype = torch.bfloat16  # run.precision=auto on an H100 (config/hardware.py): the key images cross in it
    torch.manual_seed(0)
    model = build_method(cfg, MethodParts(encoder_factory(cfg, 3, size, torch.device("cpu")), IMAGENET_TRAIN, b,
                                          dtype))
    enc = model.encoder_q
    params = sum(p.numel() for p in enc.parameters() if p.requires_grad)
    bn = sum(t.numel() * t.element_size() for t in enc.buffers())
    parts = model.checkpoint_parts()
    queue = parts.pop("queue")

    def nbytes(module: torch.nn.Module) -> int:
        return sum(t.numel() * t.element_size() for t in module.state_dict().values() if torch.is_tensor(t))

    # the checkpoint's counters, RNG states and drift probes are left out: kilobytes
    weights = nbytes(enc) + sum(nbytes(p) for p in parts.values())
    slot = slot_bytes(queue)
    e = cfg.eval
    shapes = Shapes(batch=b, dim=cfg.model.dim, queue=cfg.queue.size, image_values=3 * size * size,
                    image_itemsize=dtype.itemsize, params=params, bn_buffer_bytes=bn)
    test = e.knn_test or IMAGENET_VAL
    return Measured(shapes, weights, params * 4, slot, cfg.optim.epochs, e.knn_every,
                    monitor_images=(e.knn_bank or IMAGENET_TRAIN) + test,
                    final_images=max(e.knn_bank or IMAGENET_TRAIN, e.linear_train or IMAGENET_TRAIN)
                    + max(test, e.linear_test or IMAGENET_VAL))


def _mb(x: float) -> str:
    return f"{x / 1e6:,.1f} MB" if x < 1e9 else f"{x / 1e9:,.1f} GB"


def _ms(x: float) -> str:
    return f"{x * 1e3:,.2f} ms" if x < 1 else f"{x:,.1f} s"


def table(m: Measured, worlds: list[int]) -> str:
    """The per-step, per-checkpoint and per-run figures at each W, one column each."""
    s = m.shapes
    step_s = s.batch / TRAIN_IMAGES_PER_S
    rows: list[tuple[str, list[str]]] = []

    def row(label: str, f) -> None:
        rows.append((label, [f(w) for w in worlds]))

    row("global batch G = B·W", lambda w: f"{s.batch * w:,}")
    row("queue K / G (steps a key lives)", lambda w: f"{s.queue / (s.batch * w):g}")
    row("compute per step (assumed)", lambda w: _ms(step_s))
    for name, calls in (("shuffle, all_to_all (mocolab)", lambda w: shuffle_calls(s, w, "all_to_all")),
                        ("shuffle, all_gather (reference)", lambda w: shuffle_calls(s, w, "all_gather")),
                        ("queue all-gather (replicated)", lambda w: queue_calls(s, w, "replicated")),
                        ("queue collectives (sharded)", lambda w: queue_calls(s, w, "sharded")),
                        ("DDP: BN buffers, gradients", lambda w: ddp_calls(s))):
        row(f"{name}: bytes sent", lambda w, c=calls: _mb(sum(x.wire(w) for x in c(w))))
        row(f"{name}: time", lambda w, c=calls: _ms(seconds(sum(x.wire(w) for x in c(w)), w)))
    total = lambda w: sum(x.wire(w) for x in step_calls(s, w))  # noqa: E731
    row("step total (all_to_all, replicated): time", lambda w: _ms(seconds(total(w), w)))
    row("  ... as a share of compute", lambda w: f"{seconds(total(w), w) / step_s:.0%}")
    row("gathered images per rank (all_gather)", lambda w: _mb(w * s.batch * s.image_values * s.image_itemsize))
    row("queue memory per rank, replicated", lambda w: _mb(queue_memory(m.slot, s, w, "replicated")))
    row("queue memory per rank, sharded", lambda w: _mb(queue_memory(m.slot, s, w, "sharded")))
    row("logits B×K per rank (fp32, both)", lambda w: _mb(s.batch * s.queue * 4))
    # the same key ages at every W: K grows with the global batch, K/G held at its value for the first W
    ages = s.queue / (s.batch * worlds[0])
    grown = lambda w: replace(s, queue=int(ages * s.batch * w))  # noqa: E731
    row(f"K keeping K/G = {ages:g}", lambda w: f"{grown(w).queue:,}")
    row("  ... queue memory per rank, replicated", lambda w: _mb(queue_memory(m.slot, grown(w), w, "replicated")))
    row("  ... queue memory per rank, sharded", lambda w: _mb(queue_memory(m.slot, grown(w), w, "sharded")))
    row("  ... logits B×K per rank (fp32, both)", lambda w: _mb(s.batch * grown(w).queue * 4))
    per_rank = m.weights + m.momentum
    epoch = lambda w: IMAGENET_TRAIN / (s.batch * w) * step_s  # noqa: E731
    row("checkpoint file, each rank (replicated)", lambda w: _mb(per_rank + m.slot * s.queue))
    row("checkpoint, W files (replicated)", lambda w: _mb(w * (per_rank + m.slot * s.queue)))
    # one checkpoint at every epoch end
    row("  ... written per second of training", lambda w: _mb(w * (per_rank + m.slot * s.queue) / epoch(w)) + "/s")
    row("checkpoint, W files (sharded)", lambda w: _mb(w * per_rank + m.slot * s.queue))
    monitors = len([e for e in range(1, m.epochs) if m.knn_every and e % m.knn_every == 0])
    evals = monitors * m.monitor_images / EVAL_IMAGES_PER_S + m.final_images / EVAL_IMAGES_PER_S
    row("epoch of training (compute only)", lambda w: _ms(epoch(w)))
    row(f"rank 0's evaluation ({monitors} monitors + final)", lambda w: _ms(evals))
    row("  ... against the run's training time", lambda w: f"{evals / (m.epochs * epoch(w)):.0%}")
    width = max(len(r[0]) for r in rows) + 2
    head = "".ljust(width) + "".join(f"W = {w}".rjust(14) for w in worlds)
    return "\n".join([head] + [label.ljust(width) + "".join(v.rjust(14) for v in vals) for label, vals in rows])


def report(m: Measured, worlds: list[int]) -> str:
    s = m.shapes
    side = int((s.image_values // 3) ** 0.5)
    lines = [f"per-rank batch B = {s.batch}, key dim C = {s.dim}, queue K = {s.queue:,}, "
             f"{s.params:,} trainable parameters",
             f"key images 3×{side}×{side} at {s.image_itemsize} bytes a value: "
             f"{_mb(s.batch * s.image_values * s.image_itemsize)} a batch (uint8: half, fp32: twice)",
             f"checkpoint parts: encoder_q + encoder_k {_mb(m.weights)}, SGD momentum {_mb(m.momentum)}, "
             f"queue {m.slot} bytes a slot",
             f"NVLink {NVLINK_BYTES_PER_S / 1e9:g} GB/s, InfiniBand {IB_BYTES_PER_S / 1e9:g} GB/s, each way per GPU, "
             f"{GPUS_PER_NODE} GPUs a node",
             f"{TRAIN_IMAGES_PER_S:,.0f} training and {EVAL_IMAGES_PER_S:,} evaluation images/s per GPU",
             "", table(m, worlds)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="imagenet-resnet50")
    ap.add_argument("--worlds", type=int, nargs="+", default=[8, 64, 512])
    ap.add_argument("--per-rank-batch", type=int, default=None, help="default: the preset's batch over 8 ranks")
    args = ap.parse_args()
    print(report(measure(args.preset, args.per_rank_batch), args.worlds))


if __name__ == "__main__":
    main()
