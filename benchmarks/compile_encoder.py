"""Does torch.compile (inductor's CPU code) pay for the cpu-quick encoder? Eager against compiled, one process.

    .venv/bin/python benchmarks/compile_encoder.py [--precision bf16|fp32] [--no-layout-optimization]

What a step asks of an encoder, timed alternately: the query pass with its
backward and the key pass without gradient, batch 256 at 28×28, cpu-quick's
convnet (split batch-norm in 4 groups).  Variants:

- ``eager``: mocolab's encoder as it trains (MaxPool2x2, per-group batch-norm kernels);
- ``compiled``: the same modules under ``Module.compile()`` (reported as failing where they do not compile);
- ``compiled-plain``: written as inductor likes it, so it can fuse batch-norm, pooling and ReLU into
  its own kernels: the group statistics as one reduction over a view, ``nn.MaxPool2d(2)``;
- ``eager-plain``: that plain form without compiling (what the fusion has to beat).

It prints the compile time and the median milliseconds of each variant.
Not run by the suite: compiling takes 20-40 s and needs a C++ compiler.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from _steps import with_torch_pool
from torch import nn

from mocolab.config.hardware import keep_freed_memory
from mocolab.models.backbones import build_encoder
from mocolab.method.batchnorm import SplitBatchNorm2d


def _plain_group_bn(self: SplitBatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    """Training-mode split batch-norm as one reduction over a G×(N/G)×C×H×W view (running stats left out:
    they cost nothing here and inductor would only copy them)."""
    n, c, h, w = x.shape
    xf = x.float().view(self.groups, n // self.groups, c, h, w)
    mean = xf.mean(dim=(1, 3, 4), keepdim=True)
    var = (xf - mean).square().mean(dim=(1, 3, 4), keepdim=True)
    y = (xf - mean) * torch.rsqrt(var + self.eps) * self.weight.view(1, 1, c, 1, 1) + self.bias.view(1, 1, c, 1, 1)
    return y.to(x.dtype).view(n, c, h, w)


def plain(encoder: nn.Module) -> nn.Module:
    out = with_torch_pool(copy.deepcopy(encoder))
    for m in out.modules():
        if isinstance(m, SplitBatchNorm2d):
            m.forward = _plain_group_bn.__get__(m)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--no-layout-optimization", action="store_true",
                    help="keep inductor from converting the convolutions to channels_last")
    args = ap.parse_args()
    if args.threads < 1 or args.rounds < 1:
        ap.error(f"--threads and --rounds must be >= 1 (got {args.threads} and {args.rounds})")
    keep_freed_memory()  # as training processes run (without it, fresh pages dominate these figures)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.no_layout_optimization:
        import torch._inductor.config as inductor_config

        inductor_config.layout_optimization = False
    x = torch.randn(256, 1, 28, 28)

    def precision():  # as MoCo runs its encoders: bf16 autocast, or plain float32
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def step(encoder: nn.Module) -> None:
        with precision():
            q = encoder(x)
        q.float().square().sum().backward()
        with torch.no_grad(), precision():
            encoder(x)  # the key pass: same shapes, no graph

    base = build_encoder("convnet", 1, width=32, head="mlp", dim=64, bn_groups=4)
    variants = {"eager": base, "compiled": copy.deepcopy(base), "compiled-plain": plain(base),
                "eager-plain": plain(base)}
    for name in ("compiled", "compiled-plain"):
        t0 = time.perf_counter()
        variants[name].compile()
        try:
            step(variants[name])
            step(variants[name])  # the backward graph compiles on the first, recompiles settle by the second
        except Exception as err:  # noqa: BLE001  (a variant that does not compile is a result, not a crash)
            inner = getattr(err, "inner_exception", None) or err
            print(f"{name}: does not compile ({type(err).__name__}, from {type(inner).__name__}: "
                  f"{str(inner).strip().splitlines()[0][:120]})")
            del variants[name]
            continue
        print(f"{name}: compiled and ran twice in {time.perf_counter() - t0:.1f} s", flush=True)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, encoder in variants.items():
            step(encoder)
            t0 = time.perf_counter()
            step(encoder)
            step(encoder)
            times[name].append((time.perf_counter() - t0) / 2 * 1e3)
    eager = statistics.median(times["eager"])
    print(f"{args.precision}, {args.threads} threads, layout optimisation "
          f"{'off' if args.no_layout_optimization else 'on'}: ms per query pass + backward + key pass")
    for name, v in times.items():
        print(f"  {name:15s} {statistics.median(v):7.1f} ms  (x{eager / statistics.median(v):.2f} of eager's speed)")


if __name__ == "__main__":
    main()
