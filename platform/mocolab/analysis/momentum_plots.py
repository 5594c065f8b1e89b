"""The momentum study's picture and the paper's numbers it is read against (MoCo, He et al. 2020, Table 1b).

Beside the study (``tune/studies/momentum.py``), apart from its sweep: ``mocolab report`` and the reproduction's
write-up (``repro/document.py``) draw and quote them without loading Tune.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from mocolab.analysis import accuracy_errorbar, save_figure

# The paper's momentum ablation: ImageNet linear top-1 against the key-encoder momentum m.
PAPER_MOMENTUM: dict[float, float] = {0.9: 55.2, 0.99: 57.8, 0.999: 59.0, 0.9999: 58.9}


def momentum_plot(table: pd.DataFrame, paper: dict[float, float | None], path: Path) -> Path:
    """Accuracy against 1 − m on a log axis (m = 0 sits at 1 − m = 1); the paper's ImageNet curve on a
    second axis, since its numbers are on another dataset and scale."""
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    x = 1.0 - table["moco.m"].astype(float)
    accuracy_errorbar(ax, x, table, "linear_top1", "linear probe (ours)", "o")
    accuracy_errorbar(ax, x, table, "knn_top1", "kNN (ours)", "s")
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
    return save_figure(fig, path)
