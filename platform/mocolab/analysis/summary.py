"""The summary table a researcher reads: per value of what a study varies, accuracy over seeds.

It reads a trials table (one row per trial, built from MLflow by
``mocolab.tracking.trials_frame``), so a resumed sweep, or one whose trials
ran over three invocations, summarises all of its trials, and the summary is
the same thing the MLflow UI shows. Two values are compared seed by seed (``per_seed``, then
``analysis.stats.paired``): the trials of one seed start from the same encoder and see the same batches.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import pandas as pd

from mocolab.analysis.stats import Comparison, fmt_p, holm, paired

ALPHA = 0.05
# the accuracies a summary averages over seeds: the full linear probe and kNN, the linear probe on 1 % and 10 % of
# the labels and the k = 20 kNN (a run that logged none of one: NaN, shown as —)
SUMMARY_METRICS = ("linear_top1", "knn_top1", "linear_top1_1pct", "linear_top1_10pct", "knn20_top1")


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
        for m in SUMMARY_METRICS:
            vals = 100 * (ok[m] if m in ok else pd.Series(dtype=float)).dropna()
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


def paired_diff(c: Comparison | None) -> str:
    """A paired difference in points with its 95 % interval."""
    if c is None or c.n == 0:
        return "—"
    if c.n == 1:
        return f"{c.diff.mean:+.2f} (1 seed)"
    return f"{c.diff.mean:+.2f} [{c.diff.low:+.2f}, {c.diff.high:+.2f}]"


def _p(name: str, p: float) -> str:
    text = fmt_p(p)
    return f"{name} {text}" if text.startswith("<") else f"{name} = {text}"


def comparison_line(c: Comparison) -> str:
    """One paired test as a study's closing table prints it; "no significant difference" is not read as "the
    same" (that needs an equivalence test: the reproduction's verdicts have one)."""
    verdict = c.verdict(ALPHA)
    if verdict == "no difference":
        verdict = "no significant difference"
    t = "—" if math.isnan(c.t) else f"{c.t:.2f}"
    return (f"    {c.a + ' − ' + c.b:<22} {c.n:>2} seeds  Δ {paired_diff(c):<23} t = {t:>7}  {_p('p', c.p):<11}  "
            f"{_p('Holm p', c.p_holm):<16}  {verdict}")


def family_size(family: list[Comparison]) -> int:
    """The comparisons Holm's correction counted: those with two seeds or more."""
    return sum(not math.isnan(c.p) for c in family)


def against_reference(df: pd.DataFrame, by: str, pick: Callable[[list[Any]], Any],
                      metric: str = "linear_top1") -> list[str]:
    """A study's closing tests: each value of ``by`` against the reference ``pick`` chooses from the values,
    paired by seed on ``metric`` (points), Holm-corrected as one family, as the reproduction pairs them; a
    line saying why where nothing has two seeds."""
    arms = per_seed(df, by, metric)
    if not arms:
        return []
    ref = pick(list(arms))
    family = holm([paired(arms[v], arms[ref], (str(v), str(ref))) for v in arms if v != ref])
    if not family_size(family):
        return ["Paired t-tests across seeds need two seeds or more of an arm (--seeds 2); none here."]
    return [f"Paired t-tests on {metric.replace('_', ' ')} (points) across seeds (seed s of every arm starts from "
            f"the same encoder and sees the same batches), each against {ref}, α = {ALPHA}, Holm-corrected as one "
            f"family of {family_size(family)}:", *[comparison_line(c) for c in family]]
