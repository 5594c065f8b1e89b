"""The ViT study's table and picture: accuracy per patch projection (trained | frozen) and base momentum, beside
the first layer's gradient norm at every step, the instability MoCo v3's frozen projection acts on.

Beside the study (``tune/studies/vit.py``), apart from its sweep: ``mocolab report`` draws them without loading Tune.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from mocolab.analysis import save_figure, summarise

GRAD_FIRST = "grad_norm_first_layer"  # the per-step metric of the first layer's gradient (training/trainer.py)


def patch_momentum_table(df: pd.DataFrame) -> pd.DataFrame:
    """The ViT ablation's summary: per (patch projection trained|frozen, base m), as ``summarise`` gives it,
    with ``patch`` and ``moco.m`` columns; a run without ``vit.freeze_patch_embed`` counts as trained."""
    frozen = df.get("params.vit.freeze_patch_embed", pd.Series(False, index=df.index))
    df = df.assign(**{"params.patch": ["frozen" if str(v).lower() in ("true", "1", "1.0") else "trained"
                                       for v in frozen]})
    df["params.setting"] = [f"patch={p} m={float(m):g}" for p, m in zip(df["params.patch"], df["params.moco.m"])]
    table = summarise(df, "setting")
    first = df.drop_duplicates("params.setting").set_index("params.setting")
    table["patch"] = [first.loc[s, "params.patch"] for s in table["setting"]]
    table["moco.m"] = [float(first.loc[s, "params.moco.m"]) for s in table["setting"]]
    return table.sort_values(["patch", "moco.m"]).reset_index(drop=True)


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
    return save_figure(fig, path)
