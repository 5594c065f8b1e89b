"""The paper model of a step's traffic (benchmarks/cluster/gpu_paper_model.py) against the collectives a real
MoCo step calls on gloo at W = 2 and 4: bytes counted, not timed.

Each rank wraps ``torch.distributed``'s collectives so every call logs its operation and the tensor it hands in
(for all_to_all also the rows that leave the rank), and registers a DDP comm hook that logs each gradient
bucket. It then runs MoCo's step (DDP over a tiny encoder, shuffle BN, bf16 keys' images) with each queue
layout, the reference's gather shuffle, and a run of shuffles alone. The test compares the log, call by call,
with ``step_calls`` of the model the script prints, and the all_to_all's off-rank bytes with the model's
expected (W−1)/W. What the model adds on top (the ring's (W−1)/W factors, the bandwidths) is not measurable
on gloo.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gloo_launch import launch

from mocolab.method.key_queue import KeyQueue
from mocolab.method.queue_layouts import build_queue
from mocolab.method.shuffle import CrossRankShuffle

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cluster" / "gpu_paper_model.py"
B, DIM, SIDE, SHUFFLES = 4, 8, 8, 200  # per-rank batch, key dim, image side, shuffles for the off-rank mean
COLLECTIVES = ("all_to_all_single", "all_gather", "all_reduce", "reduce_scatter", "broadcast", "_broadcast_coalesced")


def paper_model():
    """The script's module (benchmarks/ is no package): registered before it runs, as its dataclasses need."""
    if "gpu_paper_model" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_paper_model", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpu_paper_model"] = module
        spec.loader.exec_module(module)
    return sys.modules["gpu_paper_model"]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _record(log: list, rank: int) -> dict:
    """Wrap this process's collectives: each call appends (op, payload bytes, bytes sent to other ranks).
    Returns the unwrapped ones."""
    orig = {name: getattr(dist, name) for name in COLLECTIVES}

    def a2a(output, input, output_split_sizes=None, input_split_sizes=None, *args, **kwargs):
        own = input_split_sizes[rank] if input_split_sizes else input.shape[0] // dist.get_world_size()
        row = _nbytes(input) // input.shape[0]
        log.append(("all_to_all", _nbytes(input), _nbytes(input) - own * row))
        return orig["all_to_all_single"](output, input, output_split_sizes, input_split_sizes, *args, **kwargs)

    def wrap(name: str, op: str, payload):
        def call(*args, **kwargs):
            log.append((op, payload(*args), None))
            return orig[name](*args, **kwargs)
        return call

    dist.all_to_all_single = a2a
    dist.all_gather = wrap("all_gather", "all_gather", lambda out, t, *a: _nbytes(t))
    dist.all_reduce = wrap("all_reduce", "all_reduce", lambda t, *a: _nbytes(t))
    dist.reduce_scatter = wrap("reduce_scatter", "reduce_scatter", lambda out, parts, *a: sum(map(_nbytes, parts)))
    dist.broadcast = wrap("broadcast", "broadcast", lambda t, *a: _nbytes(t))
    # DDP's buffer broadcast before each forward
    dist._broadcast_coalesced = wrap("_broadcast_coalesced", "broadcast",
                                     lambda pg, tensors, *a: sum(map(_nbytes, tensors)))
    return orig


def _ddp_hook(log: list, all_reduce):
    """DDP's default all-reduce of a gradient bucket (the mean over ranks), logged: its reducer calls the
    process group directly, past ``dist.all_reduce``."""
    def hook(state, bucket):
        grads = bucket.buffer()
        log.append(("all_reduce", _nbytes(grads), "ddp"))
        grads.div_(dist.get_world_size())
        return all_reduce(grads, async_op=True).get_future().then(lambda fut: fut.value()[0])
    return hook


def _rank(rank: int, world: int) -> dict:
    from mocolab.method.moco import MoCo
    from mocolab.models.backbones import build_encoder

    log: list = []
    out: dict = {}
    orig = _record(log, rank)
    for layout in ("replicated", "sharded"):
        torch.manual_seed(0)
        encoder = build_encoder("convnet", 3, width=4, head="mlp", dim=DIM, image_size=SIDE)
        queue = build_queue(layout, 4 * B * world, DIM, B, generator=torch.Generator().manual_seed(1))
        model = MoCo(encoder, queue, m=0.9, tau=0.2, shuffler=CrossRankShuffle(3), encoder_dtype=torch.bfloat16)
        model.encoder_q = torch.nn.parallel.DistributedDataParallel(encoder)  # as training/build.py wraps it
        model.encoder_q.register_comm_hook(None, _ddp_hook(log, orig["all_reduce"]))
        log.clear()  # DDP's start-up broadcast of the weights is no step's
        gen = torch.Generator().manual_seed(rank)
        im = torch.randn(2, B, 3, SIDE, SIDE, generator=gen)
        res = model(im[0], im[1], torch.arange(rank * B, (rank + 1) * B))
        res.loss.backward()
        out[layout] = {"calls": list(log), "queue_bytes": paper_model().slot_bytes(queue) * queue.slots,
                       "params": sum(p.numel() for p in encoder.parameters()),
                       "bn_bytes": sum(map(_nbytes, encoder.buffers()))}
    log.clear()  # the MoCo reference's shuffle: gather every image, broadcast the permutation, gather the keys
    x = torch.randn(B, 3, SIDE, SIDE).to(torch.bfloat16)
    dist.all_gather([torch.empty_like(x) for _ in range(world)], x)
    dist.broadcast(torch.randperm(B * world), 0)
    keys = torch.randn(B, DIM)
    dist.all_gather([torch.empty_like(keys) for _ in range(world)], keys)
    out["reference_shuffle"] = list(log)
    log.clear()
    shuffler = CrossRankShuffle(5)
    for _ in range(SHUFFLES):
        shuffler.shuffle(x)
    out["shuffles"] = list(log)
    return out


def _merged(calls: list) -> list[tuple[str, int]]:
    """(op, payload) a call each, DDP's gradient buckets summed into one all-reduce, as the model counts it."""
    out, ddp = [], 0
    for op, payload, tag in calls:
        if tag == "ddp":
            ddp += payload
        else:
            out.append((op, payload))
    return out + [("all_reduce", ddp)]


@pytest.mark.parametrize("world", [2, 4])
def test_step_collectives_match_the_paper_model(world, tmp_path):
    pm = paper_model()
    res = launch(_rank, world, tmp_path)
    slot = pm.slot_bytes(KeyQueue(8, DIM, 8))
    for r, got in enumerate(res):
        for layout in ("replicated", "sharded"):
            g = got[layout]
            s = pm.Shapes(batch=B, dim=DIM, queue=4 * B * world, image_values=3 * SIDE * SIDE, image_itemsize=2,
                          params=g["params"], bn_buffer_bytes=g["bn_bytes"])
            want = [(c.op, c.payload) for c in pm.step_calls(s, world, layout=layout)]
            assert _merged(g["calls"]) == want, f"rank {r}, {layout}"
            assert g["queue_bytes"] == pm.queue_memory(slot, s, world, layout), f"rank {r}, {layout}"
        ref = [(c.op, c.payload) for c in pm.shuffle_calls(s, world, "all_gather")]
        assert [(op, p) for op, p, _ in got["reference_shuffle"]] == ref
        assert {(op, p) for op, p, _ in got["shuffles"]} == {("all_to_all", pm.shuffle_calls(s, world)[0].payload)}
    # bytes that really left each rank, over SHUFFLES draws of the permutation, against the model's expectation
    sent = sum(off for got in res for _, _, off in got["shuffles"]) / (SHUFFLES * world)
    expected = pm.shuffle_calls(s, world)[0].wire(world)
    assert sent == pytest.approx(expected, rel=0.1)
    # the reference's gather moves W times what all_to_all moves
    gather = pm.shuffle_calls(s, world, "all_gather")[0].wire(world)
    assert gather / expected == pytest.approx(world, rel=1e-9)
