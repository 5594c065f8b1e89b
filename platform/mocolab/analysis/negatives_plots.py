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


def negatives_setting(negatives: Any, policy: Any, m: Any, symmetric: Any = False) -> str:
    """A negatives-ablation trial's setting, as the study names it (``tune/studies/negatives.py``'s catalogue):
    its source; for a queue the policy, the symmetric loss and m; for the key encoder's batch keys m."""
    source = str(negatives) if isinstance(negatives, str) and negatives else "queue"  # no field: a queue
    if source == "batch_keys":
        return f"batch keys m={float(m):g}"
    if source != "queue":
        return source.replace("_", " ")
    both = " symmetric" if str(symmetric).lower() == "true" else ""  # a param reads back as text
    return f"queue {policy if isinstance(policy, str) and policy else 'fifo'}{both} m={float(m):g}"


# the table's order: the sources without a stored dictionary, then the queues; within each, by m
_SOURCE_ORDER = ("in batch", "memory bank", "batch keys", "queue fifo", "queue fifo symmetric", "queue random")


def _setting_order(setting: str) -> tuple[int, float]:
    name, _, m = setting.rpartition(" m=")
    if not name:  # no m: in batch, memory bank
        name, m = setting, "0"
    return (_SOURCE_ORDER.index(name) if name in _SOURCE_ORDER else len(_SOURCE_ORDER)), float(m)


def trial_settings(df: pd.DataFrame) -> list[str]:
    """Each trial's setting (``negatives_setting``) from its params, in ``df``'s order."""
    col = lambda key: df.get(f"params.{key}", pd.Series("", index=df.index))  # noqa: E731
    return [negatives_setting(n, p, m, b) for n, p, m, b in
            zip(col("moco.negatives"), col("queue.policy"), df["params.moco.m"], col("moco.symmetric"))]


def negatives_table(df: pd.DataFrame) -> pd.DataFrame:
    """The negatives ablation's summary: per setting (``negatives_setting``) as ``summarise`` gives it, with the
    dictionary's age (mean, max) and key drift at the end, in the order in-batch, bank, queue by policy and m."""
    df = df.assign(**{"params.setting": trial_settings(df)})
    table = summarise(df, "setting")
    for key in ("staleness_mean", "staleness_max", "drift_cos", "stored_cos"):
        means = df.groupby("params.setting")[key].mean() if key in df else {}
        table[key] = [means.get(s, math.nan) for s in table["setting"]]
    table["_order"] = [_setting_order(s) for s in table["setting"]]
    return table.sort_values("_order").drop(columns="_order").reset_index(drop=True)


def negatives_drift(store: Store, df: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, tuple[list, list]], str]:
    """The negatives ablation's table, and per setting the drift probes (ages, cosines) of its trials' middle
    epoch (the run artifacts ``negatives/epoch_NNNN.json``; seeds pool their probes), and which epoch that is.

    The middle epoch, not the last: under a cosine schedule the learning rate is near 0 in the last epoch, so
    every encoder has all but stopped moving and any m looks consistent; halfway it is half its peak.
    ``drift_cos`` in the table is that epoch's mean over the probes (the last epoch's is in MLflow).
    """
    table = negatives_table(df)
    drift: dict[str, tuple[list, list]] = {}
    epochs = set()
    for run_id, setting in zip(df["run_id"], trial_settings(df)):
        names = store.json_artifacts(run_id, "negatives")
        if not names:
            continue
        name = names[(len(names) - 1) // 2]  # epochs 1..E logged: the middle one (E = 3: epoch 2)
        epochs.add(int(name.rsplit("_", 1)[-1].split(".")[0]))
        probes = store.read_json(run_id, name).get("probes")
        if probes:
            ages, cos = drift.setdefault(setting, ([], []))
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
