"""The momentum study's table and picture, and the paper's numbers they are read against (MoCo, He et al. 2020,
Table 1b).

Beside the study (``tune/studies/momentum.py``), apart from its sweep: ``mocolab report`` and the reproduction's
write-up (``repro/document.py``) draw and quote them without loading Tune. The table reads as the write-up does:
each arm beside the random-init encoder of the same seed (the untrained network its trials start from, scored by
the same kNN and linear probe), and each arm against the paper's m by paired t-tests across seeds,
Holm-corrected (``analysis/stats.py``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Mapping

import matplotlib.pyplot as plt
import pandas as pd

from mocolab.analysis import accuracy_errorbar, baseline_band, fmt_mean_std, per_seed, save_figure, summarise
from mocolab.analysis.stats import Comparison, Interval, holm, interval, paired
from mocolab.analysis.summary import ALPHA, comparison_line, family_size, paired_diff

# The paper's momentum ablation: ImageNet linear top-1 against the key-encoder momentum m.
PAPER_MOMENTUM: dict[float, float] = {0.9: 55.2, 0.99: 57.8, 0.999: 59.0, 0.9999: 58.9}
PAPER_M = 0.999  # the paper's m: each other arm is tested against it (against the largest m, where it is not run)
INIT, PIXELS = "random-init", "raw-pixels"  # the baselines' kinds (``mocolab baselines``)
# scores as fractions, as the runs log them (a baseline logged without the 1 % probe: NaN)
BASELINE_COLUMNS = ("kind", "seed", "linear_top1", "knn_top1", "linear_top1_1pct")


def baseline_frame(baselines: Iterable[Any]) -> pd.DataFrame:
    """Baselines (``training.baselines.Baseline``) as a table, one row each: NaN where one lacks a score."""
    return pd.DataFrame([{"kind": b.kind, "seed": b.seed, **{c: b.metric(c) for c in BASELINE_COLUMNS[2:]}}
                         for b in baselines], columns=list(BASELINE_COLUMNS))


def reference_m(momenta: Iterable[float]) -> float:
    """The arm every other is tested against: the paper's m where the study runs it, else the largest."""
    values = sorted(float(m) for m in momenta)
    return PAPER_M if PAPER_M in values else values[-1]


def _baseline(baselines: pd.DataFrame, kind: str, metric: str) -> Interval:
    """One baseline's scores in %, over its seeds."""
    return interval([100 * float(v) for v in baselines.loc[baselines["kind"] == kind, metric]])


def momentum_comparisons(trials: pd.DataFrame, baselines: pd.DataFrame | None = None,
                         metric: str = "linear_top1") -> tuple[list[Comparison], list[Comparison]]:
    """Two families of paired t-tests on ``metric`` (in points), each Holm-corrected on its own: each arm
    against the reference m (``reference_m``), and each arm against the random-init encoder of the same
    seed (the baseline check; empty without baselines)."""
    arms = {float(m): seeds for m, seeds in per_seed(trials, "moco.m", metric).items()}
    if not arms:
        return [], []
    ref = reference_m(arms)
    against_ref = holm([paired(arms[m], arms[ref], (f"m={m:g}", f"m={ref:g}")) for m in arms if m != ref])
    init = {}
    if baselines is not None and len(baselines):
        rows = baselines[baselines["kind"] == INIT]
        init = {int(s): 100 * float(v) for s, v in zip(rows["seed"], rows[metric]) if not math.isnan(float(v))}
    against_init = holm([paired(arms[m], init, (f"m={m:g}", INIT)) for m in arms]) if init else []
    return against_ref, against_init


def _paper(value: Any) -> str:
    """The paper column: its number or word, — where the paper did not run that m."""
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def momentum_table(trials: pd.DataFrame, baselines: pd.DataFrame | None = None,
                   paper: Mapping[float, Any] | None = None, note: str = "") -> tuple[str, pd.DataFrame]:
    """The study's closing table (its text and its summary table): per m, accuracy over seeds and its paired
    difference from the random-init encoder of the same seed; the baselines' rows beneath; then the paired
    t-tests, each arm against the paper's m and against the random-init encoder. ``paper``: the paper column
    per m (default ``PAPER_MOMENTUM``); ``note``: said where the baselines are missing."""
    paper = PAPER_MOMENTUM if paper is None else paper
    baselines = baseline_frame([]) if baselines is None else baselines
    table = summarise(trials, "moco.m")
    table["paper"] = [paper.get(float(m)) for m in table["moco.m"]]
    against_ref, against_init = momentum_comparisons(trials, baselines)
    by_a = {c.a: c for c in against_init}
    vs_ref = {c.a: c for c in against_ref}
    finished = {float(m): len(s) for m, s in per_seed(trials, "moco.m", "linear_top1").items()}
    names = [f"m={float(m):g}" for m in table["moco.m"]]
    nan = math.nan
    table["linear_vs_init"] = [by_a[n].diff.mean if n in by_a else nan for n in names]
    table["linear_vs_init_low"] = [by_a[n].diff.low if n in by_a else nan for n in names]
    table["linear_vs_init_high"] = [by_a[n].diff.high if n in by_a else nan for n in names]
    table["p_holm_vs_init"] = [by_a[n].p_holm if n in by_a else nan for n in names]
    table["linear_vs_reference"] = [vs_ref[n].diff.mean if n in vs_ref else nan for n in names]
    table["p_holm_vs_reference"] = [vs_ref[n].p_holm if n in vs_ref else nan for n in names]

    lines = [f"{'m':>11} {'seeds':>5} {'linear top-1 %':>16} {'1 % labels %':>16} {'kNN top-1 %':>16} "
             f"{'Δ linear vs init':>22} {'final loss':>10} {'status':>10} {'half-life':>9} {'staleness':>9} "
             f"{'paper':>6}"]
    for name, (_, r) in zip(names, table.iterrows()):
        lines.append(f"{r['moco.m']:>11g} {finished.get(float(r['moco.m']), 0):>5} "
                     f"{fmt_mean_std(r.linear_top1_mean, r.linear_top1_std):>16} "
                     f"{fmt_mean_std(r.linear_top1_1pct_mean, r.linear_top1_1pct_std):>16} "
                     f"{fmt_mean_std(r.knn_top1_mean, r.knn_top1_std):>16} {paired_diff(by_a.get(name)):>22} "
                     f"{r.final_loss:>10.3f} {r.status:>10} {r.ema_half_life:>9.1f} {r.max_staleness:>9.0f} "
                     f"{_paper(r.paper):>6}")
    init = {m: _baseline(baselines, INIT, m) for m in ("linear_top1", "knn_top1", "linear_top1_1pct")}
    pixels = {m: _baseline(baselines, PIXELS, m) for m in ("linear_top1", "knn_top1", "linear_top1_1pct")}
    for kind, scores, delta in ((INIT, init, "0"), (PIXELS, pixels, "—")):
        if scores["linear_top1"].n:
            low = scores["linear_top1_1pct"]
            lines.append(f"{kind:>11} {scores['linear_top1'].n:>5} "
                         f"{fmt_mean_std(scores['linear_top1'].mean, scores['linear_top1'].std):>16} "
                         f"{fmt_mean_std(low.mean, low.std) if low.n else '—':>16} "
                         f"{fmt_mean_std(scores['knn_top1'].mean, scores['knn_top1'].std):>16} {delta:>22} "
                         f"{'—':>10} {'baseline':>10} {'—':>9} {'—':>9} {'—':>6}")
    if init["linear_top1"].n:
        iv = init["linear_top1"]
        spread = ", ".join(f"{what} {v.mean:.2f}" + (f" [{v.low:.2f}, {v.high:.2f}]" if v.n > 1 else "")
                           for what, v in (("linear", iv), ("kNN", init["knn_top1"])))
        over = "1 seed" if iv.n == 1 else f"95 % t-interval over {iv.n} seeds"
        lines.append(f"random-init: the untrained encoder each seed's trials start from, scored by the same kNN and "
                     f"linear probe: {spread} ({over}).")
        lines.append("An arm has learned only as far as it is above it. raw-pixels: the same probes on the pixels. "
                     "Δ linear vs init: the paired difference from the random-init encoder of the same seed "
                     "[95 % interval].")
    if table["linear_top1_1pct_mean"].notna().any():
        lines.append("1 % labels: the linear probe on 1 % of its training images (class-balanced, the mean over "
                     "fixed draws that every arm and seed shares; evaluation/low_label.py).")
    if not init["linear_top1"].n:
        lines.append("The random-init encoder was not measured" + (f" ({note})" if note else "") +
                     ": no arm is shown against the network it started from.")
    tested = [c for c in against_ref + against_init if c.n >= 2]
    if not tested:
        lines.append("Paired t-tests across seeds need two seeds or more of an arm (--seeds 2); none here.")
        return "\n".join(lines), table
    ref = reference_m(float(m) for m in table["moco.m"])
    which = "the paper's m" if ref == PAPER_M else f"the largest here (the paper's {PAPER_M:g} is not run)"
    lines.append(f"Paired t-tests on linear top-1 (points) across seeds (seed s of every arm starts from the same "
                 f"encoder and sees the same batches), α = {ALPHA}, Holm-corrected within each family:")
    if against_ref:
        lines.append(f"  each m against m={ref:g}, {which} (a family of {family_size(against_ref)}):")
        lines += [comparison_line(c) for c in against_ref]
    if against_init:
        lines.append(f"  each m against the random-init encoder of its seed (the baseline check, a family of "
                     f"{family_size(against_init)}):")
        lines += [comparison_line(c) for c in against_init]
    return "\n".join(lines), table


def momentum_plot(table: pd.DataFrame, paper: dict[float, float | None], path: Path,
                  baselines: pd.DataFrame | None = None) -> Path:
    """Accuracy against 1 − m on a log axis (m = 0 sits at 1 − m = 1), beside the random-init encoder (its
    mean and 95 % interval over seeds, a band per probe) and the raw-pixel linear probe; the paper's ImageNet
    curve on a second axis, since its numbers are on another dataset and scale."""
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    x = 1.0 - table["moco.m"].astype(float)
    accuracy_errorbar(ax, x, table, "linear_top1", "linear probe (ours)", "o", color="C0")
    accuracy_errorbar(ax, x, table, "knn_top1", "kNN (ours)", "s", color="C1")
    if baselines is not None and len(baselines):
        for metric, probe, color in (("linear_top1", "linear", "C0"), ("knn_top1", "kNN", "C1")):
            iv = _baseline(baselines, INIT, metric)
            spread = f"95 % CI, {iv.n} seeds" if iv.n > 1 else "1 seed"
            baseline_band(ax, iv.mean, iv.low, iv.high, f"random-init encoder, {probe} ({spread})", color)
        pix = _baseline(baselines, PIXELS, "linear_top1")
        if pix.n:
            ax.axhline(pix.mean, color="gray", linestyle="--", linewidth=1, label="raw pixels, linear probe")
    bad = table[~table["status"].eq("finished")]
    for _, row in bad.iterrows():
        ax.axvline(1.0 - float(row["moco.m"]), color="red", alpha=0.3, linestyle=":")
        ax.annotate(row["status"], (1.0 - float(row["moco.m"]), ax.get_ylim()[0]), color="red",
                    rotation=90, va="bottom", ha="right", fontsize=8)
    ax.set_xscale("log")
    ax.invert_xaxis()
    ax.set_xlabel("1 − m (log scale; right = higher momentum)")
    ax.set_ylabel("top-1 accuracy on our data (%)")
    pts = [(1.0 - m, v) for m, v in sorted(paper.items()) if v is not None]
    if pts:
        ax2 = ax.twinx()
        ax2.plot([p[0] for p in pts], [p[1] for p in pts], "k--", marker="^", alpha=0.6,
                 label="MoCo paper, ImageNet (right axis)")
        ax2.set_ylabel("paper: ImageNet linear top-1 (%)")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, loc="best", fontsize=7)
    else:
        ax.legend(loc="lower left", fontsize=7)
    ax.set_title("Momentum ablation")
    ax.grid(alpha=0.3)
    return save_figure(fig, path)
