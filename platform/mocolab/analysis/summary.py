"""The summary table a researcher reads: per value of what a study varies, accuracy over seeds.

It reads a trials table (one row per trial, built from MLflow by
``mocolab.tracking.trials_frame``), so a resumed sweep, or one whose trials
ran over three invocations, summarises all of its trials, and the summary is
the same thing the MLflow UI shows.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import pandas as pd

# MoCo paper (He et al. 2020), momentum ablation: ImageNet linear top-1 against the key-encoder momentum m.
PAPER_MOMENTUM: dict[float, float] = {0.9: 55.2, 0.99: 57.8, 0.999: 59.0, 0.9999: 58.9}


def summarise(df: pd.DataFrame, by: str) -> pd.DataFrame:
    """Per value of ``by`` (a config key): mean ± std of the accuracies over seeds, and the statuses.

    Seeds are counted, not trials: a search that samples one configuration twice with one seed ran a
    repeat, not a second seed.  ``trials`` counts the runs, ``seeds`` the distinct seeds, ``repeats``
    the difference; the accuracies average one finished trial per seed (the first).
    """
    col = f"params.{by}"
    seed_col = "params.run.seed"
    out = []
    for value, g in df.groupby(col, sort=True):
        ok = g[g["status"] == "finished"]
        seeds = g[seed_col].nunique() if seed_col in g else len(g)
        if seed_col in ok:
            ok = ok.drop_duplicates(subset=[seed_col])
        row = {by: value, "trials": len(g), "seeds": seeds, "repeats": len(g) - seeds,
               "status": _status(g["status"])}
        for m in ("linear_top1", "knn_top1"):
            vals = 100 * ok[m].dropna()
            row[f"{m}_mean"] = vals.mean() if len(vals) else math.nan
            row[f"{m}_std"] = vals.std(ddof=1) if len(vals) > 1 else math.nan
        row["final_loss"] = g["final_loss"].mean()
        row["ema_half_life"] = g["ema_half_life"].mean()
        row["max_staleness"] = g["max_staleness_bound"].mean()
        out.append(row)
    return pd.DataFrame(out)


def _status(statuses: pd.Series) -> str:
    counts = statuses.value_counts()
    if len(counts) == 1:
        return str(counts.index[0])
    return ", ".join(f"{n} {s}" for s, n in counts.items())


def fmt_mean_std(mean: float, std: float) -> str:
    if math.isnan(mean):
        return "—"
    return f"{mean:.2f}" if math.isnan(std) else f"{mean:.2f} ± {std:.2f}"


def welch_t(a: Iterable[float], b: Iterable[float]) -> tuple[float, float] | None:
    """Welch's t-test (unequal variances): (t, two-sided p); None with fewer than 2 values a side."""
    a, b = [x for x in a if not math.isnan(x)], [x for x in b if not math.isnan(x)]
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy import stats

    res = stats.ttest_ind(a, b, equal_var=False)
    return float(res.statistic), float(res.pvalue)


def patch_momentum_table(df: pd.DataFrame) -> pd.DataFrame:
    """The ViT ablation's summary: per (patch projection trained|frozen, base m), as ``summarise`` gives it,
    with ``patch`` and ``moco.m`` columns; runs from before ``vit.freeze_patch_embed`` existed count as trained."""
    frozen = df.get("params.vit.freeze_patch_embed", pd.Series(False, index=df.index))
    df = df.assign(**{"params.patch": ["frozen" if str(v).lower() in ("true", "1", "1.0") else "trained"
                                       for v in frozen]})
    df["params.setting"] = [f"patch={p} m={float(m):g}" for p, m in zip(df["params.patch"], df["params.moco.m"])]
    table = summarise(df, "setting")
    first = df.drop_duplicates("params.setting").set_index("params.setting")
    table["patch"] = [first.loc[s, "params.patch"] for s in table["setting"]]
    table["moco.m"] = [float(first.loc[s, "params.moco.m"]) for s in table["setting"]]
    return table.sort_values(["patch", "moco.m"]).reset_index(drop=True)


def negatives_setting(negatives: Any, policy: Any, m: Any) -> str:
    """A negatives-ablation trial's setting: its source, and for a queue the policy and m."""
    source = str(negatives) if isinstance(negatives, str) and negatives else "queue"  # runs from before: a queue
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
