"""A trial's final evaluation as it was (float32 features, float64 probe) and as it is (features at the run's
precision, float32 probe), on the same encoders, over seeds.

    .venv/bin/python benchmarks/evaluation/eval_precision.py [--seeds 3] [--steps 0,120] [--preset cpu-quick]
        [--sklearn]

The probe is one strictly convex problem (mean cross-entropy + wd/2·|W|² on
standardised features): a solver that converges gives the same classifier,
so what a cheaper path may change is where L-BFGS stands after
``eval.linear_steps`` iterations and, with bf16 features, the features
themselves. For each seed and each training length (0 steps: the encoder
at initialisation) this prints both evaluations' kNN and linear top-1, how
many of the test images each changes, and each part's time; ``--sklearn``
adds scikit-learn's LogisticRegression (C = 1/(wd·n), the same objective)
on the float32 features (minutes on 60,000 images).
"""

from __future__ import annotations

import argparse
import time

import torch
from _machine import machine
from low_label import trained

from mocolab.config import build_config, parse_overrides
from mocolab.evaluation.scoring import extract_features
from mocolab.evaluation.knn import knn_accuracy
from mocolab.evaluation.probe import linear_probe
from mocolab.config.hardware import keep_freed_memory
from mocolab.training.trainer import Trainer


def sklearn_probe(f_tr: torch.Tensor, y_tr: torch.Tensor, f_te: torch.Tensor, y_te: torch.Tensor, wd: float,
                  steps: int) -> float:
    from sklearn.linear_model import LogisticRegression

    x = f_tr.double()
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    sk = LogisticRegression(C=1.0 / (wd * len(x)), tol=1e-8, max_iter=max(steps, 1000))
    sk.fit(((x - mean) / std).numpy(), y_tr.numpy())
    return float((sk.predict(((f_te.double() - mean) / std).numpy()) == y_te.numpy()).mean())


def features(tr: Trainer, split: str, n: int | None, dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    feats, labels = [], []
    for images, lab in tr.data.eval_split(split, n):
        feats.append(extract_features(tr.encoder.backbone, images, tr.device, dtype=dtype))
        labels.append(lab)
    return torch.cat(feats), torch.cat(labels)


def evaluate(tr: Trainer, dtype: torch.dtype | None, probe_dtype: torch.dtype) -> dict:
    e = tr.cfg.eval
    t0 = time.perf_counter()
    f_tr, y_tr = features(tr, "train", None, dtype)
    f_te, y_te = features(tr, "test", None, dtype)
    t1 = time.perf_counter()
    bank = min(e.knn_bank or len(y_tr), len(y_tr))
    knn = knn_accuracy(f_tr[:bank], y_tr[:bank], f_te, y_te, tr.data.classes, e.knn_k, e.knn_t)
    t2 = time.perf_counter()
    lin = f_tr[:e.linear_train] if e.linear_train else f_tr
    probe = linear_probe(lin, y_tr[:len(lin)], f_te, y_te, tr.data.classes, weight_decay=e.linear_wd,
                         steps=e.linear_steps, dtype=probe_dtype)
    t3 = time.perf_counter()
    return {"knn": knn, "linear": probe.test_top1, "features_s": t1 - t0, "probe_s": t3 - t2, "n_test": len(y_te),
            "f": (lin, y_tr[:len(lin)], f_te, y_te)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu-quick")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", default="0,120", help="training steps before the evaluation, comma-separated "
                                                     "(0: the encoder at initialisation)")
    ap.add_argument("--sklearn", action="store_true", help="also fit scikit-learn's LogisticRegression")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    lengths = [int(s) for s in args.steps.split(",")]
    if args.seeds < 1 or min(lengths) < 0:
        ap.error("--seeds must be >= 1 and every --steps >= 0")
    keep_freed_memory()
    print(machine(args.preset))
    print(f"{'seed':>4s} {'steps':>5s} {'evaluation':>28s} {'kNN %':>7s} {'linear %':>8s} {'Δ images':>9s} "
          f"{'features s':>10s} {'probe s':>8s}")
    worst = {"knn": 0, "linear": 0}
    spent = {"before": [0.0, 0.0], "after": [0.0, 0.0]}
    for seed in range(args.seeds):
        for n in lengths:
            cfg = build_config(args.preset, {**parse_overrides(args.set), "run.seed": seed})
            tr = trained(cfg, n)
            arms = {"before": ("float32 features, float64 probe", evaluate(tr, None, torch.float64)),
                    "after": (f"{'bf16' if tr.precision == torch.bfloat16 else 'float32'} features, float32 probe",
                              evaluate(tr, tr.precision, torch.float32))}
            ref = arms["before"][1]
            for key, (label, r) in arms.items():
                dk, dl = (round((r[m] - ref[m]) * r["n_test"]) for m in ("knn", "linear"))
                worst = {"knn": max(worst["knn"], abs(dk)), "linear": max(worst["linear"], abs(dl))}
                spent[key][0] += r["features_s"]
                spent[key][1] += r["probe_s"]
                print(f"{seed:4d} {n:5d} {label:>28s} {100 * r['knn']:7.2f} {100 * r['linear']:8.2f} "
                      f"{dk:+4d}/{dl:+4d} {r['features_s']:10.1f} {r['probe_s']:8.1f}")
            if args.sklearn:
                e = cfg.eval
                t0 = time.perf_counter()
                sk = sklearn_probe(*ref["f"], e.linear_wd, e.linear_steps)
                print(f"{seed:4d} {n:5d} {'scikit-learn on float32 features':>28s} {'':7s} {100 * sk:8.2f} "
                      f"{round((sk - ref['linear']) * ref['n_test']):+9d} {'':10s} {time.perf_counter() - t0:8.1f}")
    runs = args.seeds * len(lengths)
    b, a = spent["before"], spent["after"]
    print(f"over {runs} encoders: at most {worst['knn']} kNN and {worst['linear']} linear-probe test images of "
          f"{ref['n_test']:,} change; features {b[0] / runs:.1f} s -> {a[0] / runs:.1f} s, probe "
          f"{b[1] / runs:.1f} s -> {a[1] / runs:.1f} s a trial")


if __name__ == "__main__":
    main()
