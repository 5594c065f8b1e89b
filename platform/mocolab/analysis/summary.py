"""The summary table a researcher reads: per value of what a study varies, accuracy over seeds.

It reads a trials table (one row per trial, built from MLflow by
``mocolab.tracking.trials_frame``), so a resumed sweep, or one whose trials
ran over three invocations, summarises all of its trials, and the summary is
the same thing the MLflow UI shows. Two values are compared seed by seed (``per_seed``, then
``analysis.stats.paired``): the trials of one seed start from the same encoder and see the same batches.
"""

from __future__ import annotations

import math

import pandas as pd


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


def per_seed(df: pd.DataFrame, by: str, metric: str) -> dict[object, dict[int, float]]:
    """Per value of ``by`` (a config key): {seed: ``metric`` in %} of its finished trials, one per seed (the
    first, as ``summarise`` counts them), NaN left out: what a paired comparison across seeds reads."""
    seed_col = "params.run.seed"
    out: dict[object, dict[int, float]] = {}
    for value, g in df.groupby(f"params.{by}", sort=True):
        ok = g[g["status"] == "finished"].drop_duplicates(subset=[seed_col])
        out[value] = {int(s): 100 * float(v) for s, v in zip(ok[seed_col], ok[metric]) if not math.isnan(float(v))}
    return out
