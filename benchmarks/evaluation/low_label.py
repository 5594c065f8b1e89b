"""The final evaluation's low-label probes (1 % and 10 % of the probe's training labels) and its k = 20 kNN:
what they cost beside the full probe and the k = 200 kNN, and (``--select``) the weight decay and L-BFGS steps
the low-label probes use, chosen on a validation split, never on the test split.

    .venv/bin/python benchmarks/evaluation/low_label.py [--steps 120] [--preset cpu-quick] [--select [--wds 1e-3,1e-2]
        [--probe-steps 100,200]] [--set KEY=VALUE]

It trains one encoder ``--steps`` steps (0: the encoder at initialisation), extracts its features once, as a
run's final evaluation does, and times each part on them: the kNN at k = 200 alone and at k = 200 and 20
from one pass, the full probe, the low-label probes (every fraction and draw). ``--select`` holds out
``data.val_size`` training images (5,000 unless set), fits the low-label probes of each draw on the rest
for each weight decay and step count of the grid, scores them on the held-out images, and prints the
setting with the best mean validation top-1 over the fractions (fewer steps on a tie): what
``eval.low_label_wd`` and ``eval.low_label_steps`` are set to.
"""

from __future__ import annotations

import argparse
import time

from _machine import machine

from mocolab.config import build_config, parse_overrides
from mocolab.config.hardware import keep_freed_memory
from mocolab.evaluation.knn import knn_accuracies, knn_accuracy
from mocolab.evaluation.low_label import class_balanced_draw, low_label_metric, low_label_probes, mean
from mocolab.evaluation.precision import full_fp32
from mocolab.evaluation.probe import linear_probe
from mocolab.training.trainer import Trainer

WDS = "1e-4,1e-3,1e-2,3e-2,1e-1,3e-1,1"  # the grid --select searches (--wds, --probe-steps)
STEPS = "50,100,200"


def trained(cfg, steps: int) -> Trainer:
    tr = Trainer(cfg)
    done = 0
    while done < steps:
        for images in tr.data.epoch(tr.epoch_order(tr.epoch), tr.batch, tr.rank, tr.world_size, 0):
            tr.train_step(images, None, tr.schedule.momentum(tr.step))
            done += 1
            if done == steps:
                break
    return tr


def timed(fn, *args, **kw):
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t0


@full_fp32()
def cost(tr: Trainer) -> None:
    """Each part of the final evaluation, timed on one extraction of the features."""
    e, ev, classes = tr.cfg.eval, tr.evaluation, tr.data.classes
    (f_tr, y_tr), t_train = timed(ev.split_features, "train", None)
    (f_te, y_te), t_test = timed(ev.split_features, "test", None)
    bank = min(e.knn_bank or len(y_tr), len(y_tr))
    k200, t_k200 = timed(knn_accuracy, f_tr[:bank], y_tr[:bank], f_te, y_te, classes, e.knn_k, e.knn_t)
    both, t_both = timed(knn_accuracies, f_tr[:bank], y_tr[:bank], f_te, y_te, classes, (e.knn_k, e.knn_k_small),
                         e.knn_t)
    full, t_full = timed(linear_probe, f_tr, y_tr, f_te, y_te, classes, weight_decay=e.linear_wd,
                         steps=e.linear_steps)
    print(f"features: {len(y_tr):,} training and {len(y_te):,} test images, {f_tr.shape[1]} wide, "
          f"{t_train + t_test:.1f} s")
    print(f"{'part':<44s} {'top-1 %':>8s} {'s':>7s}")
    print(f"{'kNN k=' + str(e.knn_k) + ' alone':<44s} {100 * k200:8.2f} {t_k200:7.2f}")
    print(f"{f'kNN k={e.knn_k} and k={e.knn_k_small}, one pass':<44s} "
          f"{100 * both[e.knn_k]:>4.2f}/{100 * both[e.knn_k_small]:.2f} {t_both:7.2f}")
    print(f"{f'linear probe, {len(y_tr):,} labels, {e.linear_steps} steps':<44s} {100 * full.test_top1:8.2f} "
          f"{t_full:7.2f}")
    total = 0.0
    for f in e.low_label:
        tops, t = timed(low_label_probes, f_tr, y_tr, f_te, y_te, classes, (f,), e.low_label_draws,
                        weight_decay=e.low_label_wd, steps=e.low_label_steps)
        total += t
        n = len(class_balanced_draw(y_tr, f, classes, 0))
        print(f"{f'{low_label_metric(f)}: {n:,} labels x {e.low_label_draws} draws':<44s} "
              f"{100 * mean(tops[f]):8.2f} {t:7.2f}   draws: {', '.join(f'{100 * v:.2f}' for v in tops[f])}")
    print(f"low-label probes in all: {total:.2f} s ({total / t_full:.2f}x the full probe); kNN k={e.knn_k_small} "
          f"beside k={e.knn_k}: {t_both - t_k200:+.2f} s")


@full_fp32()
def select(tr: Trainer, wds: list[float], step_counts: list[int]) -> None:
    """The grid of weight decays and steps, each low-label probe fitted on the training split and scored on the
    validation split."""
    e, ev, classes = tr.cfg.eval, tr.evaluation, tr.data.classes
    f_tr, y_tr = ev.split_features("train", None)
    f_va, y_va = ev.split_features("val", None)
    print(f"selection: {len(y_tr):,} training images, {len(y_va):,} validation images; validation top-1 %, the "
          f"mean over {e.low_label_draws} draws")
    print(f"{'wd':>8s} {'steps':>5s} " + " ".join(f"{low_label_metric(f):>18s}" for f in e.low_label)
          + f" {'mean':>7s} {'s':>6s}")
    best = None
    for wd in wds:
        for steps in step_counts:
            tops, t = timed(low_label_probes, f_tr, y_tr, f_va, y_va, classes, e.low_label, e.low_label_draws,
                            weight_decay=wd, steps=steps)
            score = mean([mean(v) for v in tops.values()])
            print(f"{wd:8g} {steps:5d} " + " ".join(f"{100 * mean(tops[f]):18.2f}" for f in e.low_label)
                  + f" {100 * score:7.2f} {t:6.1f}")
            if best is None or score > best[0] + 1e-12:
                best = (score, wd, steps)
    print(f"best on the validation split: eval.low_label_wd={best[1]:g} eval.low_label_steps={best[2]} "
          f"(mean validation top-1 {100 * best[0]:.2f} %)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu-quick")
    ap.add_argument("--steps", type=int, default=120, help="training steps before the evaluation (0: at init)")
    ap.add_argument("--select", action="store_true", help="choose the low-label weight decay and steps on a "
                                                          "validation split (data.val_size, 5000 unless set)")
    ap.add_argument("--wds", default=WDS, help=f"weight decays --select tries (default {WDS})")
    ap.add_argument("--probe-steps", default=STEPS, help=f"L-BFGS step counts --select tries (default {STEPS})")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    wds, step_counts = [float(w) for w in args.wds.split(",")], [int(n) for n in args.probe_steps.split(",")]
    if args.steps < 0 or min(wds) < 0 or min(step_counts) < 1:
        ap.error("--steps must be >= 0, every --wds >= 0 and every --probe-steps >= 1")
    overrides = parse_overrides(args.set)
    if args.select:
        overrides.setdefault("data.val_size", 5000)
    cfg = build_config(args.preset, overrides)
    keep_freed_memory()
    print(machine(args.preset) + f", {args.steps} training steps")
    tr, t = timed(trained, cfg, args.steps)
    print(f"trained {args.steps} steps in {t:.1f} s")
    cost(tr)
    if args.select:
        select(tr, wds, step_counts)


if __name__ == "__main__":
    main()
