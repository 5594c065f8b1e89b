"""The pictures the studies and reports draw from a summary table (matplotlib, Agg: no screen needed)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


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
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


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
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def bar_plot(table: pd.DataFrame, key: str, title: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    names = [str(v) for v in table[key]]
    idx = range(len(names))
    w = 0.38
    for off, m, label in ((-w / 2, "linear_top1", "linear probe"), (w / 2, "knn_top1", "kNN")):
        vals = table[f"{m}_mean"].fillna(0)
        err = table[f"{m}_std"].fillna(0)
        ax.bar([i + off for i in idx], vals, w, yerr=err, capsize=3, label=label)
    ax.set_xticks(list(idx), names)
    low = min((v for v in table[["linear_top1_mean", "knn_top1_mean"]].values.ravel() if not math.isnan(v)),
              default=0)
    ax.set_ylim(max(0, low - 10), 100)
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


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
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
