"""The best encoders across every experiment of a store, beside what they must beat: ``mocolab report
--leaderboard``.

Ranked within each data set (accuracies on different images are not comparable), by a final metric. A
trained run's encoder is its own source run; a transfer test (``mocolab eval``) ranks on the data it was
scored on and names the run the encoder came from. Beside each, the baselines (``mocolab baselines``) that
were scored exactly as it was: the same data and evaluation settings, and for the random-init encoder the
same network, averaged over its seeds. An encoder with no matching baseline shows none: a baseline scored
on other images would mislead.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from mocolab.tracking.store import BASELINE_KIND_TAG as KIND_TAG
from mocolab.tracking.store import BASELINE_SET_TAG as SET_TAG
from mocolab.tracking.store import BASELINES_EXPERIMENT as BASELINES
from mocolab.tracking import STATUS_TAG, Store, redact_uri, run_link, trials_frame
from mocolab.evaluation.transfer import SOURCE_EXPERIMENT_TAG, SOURCE_RUN_TAG

METRICS = ("linear_top1", "knn_top1", "linear_top1_1pct", "linear_top1_10pct", "knn20_top1")
# Shown beside the ranked metric for every encoder that logged them (the low-label probes, the k = 20 kNN)
BESIDE = {"linear_top1_1pct": "linear 1 %", "linear_top1_10pct": "linear 10 %", "knn20_top1": "kNN k=20"}
# Shown for every encoder (what a reader compares encoders by), under these headings
KEY_FIELDS = {"run.preset": "preset", "model.backbone": "backbone", "moco.version": "version", "moco.m": "m",
              "moco.tau": "tau", "queue.size": "K", "augment.preset": "augment", "optim.epochs": "epochs",
              "run.seed": "seed"}
# What decides a score besides the encoder: a baseline stands beside an encoder only when these are equal
_SCORED = ("data.name", "data.subset", "data.image_size", "data.synthetic_size", "data.root", "eval.knn_k",
           "eval.knn_t", "eval.knn_bank", "eval.knn_test", "eval.linear_train", "eval.linear_test",
           "eval.linear_steps", "eval.linear_wd")
_NETWORK = ("model.backbone", "model.width", "vit.patch_size", "vit.depth")  # ... and for random-init, these


@dataclass
class Leaderboard:
    metric: str
    top: int
    table: pd.DataFrame  # one row per ranked encoder: data, rank, scores, baselines, source, key fields
    baselines: pd.DataFrame  # one row per baseline set and kind: data, kind, set, seeds, mean scores
    store: str  # the store read (credentials hidden)

    def text(self) -> str:
        """The leaderboard as a terminal reads it."""
        if self.table.empty:
            return f"no finished run with {self.metric} in {self.store}"
        lines = [f"Leaderboard by {self.metric}: the best {self.top} encoders per data set, beside the baselines "
                 f"scored the same way (Δ: {self.metric} minus the random-init encoder's). Store: {self.store}"]
        fields = _shown_fields(self.table)
        for data, rows in self.table.groupby("data_name", sort=True):
            shown = pd.DataFrame({
                "#": rows["rank"], self.metric: rows["score"].map(_pct), "random-init": rows["random_init"].map(_pct),
                "raw pixels": rows["raw_pixels"].map(_pct), "Δ": rows["delta"].map(_delta),
                **{BESIDE[m]: rows[m].map(_pct) for m in _shown_metrics(self.table, self.metric)},
                "experiment": rows["experiment"], "run": rows["label"].astype(str).str.slice(0, 40),
                "source run": [_source(r) for _, r in rows.iterrows()],
                **{KEY_FIELDS[f]: rows[f"params.{f}"].map(_cell) for f in fields}})
            lines += ["", f"{data}", shown.to_string(index=False)]
            base = self.baselines[self.baselines["data_name"] == data] if not self.baselines.empty else self.baselines
            for b in base.itertuples():
                lines.append(f"    baseline {b.kind} '{b.set}' ({b.seeds} seed(s)): linear top-1 "
                             f"{_pct(b.linear_top1)}, kNN top-1 {_pct(b.knn_top1)}")
        return "\n".join(lines)


def _source(row: pd.Series) -> str:
    """The run that trained the encoder: the row's own, or (a transfer test) the one it names, and where."""
    own = str(row["source_run"]) == str(row["run_id"])
    return str(row["source_run"])[:8] + ("" if own else f" ({row['source_experiment']})")


def _shown_fields(table: pd.DataFrame) -> list[str]:
    return [f for f in KEY_FIELDS if f"params.{f}" in table and table[f"params.{f}"].notna().any()]


def _shown_metrics(table: pd.DataFrame, ranked: str) -> list[str]:
    """The ``BESIDE`` metrics some ranked encoder logged (a store of runs without them shows no empty column)."""
    return [m for m in BESIDE if m != ranked and m in table and table[m].notna().any()]


def _pct(x) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.2f}%"


def _delta(x) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:+.2f}"


def _cell(v) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def build_leaderboard(metric: str = "linear_top1", *, top: int = 10, experiment: str | None = None,
                      tracking_uri: str | None = None) -> Leaderboard:
    """The leaderboard of every experiment in the store (``experiment``: of that one only)."""
    if metric not in METRICS:
        raise ValueError(f"--metric: unknown value {metric!r}; choose one of {list(METRICS)}")
    if top < 1:
        raise ValueError(f"--top: {top} must be >= 1")
    store = Store(tracking_uri)
    experiments = {e.experiment_id: e.name for e in store.client.search_experiments()}
    if experiment is not None and experiment not in experiments.values():
        raise ValueError(f"--experiment: no experiment {experiment!r} in this store; "
                         f"it has {sorted(experiments.values())}")
    ranked_ids = [i for i, n in experiments.items() if n != BASELINES and (experiment is None or n == experiment)]
    runs = _finished(store, ranked_ids, metric)
    baseline_ids = [i for i, n in experiments.items() if n == BASELINES]
    base_runs = _finished(store, baseline_ids, metric)
    table = _ranked(runs, experiments, metric, top)
    baselines = trials_frame(base_runs)
    if not baselines.empty:
        baselines["kind"] = [r.data.tags.get(KIND_TAG, "") for r in base_runs]
        baselines["set"] = [r.data.tags.get(SET_TAG, "") for r in base_runs]
        table = _beside(table, baselines, metric)
    else:
        table = table.assign(random_init=math.nan, raw_pixels=math.nan, delta=math.nan)
    return Leaderboard(metric, top, table, _baseline_sets(baselines), redact_uri(store.uri))


def _finished(store: Store, experiment_ids: list[str], metric: str):
    if not experiment_ids:
        return []
    runs = store.find_runs(experiment_ids, status="FINISHED", newest_first=True)  # equal scores: the newer run first
    return [r for r in runs if metric in r.data.metrics and r.data.tags.get(STATUS_TAG, "finished") == "finished"]


def _ranked(runs, experiments: dict[str, str], metric: str, top: int) -> pd.DataFrame:
    df = trials_frame(runs)
    if df.empty:
        return df
    df["score"] = df[metric]
    df["experiment"] = [experiments[r.info.experiment_id] for r in runs]
    df["experiment_id"] = [r.info.experiment_id for r in runs]
    df["source_run"] = [r.data.tags.get(SOURCE_RUN_TAG, r.info.run_id) for r in runs]
    df["source_experiment"] = [r.data.tags.get(SOURCE_EXPERIMENT_TAG, experiments[r.info.experiment_id])
                               for r in runs]
    df["data_name"] = df.get("params.data.name", pd.Series("?", index=df.index)).fillna("?")
    df = df.sort_values(["data_name", "score"], ascending=[True, False], kind="stable")
    df["rank"] = df.groupby("data_name").cumcount() + 1
    return df[df["rank"] <= top].reset_index(drop=True)


def _same(row: pd.Series, base: pd.DataFrame, fields: tuple[str, ...]) -> pd.Series:
    """Which baseline rows were scored with the same ``fields`` as ``row`` (a field absent on both is equal)."""
    keep = pd.Series(True, index=base.index)
    for f in fields:
        col = f"params.{f}"
        mine = str(row.get(col, None))
        theirs = base[col].astype(str) if col in base else pd.Series("None", index=base.index)
        keep &= theirs.replace({"nan": "None"}) == mine.replace("nan", "None")
    return keep


def _beside(table: pd.DataFrame, baselines: pd.DataFrame, metric: str) -> pd.DataFrame:
    random_init, pixels = [], []
    for _, row in table.iterrows():
        ri = baselines[(baselines["kind"] == "random-init") & _same(row, baselines, _SCORED + _NETWORK)]
        px = baselines[(baselines["kind"] == "raw-pixels") & _same(row, baselines, _SCORED)]
        random_init.append(ri[metric].mean() if not ri.empty else math.nan)
        pixels.append(px[metric].mean() if not px.empty else math.nan)
    return table.assign(random_init=random_init, raw_pixels=pixels,
                        delta=[s - r for s, r in zip(table["score"] if not table.empty else [], random_init)])


def _baseline_sets(baselines: pd.DataFrame) -> pd.DataFrame:
    """Per data set, baseline set and kind: seeds and mean scores."""
    if baselines.empty:
        return pd.DataFrame(columns=["data_name", "kind", "set", "seeds", "linear_top1", "knn_top1"])
    df = baselines.assign(data_name=baselines.get("params.data.name", "?"))
    out = (df.groupby(["data_name", "kind", "set"], sort=True)
           .agg(seeds=("run_id", "count"), linear_top1=("linear_top1", "mean"), knn_top1=("knn_top1", "mean"))
           .reset_index())
    return out


def write_leaderboard(board: Leaderboard, out: str | Path, ui_url: str = "http://127.0.0.1:5000") -> Path:
    """``leaderboard.html`` (links into the MLflow UI) and ``leaderboard.csv`` in ``out``; the page's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    board.table.to_csv(out / "leaderboard.csv", index=False)
    sections = []
    fields = _shown_fields(board.table)
    beside = _shown_metrics(board.table, board.metric) if not board.table.empty else []
    if not board.table.empty:
        for data, rows in board.table.groupby("data_name", sort=True):
            head = "".join(f"<th>{html.escape(h)}</th>" for h in
                           ["#", board.metric, "random-init", "raw pixels", "Δ", *(BESIDE[m] for m in beside),
                            "experiment", "run", "source run", *(KEY_FIELDS[f] for f in fields)])
            body = []
            for _, r in rows.iterrows():
                link = run_link(r["experiment_id"], r["run_id"], ui_url)
                cells = [str(r["rank"]), _pct(r["score"]), _pct(r["random_init"]), _pct(r["raw_pixels"]),
                         _delta(r["delta"]), *(_pct(r[m]) for m in beside), str(r["experiment"])]
                tds = "".join(f"<td>{html.escape(c)}</td>" for c in cells)
                tds += f'<td><a href="{html.escape(link)}">{html.escape(str(r["label"]))}</a></td>'
                tds += f"<td>{html.escape(_source(r))}</td>"
                tds += "".join(f"<td>{html.escape(_cell(r.get(f'params.{f}')))}</td>" for f in fields)
                body.append(f"<tr>{tds}</tr>")
            base = board.baselines[board.baselines["data_name"] == data]
            notes = "".join(f"<li>{html.escape(b.kind)} '{html.escape(str(b.set))}' ({b.seeds} seed(s)): linear "
                            f"{_pct(b.linear_top1)}, kNN {_pct(b.knn_top1)}</li>" for b in base.itertuples())
            sections.append(f"<h2>{html.escape(str(data))}</h2><table><thead><tr>{head}</tr></thead>"
                            f"<tbody>{''.join(body)}</tbody></table>" + (f"<ul>{notes}</ul>" if notes else ""))
    page = out / "leaderboard.html"
    page.write_text(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Leaderboard by {html.escape(board.metric)}</title>
<style>body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.9em; }} th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; }}
</style></head><body><h1>Leaderboard by {html.escape(board.metric)}</h1>
<p>The best {board.top} encoders per data set, beside the baselines scored the same way. Store:
{html.escape(board.store)}</p>
{''.join(sections) or '<p>No finished run has this metric.</p>'}
</body></html>
""")
    return page
