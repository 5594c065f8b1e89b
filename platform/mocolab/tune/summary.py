"""From a sweep's MLflow child runs to the table and the plot a researcher reads.

Everything is read back from MLflow, not from Tune's memory, so a resumed
sweep (or one whose trials ran in three invocations) summarises all of its
trials, and the summary is the same thing the MLflow UI shows.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from ..tracking.mlflow_log import STATUS_TAG

METRICS = ("linear_top1", "knn_top1", "final_loss", "ema_half_life", "max_staleness_bound", "pretext_acc")


def trials_frame(runs: Iterable[Any]) -> pd.DataFrame:
    """One row per child run: label, status, every param (``params.*``), the final metrics."""
    rows = []
    for run in runs:
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        status = tags.get(STATUS_TAG) or run.info.status.lower()
        if run.info.status == "RUNNING":
            status = "running"
        row = {"label": tags.get("trial") or run.info.run_name, "status": status, "run_id": run.info.run_id}
        row.update({f"params.{k}": _num(v) for k, v in params.items()})
        row.update({k: metrics.get(k, math.nan) for k in METRICS})
        rows.append(row)
    return pd.DataFrame(rows)


def _num(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except (TypeError, ValueError):
            pass
    return text


def summarise(df: pd.DataFrame, by: str) -> pd.DataFrame:
    """Per value of ``by`` (a config key): mean ± std of the accuracies over seeds, and the statuses."""
    col = f"params.{by}"
    out = []
    for value, g in df.groupby(col, sort=True):
        ok = g[g["status"] == "finished"]
        row = {by: value, "seeds": len(g), "status": _status(g["status"])}
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


def log_to_parent(client, run_id: str, table: pd.DataFrame, trials: pd.DataFrame, figure_path: Path | None,
                  text: str) -> None:
    """CSV and JSON tables, the plot and the printed summary as artifacts of the parent run."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        table.to_csv(d / "summary.csv", index=False)
        trials.to_csv(d / "trials.csv", index=False)
        (d / "summary.json").write_text(table.to_json(orient="split", index=False))
        (d / "summary.txt").write_text(text)
        for name in ("summary.csv", "trials.csv", "summary.json", "summary.txt"):
            client.log_artifact(run_id, str(d / name))
    if figure_path is not None and figure_path.exists():
        client.log_artifact(run_id, str(figure_path))
