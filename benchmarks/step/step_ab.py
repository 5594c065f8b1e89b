"""Before and after of each speed change to the training step, measured alternately in one process.

Each variant is the cpu-quick Trainer with one change undone (the code as it
was before that change); ``all`` undoes every one.  Rounds alternate between
the variants so that the machine's drift hits them alike, and the figure is
the median over rounds.

    .venv/bin/python benchmarks/step/step_ab.py [--variants current,native-pool] [--set run.precision=fp32]
"""

from __future__ import annotations

import argparse
import resource
import statistics

import torch
from _steps import held_batches, timed_steps, with_kornia_crop, with_relu_before_pool, with_torch_pool

from mocolab.config import build_config
from mocolab.config.hardware import keep_freed_memory
from mocolab.training.trainer import Trainer
from mocolab.method.losses import queue_info_nce
from mocolab.method.batchnorm import SplitBatchNorm2d, _strided_batch_norm


def native_pool(tr: Trainer) -> None:
    """Before: torch's nn.MaxPool2d(2) in the convnet."""
    with_torch_pool(tr.model.encoder_q)
    with_torch_pool(tr.model.encoder_k)


def relu_then_pool(tr: Trainer) -> None:
    """Before: the convnet's ReLU ahead of its max-pool (on four times the elements)."""
    with_relu_before_pool(tr.model.encoder_q)
    with_relu_before_pool(tr.model.encoder_k)


def kornia_crop(tr: Trainer) -> None:
    """Before: kornia's RandomResizedCrop, which slices and resizes image by image."""
    with_kornia_crop(tr.augment)


def strided_bn(tr: Trainer) -> None:
    """Split batch-norm as a GPU computes it: one training-mode BN over the batch viewed with its strided
    groups as channels (float32 statistics accumulated in float64 on this CPU)."""
    for enc in (tr.model.encoder_q, tr.model.encoder_k):
        for module in enc.modules():
            if isinstance(module, SplitBatchNorm2d):
                module._kernel = lambda x: _strided_batch_norm


def unfused_loss(tr: Trainer) -> None:
    """Before: InfoNCE over the concatenated logits, with a copy of the queue for backward."""
    queue = tr.model.queue

    def contrast(q, l_pos, tau, negatives=None):
        return queue_info_nce(q, l_pos, (negatives if negatives is not None else queue.snapshot()).read(), tau)

    queue.contrast = contrast


def no_online_probe(tr: Trainer) -> None:
    """Without the online linear probe (training/online_probe.py): what it costs a step."""
    tr.monitors.remove(tr.online)
    tr.online = tr.evaluation.online = None


UNDO = {"native-pool": [native_pool], "relu-then-pool": [relu_then_pool], "kornia-crop": [kornia_crop],
        "strided-bn": [strided_bn], "unfused-loss": [unfused_loss]}
UNDO["all"] = [f for fs in UNDO.values() for f in fs]
UNDO["no-online-probe"] = [no_online_probe]  # a monitor, not a speed change: left out of "all"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="current," + ",".join(UNDO),
                    help=f"comma-separated: current, {', '.join(UNDO)}")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4, help="timed steps per round")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--default-allocator", action="store_true",
                    help="leave glibc's malloc as it is (process-wide, so compared across invocations)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not args.default_allocator:
        keep_freed_memory()
    names = args.variants.split(",")
    unknown = [n for n in names if n != "current" and n not in UNDO]
    if unknown:
        ap.error(f"--variants: unknown {unknown}; choose from current, {', '.join(UNDO)}")
    cfg = build_config("cpu-quick", args.set)
    trainers, data = {}, {}
    for name in names:
        torch.manual_seed(0)
        tr = trainers[name] = Trainer(cfg)
        for undo in UNDO.get(name, []):
            undo(tr)
        data[name] = held_batches(tr, 2 + args.steps)
    rates: dict[str, list[float]] = {n: [] for n in names}
    faults = {n: 0 for n in names}  # minor page faults: memory the allocator handed back and took again
    for name in names:  # one untimed round: the heap grows to its working size once
        timed_steps(trainers[name], data[name], warmup=2)
    for r in range(args.rounds):
        for name in names:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            rates[name].append(timed_steps(trainers[name], data[name], warmup=2))
            faults[name] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {rates[n][-1]:.0f}" for n in names), flush=True)
    base = statistics.median(rates[names[0]])
    precision = "bf16" if trainers[names[0]].precision is not None else "fp32"
    print(f"\ncpu-quick step, {precision} encoders, batch {cfg.optim.batch_size}, {torch.get_num_threads()} threads, "
          f"median of {args.rounds} rounds of {args.steps} steps")
    print(f"{'variant':<16} {'images/s':>9} {'× ' + names[0]:>12} {'page faults/step':>17}")
    for name in names:
        med = statistics.median(rates[name])
        per_step = faults[name] / (args.rounds * (2 + args.steps))
        print(f"{name:<16} {med:>9.0f} {med / base:>12.2f} {per_step:>17.0f}")


if __name__ == "__main__":
    main()
