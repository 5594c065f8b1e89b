"""MoCo v2 on Fashion-MNIST in one screen: a training loop of your own around mocolab's stable parts.

The loop body is Algorithm 1 of He et al. 2020: two augmented views per image, a query encoder f_q trained
by SGD, a key encoder f_k that follows it (``momentum_update``), keys computed on a shuffled batch
(``LocalShuffle`` over split BN's four groups, ``convert_split_bn``) so BN cannot give the positive away,
a FIFO ``KeyQueue`` of past keys as negatives (``contrast``: InfoNCE), and at the end ``knn_accuracy`` on
the frozen backbone's features.  The encoder and the augmentation are this file's own plain PyTorch: any
module that maps images to vectors will do.  Everything imported from mocolab is on the list of
docs/api.md; Ray, MLflow, checkpoints and configs stay out.

    .venv/bin/python examples/minimal_moco.py                 # 600 steps, a few minutes on 2 CPU cores
    .venv/bin/python examples/minimal_moco.py --steps 5 --subset 1024 --batch-size 64

``main(argv)`` returns the final kNN top-1 (a fraction in [0, 1]).
"""

import argparse
import copy
import itertools
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from mocolab.data.sets import load_dataset
from mocolab.evaluation.knn import knn_accuracy
from mocolab.method.batchnorm import convert_split_bn
from mocolab.method.key_queue import KeyQueue
from mocolab.method.moco import momentum_update
from mocolab.method.shuffle import LocalShuffle

MEAN, STD = 0.286, 0.353  # Fashion-MNIST's pixel statistics


def convnet(width: int = 16) -> nn.Sequential:
    """Four conv-BN-ReLU blocks (w, 2w, 4w, 8w channels), three 2×2 max-pools: B×1×28×28 -> B×8w."""
    chans, layers = [1, width, 2 * width, 4 * width, 8 * width], []
    for i in range(4):
        layers += [nn.Conv2d(chans[i], chans[i + 1], 3, padding=1, bias=False), nn.BatchNorm2d(chans[i + 1]),
                   nn.ReLU(inplace=True)]
        layers += [nn.MaxPool2d(2)] if i < 3 else [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return nn.Sequential(*layers)


def augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """uint8 B×1×H×W -> a float view each: a crop of 50-100 % of the area (aspect 3/4 to 4/3) resized back,
    a horizontal flip half the time, contrast and brightness jitter of ±40 %, standardised."""
    b = x.shape[0]
    u = torch.rand(b, 7, generator=g)  # each image's own draws, from the example's stream
    area, ratio = 0.5 + 0.5 * u[:, 0], torch.exp((2 * u[:, 1] - 1) * math.log(4 / 3))
    w, h = (area * ratio).sqrt().clamp(max=1), (area / ratio).sqrt().clamp(max=1)  # the crop, as fractions
    theta = torch.zeros(b, 2, 3)  # output grid -> input coordinates in [-1, 1]
    theta[:, 0, 0] = w * torch.where(u[:, 2] < 0.5, -1.0, 1.0)
    theta[:, 1, 1] = h
    theta[:, 0, 2], theta[:, 1, 2] = (1 - w) * (2 * u[:, 3] - 1), (1 - h) * (2 * u[:, 4] - 1)
    grid = F.affine_grid(theta.to(x.device), list(x.shape), align_corners=False)
    v = F.grid_sample(x.float() / 255, grid, align_corners=False)  # B×1×H×W in [0, 1]
    contrast, brightness = (0.6 + 0.8 * u[:, 5:7].to(x.device)).view(b, 2, 1, 1).unbind(1)
    mean = v.mean(dim=(1, 2, 3), keepdim=True)
    v = (((v - mean) * contrast[:, None] + mean) * brightness[:, None]).clamp(0, 1)
    return (v - MEAN) / STD


@torch.no_grad()
def features(backbone: nn.Module, images: torch.Tensor, dev: str) -> torch.Tensor:
    """uint8 N×1×28×28 -> N×D features in eval mode (BN on its running statistics)."""
    backbone.eval()
    out = [backbone((images[i:i + 512].to(dev).float() / 255 - MEAN) / STD).cpu()
           for i in range(0, len(images), 512)]
    backbone.train()
    return torch.cat(out)


def main(argv=None) -> float:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600, help="SGD steps (default 600)")
    p.add_argument("--subset", type=int, default=8192, help="training images used, 0 for all 60,000")
    p.add_argument("--batch-size", type=int, default=128, help="a multiple of the 4 BN groups")
    p.add_argument("--queue", type=int, default=4096, help="negatives K, a multiple of the batch")
    p.add_argument("--lr", type=float, default=0.06)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--print-every", type=int, default=25)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)  # the subset and the initial weights
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m, tau = 0.99, 0.2

    full = load_dataset("fashion-mnist", "train")  # uint8 60000×1×28×28, labels 60000
    idx = torch.randperm(len(full))[:args.subset or len(full)]
    images, labels = full.images[idx], full.labels[idx]  # N×1×28×28, N
    backbone = convert_split_bn(convnet(16), groups=4)  # BN statistics per quarter of the batch
    encoder_q = nn.Sequential(backbone, nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128)).to(dev)  # -> B×128
    encoder_k = copy.deepcopy(encoder_q).requires_grad_(False)  # f_k: follows f_q, never in the optimizer
    queue = KeyQueue(args.queue, 128, args.batch_size).to(dev)  # K×128 keys, oldest overwritten first
    shuffler = LocalShuffle(torch.Generator().manual_seed(args.seed))
    opt = torch.optim.SGD(encoder_q.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)

    g = torch.Generator().manual_seed(args.seed)  # the batch order and the augmentations
    n = len(images) // args.batch_size * args.batch_size
    batches = (images[i] for _ in itertools.count() for i in torch.randperm(len(images), generator=g)[:n]
               .view(-1, args.batch_size))  # endless, a new order each epoch
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x = next(batches).to(dev)  # uint8 B×1×28×28
        im_q, im_k = augment(x, g), augment(x, g)  # two views
        q = F.normalize(encoder_q(im_q), dim=1)  # queries: B×128
        with torch.no_grad():
            momentum_update(encoder_k, encoder_q, m)  # θ_k ← m·θ_k + (1−m)·θ_q
            shuffled, restore = shuffler.shuffle(im_k)  # BN groups see other images than the queries'
            k = shuffler.unshuffle(F.normalize(encoder_k(shuffled), dim=1), restore)  # keys: B×128
        l_pos = (q * k).sum(dim=1, keepdim=True)  # B×1
        loss, correct = queue.contrast(q, l_pos, tau)  # InfoNCE over 1 + K logits
        queue.enqueue(k, step)  # after contrast: this step's keys are no negatives of its own queries
        opt.zero_grad()
        loss.backward()  # gradient reaches f_q only
        opt.step()
        if step % args.print_every == 0 or step in (1, args.steps):
            print(f"step {step:4d}/{args.steps}  loss {loss.item():.4f}  "
                  f"pretext acc {correct.float().mean():.3f}  lr {sched.get_last_lr()[0]:.4f}  "
                  f"{time.perf_counter() - start:.0f}s", flush=True)
        sched.step()  # cosine decay from --lr to 0 over --steps

    # kNN top-1 on the frozen backbone's features (128-d), the training subset as the bank.
    test = load_dataset("fashion-mnist", "test")
    acc = knn_accuracy(features(backbone, images, dev), labels, features(backbone, test.images[:2000], dev),
                       test.labels[:2000], full.classes)
    print(f"kNN top-1 (k=200, bank {len(images)} train images, 2000 test images): {100 * acc:.2f} %")
    return acc


if __name__ == "__main__":
    main()
