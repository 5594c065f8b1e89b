"""``results/*.csv`` -> ``docs/REPRODUCTION.md`` and its figures: every number in the write-up is computed here
from the committed CSV files, so the document regenerates without the MLflow store that produced them.

Each paper claim is stated with the test behind it and marked reproduced, not reproduced or reversed.
Definitions (what "fails" means, which comparisons form a family) are fixed in this module, before the runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from mocolab.analysis.stats import Comparison, fmt_p, holm, interval, paired  # noqa: E402
from mocolab.analysis.momentum_plots import PAPER_MOMENTUM  # noqa: E402
from mocolab.repro.inputs import check_results  # noqa: E402
from mocolab.repro.plan import HEADLINE_BEGIN, HEADLINE_END, HISTORY, LABEL, STUDIES, Study  # noqa: E402

ALPHA = 0.05
# "m = 0 fails", fixed before the runs: every seed of m = 0 meets all three.
FAIL_LOSS_FRACTION = 0.9  # final InfoNCE loss >= 0.9 * ln(1 + K): no better than guessing among K + 1 keys
FAIL_PRETEXT = 0.05  # pretext (instance discrimination) accuracy below 5 % at the end
FAIL_MARGIN = 0.01  # linear probe no more than 1 point above the random-init encoder of the same seed
# Paper claims about momentum (MoCo, He et al. 2020, Table 1b: 0.9 -> 55.2, 0.99 -> 57.8, 0.999 -> 59.0,
# 0.9999 -> 58.9 linear top-1 on ImageNet): (higher arm, lower arm) pairs it orders, and the pair it ties.
ORDERED = ((0.99, 0.9), (0.999, 0.99))
TIED = (0.9999, 0.999)
# "Learning is plain at this budget": the bar a budget clears before its ablations read as more than noise.
# In every seed, m = 0.99 beats the random-init encoder of the same seed by >= 5 kNN points and the raw-pixel
# probe by >= 3 linear points (test split).
PLAIN_ARM, PLAIN_KNN, PLAIN_LINEAR = "0.99", 0.05, 0.03


@dataclass
class Written:
    markdown: str
    headline: str  # README's table, between HEADLINE_BEGIN and HEADLINE_END
    figures: list[Path]


def pct(x: float) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.2f}"


def _ci(values) -> str:
    iv = interval(values)
    if iv.n == 0:
        return "—"
    if iv.n == 1:
        return f"{100 * iv.mean:.2f} (1 seed)"
    return f"{100 * iv.mean:.2f} ± {100 * iv.std:.2f} [{100 * iv.low:.2f}, {100 * iv.high:.2f}]"


def _diff(c: Comparison) -> str:
    if c.n == 0:
        return "—"
    if c.n == 1:
        return f"{100 * c.diff.mean:+.2f} (1 seed)"
    return f"{100 * c.diff.mean:+.2f} [{100 * c.diff.low:+.2f}, {100 * c.diff.high:+.2f}]"


def _t(c: Comparison) -> str:
    return "—" if math.isnan(c.t) else f"{c.t:.2f}"


def _seeds(n: int) -> str:
    return f"{n} seed" + ("" if n == 1 else "s")


def _p(name: str, p: float) -> str:
    text = fmt_p(p)
    return f"{name} {text}" if text.startswith("<") else f"{name} = {text}"


def _by_seed(frame: pd.DataFrame, arm: str, metric: str) -> dict[int, float]:
    rows = frame[(frame["arm"] == arm) & (frame["status"] == "finished")].drop_duplicates("seed")
    return {int(s): float(v) for s, v in zip(rows["seed"], rows[metric]) if not math.isnan(float(v))}


def _precision(frame: pd.DataFrame) -> str:
    values = sorted({str(v) for v in frame["precision"].dropna()} - {"", "nan"})
    return values[0] if len(values) == 1 else "auto"


def _provenance(frame: pd.DataFrame) -> list[str]:
    """One line per field a pooled result must agree on; two values are flagged, never averaged silently."""
    lines = []
    for col, label in (("commit", "code commit"), ("precision", "precision"), ("torch", "torch"),
                       ("device", "device"), ("data", "training data (name@digest)")):
        values = sorted({str(v) for v in frame[col].fillna("") if str(v) not in ("", "nan")})
        if not values:
            continue
        flag = "" if len(values) == 1 or col == "commit" else " — **mixed: these runs are not comparable**"
        lines.append(f"- {label}: {', '.join(f'`{v}`' for v in values)}{flag}")
    if (frame["dirty"].astype(str).str.lower() == "true").any():
        lines.append("- some runs were made from a checkout with uncommitted changes (`mocolab.source.git.dirty`)")
    lines.append(_code_line(frame))
    return lines


def _code_line(frame: pd.DataFrame) -> str:
    """Which code made the runs (their code fingerprints), and where a run continued across a change."""
    codes = (frame["code"].fillna("").astype(str).replace("nan", "") if "code" in frame
             else pd.Series("", index=frame.index))
    trained = ~frame["arm"].astype(str).isin(["random-init", "raw-pixels"])
    known = sorted({c[:8] for c in codes[trained] if c})
    unknown = int((codes[trained] == "").sum())
    parts = [f"`{c}`" for c in known] + ([f"unknown for {unknown} run(s), made before code fingerprints"]
                                          if unknown else [])
    line = f"- code fingerprint (the training path's code): {', '.join(parts) or 'none recorded'}"
    if len(known) > 1:
        line += " — **runs by several versions of the code**"
    if "code_segments" in frame:
        segments = [f"{r.arm} seed {int(r.seed)}: {r.code_segments}" for r in frame.itertuples()
                    if isinstance(r.code_segments, str) and r.code_segments]
        if segments:
            line += "; continued across a code change (segments `code@step`): " + "; ".join(segments)
    return line


def momentum_section(study: Study, frame: pd.DataFrame, fig_dir: Path, fig_rel: str,
                     history: pd.DataFrame | None = None) -> tuple[str, str, Path]:
    """(the study's section, README's headline table, the figure); ``history`` as for ``study_section``."""
    arms = [a for a in frame["arm"].unique() if a not in ("random-init", "raw-pixels")]
    arms = sorted(arms, key=float)
    init = {m: _by_seed(frame, "random-init", m) for m in ("linear_top1", "knn_top1")}
    pixels = frame[frame["arm"] == "raw-pixels"]
    rows, head = [], []
    for arm in arms:
        g = frame[frame["arm"] == arm]
        ok = g[g["status"] == "finished"].drop_duplicates("seed")
        statuses = ", ".join(f"{n} {s}" for s, n in g["status"].value_counts().items())
        dl = paired(_by_seed(frame, arm, "linear_top1"), init["linear_top1"], (f"m={arm}", "random-init"))
        dk = paired(_by_seed(frame, arm, "knn_top1"), init["knn_top1"], (f"m={arm}", "random-init"))
        paper = "fail" if float(arm) == 0 else (f"{PAPER_MOMENTUM[float(arm)]:.1f}"
                                                 if float(arm) in PAPER_MOMENTUM else "—")
        rows.append(f"| {arm} | {len(ok)} | {_ci(ok['linear_top1'])} | {_diff(dl)} | {_ci(ok['knn_top1'])} | "
                    f"{_diff(dk)} | {ok['final_loss'].mean():.3f} | {pct(ok['pretext_acc'].mean())} | "
                    f"{g['ema_half_life'].mean():.1f} | {statuses} | {paper} |")
        head.append(f"| {arm} | {len(ok)} | {_ci(ok['linear_top1'])} | {_diff(dl)} | {_diff(dk)} | {paper} |")
    for name, metric_rows in (("random-init", frame[frame["arm"] == "random-init"]), ("raw-pixels", pixels)):
        if len(metric_rows):
            n = len(metric_rows)
            zero = "0" if name == "random-init" else "—"
            rows.append(f"| {name} | {n} | {_ci(metric_rows['linear_top1'])} | {zero} | "
                        f"{_ci(metric_rows['knn_top1'])} | {zero} | — | — | — | baseline | — |")
            head.append(f"| {name} | {n} | {_ci(metric_rows['linear_top1'])} | "
                        f"{'0' if name == 'random-init' else '—'} | {'0' if name == 'random-init' else '—'} | — |")

    # the family of comparisons, Holm-corrected together
    lin = {arm: _by_seed(frame, arm, "linear_top1") for arm in arms}
    family = [paired(lin[f"{hi:g}"], lin[f"{lo:g}"], (f"m={hi:g}", f"m={lo:g}"))
              for hi, lo in (*ORDERED, TIED) if f"{hi:g}" in lin and f"{lo:g}" in lin]
    family += [paired(lin[arm], init["linear_top1"], (f"m={arm}", "random-init")) for arm in arms]
    family = holm(family)
    comp_rows = [f"| {c.a} − {c.b} | {c.n} | {_diff(c)} | {_t(c)} | {fmt_p(c.p)} | {fmt_p(c.p_holm)} | "
                 f"{c.verdict(ALPHA)} |" for c in family]
    claims = _momentum_claims(frame, family, init["linear_top1"], study.seeds)
    plain = _learning_is_plain(frame, init["knn_top1"], study.seeds)

    figure = _momentum_figure(frame, arms, fig_dir / f"{study.name}.png", history)
    text = "\n".join([
        f"## {study.title}",
        "",
        f"Preset `{study.preset}`, m ∈ {{{', '.join(arms)}}}, seeds 0 to {study.seeds - 1} planned "
        f"(the table counts those finished; paired: seed s of every arm starts from the same encoder and "
        f"sees the same batches). "
        f"Fashion-MNIST test split (10,000 images) for every number.",
        "",
        *_provenance(frame),
        "",
        f"Run by `make repro` as: `python {' '.join(study.command(_precision(frame), 1))}`, after "
        f"`mocolab baselines --preset {study.preset} --seeds {study.seeds} --name {study.name}` with the same "
        f"`--set` values.",
        "",
        f"![{study.title}]({fig_rel}/{figure.name})",
        "",
        *([f"Right: each arm's pretext accuracy over training, from `results/{HISTORY}/{study.name}.csv`.", ""]
          if history is not None and len(history) else []),
        "Top-1 accuracy in %: mean ± std over seeds [95 % t-interval]; Δ: paired difference from the random-init "
        "encoder of the same seed [95 % interval]. The EMA half-life (ln 0.5 / ln m, in steps) is true by "
        "construction, not measured.",
        "",
        "| m | seeds | linear | Δ linear vs init | kNN | Δ kNN vs init | final loss | pretext % | "
        "EMA half-life | status | paper (ImageNet) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Paired t-tests on linear top-1 across seeds, Holm-corrected as one family of {len(family)} "
        f"(α = {ALPHA}):",
        "",
        "| comparison | seeds | Δ points [95 %] | t | p | p (Holm) | verdict |",
        "|---|---|---|---|---|---|---|",
        *comp_rows,
        "",
        "### The paper's claims",
        "",
        *claims,
        "",
        "### Is learning plain at this budget?",
        "",
        plain,
        "",
    ])
    headline = "\n".join([
        f"Momentum ablation, `{study.preset}` preset, Fashion-MNIST, seeds finished per arm as counted "
        "(top-1 %, mean ± std [95 % interval]; Δ: paired difference from the same seed's random-init encoder):",
        "",
        "| m | seeds | linear | Δ linear | Δ kNN | paper (ImageNet) |",
        "|---|---|---|---|---|---|",
        *head,
        "",
        *claims,
        plain,
        "",
        # README sits at the repository's root, the figures in docs/figures (where `mocolab repro` writes them)
        f"![{study.name}: top-1 against 1 − m, beside the random-init encoder and raw pixels]"
        f"(docs/figures/{figure.name})",
    ])
    return text, headline, figure


def _learning_is_plain(frame: pd.DataFrame, init_knn: dict[int, float], planned: int) -> str:
    """Whether the budget separates a trained encoder from the baselines, by PLAIN_*: per seed of m = 0.99."""
    arm = _by_seed(frame, PLAIN_ARM, "knn_top1")
    linear = _by_seed(frame, PLAIN_ARM, "linear_top1")
    pixels = frame.loc[frame["arm"] == "raw-pixels", "linear_top1"]
    seeds = [s for s in arm if s in init_knn]
    rule = (f"the bar: m = {PLAIN_ARM} beats the random-init encoder of its seed by ≥ "
            f"{100 * PLAIN_KNN:.0f} kNN points and the raw-pixel linear probe by ≥ {100 * PLAIN_LINEAR:.0f} linear "
            f"points, in every seed")
    if not seeds or not len(pixels):
        return f"- *Learning is plain at this budget* ({rule}): **not yet measured** — no finished seed of " \
               f"m = {PLAIN_ARM} beside its baselines."
    knn_margin = [arm[s] - init_knn[s] for s in seeds]
    linear_margin = [linear[s] - float(pixels.mean()) for s in seeds]
    met = sum(k >= PLAIN_KNN and lin >= PLAIN_LINEAR for k, lin in zip(knn_margin, linear_margin))
    verdict = "**met**" if met == len(seeds) else "**not met**"
    if len(seeds) < planned:
        verdict += f" so far ({len(seeds)} of {planned} planned seeds finished)"
    return (f"- *Learning is plain at this budget* ({rule}): {verdict} — {met} of {len(seeds)} seeds; kNN margin "
            f"over random-init "
            f"{100 * min(knn_margin):+.2f} to {100 * max(knn_margin):+.2f} points, linear margin over raw pixels "
            f"{100 * min(linear_margin):+.2f} to {100 * max(linear_margin):+.2f} points.")


def _momentum_claims(frame: pd.DataFrame, family: list[Comparison], init: dict[int, float],
                     planned: int) -> list[str]:
    out = []
    by = {(c.a, c.b): c for c in family}
    zero = frame[(frame["arm"] == "0") & (frame["status"].isin(["finished", "diverged"]))]
    if len(zero):
        k = zero["queue_size"].astype(float)
        loss_ok = zero["final_loss"] >= FAIL_LOSS_FRACTION * (k + 1).apply(math.log)
        pretext_ok = zero["pretext_acc"] < FAIL_PRETEXT
        margin_ok = [float(lin) <= init.get(int(s), math.nan) + FAIL_MARGIN
                     for s, lin in zip(zero["seed"], zero["linear_top1"])]
        diverged = zero["status"] == "diverged"
        each = [d or (lo and pr and ma) for d, lo, pr, ma in zip(diverged, loss_ok, pretext_ok, margin_ok)]
        verdict = "**reproduced**" if all(each) else "**not reproduced**"
        if len(each) < planned:
            verdict += f" so far ({len(each)} of {planned} planned seeds finished)"
        out.append(f"- *m = 0 fails* (defined before the runs: a seed fails when it diverges, "
                   f"or when its final loss is "
                   f"≥ {FAIL_LOSS_FRACTION}·ln(1+K), its pretext accuracy < {100 * FAIL_PRETEXT:.0f} % and its "
                   f"linear probe ≤ its random-init encoder's + {100 * FAIL_MARGIN:.0f} point): {verdict} — "
                   f"{sum(each)} of {len(each)} seeds fail (loss criterion met by {int(loss_ok.sum())}, pretext by "
                   f"{int(pretext_ok.sum())}, probe by {sum(margin_ok)}, diverged {int(diverged.sum())}).")
    for hi, lo in ORDERED:
        c = by.get((f"m={hi:g}", f"m={lo:g}"))
        if c is None:
            continue
        v = c.verdict(ALPHA)
        mark = ("**not yet tested**" if c.n < 2 else "**reproduced**" if v == c.a + " > " + c.b
                else "**reversed**" if v == c.a + " < " + c.b else "**not reproduced** (no significant difference)")
        out.append(f"- *m = {lo:g} < m = {hi:g}* (paper: {PAPER_MOMENTUM[lo]} < {PAPER_MOMENTUM[hi]}): {mark} — "
                   f"m={hi:g} − m={lo:g} = {_diff(c)} points, paired t = {_t(c)}, {_p('p', c.p)}, "
                   f"{_p('Holm p', c.p_holm)}, {_seeds(c.n)}.")
    hi, lo = TIED
    c = by.get((f"m={hi:g}", f"m={lo:g}"))
    if c is not None:
        v = c.verdict(ALPHA)
        mark = ("**not yet tested**" if c.n < 2 else "**consistent** (no significant difference)"
                if v == "no difference" else f"**not reproduced** ({v})")
        out.append(f"- *m = {hi:g} ≈ m = {lo:g}* (paper: {PAPER_MOMENTUM[hi]} vs {PAPER_MOMENTUM[lo]}): {mark} — "
                   f"{_diff(c)} points, paired t = {_t(c)}, {_p('Holm p', c.p_holm)}, {_seeds(c.n)}.")
    return out


METRICS = (("linear_top1", "linear probe", "o", "C0"), ("knn_top1", "kNN", "s", "C1"))  # metric, label, marker, colour


def _arm_bars(frame: pd.DataFrame, arms: list[str], metric: str) -> tuple[list[float], list[list[float]]]:
    """Per arm, the finished trials' mean in % (NaN, drawn as nothing, for an arm with no value yet) and its
    95 % interval as matplotlib's (below, above) error bars; none where one seed gives no interval."""
    ivs = [interval(frame[(frame["arm"] == a) & (frame["status"] == "finished")][metric]) for a in arms]
    means = [100 * iv.mean for iv in ivs]
    err = [[100 * (iv.mean - iv.low) if iv.n > 1 else 0 for iv in ivs],
           [100 * (iv.high - iv.mean) if iv.n > 1 else 0 for iv in ivs]]
    return means, err


def _random_init_band(ax, frame: pd.DataFrame, metric: str, label: str, color: str) -> None:
    """The random-init encoder's mean and 95 % interval across seeds, behind the arms it is the baseline of."""
    base = interval(frame[frame["arm"] == "random-init"][metric])
    if base.n:
        lo, hi = (base.low, base.high) if base.n > 1 else (base.mean, base.mean)
        ax.axhspan(100 * lo, 100 * hi, color=color, alpha=0.15, label=f"{label}, random-init encoder (95 % CI)")
        ax.axhline(100 * base.mean, color=color, alpha=0.5, linewidth=0.8)


def _raw_pixels_line(ax, frame: pd.DataFrame) -> None:
    pix = frame[frame["arm"] == "raw-pixels"]["linear_top1"]
    if len(pix):
        ax.axhline(100 * float(pix.iloc[0]), color="gray", linestyle="--", label="linear probe on raw pixels")


def _momentum_figure(frame: pd.DataFrame, arms: list[str], path: Path, history: pd.DataFrame | None = None) -> Path:
    """Accuracy against 1 − m beside the baselines; with the trials' curves, pretext accuracy over training
    beside it (where m = 0's failure shows)."""
    curves = history is not None and len(history)
    fig, axes = plt.subplots(1, 2 if curves else 1, figsize=(12.5 if curves else 7, 4.2), dpi=110, squeeze=False)
    ax = axes[0][0]
    x = [1.0 - float(a) for a in arms]
    for metric, label, marker, color in METRICS:
        means, err = _arm_bars(frame, arms, metric)
        ax.errorbar(x, means, yerr=err, marker=marker, color=color, capsize=3, label=f"{label} (mean, 95 % CI)")
        _random_init_band(ax, frame, metric, label, color)
    _raw_pixels_line(ax, frame)
    ax.set_xscale("log")
    ax.invert_xaxis()
    ax.set_xlabel("1 − m (log scale; right = higher momentum; m = 0 at 1)")
    ax.set_ylabel("top-1 accuracy, Fashion-MNIST test (%)")
    ax.set_title("Momentum ablation: accuracy against the key encoder's momentum")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)  # below: no point hidden
    if curves:
        _pretext_curves(axes[0][1], history, arms, prefix="m = ")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return path


# What the papers say about each generic study (by the field its arms differ in, else by its script): their
# numbers where they give them, and the claims tested here as (arm, "<" or ">", the claim's words), the arm
# against the study's reference on linear top-1.
Paper = tuple[str, tuple[tuple[str, str, str], ...]]
PAPER: dict[str, Paper] = {
    "queue.size": (
        "Paper (Figure 3, ImageNet linear top-1, ResNet-50): MoCo's accuracy rises with K all the way to "
        "K = 65,536 (60.6); at K = 4,096 it is 59.0 (the momentum ablation's m = 0.999). The paper has no "
        "Fashion-MNIST number.",
        (("256", "<", "a larger dictionary is better: the smallest K is below the preset's K"),)),
    "moco.bn": (
        "Paper (Section 3.3, Shuffling BN): without shuffling, the batch's statistics leak which key is the "
        "positive, so the model 'cheats' the pretext task and finds a low-loss solution that does not make "
        "a good representation. The paper gives no accuracy for the unshuffled model. Here `split` emulates "
        "its per-GPU BN with the key batch shuffled across the groups; `groups` and `plain` do not shuffle.",
        (("plain", "<", "one BN over the whole batch, unshuffled, is worse than shuffled BN"),
         ("groups", "<", "the same BN groups without the shuffle are worse than shuffled BN"))),
    "negatives_ablation.py": (
        "Paper (Figure 3, ImageNet linear top-1): MoCo's queue beats the memory bank at every K, 60.6 against "
        "58.0 at K = 65,536 (a 2.6-point gap); end-to-end (in-batch) negatives match MoCo where memory allows "
        "(K up to 1,024), and MoCo's larger queues go above them. The paper runs FIFO only: it gives no number "
        "for random replacement. Here the in-batch arm has 2 x 256 - 2 negatives a query, the queue 16,384.",
        (("memory bank", "<", "the memory bank is below MoCo's FIFO queue"),
         ("in batch", "<", "in-batch negatives (end-to-end: K is the batch) are below MoCo's large queue"))),
    "moco.negatives": (
        "Paper (Figure 3, ImageNet linear top-1): the memory bank is below MoCo's queue at every K, 58.0 against "
        "60.6 at K = 65,536. Here the bank trains three times as long as the queue it is set against (30 epochs "
        "against the 10 of `negatives-cpu-full`, whose bank did not learn), both with 16,384 negatives a query.",
        (("memory_bank", "<", "the memory bank is below MoCo's FIFO queue, even trained three times as long"),)),
    "vit_ablation.py": (
        "Papers (ImageNet linear top-1, ResNet-50, 200 epochs): MoCo v1 60.6, MoCo v2 67.5 (Chen et al. 2020); "
        "MoCo v3 (Chen, Xie, He 2021) reports other epochs and backbones, no number at this recipe. Here every "
        "recipe trains at vit-quick's data, batch and epochs. The random-init baseline is the convnet the "
        "three convnet recipes train: the ViT's Δ is against that convnet, not against a random ViT.",
        (("v1 convnet", "<", "v2's recipe (MLP head, τ 0.2, blur) improves on v1's"),)),
}
PRETEXT_NOTE = {"moco.bn": "pretext_acc"}  # studies whose pretext accuracy is itself tested against the reference


def _paper(study: Study) -> Paper:
    return PAPER.get(study.by) or PAPER.get(study.script) or ("The paper gives no number here.", ())


def _arms(study: Study, frame: pd.DataFrame) -> list[str]:
    """The arms in the CSV, in the plan's order (others after, by their text)."""
    found = [a for a in frame["arm"].astype(str).unique() if a not in ("random-init", "raw-pixels")]
    order = {a: i for i, a in enumerate(study.arms)}
    return sorted(found, key=lambda a: (order.get(a, len(order)), a))


def study_family(study: Study, frame: pd.DataFrame) -> list[tuple[str, Comparison]]:
    """Every paired test of the study as (metric, comparison), Holm-corrected together: each arm against the
    reference on linear and kNN top-1 (and pretext accuracy where the study says so), then each arm's linear
    top-1 against the random-init encoder of the same seed."""
    arms, ref = _arms(study, frame), study.reference
    metrics = ["linear_top1", "knn_top1", *([PRETEXT_NOTE[study.by]] if study.by in PRETEXT_NOTE else [])]
    tests: list[tuple[str, Comparison]] = []
    if ref in arms:
        for metric in metrics:
            base = _by_seed(frame, ref, metric)
            tests += [(metric, paired(_by_seed(frame, a, metric), base, (a, ref))) for a in arms if a != ref]
    init = _by_seed(frame, "random-init", "linear_top1")
    if init:
        tests += [("linear_top1", paired(_by_seed(frame, a, "linear_top1"), init, (a, "random-init"))) for a in arms]
    return list(zip([m for m, _ in tests], holm([c for _, c in tests])))


_METRIC = {"linear_top1": "linear", "knn_top1": "kNN", "pretext_acc": "pretext"}


def study_section(study: Study, frame: pd.DataFrame, fig_dir: Path, fig_rel: str,
                  history: pd.DataFrame | None = None) -> tuple[str, Path]:
    """(the section of a study whose arms are any config field's values or a script's settings, its figure).
    ``history``: the trials' curves (``results/history/<study>.csv``), drawn where the study reads pretext
    accuracy."""
    frame = frame.assign(arm=frame["arm"].astype(str))
    arms = _arms(study, frame)
    init = {m: _by_seed(frame, "random-init", m) for m in ("linear_top1", "knn_top1")}
    rows = []
    for arm in arms:
        g = frame[frame["arm"] == arm]
        ok = g[g["status"] == "finished"].drop_duplicates("seed")
        statuses = ", ".join(f"{n} {s}" for s, n in g["status"].value_counts().items())
        dl = paired(_by_seed(frame, arm, "linear_top1"), init["linear_top1"], (arm, "random-init"))
        dk = paired(_by_seed(frame, arm, "knn_top1"), init["knn_top1"], (arm, "random-init"))
        mark = " (reference)" if arm == study.reference else ""
        rows.append(f"| {arm}{mark} | {len(ok)} | {_ci(ok['linear_top1'])} | {_diff(dl)} | {_ci(ok['knn_top1'])} | "
                    f"{_diff(dk)} | {_num(ok['final_loss'].mean(), '.3f')} | {_ci(ok['pretext_acc'].dropna())} | "
                    f"{statuses} |")
    for name in ("random-init", "raw-pixels"):
        base = frame[frame["arm"] == name]
        if len(base):
            zero = "0" if name == "random-init" else "—"
            rows.append(f"| {name} | {len(base)} | {_ci(base['linear_top1'])} | {zero} | {_ci(base['knn_top1'])} | "
                        f"{zero} | — | — | baseline |")
    family = study_family(study, frame)
    comp_rows = [f"| {c.a} − {c.b} | {_METRIC[m]} | {c.n} | {_diff(c)} | {_t(c)} | {fmt_p(c.p)} | "
                 f"{fmt_p(c.p_holm)} | {c.verdict(ALPHA)} |" for m, c in family]
    tested = sum(not math.isnan(c.p) for _, c in family)
    paper, claims = _paper(study)
    figure = _study_figure(study, frame, arms, fig_dir / f"{study.name}.png", history)
    what = f"`{study.by}`" if study.by != LABEL else f"the settings of `{study.script}`"
    pairing = ("paired by seed: seed s of every arm sees the same batches, but the recipes build different "
               "networks" if study.baseline_sets else
               "paired: seed s of every arm starts from the same encoder, and epoch e of every arm draws the same "
               "batches" if study.reference_from else
               "paired: seed s of every arm starts from the same encoder and sees the same batches")
    reference = (f"the reference arm is `{study.reference}`" if study.reference in arms
                 else f"the reference arm `{study.reference}` has no finished run yet")
    if study.reference_from:
        reference += f", the study `{study.reference_from}`'s arm, with that study's settings (its section)"
    text = "\n".join([
        f"## {study.title}",
        "",
        f"Preset `{study.preset}`, {what} ∈ {{{', '.join(arms)}}}, seeds 0 to {study.seeds - 1} planned (the "
        f"table counts those finished; {pairing}); {reference}. Fashion-MNIST test split (10,000 images) for "
        f"every number.",
        "",
        *_provenance(frame),
        "",
        f"Run by `mocolab repro --study {study.name}` as: `python {' '.join(study.command(_precision(frame), 1))}`, "
        f"after `mocolab baselines --preset {study.preset} --seeds {study.seeds} --name {study.name}` with the same "
        f"`--set` values" + (f" and `{'`, `'.join(study.baseline_sets)}` (the baselines' encoder)"
                             if study.baseline_sets else "") + ".",
        "",
        f"![{study.title}]({fig_rel}/{figure.name})",
        "",
        "Top-1 accuracy and pretext accuracy in %: mean ± std over seeds [95 % t-interval]; Δ: paired "
        "difference from the random-init encoder of the same seed [95 % interval].",
        "",
        "| arm | seeds | linear | Δ linear vs init | kNN | Δ kNN vs init | final loss | pretext % | status |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Paired t-tests across seeds, Holm-corrected as one family of the {tested} with two or more paired "
        f"seeds (α = {ALPHA}): each arm against `{study.reference}` on linear and kNN top-1"
        + (" and pretext accuracy" if study.by in PRETEXT_NOTE else "")
        + ", and each arm's linear top-1 against the random-init encoder of the same seed:",
        "",
        "| comparison | metric | seeds | Δ points [95 %] | t | p | p (Holm) | verdict |",
        "|---|---|---|---|---|---|---|---|",
        *comp_rows,
        "",
        "### The paper's claims",
        "",
        paper,
        "",
        *_claims(study, family, claims),
        "",
    ])
    return text, figure


def _num(x: float, spec: str) -> str:
    return "—" if x is None or math.isnan(x) else format(x, spec)


def _claims(study: Study, family: list[tuple[str, Comparison]], claims) -> list[str]:
    by = {(c.a, c.b): c for m, c in family if m == "linear_top1"}
    out = []
    for arm, sign, words in claims:
        c = by.get((arm, study.reference))
        if c is None:
            out.append(f"- *{words}* (`{arm}` {sign} `{study.reference}`, linear top-1): **not yet tested** "
                       f"(an arm has no finished run).")
            continue
        v = c.verdict(ALPHA)
        mark = ("**not yet tested**" if c.n < 2 else "**reproduced**" if v == f"{c.a} {sign} {c.b}"
                else "**not reproduced** (no significant difference)" if v == "no difference" else "**reversed**")
        out.append(f"- *{words}* (`{arm}` {sign} `{study.reference}`, linear top-1): {mark} — "
                   f"{c.a} − {c.b} = {_diff(c)} points, paired t = {_t(c)}, {_p('p', c.p)}, "
                   f"{_p('Holm p', c.p_holm)}, {_seeds(c.n)}.")
    return out or ["- The paper states no claim this study tests; the table and tests above are the finding."]


def _study_figure(study: Study, frame: pd.DataFrame, arms: list[str], path: Path,
                  history: pd.DataFrame | None = None) -> Path:
    pretext = study.by in PRETEXT_NOTE
    fig, axes = plt.subplots(1, 2 if pretext else 1, figsize=(11 if pretext else 7, 4.2), dpi=110, squeeze=False)
    ax = axes[0][0]
    numeric = study.by == "queue.size"
    x = [float(a) for a in arms] if numeric else list(range(len(arms)))
    width = 0.38
    for i, (metric, label, marker, color) in enumerate(METRICS):
        means, err = _arm_bars(frame, arms, metric)
        if numeric:
            ax.errorbar(x, means, yerr=err, marker=marker, color=color, capsize=3, label=f"{label} (mean, 95 % CI)")
        else:
            ax.bar([xi + (i - 0.5) * width for xi in x], means, width, yerr=err, color=color, capsize=3,
                   label=f"{label} (mean, 95 % CI)")
        _random_init_band(ax, frame, metric, label, color)
    _raw_pixels_line(ax, frame)
    if numeric:
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, arms)
        ax.set_xlabel(f"{study.by} (log scale)")
    else:
        ax.set_xticks(x, arms, rotation=15)
        ax.set_xlabel(study.by if study.by != "label" else "setting")
        values = [100 * v for v in frame[frame["status"] == "finished"][["linear_top1", "knn_top1"]].stack()]
        if values:
            ax.set_ylim(max(0.0, min(values) - 5), min(100.0, max(values) + 3))
    ax.set_ylabel("top-1 accuracy, Fashion-MNIST test (%)")
    ax.set_title(study.title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    if pretext and history is not None and len(history):
        _pretext_curves(axes[0][1], history, arms)
    elif pretext:
        bx = axes[0][1]
        means, err = _arm_bars(frame, arms, "pretext_acc")
        bx.bar(x, [0.0 if math.isnan(v) else v for v in means], 0.6, color="C2", capsize=3, yerr=err)
        bx.set_xticks(x, arms)
        bx.set_xlabel(study.by)
        bx.set_ylabel("pretext accuracy at the end of training (%)")
        bx.set_title("Pretext (instance discrimination) accuracy, mean and 95 % CI", fontsize=9)
        bx.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return path


def _pretext_curves(ax, history: pd.DataFrame, arms: list[str], prefix: str = "") -> None:
    """Pretext accuracy against the training step, one line per arm (mean over seeds, the band their range):
    the per-step series where the runs logged one, else the epochs' means."""
    metric = "step_pretext_acc" if (history["metric"] == "step_pretext_acc").any() else "pretext_acc"
    curves = history[history["metric"] == metric]
    for i, arm in enumerate(arms):
        own = curves[curves["arm"] == arm]
        if not len(own):
            continue
        per_step = own.groupby("step")["value"]
        mean, lo, hi = (100 * per_step.mean(), 100 * per_step.min(), 100 * per_step.max())
        ax.plot(mean.index, mean.values, color=f"C{i}", label=f"{prefix}{arm} ({_seeds(own['seed'].nunique())})",
                marker="." if len(mean) < 30 else None)
        ax.fill_between(mean.index, lo.values, hi.values, color=f"C{i}", alpha=0.15, linewidth=0)
    ax.set_xlabel("training step")
    ax.set_ylabel("pretext accuracy (%)" + (", per step" if metric == "step_pretext_acc" else ", epoch mean"))
    ax.set_title("Pretext (instance discrimination) accuracy over training\nmean over seeds, band: their range",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _ended(history: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """The curves of the trials that ended (finished or diverged): a running trial's would be half a curve."""
    ended = frame[frame["status"].isin(["finished", "diverged"])]
    keys = set(zip(ended["arm"].astype(str), ended["seed"]))
    return history[[(a, s) in keys for a, s in zip(history["arm"].astype(str), history["seed"])]]


def write(results: Path, doc: Path, fig_dir: Path) -> Written:
    """Read every study's CSV under ``results``, write ``doc`` and the figures; what it wrote."""
    check_results(results)  # every file before the first figure is drawn
    fig_rel = Path("figures").as_posix() if fig_dir.parent == doc.parent else str(fig_dir)
    sections, headlines, figures = [], [], []
    for study in STUDIES:
        path = results / f"{study.name}.csv"
        if not path.is_file():
            sections.append(not_run(study))
            continue
        frame = pd.read_csv(path, dtype={"arm": str, "commit": str, "code": str, "code_segments": str})
        other = results / f"{study.reference_from}.csv"
        if study.reference_from and other.is_file():  # the reference arm, as its own study ran it
            borrowed = pd.read_csv(other, dtype={"arm": str, "commit": str, "code": str, "code_segments": str})
            frame = pd.concat([frame, borrowed[borrowed["arm"] == study.reference].assign(study=study.name)],
                              ignore_index=True)
        curves = results / HISTORY / f"{study.name}.csv"
        history = _ended(pd.read_csv(curves, dtype={"arm": str}), frame) if curves.is_file() else None
        if study.by == "moco.m":
            text, headline, figure = momentum_section(study, frame, fig_dir, fig_rel, history)
            headlines.append(headline)
        else:
            text, figure = study_section(study, frame, fig_dir, fig_rel, history)
        sections.append(text)
        figures.append(figure)
    markdown = "\n".join([
        "# Reproduction",
        "",
        "Generated by `mocolab repro --document-only` from the CSV files in `results/` (one row per MLflow "
        "run, exported by `mocolab repro --skip-run`); do not edit by hand. `make repro` runs or resumes every "
        "study, exports it and regenerates this page. A test regenerates it from the committed CSV files and "
        "fails if it differs.",
        "",
        "Every accuracy is beside two baselines scored by the same kNN and linear probe on the same images: "
        "the *random-init* encoder (the network each seed starts from, before any training) and a linear "
        "probe on the *raw pixels*.",
        "",
        *sections,
    ]).rstrip() + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(markdown)
    return Written(markdown, "\n\n".join(headlines), figures)


def not_run(study: Study) -> str:
    """What stands for a study with no CSV yet: its title and the command that runs it."""
    return f"## {study.title}\n\nNot run yet: `mocolab repro --study {study.name}`.\n"


def replace_headline(readme: str, headline: str) -> str:
    """README's text with the generated table between its markers (a ValueError if the markers are missing)."""
    start, end = readme.find(HEADLINE_BEGIN), readme.find(HEADLINE_END)
    if start < 0 or end < start:
        raise ValueError(f"README has no {HEADLINE_BEGIN} ... {HEADLINE_END} block")
    return readme[:start + len(HEADLINE_BEGIN)] + "\n" + (headline + "\n" if headline else "") + readme[end:]
