"""Ablation reports drawn from MLflow: the pictures a researcher reads at a glance.

``mocolab report --experiment momentum-ablation [--parent-run ID] --out DIR``
reads the runs with ``MlflowClient.search_runs`` (the same records the MLflow
UI shows), finds what varies across them, and draws: accuracy against
momentum (log(1−m) axis, the paper's ImageNet curve on a second axis, and
for a sweep the random-init encoder and raw pixels its study logged as baselines),
accuracy against queue size, grouped bars for augmentation and batch-norm
settings; for MoCo v3 runs, accuracy per patch projection and base momentum
beside every trial's first-layer gradient norm per step, and bars per recipe
when the MoCo version varies (the recipes differ in many fields at once, so
nothing finer is drawn); per-trial training curves, and a table of every trial with a link
into the MLflow UI.  Output: PNG files and one self-contained HTML page
(images embedded), also logged as artifacts of the parent run.
"""

from __future__ import annotations

import base64
import html
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
import pandas as pd  # noqa: E402

from mocolab.analysis import bar_plot, line_plot, summarise  # noqa: E402
from mocolab.analysis.momentum_plots import BASELINE_COLUMNS, PAPER_MOMENTUM, momentum_plot  # noqa: E402
from mocolab.analysis.feature_maps import PANELS_NAME, feature_map_panels  # noqa: E402
from mocolab.analysis.negatives_plots import negatives_drift, negatives_plot  # noqa: E402
from mocolab.analysis.probe_curves import probe_curves  # noqa: E402
from mocolab.analysis.vit_plots import GRAD_FIRST, patch_momentum_table, vit_plot  # noqa: E402
from mocolab.tracking import PARENT_TAG, Store, redact_uri, run_link, trials_frame  # noqa: E402
from mocolab.tracking.store import (BASELINE_KIND_TAG, BASELINE_SET_TAG, BASELINES_EXPERIMENT,  # noqa: E402
                                    HistoryCache)

CURVES = (("loss", "InfoNCE loss"), ("knn_top1", "kNN top-1"), ("pretext_acc", "pretext accuracy"),
          ("staleness_mean", "mean key staleness (steps)"))
LEGEND_MAX = 10  # legend entries of the curves: more trials are grouped by what they vary, or counted
History = Callable[[str, str], list[tuple[int, float]]]  # (run id, metric) -> (step, value) pairs


@dataclass
class Report:
    out: Path
    html: Path | None
    figures: list[Path] = field(default_factory=list)
    trials: int = 0
    message: str = ""
    running: int = 0  # trials still running when it was written
    live: bool = False  # the page reloads itself (watched, and something still runs)


def _runs(store: Store, experiment: str, parent_run: str | None):
    """(experiment id, trial runs): a sweep's children, or every trial of the experiment."""
    exp_id = store.experiment_id(experiment)
    if exp_id is None:
        raise ValueError(f"--experiment: no experiment {experiment!r} in this store; it has "
                         f"{store.experiment_names()}")
    if parent_run and not store.run_exists(parent_run):
        raise ValueError(f"--parent-run: {parent_run!r} is not a run in this store")
    return exp_id, store.trial_runs(exp_id, parent_run)


def _history_reader(store: Store, runs: list, kept: HistoryCache) -> History:
    """(run id, metric) -> its (step, value) pairs: the first ask for a metric reads it for every trial of the
    report at once (a few requests, not one per trial), and ended trials' curves are kept in ``kept``."""
    read: dict[str, dict[str, list[tuple[int, float]]]] = {}

    def history(run_id: str, key: str) -> list[tuple[int, float]]:
        if key not in read:
            read[key] = kept.histories(store, runs, key)
        return read[key][run_id]

    return history


def _varying(df: pd.DataFrame) -> list[str]:
    keys = []
    for col in df.columns:
        if col.startswith("params.") and not col.startswith("params.run.") and df[col].nunique(dropna=True) > 1:
            keys.append(col[len("params."):])
    return keys


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) read from a PNG header; raises ValueError for anything else."""
    head = path.read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def legend_groups(df: pd.DataFrame, varying: list[str],
                  cap: int = LEGEND_MAX) -> tuple[list[tuple[str, list[int]]], list[int]]:
    """(legend entry, the row positions drawn in its colour) for at most ``cap`` entries, and the rows left
    unlabelled: one entry per trial up to ``cap`` trials; beyond, one per value of the first varied param
    with at most ``cap`` values; else the first ``cap`` trials, and the rest counted.  A legend of hundreds
    of trials hides the plot it labels."""
    rows = list(range(len(df)))
    if len(df) <= cap:
        return [(str(label), [i]) for i, label in enumerate(df["label"])], []
    for key in varying:
        values = df[f"params.{key}"].astype(str).tolist()
        if len(set(values)) <= cap:
            groups: dict[str, list[int]] = {}
            for i, v in enumerate(values):
                groups.setdefault(v, []).append(i)
            return [(f"{key}={v} ({len(members)} trials)", members) for v, members in groups.items()], []
    return [(str(df["label"].iloc[i]), [i]) for i in rows[:cap]], rows[cap:]


def _curves(history: History, df: pd.DataFrame, varying: list[str], path: Path) -> Path:
    """Small multiples: one panel per metric, one line per trial (a colour per legend entry).

    The trials of one colour and style are one matplotlib line, broken between trials (NaN): a line object
    per trial costs milliseconds each, which a report of hundreds of trials rebuilt at every trial's end
    pays again and again."""
    groups, rest = legend_groups(df, varying)
    colour = {i: f"C{n % 10}" for n, (_, members) in enumerate(groups) for i in members}
    fig, axes = plt.subplots(1, len(CURVES), figsize=(4 * len(CURVES), 3.4), dpi=100)
    drawn = False
    for ax, (key, title) in zip(axes, CURVES):
        lines: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
        for i, row in enumerate(df.itertuples()):
            hist = history(row.run_id, key)
            if hist:
                xs, ys = lines.setdefault((colour.get(i, "0.6"), ":" if row.status != "finished" else "-"), ([], []))
                xs.extend([h[0] for h in hist] + [math.nan])
                ys.extend([h[1] for h in hist] + [math.nan])
        for (c, style), (xs, ys) in lines.items():
            ax.plot(xs, ys, style, marker=".", color=c, alpha=1.0 if c != "0.6" else 0.5)
            drawn = True
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if drawn:
        handles = [Line2D([], [], color=f"C{n % 10}", marker=".", label=label) for n, (label, _) in enumerate(groups)]
        if rest:
            handles.append(Line2D([], [], color="0.6", marker=".", label=f"{len(rest)} more trials"))
        fig.legend(handles=handles, loc="lower center", ncol=min(6, len(handles)), fontsize=8)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def _table_html(df: pd.DataFrame, varying: list[str], ui: str, experiment_id: str) -> str:
    cols = (["label", "status", "epochs"] + [f"params.{k}" for k in varying]
            + ["linear_top1", "knn_top1", "final_loss", "loss"] + (["data"] if "data" in df else []))
    cols = [c for c in cols if c in df]
    names = {"loss": "latest loss", "epochs": "epochs done"}
    head = "".join(f"<th>{html.escape(names.get(c, c.replace('params.', '')))}</th>" for c in cols) + "<th>MLflow</th>"
    rows = []
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            v = r.get(c)
            if isinstance(v, float):
                v = "—" if math.isnan(v) else (f"{100 * v:.2f}%" if c.endswith("top1") else f"{v:.4g}")
            cls = f' class="{html.escape(str(v))}"' if c == "status" else ""
            cells.append(f"<td{cls}>{html.escape(str(v))}</td>")
        link = run_link(experiment_id, r["run_id"], ui)
        cells.append(f'<td><a href="{html.escape(link)}">{html.escape(r["run_id"][:8])}</a></td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>{refresh}
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 1400px; color: #222; }}
img {{ max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }}
td.diverged, td.failed, td.stopped {{ color: #b00; font-weight: bold; }}
td.running {{ color: #06c; font-weight: bold; }}
.live {{ background: #eef6ff; border: 1px solid #9cf; padding: 0.4em 0.8em; }}
.note {{ color: #555; }}
</style></head>
<body>
<h1>{title}</h1>
<p class="note">{subtitle}</p>
{live}
{sections}
<h2>Every trial</h2>
{table}
<p id="status" class="note">loading…</p>
<script>
window.addEventListener("load", function () {{
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) {{ return i.complete && i.naturalWidth > 0; }}).length;
  document.getElementById("status").textContent = "images loaded: " + ok + "/" + imgs.length;
}});
</script>
</body></html>
"""


def build_report(experiment: str, out: str | Path, *, parent_run: str | None = None,
                 tracking_uri: str | None = None, ui_url: str = "http://127.0.0.1:5000",
                 log_artifacts: bool = True, refresh_s: int | None = None,
                 histories: HistoryCache | None = None) -> Report:
    """Render the report; an empty experiment gives a page that says so, never a crash.

    ``refresh_s``: a live page (``report --watch``, a study's ``--watch``) that reloads itself every
    ``refresh_s`` seconds while anything in it runs; the page written once nothing runs does not.
    ``histories``: the metric histories of ended runs kept from earlier builds (one cache per watched
    report), so that rebuilding at every trial's end does not read every trial's curves again.
    """
    store = Store(tracking_uri)
    uri = store.uri
    experiment_id, runs = _runs(store, experiment, parent_run)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    df = trials_frame(runs)
    history = _history_reader(store, runs, histories if histories is not None else HistoryCache())
    if not df.empty:
        df["epochs"] = [len(history(r, "loss")) for r in df["run_id"]]  # one loss point per epoch
        df["loss"] = [run.data.metrics.get("loss", math.nan) for run in runs]
    title = f"{experiment}" + (f" — sweep {parent_run[:8]}" if parent_run else "")
    running = int((df["status"] == "running").sum()) if not df.empty else 0
    live_now = refresh_s is not None and (running > 0 or (parent_run is not None and store.is_running(parent_run)))
    refresh = f'\n<meta http-equiv="refresh" content="{int(refresh_s)}">' if live_now else ""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    live = (f'<p class="live">Live: {running} trial(s) running; this page reloads itself every {refresh_s} s '
            f'(written {stamp}).</p>' if live_now else
            (f'<p class="note">Final: nothing is running (written {stamp}).</p>' if refresh_s is not None else ""))
    if df.empty:
        msg = f"experiment '{experiment}' has no trial runs yet" + (f" under parent {parent_run}" if parent_run else "")
        page = out / "report.html"
        _write(page, PAGE.format(title=html.escape(title), subtitle=html.escape(msg), sections="",
                                 table="<p>No trials.</p>", refresh=refresh, live=live))
        return Report(out, page, [], 0, msg, running=running, live=live_now)

    varying = _varying(df)
    figures: list[tuple[str, Path]] = []
    v3 = "params.moco.version" in df and (df["params.moco.version"].astype(str) == "v3").any()
    if "moco.version" in varying:  # recipes that differ in many fields at once: one bar per recipe, nothing finer
        by = df.assign(**{"params.recipe": [f"{v} {b}" for v, b in zip(df["params.moco.version"],
                                                                         df["params.model.backbone"])]})
        figures.append(("MoCo versions at one budget (grouped bars: linear probe and kNN)", bar_plot(
            summarise(by, "recipe"), "recipe", "MoCo v1, v2, v3", out / "versions.png")))
        varying_keys: list[str] = []
    else:
        varying_keys = varying
    negatives = "moco.negatives" in varying_keys or "queue.policy" in varying_keys
    if v3 and ("moco.m" in varying_keys or "vit.freeze_patch_embed" in varying_keys):  # the ViT ablation
        curves = {str(r.label): history(r.run_id, GRAD_FIRST) for r in df.itertuples()}
        figures.append(("MoCo v3: accuracy against base momentum per patch projection (trained | frozen), and "
                        "the first layer's gradient norm at every step of every trial",
                        vit_plot(patch_momentum_table(df), curves, out / "vit.png")))
    elif "moco.m" in varying_keys and not negatives:  # (the negatives ablation plots m per source below)
        table = summarise(df, "moco.m")
        baselines = sweep_baselines(store, parent_run)
        figures.append(("Accuracy against momentum (mean ± std over seeds; red: trials that did not finish; "
                        + ("bands: the random-init encoder of the same seeds, 95 % interval; dashed: raw pixels; "
                           if len(baselines) else "")
                        + "the paper's ImageNet numbers on the right axis, a different dataset and scale)",
                        momentum_plot(table, PAPER_MOMENTUM, out / "momentum.png", baselines)))
    if negatives:  # the negatives ablation
        table, drift, epoch = negatives_drift(store, df)
        figures.append(("Sources of negatives: accuracy per source, and key drift against the age of the stored "
                        "negative (mean cosine of the writing and the current encoder's embedding of the same image, "
                        f"at the end of epoch {epoch}, the middle of training; in-batch negatives are fresh by "
                        "construction)", negatives_plot(table, drift, out / "negatives.png", epoch)))
    if "queue.size" in varying_keys:
        table = summarise(df, "queue.size").dropna(subset=["knn_top1_mean"])
        if not table.empty:
            figures.append(("Accuracy against queue size K", line_plot(
                table, "queue.size", "queue size K (log scale)", "Queue-size ablation", out / "queue.png")))
    for key, name in (("augment.preset", "augmentation"), ("moco.bn", "batchnorm")):
        if key in varying_keys:
            figures.append((f"{name.capitalize()} settings (grouped bars: linear probe and kNN)", bar_plot(
                summarise(df, key), key, f"{name} ablation", out / f"{name}.png")))
    # each arm's online probe during training, and its features' map (where the runs logged them)
    figures += [f for f in (probe_curves(history, df, varying, out / "online_probe.png"),
                            feature_map_panels(store, df, varying, out / PANELS_NAME)) if f is not None]
    figures.append(("Training curves of every trial (dotted: did not finish)",
                    _curves(history, df, varying, out / "curves.png")))

    sections = []
    for caption, path in figures:
        data = base64.b64encode(path.read_bytes()).decode()
        sections.append(f"<h2>{html.escape(caption)}</h2>\n"
                        f"<img alt=\"{path.name}\" src=\"data:image/png;base64,{data}\">")
    n_bad = int((df["status"] != "finished").sum())
    seeds = df["params.run.seed"].nunique() if "params.run.seed" in df else 1
    subtitle = (f"{len(df)} trials, {seeds} seed(s), varying {', '.join(varying) or 'nothing'}; "
                f"{n_bad} did not finish. Store: {redact_uri(uri)}")
    subtitle += "".join(f". Warning: {w}" for w in mixed_provenance(df))
    page = out / "report.html"
    _write(page, PAGE.format(title=html.escape(title), subtitle=html.escape(subtitle), refresh=refresh, live=live,
                             sections="\n".join(sections), table=_table_html(df, varying, ui_url, experiment_id)))
    paths = [p for _, p in figures]
    if log_artifacts and parent_run:
        store.log_artifacts(parent_run, [page, *paths], artifact_path="report")
    return Report(out, page, paths, len(df), subtitle, running=running, live=live_now)


def sweep_baselines(store: Store, parent_run: str | None) -> pd.DataFrame:
    """The random-init encoder and raw pixels the sweep's study logged beside it (``mocolab baselines``'s set
    named as the sweep), one row each (``momentum_plots.BASELINE_COLUMNS``); none for a whole experiment."""
    empty = pd.DataFrame(columns=list(BASELINE_COLUMNS))
    exp_id = store.experiment_id(BASELINES_EXPERIMENT)
    name = store.client.get_run(parent_run).data.tags.get(PARENT_TAG) if parent_run else None
    if not name or exp_id is None:
        return empty
    runs = store.search_all([exp_id], f"tags.`{BASELINE_SET_TAG}` = '{name}' and attributes.status = 'FINISHED'")
    rows = []
    for r in runs:
        kind = r.data.tags.get(BASELINE_KIND_TAG)
        rows.append({"kind": kind, "seed": int(r.data.params["run.seed"]) if kind == "random-init" else None,
                     **{m: r.data.metrics.get(m, math.nan) for m in BASELINE_COLUMNS[2:]}})
    return pd.DataFrame(rows, columns=list(BASELINE_COLUMNS)) if rows else empty


def mixed_provenance(df: pd.DataFrame) -> list[str]:
    """What the trials of one table differ in beyond their config (data, precision, torch, code): a report
    that pools several sweeps says so rather than average runs that are not comparable."""
    out = []
    for col, what, advice in (("data", "data sets", "compare within one"),
                              ("precision", "precisions", "compare within one (run.precision)"),
                              ("torch", "torch versions", "compare within one"),
                              ("commit", "code commits", "check that the method did not change between them")):
        values = sorted({str(v) for v in df[col].dropna()} - {"", "nan"}) if col in df else []
        if len(values) > 1:
            out.append(f"the trials come from {len(values)} different {what} ({'; '.join(values)}): {advice}")
    return out


def _write(page: Path, text: str) -> None:
    """Whole or not at all: a browser reloading a live page never reads half of it."""
    tmp = page.with_name(page.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, page)


def watch_report(experiment: str, out: str | Path, *, interval_s: int = 30, parent_run: str | None = None,
                 tracking_uri: str | None = None, ui_url: str = "http://127.0.0.1:5000",
                 say=print) -> Report:
    """Rewrite the report every ``interval_s`` while anything in it runs; the last one is final (logged
    to the parent run, like a sweep's closing report). Ctrl-C stops watching and leaves the last page."""
    say(f"watching '{experiment}'" + (f" sweep {parent_run}" if parent_run else "") +
        f": {Path(out) / 'report.html'} is rewritten every {interval_s} s while trials run (Ctrl-C stops)")
    histories = HistoryCache()
    while True:
        rep = build_report(experiment, out, parent_run=parent_run, tracking_uri=tracking_uri, ui_url=ui_url,
                           log_artifacts=False, refresh_s=interval_s, histories=histories)
        if not rep.live:
            break
        say(f"  {time.strftime('%H:%M:%S')}  {rep.trials} trial(s), {rep.running} running")
        time.sleep(interval_s)
    return build_report(experiment, out, parent_run=parent_run, tracking_uri=tracking_uri, ui_url=ui_url,
                        refresh_s=interval_s, histories=histories)

