"""The online linear probe's curve of each arm of a study on one plot: how each arm learns, epoch by epoch.

A study's arms are the values of what it varies (the momentum study: m = 0, 0.9, 0.99, 0.999); the seeds of
one arm are one line, their mean at each step (with the band of their range where there are several). The
probe (training/online_probe.py) is scored with each kNN monitor, on the validation split where one is held
out (``val_online_linear_top1``), else on the test split (``online_linear_top1``). Matplotlib only.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

ONLINE_KEYS = ("val_online_linear_top1", "online_linear_top1")  # the first any trial logged is drawn
History = Callable[[str, str], list[tuple[int, float]]]  # (run id, metric) -> (step, value) pairs


def arms(df: pd.DataFrame, varying: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """(label, its trials) per arm: the trials that share every varied param (seeds apart), in the order of
    the first varied param's values (numerically where they are numbers). No varied param: one arm each."""
    keys = [f"params.{k}" for k in varying if f"params.{k}" in df and k != "run.seed"]
    if not keys:
        return [(str(r.label), df.iloc[[i]]) for i, r in enumerate(df.itertuples())]
    groups = list(df.groupby(keys, sort=False, dropna=False))

    def order(item):
        value = item[0][0] if isinstance(item[0], tuple) else item[0]
        try:
            return (0, float(value), "")
        except (TypeError, ValueError):
            return (1, 0.0, str(value))

    out = []
    for values, trials in sorted(groups, key=order):
        values = values if isinstance(values, tuple) else (values,)
        short = [k[len("params."):] for k in keys]
        label = ", ".join(f"{'m' if k == 'moco.m' else k} = {v}" for k, v in zip(short, values))
        out.append((label, trials))
    return out


def online_probe_key(history: History, df: pd.DataFrame) -> str | None:
    """The online probe's metric the trials logged (the validation split's first), or None: probe off."""
    for key in ONLINE_KEYS:
        if any(history(r, key) for r in df["run_id"]):
            return key
    return None


def probe_curves(history: History, df: pd.DataFrame, varying: list[str], path: Path) -> tuple[str, Path] | None:
    """(caption, the figure) of the online probe per arm against the step; None where no trial logged it.

    The last point of each trial is its end-of-run score on the final evaluation's test images; the others
    are the per-epoch monitors."""
    key = online_probe_key(history, df)
    if key is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    seeds = 1
    for n, (label, trials) in enumerate(arms(df, varying)):
        curves = [dict(history(r, key)) for r in trials["run_id"]]
        curves = [c for c in curves if c]
        if not curves:
            continue
        seeds = max(seeds, len(curves))
        steps = sorted({s for c in curves for s in c})
        values = np.array([[c.get(s, math.nan) for s in steps] for c in curves], dtype=float)
        with np.errstate(all="ignore"):
            mean = np.nanmean(values, axis=0) * 100
        colour = f"C{n % 10}"
        ax.plot(steps, mean, marker=".", color=colour, label=f"{label}" + (f" ({len(curves)} seeds)"
                                                                          if len(curves) > 1 else ""))
        if len(curves) > 1:
            ax.fill_between(steps, np.nanmin(values, axis=0) * 100, np.nanmax(values, axis=0) * 100,
                            color=colour, alpha=0.15, linewidth=0)
    split = "validation" if key.startswith("val_") else "test"
    ax.set_xlabel("step")
    ax.set_ylabel(f"online linear probe top-1 (%), {split} split")
    ax.set_title("Online linear probe during training, per arm")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    caption = (f"Online linear probe ({key}) during training, one line per arm"
               + (" (mean over seeds, band: their range)" if seeds > 1 else "")
               + f"; scored on the {split} split with each kNN monitor, the last point at the run's end. "
               "It reads detached features and never changes the encoder.")
    return caption, path
