"""The pictures any study or report draws from a summary table, and their parts (matplotlib, Agg: no screen
needed). A study's own picture (momentum against the paper's curve, the ViT's gradients, the sources of
negatives) lives beside the study, in ``analysis/<study>_plots.py``, drawn with these parts."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def save_figure(fig, path: Path) -> Path:
    """The figure laid out, written to ``path`` and closed (pyplot keeps every open figure otherwise)."""
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def accuracy_errorbar(ax, x, table: pd.DataFrame, key: str, label: str, marker: str, color: str | None = None) -> None:
    """One accuracy of a summary table (``<key>_mean`` ± ``<key>_std``, as ``summarise`` gives them) against x."""
    ax.errorbar(x, table[f"{key}_mean"], yerr=table[f"{key}_std"].fillna(0), marker=marker, capsize=3,
                label=label, color=color)


def baseline_band(ax, mean: float, low: float, high: float, label: str, color: str) -> None:
    """A baseline behind the arms: its mean as a line, its interval (``low`` to ``high``; NaN: none, one
    value) as a band, one legend entry."""
    if math.isnan(mean):
        return
    if math.isnan(low) or math.isnan(high):
        ax.axhline(mean, color=color, alpha=0.6, linewidth=1.2, linestyle="-.", label=label)
        return
    ax.axhspan(low, high, color=color, alpha=0.15, label=label)
    ax.axhline(mean, color=color, alpha=0.6, linewidth=0.8)


def line_plot(table: pd.DataFrame, key: str, xlabel: str, title: str, path: Path, logx: bool = True) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    x = table[key].astype(float)
    accuracy_errorbar(ax, x, table, "linear_top1", "linear probe", "o")
    accuracy_errorbar(ax, x, table, "knn_top1", "kNN", "s")
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def accuracy_bars(ax, table: pd.DataFrame, key: str, title: str, rotate: bool = False) -> None:
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
    accuracy_bars(ax, table, key, title)
    return save_figure(fig, path)


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
    return save_figure(fig, path)
