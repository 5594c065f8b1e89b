"""MoCo v2 on Fashion-MNIST in one screen: the method layer alone, no Ray, no MLflow.

The whole algorithm is here: two augmented views per image, a query encoder
trained by SGD, a key encoder that is its moving average (inside ``MoCo``), a
FIFO queue of past keys as negatives, InfoNCE, and at the end a kNN monitor
on the frozen backbone's features.  Everything the platform adds (Ray Train
workers, Tune sweeps, MLflow tracking, checkpoints) is left out.

    .venv/bin/python examples/minimal_moco.py                 # about 1-2 minutes on 2 CPU cores
    .venv/bin/python examples/minimal_moco.py --steps 5 --subset 1024 --batch-size 64

``main(argv)`` returns the final kNN top-1 (a fraction in [0, 1]).
"""

import argparse
import itertools
import time

import torch

from mocolab.data.augment import TwoViews
from mocolab.data.sets import ImageDataset, iterate_batches, load_dataset
from mocolab.evaluation.scoring import extract_features
from mocolab.evaluation.knn import knn_accuracy
from mocolab.models.backbones import build_encoder
from mocolab.method.moco import MoCo
from mocolab.method.shuffle import LocalShuffle
from mocolab.method.key_queue import KeyQueue


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
    torch.manual_seed(args.seed)  # the subset, the batch order, the augmentations, the initial weights
    dev = "cuda" if torch.cuda.is_available() else "cpu"

    full = load_dataset("fashion-mnist", "train", None)  # uint8 60000×1×28×28, labels 60000
    idx = torch.randperm(len(full))[:args.subset or len(full)]
    train = ImageDataset(full.images[idx], full.labels[idx], full.classes, "fashion-mnist")  # N×1×28×28
    augment = TwoViews("mocov2", 28, 1, crop_min=0.5).to(dev)  # uint8 B×1×28×28 -> 2 × float B×1×28×28
    encoder = build_encoder("convnet", 1, width=16, head="mlp", dim=128, bn_groups=4)  # B×1×28×28 -> B×128
    queue = KeyQueue(args.queue, 128, args.batch_size)  # K×128 keys, oldest overwritten first
    model = MoCo(encoder, queue, m=0.99, tau=0.2, shuffler=LocalShuffle()).to(dev)  # f_k = EMA copy of f_q
    opt = torch.optim.SGD(model.encoder_q.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)

    g = torch.Generator().manual_seed(args.seed)
    batches = (x for _ in itertools.count() for x, _, _ in iterate_batches(train, args.batch_size, g))  # endless
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        im_q, im_k = augment(next(batches).to(dev))  # two views, B×1×28×28 each
        out = model(im_q, im_k)  # q: B×128, k: B×128 (no grad); logits B×(1+K); keys enqueued
        opt.zero_grad()
        out.loss.backward()  # gradient reaches f_q only
        opt.step()
        if step % args.print_every == 0 or step in (1, args.steps):
            print(f"step {step:4d}/{args.steps}  loss {out.loss.item():.4f}  "
                  f"pretext acc {out.pretext_accuracy:.3f}  lr {sched.get_last_lr()[0]:.4f}  "
                  f"{time.perf_counter() - start:.0f}s", flush=True)
        sched.step()  # cosine decay from --lr to 0 over --steps

    # kNN top-1 on the frozen backbone's features (128-d for width 16), the training subset as the bank.
    test = load_dataset("fashion-mnist", "test", None)
    bank = extract_features(model.encoder_q.backbone, train.images, dev)  # N×128
    feats = extract_features(model.encoder_q.backbone, test.images[:2000], dev)  # 2000×128
    acc = knn_accuracy(bank, train.labels, feats, test.labels[:2000], full.classes)
    print(f"kNN top-1 (k=200, bank {len(train)} train images, 2000 test images): {100 * acc:.2f} %")
    return acc


if __name__ == "__main__":
    main()
