"""mocolab's training step against a lightly-style MoCo pipeline, side by side in one process.

    .venv/bin/python -m pip install --no-deps --target /tmp/lightly-pkgs lightly lightning-utilities
    PYTHONPATH=/tmp/lightly-pkgs .venv/bin/python benchmarks/step/peer_lightly.py [--threads 2] [--steps 20]

(the peer beside the venv, not in it: its dependencies would pin other torch packages).

The peer is built the way lightly's own MoCo example builds it: its
``MoCoProjectionHead``, ``NTXentLoss`` with a memory bank of K negatives,
``update_momentum`` on backbone and head, and its ``MoCoV2Transform`` applied
per PIL image in a torch ``DataLoader``. Both sides get cpu-quick's convnet
backbone, batch 256, K = 16,384, embedding 64, τ 0.2, SGD, Fashion-MNIST's
28×28 images and the same torch thread count; mocolab runs its real
``Trainer.train_step`` (batched two-view augmentation on the tensor,
split-BN key shuffle, the queue) in fp32 and in its default precision
(cpu-quick: bf16 encoders where the CPU has native bf16). Prints images/s
(pairs of views per second) for each and the ratios, measured in one run. The peer's convnet is
built from torch's own layers. The peer is timed twice: as its users run it, then under the allocator
setting mocolab's training processes make (``hardware.keep_freed_memory``), which the ratios use.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import time

import torch
from _steps import held_batches, timed_steps, with_relu_before_pool, with_torch_pool
from torch import nn


def lightly_pipeline(images: torch.Tensor, args, backbone: nn.Module, feat: int):
    """(model, step function, loader) of the peer, from its public pieces, as its MoCo example wires them."""
    from PIL import Image
    from lightly.loss import NTXentLoss
    from lightly.models.modules import MoCoProjectionHead
    from lightly.models.utils import deactivate_requires_grad, update_momentum
    from lightly.transforms.moco_transform import MoCoV2Transform

    class PeerMoCo(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = backbone
            self.projection_head = MoCoProjectionHead(feat, feat, 64)
            self.backbone_momentum = copy.deepcopy(self.backbone)
            self.projection_head_momentum = copy.deepcopy(self.projection_head)
            deactivate_requires_grad(self.backbone_momentum)
            deactivate_requires_grad(self.projection_head_momentum)

        def forward(self, x):
            return self.projection_head(self.backbone(x).flatten(start_dim=1))

        def forward_momentum(self, x):
            return self.projection_head_momentum(self.backbone_momentum(x).flatten(start_dim=1)).detach()

    transform = MoCoV2Transform(input_size=images.shape[-1], min_scale=0.5,
                                normalize={"mean": [0.286], "std": [0.353]})

    class Pictures(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return images.shape[0]

        def __getitem__(self, i):
            return transform(Image.fromarray(images[i, 0].numpy(), mode="L")), 0

    model = PeerMoCo()
    criterion = NTXentLoss(temperature=0.2, memory_bank_size=(args.k, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.06, momentum=0.9, weight_decay=5e-4)
    loader = torch.utils.data.DataLoader(Pictures(), batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.loader_workers)

    def step(batch) -> float:
        x_query, x_key = batch[0]
        update_momentum(model.backbone, model.backbone_momentum, m=0.999)
        update_momentum(model.projection_head, model.projection_head_momentum, m=0.999)
        loss = criterion(model(x_query), model.forward_momentum(x_key))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return float(loss.detach())

    return model, step, loader


def time_peer(images, args, backbone, feat) -> float:
    model, step, loader = lightly_pipeline(images, args, backbone, feat)
    model.train()
    it = iter(loader)
    for _ in range(args.warmup):
        step(next(it))
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step(next(it))  # the loader's per-image transforms are part of the pipeline's time
    return args.steps * args.batch / (time.perf_counter() - t0)


def time_mocolab(precision: str, args) -> tuple[float, str]:
    from mocolab.config import build_config
    from mocolab.training.trainer import Trainer

    cfg = build_config("cpu-quick", {"run.precision": precision, "optim.batch_size": args.batch,
                                     "queue.size": args.k})
    tr = Trainer(cfg)
    # batches already in memory: mocolab's loader holds them so
    rate = timed_steps(tr, held_batches(tr, args.warmup + args.steps), args.warmup)
    return rate, "bf16" if tr.precision is not None else "fp32"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--k", type=int, default=16384)
    ap.add_argument("--loader-workers", type=int, default=0,
                    help="the peer's DataLoader worker processes (0: in the timing process, on its threads)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    try:
        import lightly  # noqa: F401
    except ImportError:
        raise SystemExit("error: the peer needs lightly: .venv/bin/python -m pip install --no-deps --target "
                         "/tmp/lightly-pkgs lightly lightning-utilities, then PYTHONPATH=/tmp/lightly-pkgs") from None
    from mocolab.config import build_config
    from mocolab.data.sets import load_dataset
    from mocolab.models.backbones import build_backbone

    cfg = build_config("cpu-quick")
    train = load_dataset(cfg.data.name, "train", cfg.data.root)
    images = train.images[: args.batch * (args.warmup + args.steps + 1)]
    torch.manual_seed(0)
    # the peer's backbone: the same convnet in torch's own layers (conv, BN, ReLU, nn.MaxPool2d), as a
    # lightly user writes it; mocolab's exact faster pooling is part of what is measured
    backbone = with_relu_before_pool(with_torch_pool(build_backbone("convnet", 1, cfg.model.width)))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads; lightly {lightly.__version__}; batch "
          f"{args.batch}, K {args.k}, convnet width {cfg.model.width}, 28x28 Fashion-MNIST")
    from mocolab.config.hardware import keep_freed_memory

    peer_as_is = time_peer(images, args, copy.deepcopy(backbone), backbone.out_dim)
    keep_freed_memory()  # mocolab's training processes set this; the peer is timed again with it, and the
    peer = time_peer(images, args, backbone, backbone.out_dim)  # ratios are against that (the faster) figure
    fp32, _ = time_mocolab("fp32", args)
    default, which = time_mocolab(cfg.run.precision, args)
    print(f"lightly-style pipeline (per-image transforms, DataLoader workers {args.loader_workers}), "
          f"glibc malloc as it is: {peer_as_is:7.0f} images/s")
    print(f"lightly-style pipeline, with mocolab's allocator setting:    {peer:7.0f} images/s  (the ratios' base)")
    print(f"mocolab step, fp32:                      {fp32:7.0f} images/s  x{fp32 / peer:.2f}")
    print(f"mocolab step, default ({cfg.run.precision} -> {which}):       {default:7.0f} images/s  "
          f"x{default / peer:.2f}")


if __name__ == "__main__":
    main()
