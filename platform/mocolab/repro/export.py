"""MLflow -> ``results/<study>.csv``: every trial of a study's sweep and its baselines, one row each, with what
each number depends on (commit, precision, torch, device, data digest), so the write-up needs no store."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from mocolab.tracking import DIRTY_TAG, PARENT_TAG, STATUS_TAG, Store, trials_frame
from mocolab.tracking.store import BASELINE_KIND_TAG as KIND_TAG
from mocolab.tracking.source import CHANGED_TAG, PLAN_TAG
from mocolab.tracking.store import CODE_TAG, SEGMENTS_TAG, latest_trial_runs
from mocolab.tracking.store import BASELINE_SET_TAG as SET_TAG
from mocolab.tracking.store import BASELINES_EXPERIMENT as BASELINES
from mocolab.repro.plan import HISTORY, LABEL, Study, word

# the final evaluation's instruments beside the full probe (repro/claims.py's SECONDARY_METRICS) and the
# measured key ages a queue arm sets beside its bound; empty in a run made before they were logged
INSTRUMENTS = ("knn20_top1", "linear_top1_1pct", "linear_top1_10pct")
AGES = ("staleness_mean", "staleness_max")
COLUMNS = ["study", "arm", "seed", "status", "linear_top1", "knn_top1", "final_loss", "pretext_acc", "queue_size",
           "ema_half_life", "max_staleness_bound", "commit", "dirty", "precision", "torch", "device", "data",
           "run_id", "code", "code_segments", "changed", "plan_hash", *INSTRUMENTS, *AGES]
# the MLflow experiment each study script logs to (its make_sweep's study); the parent run is tagged with --name
EXPERIMENTS = {"momentum_ablation.py": "momentum-ablation", "queue_ablation.py": "queue-ablation",
               "augmentation_ablation.py": "augmentation-ablation", "negatives_ablation.py": "negatives-ablation",
               "vit_ablation.py": "vit-ablation"}
SEED_SUFFIX = re.compile(r"\s*seed=-?\d+$")
# The curves over training, long form: the epoch means every run logs and the per-step series where a run has them
HISTORY_COLUMNS = ["study", "arm", "seed", "metric", "step", "value"]
HISTORY_METRICS = ("loss", "pretext_acc", "step_loss", "step_pretext_acc")


def export(study: Study, store: Store, out_dir: Path) -> Path | None:
    """Write ``out_dir/<study>.csv`` (one row per run) and ``out_dir/history/<study>.csv`` (its trials' curves);
    None (and nothing written) when the store has no run of the study."""
    trials = trial_runs(study, store)
    rows = [_trial_row(study, run, arm, t) for run, arm, t in trials] + _baselines(study, store)
    if not rows:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    order = {arm: i for i, arm in enumerate(study.arms)}
    frame = pd.DataFrame(rows, columns=COLUMNS).sort_values(
        ["arm", "seed"], key=lambda col: _order(col, order)).reset_index(drop=True)
    path = out_dir / f"{study.name}.csv"
    frame.to_csv(path, index=False, float_format="%.6g")
    curves = [{"study": study.name, "arm": arm, "seed": int(t["params.run.seed"]), "metric": key, "step": p.step,
               "value": p.value}
              for run, arm, t in trials for key in HISTORY_METRICS
              for p in store.client.get_metric_history(run.info.run_id, key)]
    if curves:
        history = pd.DataFrame(curves, columns=HISTORY_COLUMNS).sort_values(
            ["arm", "seed", "metric", "step"], key=lambda col: _order(col, order)).reset_index(drop=True)
        (out_dir / HISTORY).mkdir(exist_ok=True)
        history.to_csv(out_dir / HISTORY / f"{study.name}.csv", index=False, float_format="%.6g")
    return path


def _order(col: pd.Series, order: dict[str, int]) -> pd.Series:
    if col.name == "arm":  # baselines first, then the arms in the plan's order, then any other by its text
        baseline = {"raw-pixels": -2, "random-init": -1}
        return col.map(lambda a: baseline.get(a, order.get(a, len(order)))).astype(float)
    if col.name == "metric":
        return col
    return col.astype(float).fillna(-1)


def arm_of(study: Study, trial: pd.Series) -> str:
    """The trial's arm as text: its value of ``study.by`` (0.99, 4096, split), or its label less the seed."""
    if study.by == LABEL:
        return SEED_SUFFIX.sub("", str(trial["label"]))
    value = word(trial[f"params.{study.by}"])
    return dict(study.names).get(value, value)


def _common(run) -> dict:
    tags = run.data.tags
    return {"commit": tags.get("mlflow.source.git.commit", "")[:12], "dirty": tags.get(DIRTY_TAG, ""),
            "precision": tags.get("mocolab.precision", ""), "torch": tags.get("mocolab.torch", ""),
            "device": tags.get("mocolab.device", ""), "run_id": run.info.run_id,
            # the code that made it (empty: none recorded) and, across a change, its segments
            "code": tags.get(CODE_TAG, ""), "code_segments": tags.get(SEGMENTS_TAG, ""),
            "changed": tags.get(CHANGED_TAG, ""),  # the uncommitted files of a dirty checkout, where recorded
            # the hashes of the rules it was made under (repro/preregistration.py); empty: the run has no such tag
            "plan_hash": tags.get(PLAN_TAG, "")}


def trial_runs(study: Study, store: Store) -> list[tuple]:
    """(MLflow run, its arm, its row of ``trials_frame``) for every trial of the study's sweep."""
    exp_id = store.experiment_id(EXPERIMENTS[study.script])
    if exp_id is None:
        return []
    parents = store.client.search_runs([exp_id], f"tags.`{PARENT_TAG}` = '{study.name}'", max_results=1)
    if not parents:
        return []
    runs = latest_trial_runs(store.runs(exp_id, parent_run_id=parents[0].info.run_id))
    return [(run, arm_of(study, t), t) for run, (_, t) in zip(runs, trials_frame(runs).iterrows())]


def _trial_row(study: Study, run, arm: str, t: pd.Series) -> dict:
    return {"study": study.name, "arm": arm, "seed": int(t["params.run.seed"]), "status": t["status"],
            "linear_top1": t["linear_top1"], "knn_top1": t["knn_top1"], "final_loss": t["final_loss"],
            "pretext_acc": run.data.metrics.get("pretext_acc", math.nan), "queue_size": t.get("params.queue.size"),
            "ema_half_life": t["ema_half_life"], "max_staleness_bound": t["max_staleness_bound"],
            "data": t["data"], **_common(run), **_metrics(run, INSTRUMENTS + AGES)}


def _metrics(run, keys: tuple[str, ...]) -> dict[str, float]:
    return {k: run.data.metrics.get(k, math.nan) for k in keys}


def _baselines(study: Study, store: Store) -> list[dict]:
    exp_id = store.experiment_id(BASELINES)
    if exp_id is None:
        return []
    runs = store.search_all([exp_id], f"tags.`{SET_TAG}` = '{study.name}' and attributes.status = 'FINISHED'")
    rows = []
    for run in runs:
        kind = run.data.tags[KIND_TAG]
        m = run.data.metrics
        rows.append({"study": study.name, "arm": kind,
                     "seed": int(run.data.params["run.seed"]) if kind == "random-init" else math.nan,
                     "status": run.data.tags.get(STATUS_TAG, "finished"), "linear_top1": m["linear_top1"],
                     "knn_top1": m["knn_top1"], "final_loss": math.nan, "pretext_acc": math.nan,
                     "queue_size": math.nan, "ema_half_life": math.nan, "max_staleness_bound": math.nan,
                     "data": "", **_common(run), **_metrics(run, INSTRUMENTS),
                     **{k: math.nan for k in AGES}})
    return rows
