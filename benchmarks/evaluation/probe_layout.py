"""The linear probe as mocolab fits it against the same fit on row-major features, float64 and scikit-learn.

    .venv/bin/python benchmarks/evaluation/probe_layout.py [--seeds 2] [--preset cpu-quick] [--sklearn]
        [--set key=value ...]

``evaluation.linear_probe`` keeps the standardised features as D×N, so the
gradient of its weights is a product over contiguous rows; ``row_major_probe``
below is the same estimator (the loss, L-BFGS and its settings, zeros to
start) on N×D features, the layout it had before. Each is fitted on the
features of the random-init encoder of each seed and on raw pixels, in
float32 and float64, one after another in this process: compare the times
as ratios, and the test top-1 as images of the test split. ``--sklearn``
adds scikit-learn's ``LogisticRegression`` (lbfgs, the same L2 penalty) as
the outside reference.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from _machine import machine

from mocolab.training.baselines import pixel_features
from mocolab.config import build_config, parse_overrides
from mocolab.evaluation.probe import linear_probe
from mocolab.training.trainer import Trainer


def row_major_probe(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                    test_labels: torch.Tensor, classes: int, *, weight_decay: float, steps: int,
                    dtype: torch.dtype) -> float:
    """Test top-1 of the probe on N×D features (logits = X·W + b): the reference for the layout."""
    x = train_feats.double()
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    x = ((x - mean) / std).to(dtype)
    xt = ((test_feats.double() - mean) / std).to(dtype)
    w = torch.zeros(x.shape[1], classes, dtype=dtype, requires_grad=True)
    b = torch.zeros(classes, dtype=dtype, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=steps, history_size=20, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-9, tolerance_change=1e-12)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(x @ w + b, train_labels) + 0.5 * weight_decay * (w * w).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    with torch.no_grad():
        return float(((xt @ w + b).argmax(1) == test_labels).double().mean())


def sklearn_probe(train_feats, train_labels, test_feats, test_labels, *, weight_decay: float, steps: int) -> float:
    """scikit-learn's multinomial logistic regression with the same objective: C = 1 / (N · weight decay)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(train_feats.double().numpy())
    model = LogisticRegression(C=1.0 / (len(train_labels) * weight_decay), max_iter=steps * 5, tol=1e-10)
    model.fit(scaler.transform(train_feats.double().numpy()), train_labels.numpy())
    return float((model.predict(scaler.transform(test_feats.double().numpy())) == test_labels.numpy()).mean())


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu-quick")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--sklearn", action="store_true", help="also fit scikit-learn's LogisticRegression")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    print(machine(args.preset))
    print(f"{'features':14s} {'dtype':8s} {'row-major %':>11s} {'s':>6s} {'mocolab %':>10s} {'s':>6s} "
          f"{'speed-up':>8s} {'Δ test images':>13s}" + (f" {'sklearn %':>10s}" if args.sklearn else ""))
    speedups = []
    for seed in range(args.seeds):
        cfg = build_config(args.preset, {**parse_overrides(args.set), "run.seed": seed})
        e = cfg.eval
        tr = Trainer(cfg)
        for name, embed in ((f"init, seed {seed}", None), ("raw pixels", pixel_features)):
            if embed is not None and seed > 0:
                continue  # the pixels do not depend on the seed
            f_train, l_train = tr.evaluation.split_features("train", e.linear_train, embed=embed)
            f_test, l_test = tr.evaluation.split_features("test", None, embed=embed)
            for dtype in (torch.float32, torch.float64):
                kw = {"weight_decay": e.linear_wd, "steps": e.linear_steps, "dtype": dtype}
                ref, t_ref = timed(lambda: row_major_probe(f_train, l_train, f_test, l_test, tr.data.classes, **kw))
                ours, t_ours = timed(lambda: linear_probe(f_train, l_train, f_test, l_test, tr.data.classes, **kw))
                speedups.append(t_ref / t_ours)
                line = (f"{name:14s} {str(dtype).split('.')[1]:8s} {100 * ref:11.2f} {t_ref:6.1f} "
                        f"{100 * ours.test_top1:10.2f} {t_ours:6.1f} {t_ref / t_ours:7.2f}x "
                        f"{round((ours.test_top1 - ref) * len(l_test)):+13d}")
                if args.sklearn and dtype == torch.float64:
                    sk_top1 = sklearn_probe(f_train, l_train, f_test, l_test, weight_decay=e.linear_wd,
                                            steps=e.linear_steps)
                    line += f" {100 * sk_top1:10.2f}"
                print(line, flush=True)
    print(f"speed-up of the probe's fit, median over {len(speedups)} fits: "
          f"{sorted(speedups)[len(speedups) // 2]:.2f}x")


if __name__ == "__main__":
    main()
