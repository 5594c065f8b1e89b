"""The pictures the studies and reports draw from a summary table (matplotlib, Agg: no screen needed)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _acc(ax, x, table: pd.DataFrame, key: str, label: str, marker: str) -> None:
    ax.errorbar(x, table[f"{key}_mean"], yerr=table[f"{key}_std"].fillna(0), marker=marker, capsize=3,
                label=label)


def momentum_plot(table: pd.DataFrame, paper: dict[float, float | None], path: Path) -> Path:
    """Accuracy against 1 − m on a log axis (m = 0 sits at 1 − m = 1); the paper's ImageNet curve on a
    second axis, since its numbers are on another dataset and scale."""
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    x = 1.0 - table["moco.m"].astype(float)
    _acc(ax, x, table, "linear_top1", "linear probe (ours)", "o")
    _acc(ax, x, table, "knn_top1", "kNN (ours)", "s")
    bad = table[~table["status"].eq("finished")]
    for _, row in bad.iterrows():
        ax.axvline(1.0 - float(row["moco.m"]), color="red", alpha=0.3, linestyle=":")
        ax.annotate(row["status"], (1.0 - float(row["moco.m"]), ax.get_ylim()[0]), color="red",
                    rotation=90, va="bottom", ha="right", fontsize=8)
    ax.set_xscale("log")
    ax.invert_xaxis()
    ax.set_xlabel("1 − m (log scale; right = higher momentum)")
    ax.set_ylabel("top-1 accuracy on our data (%)")
    pts = [(1.0 - m, v) for m, v in sorted(paper.items()) if v is not None]
    if pts:
        ax2 = ax.twinx()
        ax2.plot([p[0] for p in pts], [p[1] for p in pts], "k--", marker="^", alpha=0.6,
                 label="MoCo paper, ImageNet (right axis)")
        ax2.set_ylabel("paper: ImageNet linear top-1 (%)")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, loc="best", fontsize=8)
    else:
        ax.legend(loc="lower left", fontsize=8)
    ax.set_title("Momentum ablation")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def line_plot(table: pd.DataFrame, key: str, xlabel: str, title: str, path: Path, logx: bool = True) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    x = table[key].astype(float)
    _acc(ax, x, table, "linear_top1", "linear probe", "o")
    _acc(ax, x, table, "knn_top1", "kNN", "s")
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _accuracy_bars(ax, table: pd.DataFrame, key: str, title: str, rotate: bool = False) -> None:
    """Grouped bars, linear probe and kNN (mean ± std over seeds), one group per row of ``table[key]``."""
    names = [str(v) for v in table[key]]
    idx = range(len(names))
    w = 0.38
    for off, m, label in ((-w / 2, "linear_top1", "linear probe"), (w / 2, "knn_top1", "kNN")):
        ax.bar([i + off for i in idx], table[f"{m}_mean"].fillna(0), w, yerr=table[f"{m}_std"].fillna(0),
               capsize=3, label=label)
    if rotate:
        ax.set_xticks(list(idx), names, rotation=30, ha="right", fontsize=8)
    else:
        ax.set_xticks(list(idx), names)
    low = min((v for v in table[["linear_top1_mean", "knn_top1_mean"]].values.ravel() if not math.isnan(v)),
              default=0)
    ax.set_ylim(max(0, low - 10), 100)
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")


def bar_plot(table: pd.DataFrame, key: str, title: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    _accuracy_bars(ax, table, key, title)
    return _save(fig, path)


def vit_plot(table: pd.DataFrame, curves: dict[str, list[tuple[float, float]]], path: Path) -> Path:
    """MoCo v3 ViT ablation: accuracy against base momentum per patch-projection setting (left), and the
    first layer's gradient norm per step of every trial (right, log scale): where a trained patch
    projection's gradient spikes, the frozen one's shows what MoCo v3's fix removes."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2), dpi=110)
    for (patch, g), marker in zip(table.groupby("patch", sort=True), "os^v"):
        g = g.sort_values("moco.m")
        x = 1.0 - g["moco.m"].astype(float)
        ax.errorbar(x, g["linear_top1_mean"], yerr=g["linear_top1_std"].fillna(0), marker=marker, capsize=3,
                    label=f"linear, patch {patch}")
        ax.errorbar(x, g["knn_top1_mean"], yerr=g["knn_top1_std"].fillna(0), marker=marker, capsize=3,
                    linestyle="--", label=f"kNN, patch {patch}")
    ax.set_xscale("log")
    ax.invert_xaxis()
    ax.set_xlabel("1 − base m (log scale; right = higher momentum)")
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title("MoCo v3, ViT: accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    for label, pts in sorted(curves.items()):
        if pts:
            ax2.plot([p[0] for p in pts], [p[1] for p in pts], linewidth=0.9, label=label)
    ax2.set_yscale("log")
    ax2.set_xlabel("training step")
    ax2.set_ylabel("‖∂loss/∂W‖ of the patch projection")
    ax2.set_title("first-layer gradient norm per step")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=7)
    return _save(fig, path)


def binned_mean(ages: list[float], cos: list[float], bins: int = 8) -> tuple[list[float], list[float]]:
    """Mean cosine per equal-width age bin (the probes' scatter is noisy; the trend is what reads)."""
    if not ages:
        return [], []
    lo, hi = min(ages), max(ages)
    width = (hi - lo) / bins if hi > lo else 1.0
    sums: dict[int, list[float]] = {}
    for a, c in zip(ages, cos):
        b = min(int((a - lo) / width), bins - 1)
        sums.setdefault(b, [0.0, 0.0, 0])
        sums[b][0] += a
        sums[b][1] += c
        sums[b][2] += 1
    keys = sorted(sums)
    return [sums[b][0] / sums[b][2] for b in keys], [sums[b][1] / sums[b][2] for b in keys]


def dictionary_plot(diagnostics: dict, drift: dict[int, tuple[list[float], list[float]]], path: Path, title: str,
                    fifo_bound: float | None = None, most: int = 6) -> Path:
    """One run's dictionary: the ages of its stored negatives at the last epoch's end (left), and the key drift
    of the probes against their age at the end of up to ``most`` epochs spread over the run (right: the mean
    cosine per age bin; ``drift`` maps an epoch to its probes' ages and cosines)."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2), dpi=110)
    hist = diagnostics.get("age_histogram", {})
    edges, counts = hist.get("edges", []), hist.get("counts", [])
    if counts:
        ax.bar(edges[:-1], counts, width=[b - a for a, b in zip(edges[:-1], edges[1:])], align="edge",
               edgecolor="white")
    if fifo_bound:
        ax.axvline(fifo_bound, color="red", linestyle=":", label=f"FIFO bound K/(B·W) = {fifo_bound:g}")
        ax.legend(fontsize=8)
    ax.set_xlabel("age of a stored negative (steps since written)")
    ax.set_ylabel("stored negatives")
    ax.set_title(f"ages: {title}")
    ax.grid(alpha=0.3)
    epochs = sorted(e for e, (ages, _) in drift.items() if ages)
    if len(epochs) > most:  # evenly spread, the first and the last included
        epochs = sorted({epochs[round(i * (len(epochs) - 1) / (most - 1))] for i in range(most)})
    for epoch in epochs:
        bx, by = binned_mean(*drift[epoch])
        ax2.plot(bx, by, marker="o", label=f"end of epoch {epoch}")
    ax2.set_xlabel("age of the probed entry (steps)")
    ax2.set_ylabel("cosine: writing vs current encoder")
    ax2.set_title("key drift against age (the learning rate falls over the epochs)")
    ax2.grid(alpha=0.3)
    if epochs:
        ax2.legend(fontsize=8)
    return _save(fig, path)


def negatives_plot(table: pd.DataFrame, drift: dict[str, tuple[list[float], list[float]]], path: Path,
                   epoch: str = "") -> Path:
    """The negatives ablation: accuracy per source (left) and key drift against age per source and m (right,
    the mean cosine of the writing and the current encoder's embedding per age bin, at one epoch's end)."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.6), dpi=110)
    _accuracy_bars(ax, table, "setting", "accuracy per source of negatives", rotate=True)
    for label, (ages, cos) in sorted(drift.items()):
        bx, by = binned_mean(ages, cos)
        if bx:
            ax2.plot(bx, by, marker="o", label=label)
    ax2.set_xscale("symlog", linthresh=10)
    ax2.set_xlabel("age of the stored negative (steps, log scale above 10)")
    ax2.set_ylabel("cosine: writing vs current encoder")
    ax2.set_title(f"key drift against age (probes at the end of epoch {epoch})" if epoch else "key drift against age")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=7)
    return _save(fig, path)
