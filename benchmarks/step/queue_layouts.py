"""Replicated vs sharded queue: memory, time and traffic per step on W gloo CPU processes.

    .venv/bin/python benchmarks/step/queue_layouts.py [--worlds 2 4] [--size 65536] [--dim 128] [--batch 256]
                                                 [--steps 5] [--warmup 1]

Each rank runs, per step, the queue's part of a MoCo step on random unit
queries and keys (no encoder): contrast + backward into the queries +
enqueue.  Ranks are synchronised by a barrier before each step (not timed);
ms/step is the median over steps of the slowest rank.  One torch thread per
process: with W processes on fewer cores the times include the
oversubscription, so compare layouts at equal W, not across W.

Bytes sent per step per rank are counted analytically from the collectives
each layout calls, assuming bandwidth-optimal (ring) algorithms: all_gather
or reduce_scatter with n elements per rank sends (W-1)·n, all_reduce of n
elements sends 2·(W-1)/W·n.  gloo's real algorithms may send more.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from mocolab.method.queue_layouts import build_queue

F32, I64 = 4, 8


def bytes_sent(layout: str, world: int, b: int, c: int) -> int:
    """Analytic bytes one rank sends per step (ring algorithms), from the collectives the layout calls."""
    w1 = world - 1
    if layout == "replicated":
        return w1 * b * c * F32  # enqueue: all_gather of the B×C keys
    return (w1 * b * c * F32  # forward: all_gather of the B×C queries
            + 2 * w1 * b * F32  # forward: all_reduce(MAX) of the B·W max negatives (2·(W-1)/W·B·W)
            + w1 * b * F32  # forward: reduce_scatter of the B·W partial denominators
            + w1 * b * F32  # backward: all_gather of the B denominator gradients
            + w1 * b * c * F32)  # backward: reduce_scatter of the (B·W)×C query gradients


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, layout: str, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        b, c = args.batch, args.dim
        queue = build_queue(layout, args.size, c, b, generator=torch.Generator().manual_seed(0))
        qbytes = sum(t.numel() * t.element_size() for t in queue.buffers())
        gen = torch.Generator().manual_seed(1000 + rank)
        times = []
        for step in range(args.warmup + args.steps):
            q = F.normalize(torch.randn(b, c, generator=gen), dim=1).requires_grad_()  # B×C
            k = F.normalize(torch.randn(b, c, generator=gen), dim=1)  # B×C
            dist.barrier()
            t0 = time.perf_counter()
            l_pos = (q * k).sum(1, keepdim=True)
            loss, _ = queue.contrast(q, l_pos, 0.2)
            loss.backward()
            queue.enqueue(k, step)
            if step >= args.warmup:
                times.append(time.perf_counter() - t0)
        med = torch.tensor([statistics.median(times)])
        slowest = med.clone()
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            torch.save({"ms": float(slowest) * 1e3, "queue_bytes": qbytes}, out)
    finally:
        dist.destroy_process_group()


def run(layout: str, world: int, args: argparse.Namespace) -> dict:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pt")
        port = _free_port()
        procs = [ctx.Process(target=_rank, args=(r, world, port, layout, args, out)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
        codes = [p.exitcode for p in procs]
        if any(code != 0 for code in codes):
            for p in procs:
                if p.is_alive():
                    p.terminate()
            sys.exit(f"{layout} W={world}: ranks exited with {codes}")
        return torch.load(out, weights_only=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--size", type=int, default=65536, help="K, the global queue size")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=256, help="per-rank batch B")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args()
    print(f"K={args.size}, dim={args.dim}, per-rank batch={args.batch}, {args.steps} timed steps "
          f"(+{args.warmup} warm-up), gloo, 1 torch thread per rank, {os.cpu_count()} cores, torch {torch.__version__}")
    print("step = contrast + backward into the queries + enqueue; ms/step = median over steps of the slowest rank")
    print("bytes sent/step/rank: analytic, from the collective sizes each layout calls, ring algorithms "
          "(all_gather/reduce_scatter: (W-1)·n, all_reduce: 2(W-1)/W·n)\n")
    print(f"{'layout':<11} {'W':>2} {'queue bytes/rank':>17} {'ms/step':>9} {'bytes sent/step/rank':>21}")
    for world in args.worlds:
        for layout in ("replicated", "sharded"):
            r = run(layout, world, args)
            sent = bytes_sent(layout, world, args.batch, args.dim)
            print(f"{layout:<11} {world:>2} {r['queue_bytes']:>17,} {r['ms']:>9.1f} {sent:>21,}", flush=True)


if __name__ == "__main__":
    main()
