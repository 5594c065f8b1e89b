"""The negatives study's table and picture: accuracy per source of negatives, and how far the encoder that wrote a
stored negative has drifted from the current one, against the negative's age.

Beside the study (``tune/studies/negatives.py``), apart from its sweep: ``mocolab report`` draws them without
loading Tune. The drift probes come from each trial's run artifacts (``negatives/epoch_NNNN.json``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib.pyplot as plt
import pandas as pd

from mocolab.analysis import accuracy_bars, binned_mean, save_figure, summarise

if TYPE_CHECKING:
    from mocolab.tracking import Store


def negatives_setting(negatives: Any, policy: Any, m: Any) -> str:
    """A negatives-ablation trial's setting: its source, and for a queue the policy and m."""
    source = str(negatives) if isinstance(negatives, str) and negatives else "queue"  # no field: a queue
    if source != "queue":
        return source.replace("_", " ")
    return f"queue {policy if isinstance(policy, str) and policy else 'fifo'} m={float(m):g}"


def negatives_table(df: pd.DataFrame) -> pd.DataFrame:
    """The negatives ablation's summary: per setting (``negatives_setting``) as ``summarise`` gives it, with the
    dictionary's age (mean, max) and key drift at the end, in the order in-batch, bank, queue by policy and m."""
    col = lambda key: df.get(f"params.{key}", pd.Series("", index=df.index))  # noqa: E731
    df = df.assign(**{"params.setting": [negatives_setting(n, p, m) for n, p, m in
                                         zip(col("moco.negatives"), col("queue.policy"), df["params.moco.m"])]})
    table = summarise(df, "setting")
    for key in ("staleness_mean", "staleness_max", "drift_cos", "stored_cos"):
        means = df.groupby("params.setting")[key].mean() if key in df else {}
        table[key] = [means.get(s, math.nan) for s in table["setting"]]

    def order(setting: str) -> tuple[int, float]:
        fixed = {"in batch": 0, "memory bank": 1}
        if setting in fixed:
            return fixed[setting], 0.0
        return (2 if "fifo" in setting else 3), float(setting.rsplit("=", 1)[-1])

    table["_order"] = [order(s) for s in table["setting"]]
    return table.sort_values("_order").drop(columns="_order").reset_index(drop=True)


def negatives_drift(store: Store, df: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, tuple[list, list]], str]:
    """The negatives ablation's table, and per setting the drift probes (ages, cosines) of its trials' middle
    epoch (the run artifacts ``negatives/epoch_NNNN.json``; seeds pool their probes), and which epoch that is.

    The middle epoch, not the last: under a cosine schedule the learning rate is near 0 in the last epoch, so
    every encoder has all but stopped moving and any m looks consistent; halfway it is half its peak.
    ``drift_cos`` in the table is that epoch's mean over the probes (the last epoch's is in MLflow).
    """
    table = negatives_table(df)
    col = lambda key: df.get(f"params.{key}", pd.Series("", index=df.index))  # noqa: E731
    drift: dict[str, tuple[list, list]] = {}
    epochs = set()
    for run_id, n, p, m in zip(df["run_id"], col("moco.negatives"), col("queue.policy"), df["params.moco.m"]):
        names = store.json_artifacts(run_id, "negatives")
        if not names:
            continue
        name = names[(len(names) - 1) // 2]  # epochs 1..E logged: the middle one (E = 3: epoch 2)
        epochs.add(int(name.rsplit("_", 1)[-1].split(".")[0]))
        probes = store.read_json(run_id, name).get("probes")
        if probes:
            ages, cos = drift.setdefault(negatives_setting(n, p, m), ([], []))
            ages.extend(probes["age"])
            cos.extend(probes["drift_cos"])
    table["drift_cos"] = [sum(drift[s][1]) / len(drift[s][1]) if drift.get(s, ([], []))[1] else
                          (1.0 if s == "in batch" else math.nan) for s in table["setting"]]
    which = ", ".join(str(e) for e in sorted(epochs)) or "-"
    return table, drift, which


def negatives_plot(table: pd.DataFrame, drift: dict[str, tuple[list[float], list[float]]], path: Path,
                   epoch: str = "") -> Path:
    """The negatives ablation: accuracy per source (left) and key drift against age per source and m (right,
    the mean cosine of the writing and the current encoder's embedding per age bin, at one epoch's end)."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.6), dpi=110)
    accuracy_bars(ax, table, "setting", "accuracy per source of negatives", rotate=True)
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
    return save_figure(fig, path)
