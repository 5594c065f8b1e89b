"""``results/*.csv`` -> ``docs/REPRODUCTION.md`` and its figures: every number in the write-up is computed here
from the committed CSV files, so the document regenerates without the MLflow store that produced them.

Each paper claim gets one of four verdicts by the rules of repro/claims.py and analysis/verdicts.py; this module
applies them, shows each rule beside its verdict, and labels a verdict post hoc unless every run it judges
carries the hash of the rules that judge it (repro/preregistration.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from mocolab.analysis.stats import interval, paired  # noqa: E402
from mocolab.analysis.momentum_plots import PAPER_MOMENTUM  # noqa: E402
from mocolab.repro.claims import FAIL_LOSS_FRACTION, FAIL_PRETEXT, RANDOM_INIT  # noqa: E402
from mocolab.repro.claims import PLAIN_BARS  # noqa: E402
from mocolab.repro.judging import (RULES, Plain, Registration, budget_bar, by_seed, claim_lines, claim_table,  # noqa: E402
                                   contrast_lines, diff_points, judge_contrasts, judge_secondary, judge_study,
                                   plan_table, rules_line, secondary_table, tested_at)
from mocolab.repro.preregistration import PLAN_COLUMN, rules_hash  # noqa: E402
from mocolab.repro.inputs import check_results  # noqa: E402
from mocolab.repro.plan import (HEADLINE_BEGIN, HEADLINE_END, HISTORY, LABEL, SAME_CONFIG, STUDIES, SUPERVISED,  # noqa: E402
                                Study)

@dataclass
class Written:
    markdown: str
    headline: str  # README's table and claim lines, between HEADLINE_BEGIN and HEADLINE_END
    figures: list[Path]


@dataclass(frozen=True)
class Bound:
    """The supervised bound's finished runs and the budget they trained (its study's preset and steps)."""

    study: Study
    frame: pd.DataFrame
    steps: int


@dataclass(frozen=True)
class Headline:
    """A momentum study's candidate for README's headline: one table and one line per claim. README shows one
    study's, so that its first screen holds one table (``_headline``)."""

    study: Study
    plain: Plain
    arms: int
    text: str


def _headline(candidates: Sequence[Headline]) -> str:
    """The study README shows: a budget where learning is plain first (its verdicts are not provisional), then
    the one with the most momenta (the ablation, not a pair of its arms), then the plan's order."""
    if not candidates:
        return ""
    return min(enumerate(candidates), key=lambda ic: (ic[1].plain.met is not True, -ic[1].arms, ic[0]))[1].text


def _plain_words(plain: Plain) -> str:
    """Whether learning is plain at the headline's budget, in the words its title needs."""
    if plain.met is True:
        return "learning is plain at this budget"
    if plain.met is False:
        return "learning is not plain at this budget, so its verdicts are provisional"
    return "learning not yet measured at this budget, so its verdicts are provisional"


def _bound_row(study: Study, bound: Bound | None, steps: int) -> list[str]:
    """The supervised bound as a row of README's headline table, where it trained the same preset for the same
    steps (Δ: paired with the random-init encoders of its own study)."""
    if bound is None or (study.preset, steps) != (bound.study.preset, bound.steps):
        return []
    arm = bound.study.arms[0]
    ok = bound.frame[(bound.frame["arm"] == arm) & (bound.frame["status"] == "finished")].drop_duplicates("seed")
    if not len(ok):
        return []
    d = {m: paired(by_seed(bound.frame, arm, m), by_seed(bound.frame, RANDOM_INIT, m), (arm, RANDOM_INIT))
         for m in ("linear_top1", "knn_top1")}
    return [f"| {arm} | {len(ok)} | {_ci(ok['linear_top1'])} | {diff_points(d['linear_top1'])} | "
            f"{diff_points(d['knn_top1'])} | — |"]


BASELINE_ARMS = (RANDOM_INIT, "raw-pixels")  # rows a study's baselines wrote beside its trained arms


def _trained(frame: pd.DataFrame) -> pd.Series:
    """The rows of trained arms, the baselines left out."""
    return ~frame["arm"].astype(str).isin(BASELINE_ARMS)


def _arm_machines(frame: pd.DataFrame) -> dict[int, set[str]]:
    """{seed: the machines its trained arms ran on}: one each where every pair of a seed is taken on one machine."""
    rows = frame[_trained(frame) & frame["device"].notna()]
    return {int(s): set(g["device"].astype(str)) for s, g in rows.groupby("seed")}


def _span(study: Study, frame: pd.DataFrame, bound: Bound | None, steps: int) -> float | None:
    """What there is to learn at this budget (fractions): the supervised bound's mean linear top-1 less the
    random-init encoder's, where the bound trained the same preset for the same steps; else None."""
    if bound is None or (study.preset, steps) != (bound.study.preset, bound.steps):
        return None
    init = by_seed(frame, RANDOM_INIT, "linear_top1")
    labels = by_seed(bound.frame, bound.study.arms[0], "linear_top1")
    if not init or not labels:
        return None
    return sum(labels.values()) / len(labels) - sum(init.values()) / len(init)


def _scale(study: Study, frame: pd.DataFrame, bound: Bound | None, steps: int) -> list[str]:
    """What there is to learn at this budget: the random-init start, the best arm, the supervised bound (where
    it trained the same preset for the same steps), and the share of the gap the best arm closes."""
    if bound is None or study.name == bound.study.name or (study.preset, steps) != (bound.study.preset, bound.steps):
        return []
    init = by_seed(frame, RANDOM_INIT, "linear_top1")
    arms = {a: by_seed(frame, a, "linear_top1") for a in frame["arm"].astype(str).unique()
            if a not in BASELINE_ARMS}
    means = {a: sum(v.values()) / len(v) for a, v in arms.items() if v}
    labels = by_seed(bound.frame, bound.study.arms[0], "linear_top1")
    if not init or not means or not labels:
        return []
    start, top = sum(init.values()) / len(init), sum(labels.values()) / len(labels)
    best = max(means, key=means.get)
    share = (means[best] - start) / (top - start) if top > start else math.nan
    return [f"What there is to learn at this budget (linear top-1, means over seeds): the random-init encoder "
            f"{100 * start:.2f}, the best arm (`{best}`) {100 * means[best]:.2f}, the supervised bound "
            f"{100 * top:.2f} (`{bound.study.name}`, {_seeds(len(labels))}: the same network, augmentation and "
            f"steps trained with the labels): the best arm closes {100 * share:.0f} % of the gap between its start "
            f"and the labels.", ""]


def pct(x: float) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.2f}"


def _ci(values) -> str:
    iv = interval(values)
    if iv.n == 0:
        return "—"
    if iv.n == 1:
        return f"{100 * iv.mean:.2f} (1 seed)"
    return f"{100 * iv.mean:.2f} ± {100 * iv.std:.2f} [{100 * iv.low:.2f}, {100 * iv.high:.2f}]"


def _seeds(n: int) -> str:
    return f"{n} seed" + ("" if n == 1 else "s")


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
        if col == "device" and len(values) > 1 and (line := _machines_line(frame)):
            lines.append(line)
            continue
        flag = "" if len(values) == 1 or col == "commit" else " — **mixed: these runs are not comparable**"
        lines.append(f"- {label}: {', '.join(f'`{v}`' for v in values)}{flag}")
    dirty = frame["dirty"].astype(str).str.lower() == "true"
    if dirty.any():
        lines.append(_dirty_line(frame[dirty], len(frame)))
    lines.append(_code_line(frame))
    return lines


def _seed_list(seeds: Sequence[int]) -> str:
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(str(s) for s in sorted(seeds))


def _machines_line(frame: pd.DataFrame) -> str | None:
    """A study made on several machines (a study of days spans sessions): comparable where each seed's arms
    ran on one machine, since every paired difference between arms is then taken on one machine; None (mixed)
    where a seed's arms ran on two. A seed whose random-init encoder was measured elsewhere is named: its
    Δ vs init holds the machines' difference too."""
    per_seed = _arm_machines(frame)
    if not per_seed or any(len(d) > 1 for d in per_seed.values()):
        return None
    machine = {s: next(iter(d)) for s, d in per_seed.items()}
    where = "; ".join(f"`{m}` ({_seed_list([s for s in machine if machine[s] == m])})"
                      for m in sorted(set(machine.values())))
    init = frame[frame["arm"].astype(str) == RANDOM_INIT].dropna(subset=["seed", "device"])
    apart = sorted({int(s) for s, d in zip(init["seed"], init["device"].astype(str))
                    if int(s) in machine and machine[int(s)] != d})
    text = (f"- device: {where} — each seed's arms on one machine, so every paired difference between arms is "
            "taken on one machine")
    if apart:
        measured = ", ".join(f"`{d}`" for d in sorted(set(init.loc[init["seed"].astype(int).isin(apart),
                                                                       "device"].astype(str))))
        text += (f"; the random-init encoder of {_seed_list(apart)} was measured on {measured}, so their Δ vs init "
                 "also holds the difference between the machines (their size: \"The same config in more than one "
                 "study\", at the end)")
    return text


def _dirty_line(dirty: pd.DataFrame, runs: int) -> str:
    """Which uncommitted files the dirty runs' checkouts had, so a reader sees whether code or only text changed
    (the code fingerprint on the next line is the code's own word)."""
    changed = (dirty["changed"].fillna("").astype(str).replace("nan", "") if "changed" in dirty
               else pd.Series("", index=dirty.index))
    counts: dict[str, int] = {}
    more = 0  # the tag names 20 files and counts the rest ("... and 3 more")
    for files in changed[changed != ""]:
        listed, _, rest = files.partition(" and ")
        more += int(rest.split()[0]) if rest.endswith(" more") else 0
        for name in listed.split(", "):
            counts[name] = counts.get(name, 0) + 1
    where = ", ".join(f"`{f}` ({n})" for f, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    where += f", and {more} more file(s) unnamed" if more else ""
    unknown = int((changed == "").sum())
    return (f"- {len(dirty)} of {runs} runs were made from a checkout with uncommitted changes "
            f"(`mocolab.source.git.dirty`)" + (f"; the files changed, with the runs made so: {where}" if where else "")
            + (f"; not recorded for {unknown} run(s), made before the changed files were tagged" if unknown else ""))


def _code_line(frame: pd.DataFrame) -> str:
    """Which code made the runs (their code fingerprints), and where a run continued across a change."""
    codes = (frame["code"].fillna("").astype(str).replace("nan", "") if "code" in frame
             else pd.Series("", index=frame.index))
    trained = _trained(frame)
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
                     history: pd.DataFrame | None = None, bound: Bound | None = None,
                     elsewhere: Mapping[str, str] | None = None,
                     plain: Plain | None = None) -> tuple[str, Headline, Path]:
    """(the study's section, its candidate for README's headline, the figure); ``history``, ``bound`` and
    ``plain`` as for ``study_section``; ``elsewhere``: what other studies' budgets could test of the claims this
    one's cannot."""
    arms = [a for a in frame["arm"].unique() if a not in BASELINE_ARMS]
    arms = sorted(arms, key=float)
    init = {m: by_seed(frame, RANDOM_INIT, m) for m in ("linear_top1", "knn_top1")}
    pixels = frame[frame["arm"] == "raw-pixels"]
    rows, head = [], []
    for arm in arms:
        g = frame[frame["arm"] == arm]
        ok = g[g["status"] == "finished"].drop_duplicates("seed")
        statuses = ", ".join(f"{n} {s}" for s, n in g["status"].value_counts().items())
        dl = paired(by_seed(frame, arm, "linear_top1"), init["linear_top1"], (f"m={arm}", RANDOM_INIT))
        dk = paired(by_seed(frame, arm, "knn_top1"), init["knn_top1"], (f"m={arm}", RANDOM_INIT))
        paper = "fail" if float(arm) == 0 else (f"{PAPER_MOMENTUM[float(arm)]:.1f}"
                                                 if float(arm) in PAPER_MOMENTUM else "—")
        rows.append(f"| {arm} | {len(ok)} | {_ci(ok['linear_top1'])} | {diff_points(dl)} | {_ci(ok['knn_top1'])} | "
                    f"{diff_points(dk)} | {ok['final_loss'].mean():.3f} | {pct(ok['pretext_acc'].mean())} | "
                    f"{g['ema_half_life'].mean():.1f} | {statuses} | {paper} |")
        head.append(f"| {arm} | {len(ok)} | {_ci(ok['linear_top1'])} | {diff_points(dl)} | {diff_points(dk)} | "
                    f"{paper} |")
    for name, metric_rows in ((RANDOM_INIT, frame[frame["arm"] == RANDOM_INIT]), ("raw-pixels", pixels)):
        if len(metric_rows):
            n = len(metric_rows)
            zero = "0" if name == RANDOM_INIT else "—"
            rows.append(f"| {name} | {n} | {_ci(metric_rows['linear_top1'])} | {zero} | "
                        f"{_ci(metric_rows['knn_top1'])} | {zero} | — | — | — | baseline | — |")
            head.append(f"| {name} | {n} | {_ci(metric_rows['linear_top1'])} | {zero} | {zero} | — |")

    steps = study.steps()
    head += _bound_row(study, bound, steps)
    paper, claims, baselines, plain = judge_study(study, frame, steps, plain)
    contrasts = judge_contrasts(study, frame, steps)
    span = _span(study, frame, bound, steps)
    registration = Registration(rules_hash(study, steps), frame)
    lines = [*claim_lines(claims, plain, elsewhere, span, planned=study.seeds),
             *contrast_lines(contrasts, plain, span, planned=study.seeds),
             rules_line(study, registration, [*claims, *baselines], contrasts)]
    figure = _momentum_figure(frame, arms, fig_dir / f"{study.name}.png", history)
    text = "\n".join([
        f"## {study.title}",
        "",
        f"Preset `{study.preset}`, {steps:,} training steps, m ∈ {{{', '.join(arms)}}}, seeds 0 to "
        f"{study.seeds - 1} planned (the table counts those finished; paired: seed s of every arm starts from the "
        f"same encoder and sees the same batches). Fashion-MNIST test split (10,000 images) for every number.",
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
        "### The paper's claims",
        "",
        paper.text,
        "",
        *_scale(study, frame, bound, steps),
        *_verdict_block(study, frame, claims, baselines, steps, plain, elsewhere, contrasts, span),
        *_zero_diagnostics(frame),
    ])
    headline = "\n".join([
        f"**{study.title}** (`{study.name}`: preset `{study.preset}`, {steps:,} steps; {_plain_words(plain)}), "
        "Fashion-MNIST, top-1 % over seeds (mean ± std [95 % interval]; Δ: paired difference from the same seed's "
        "random-init encoder; supervised: the same network, augmentation and steps trained with the labels):",
        "",
        "| m | seeds | linear | Δ linear | Δ kNN | paper (ImageNet) |",
        "|---|---|---|---|---|---|",
        *head,
        "",
        "The paper's claims, one line each, judged by the rules of docs/REPRODUCTION.md (*How a claim is judged*):",
        "",
        *lines,
        "",
        "Every study, seed, rule and figure: [docs/REPRODUCTION.md](docs/REPRODUCTION.md).",
    ])
    return text, Headline(study, plain, len(arms), headline), figure


def _verdict_block(study: Study, frame: pd.DataFrame, claims, baselines, steps: int, plain: Plain,
                   elsewhere: Mapping[str, str] | None = None, contrasts=(), span: float | None = None) -> list[str]:
    """The claims' verdicts, whether their rules came before their runs, their table, the baseline checks and
    the budget's bar: a study section's end."""
    registration = Registration(rules_hash(study, steps), frame)
    table = claim_table(claims, steps, plain, contrasts=contrasts, span=span, registration=registration,
                        planned=study.seeds)
    secondary = secondary_table(judge_secondary(claims, study, frame, steps), steps, plain, planned=study.seeds)
    base = claim_table(baselines, steps, plain, baseline=True, registration=registration, planned=study.seeds)
    return [
        *([*claim_lines(claims, plain, elsewhere, span, planned=study.seeds),
           *contrast_lines(contrasts, plain, span, planned=study.seeds)]
          or ["- The paper states no claim this study tests; the tables are the finding."]),
        rules_line(study, registration, [*claims, *baselines], contrasts),
        "",
        *(table + [""] if table else []),
        *(secondary + [""] if secondary else []),
        *_key_ages(study, frame),
        *(["### Baseline checks", "",
           "Each arm's linear top-1 against the random-init encoder of its seed, a Holm family of its own, by "
           "the same rules: *above its start* (significant), *below its start*, *within the margin of its start* "
           "(the no-effect test excludes a gain of the margin) or *inconclusive*.", "", *base, ""] if base else []),
        "### Is learning plain at this budget?",
        "",
        plain.line,
        "",
    ]


AGE_FIELDS = ("queue.size", "moco.negatives")  # besides the negatives script's: where arms' key ages differ


def _key_ages(study: Study, frame: pd.DataFrame) -> list[str]:
    """Each queue arm's measured key ages (the last epoch's mean and oldest, steps since a stored key was
    written) beside the FIFO bound K/(B·W): what MoCo's staleness argument rests on, where the runs logged it."""
    if (study.script != "negatives_ablation.py" and study.by not in AGE_FIELDS or "staleness_max" not in frame
            or not frame["staleness_max"].notna().any()):
        return []
    rows = []
    for arm in _arms(study, frame):
        g = frame[(frame["arm"] == arm) & (frame["status"] == "finished")].drop_duplicates("seed")
        g = g[g["staleness_max"].notna() & (g["staleness_max"] > 0)]
        if len(g):
            bound = g["max_staleness_bound"].astype(float).mean()
            bound = bound if bound > 0 else math.nan  # a bank's or the batch's: no FIFO bound
            rows.append(f"| {arm} | {len(g)} | {_num(bound, '.0f')} | {g['staleness_mean'].mean():.1f} "
                        f"[{g['staleness_mean'].min():.1f}, {g['staleness_mean'].max():.1f}] | "
                        f"{g['staleness_max'].mean():.0f} [{g['staleness_max'].min():.0f}, "
                        f"{g['staleness_max'].max():.0f}] |")
    if not rows:
        return []
    return ["Key ages, measured (the stored negatives' age in steps since written, each run's last epoch; mean over "
            "seeds [lowest, highest seed]) beside the FIFO bound K/(B·W): a FIFO queue's oldest key is the bound; "
            "random replacement keeps some far longer.", "",
            "| arm | seeds | FIFO bound | mean age | oldest age |", "|---|---|---|---|---|", *rows, ""]


def _zero_diagnostics(frame: pd.DataFrame) -> list[str]:
    """How m = 0's seeds ended (loss, pretext accuracy, divergence): description beside its verdict."""
    zero = frame[(frame["arm"] == "0") & (frame["status"].isin(["finished", "diverged"]))]
    if not len(zero):
        return []
    k = zero["queue_size"].astype(float)
    loss_ok = zero["final_loss"] >= FAIL_LOSS_FRACTION * (k + 1).apply(math.log)
    pretext_ok = zero["pretext_acc"] < FAIL_PRETEXT
    diverged = zero["status"] == "diverged"
    return [f"How m = 0 ended, per seed: final loss ≥ {FAIL_LOSS_FRACTION}·ln(1+K) (no better than guessing among "
            f"the keys) in {int(loss_ok.sum())} of {len(zero)}, pretext accuracy < {100 * FAIL_PRETEXT:.0f} % in "
            f"{int(pretext_ok.sum())}, diverged in {int(diverged.sum())}.", ""]


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


PRETEXT = "moco.bn"  # the study whose figure draws pretext accuracy beside the top-1 (its claim reads it)


def _arms(study: Study, frame: pd.DataFrame) -> list[str]:
    """The arms in the CSV, in the plan's order (others after, by their text)."""
    found = [a for a in frame["arm"].astype(str).unique() if a not in BASELINE_ARMS]
    order = {a: i for i, a in enumerate(study.arms)}
    return sorted(found, key=lambda a: (order.get(a, len(order)), a))


def study_section(study: Study, frame: pd.DataFrame, fig_dir: Path, fig_rel: str,
                  history: pd.DataFrame | None = None, bound: Bound | None = None,
                  borrowed: Sequence[str] = (), plain: Plain | None = None) -> tuple[str, Path]:
    """(the section of a study whose arms are any config field's values or a script's settings, its figure).
    ``history``: the trials' curves (``results/history/<study>.csv``), drawn where the study reads pretext
    accuracy. ``bound``: the supervised bound's runs, the top of the scale where the budget is the same.
    ``borrowed``: a line for each borrowed arm, its runs read and left out (``_with_borrowed``). ``plain``: the
    budget's bar, measured once on its named arm (``budget_bar``); None reads it from ``frame``."""
    frame = frame.assign(arm=frame["arm"].astype(str))
    arms = _arms(study, frame)
    init = {m: by_seed(frame, "random-init", m) for m in ("linear_top1", "knn_top1")}
    rows = []
    for arm in arms:
        g = frame[frame["arm"] == arm]
        ok = g[g["status"] == "finished"].drop_duplicates("seed")
        statuses = ", ".join(f"{n} {s}" for s, n in g["status"].value_counts().items())
        dl = paired(by_seed(frame, arm, "linear_top1"), init["linear_top1"], (arm, "random-init"))
        dk = paired(by_seed(frame, arm, "knn_top1"), init["knn_top1"], (arm, "random-init"))
        mark = " (reference)" if arm == study.reference else ""
        rows.append(f"| {arm}{mark} | {len(ok)} | {_ci(ok['linear_top1'])} | {diff_points(dl)} | "
                    f"{_ci(ok['knn_top1'])} | {diff_points(dk)} | {_num(ok['final_loss'].mean(), '.3f')} | "
                    f"{_ci(ok['pretext_acc'].dropna())} | {statuses} |")
    for name in BASELINE_ARMS:
        base = frame[frame["arm"] == name]
        if len(base):
            zero = "0" if name == RANDOM_INIT else "—"
            rows.append(f"| {name} | {len(base)} | {_ci(base['linear_top1'])} | {zero} | {_ci(base['knn_top1'])} | "
                        f"{zero} | — | — | baseline |")
    steps = study.steps()
    paper, claims, baselines, plain = judge_study(study, frame, steps, plain)
    contrasts = judge_contrasts(study, frame, steps)
    figure = _study_figure(study, frame, arms, fig_dir / f"{study.name}.png", history)
    what = f"`{study.by}`" if study.by != LABEL else f"the settings of `{study.script}`"
    pairing = ("paired by seed: seed s of every arm sees the same batches, but the recipes build different "
               "networks" if study.baseline_sets else
               "paired: seed s of every arm starts from the same encoder, and epoch e of every arm draws the same "
               "batches" if study.borrow else
               "paired: seed s of every arm starts from the same encoder and sees the same batches")
    reference = (f"the reference arm is `{study.reference}`" if study.reference in arms
                 else f"the reference arm `{study.reference}` has no finished run yet")
    if study.borrow:
        theirs = ", ".join(f"`{b.here}` (`{b.study}`" + (f"'s `{b.arm}`)" if b.name else ")") for b in study.borrow)
        reference += f"; read from other studies, with their settings (their sections): {theirs}"
    text = "\n".join([
        f"## {study.title}",
        "",
        f"Preset `{study.preset}`, {steps:,} training steps, {what} ∈ {{{', '.join(arms or study.arms)}}}, seeds 0 to "
        f"{study.seeds - 1} planned (the table counts those finished; {pairing}); {reference}. Fashion-MNIST test "
        "split (10,000 images) for every number.",
        "",
        *_provenance(frame),
        *borrowed,
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
        "### The paper's claims",
        "",
        paper.text,
        "",
        *([f"Where this data set limits the claim: {paper.limits}", ""] if paper.limits else []),
        *_scale(study, frame, bound, steps),
        *_verdict_block(study, frame, claims, baselines, steps, plain, None, contrasts,
                        _span(study, frame, bound, steps)),
    ])
    return text, figure


def _num(x: float, spec: str) -> str:
    return "—" if x is None or math.isnan(x) else format(x, spec)


def _study_figure(study: Study, frame: pd.DataFrame, arms: list[str], path: Path,
                  history: pd.DataFrame | None = None) -> Path:
    pretext = study.by == PRETEXT
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
    bound = _bound(results)
    loaded = {study.name: _with_borrowed(study, _read(path), results) for study in STUDIES
              if (path := results / f"{study.name}.csv").is_file()}
    bars = {budget: (owner, loaded[owner.name][0]) for budget, (name, _) in PLAIN_BARS.items()
            for owner in STUDIES if owner.name == name and name in loaded}
    plains = {study.name: budget_bar(study, bars, loaded[study.name][0]) for study in STUDIES if study.name in loaded}
    tested = _momentum_tested(loaded, plains)
    steps = {study.name: study.steps() for study in STUDIES}
    hashes = {study.name: rules_hash(study, steps[study.name]) for study in STUDIES}
    for study in STUDIES:
        if study.name not in loaded:
            sections.append(not_run(study))
            continue
        frame, borrowed = loaded[study.name]
        curves = results / HISTORY / f"{study.name}.csv"
        history = _ended(pd.read_csv(curves, dtype={"arm": str}), frame) if curves.is_file() else None
        if study.by == "moco.m":
            elsewhere = _joined(found for name, found in tested if name != study.name)
            text, headline, figure = momentum_section(study, frame, fig_dir, fig_rel, history, bound, elsewhere,
                                                      plains[study.name])
            headlines.append(headline)
        else:
            text, figure = study_section(study, frame, fig_dir, fig_rel, history, bound, borrowed, plains[study.name])
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
        "## How a claim is judged",
        "",
        *RULES,
        "",
        *plan_table(STUDIES, steps, hashes),
        "",
        _tagged_line(results),
        "",
        *sections,
        same_config_section(results),
    ]).rstrip() + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(markdown)
    return Written(markdown, _headline(headlines), figures)


def _tagged_line(results: Path) -> str:
    """How many of the runs in ``results/`` carry a plan hash at all: the page's verdicts can be before their
    runs only where they do."""
    runs, tagged = 0, 0
    for study in STUDIES:
        path = results / f"{study.name}.csv"
        if path.is_file():
            frame = _read(path)
            runs += len(frame)
            if PLAN_COLUMN in frame:
                tagged += int((frame[PLAN_COLUMN].fillna("").astype(str).str.strip() != "").sum())
    return (f"Of the {runs} runs in `results/*.csv`, {tagged} carry a plan hash; a verdict whose runs do not carry "
            "the hash of its study's rules is post hoc, whatever the order in which its rules and runs were written.")


def _momentum_tested(loaded: Mapping[str, tuple[pd.DataFrame, list[str]]],
                     plains: Mapping[str, Plain]) -> list[tuple[str, dict[str, str]]]:
    """(study, what its budget could test) for every momentum study with results (``loaded``: study -> its
    frame, as ``write`` read it): the claims about m that a short budget cannot test are answered, where one
    was run, by a longer one."""
    out = []
    for study in STUDIES:
        if study.by == "moco.m" and study.name in loaded:
            frame = loaded[study.name][0]
            steps = study.steps()
            _, claims, _, plain = judge_study(study, frame, steps, plains.get(study.name))
            out.append((study.name, tested_at(study, claims, plain, steps)))
    return out


def _joined(found: Iterable[Mapping[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for answers in found:
        for words, text in answers.items():
            out[words] = f"{out[words]} {text}" if words in out else text
    return out


def _read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype={"arm": str, "commit": str, "code": str, "code_segments": str, PLAN_COLUMN: str})


def _with_borrowed(study: Study, frame: pd.DataFrame, results: Path) -> tuple[pd.DataFrame, list[str]]:
    """The study's rows and those of the arms it borrows, under the names its claims use, with a line for each
    borrowed arm: how many runs were read, and how many left out for being made on another kind of machine than
    the one of this study's own arms of that seed (seed s there is not seed s here: another CPU trains the same
    config and seed otherwise)."""
    own = {str(v) for v in frame["device"].dropna()} - {"", "nan"}
    seat = _arm_machines(frame)
    mine = ", ".join(f"`{d}`" for d in sorted(own)) or "no recorded machine"
    parts, lines = [frame], []
    for b in study.borrow:
        path = results / f"{b.study}.csv"
        if not path.is_file():
            continue
        rows = _read(path)
        rows = rows[rows["arm"] == b.arm]
        same = pd.Series([dev in seat.get(int(s), own) for s, dev in zip(rows["seed"], rows["device"].astype(str))],
                         index=rows.index, dtype=bool)
        named = f"`{b.study}`'s `{b.arm}`" if b.name else f"`{b.study}`"
        line = f"- `{b.here}`: {int(same.sum())} run(s) read from {named}, described with this study's own above"
        if (~same).any():
            theirs = ", ".join(f"`{d}`" for d in sorted(set(rows.loc[~same, "device"].fillna("unknown").astype(str))))
            line += (f"; {int((~same).sum())} run(s) made on {theirs} left out (this study's runs were made on "
                     f"{mine}; a pair across machines is not a pair)")
        lines.append(line)
        parts.append(rows[same].assign(study=study.name, arm=b.here))
    return pd.concat(parts, ignore_index=True), lines


def same_config_section(results: Path) -> str:
    """The arms that train one config in several studies, seed by seed: equal to the last digit where one kind of
    machine made them, and by how much they differ where two did."""
    metrics = ("linear_top1", "knn_top1", "final_loss", "pretext_acc")
    lines = ["## The same config in more than one study", "",
             "Arms of different studies that train the same config (a test compares the configs their runs recorded "
             "in `results/runs.db`, field by field, leaving out the experiment a run logged to and the fields that "
             "do not change what it computes: `config/run_identity.py`'s `RESUMABLE_FIELDS`), seed by seed: linear "
             "and kNN top-1 %, the final loss. A run is determined by its config, its "
             "seed and the machine: the same kind of CPU gives the same numbers to the last digit, another gives "
             "others (its bf16 kernels round otherwise), which is why a study reads a borrowed arm only from its "
             "own kind of machine.", ""]
    for group in SAME_CONFIG:
        frames = []
        for name, arm in group:
            path = results / f"{name}.csv"
            if path.is_file():
                rows = _read(path)
                frames.append(rows[rows["arm"] == arm].assign(study=name))
        rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["seed"])
        seeds = sorted({int(s) for s in rows["seed"].dropna()})
        lines.append(" = ".join(f"`{name}`'s `{arm}`" for name, arm in group) + ":")
        lines.append("")
        if not seeds:
            lines += ["no runs yet.", ""]
            continue
        lines += ["| seed | " + " | ".join(f"{n} ({a})" for n, a in group) + " |",
                  "|---" * (len(group) + 1) + "|"]
        same, across = [], []
        for seed in seeds:
            done = rows[(rows["seed"] == seed) & (rows["status"] == "finished")]
            cells = [_run_cell(done[done["study"] == name]) for name, _ in group]
            lines.append(f"| {seed} | " + " | ".join(cells) + " |")
            twins = [g for _, g in done.groupby("device") if g["study"].nunique() > 1]
            if twins:  # a seed is equal when every machine's runs of it agree in every number
                same.append(all(g[m].nunique(dropna=False) == 1 for g in twins for m in metrics))
            across += [abs(a.linear_top1 - b.linear_top1) for a in done.itertuples() for b in done.itertuples()
                       if a.device != b.device]
        verdicts = []
        if same:
            verdicts.append(f"on one kind of machine the numbers are equal to the last digit in {sum(same)} of "
                            f"{len(same)} seed(s)")
        if across:
            verdicts.append(f"across machines the linear top-1 differs by up to {100 * max(across):.2f} points")
        said = "; ".join(verdicts)
        lines += ["", (said[:1].upper() + said[1:] + "." if verdicts else
                       "No seed has finished runs in two of these studies yet."), ""]
    return "\n".join(lines)


def _run_cell(run: pd.DataFrame) -> str:
    if run.empty:
        return "—"
    r = run.iloc[0]
    return f"{pct(r['linear_top1'])} / {pct(r['knn_top1'])} / {_num(r['final_loss'], '.4f')} ({_machine(r['device'])})"


def _machine(device: str) -> str:
    """The CPU's name as a column can hold it: its maker and family, less the core count and flags."""
    return str(device).split(",")[0].replace("(R)", "").replace(" Processor", "")


def _bound(results: Path) -> Bound | None:
    """The supervised bound's study, read from its CSV where it has run."""
    bound = next((s for s in STUDIES if s.by == "method.name" and s.arms == (SUPERVISED,)), None)
    path = results / f"{bound.name}.csv" if bound else None
    if path is None or not path.is_file():
        return None
    return Bound(bound, _read(path), bound.steps())


def not_run(study: Study) -> str:
    """What stands for a study with no CSV yet: its title and the command that runs it."""
    return f"## {study.title}\n\nNot run yet: `mocolab repro --study {study.name}`.\n"


def replace_headline(readme: str, headline: str) -> str:
    """README's text with the generated table between its markers (a ValueError if the markers are missing)."""
    start, end = readme.find(HEADLINE_BEGIN), readme.find(HEADLINE_END)
    if start < 0 or end < start:
        raise ValueError(f"README has no {HEADLINE_BEGIN} ... {HEADLINE_END} block")
    return readme[:start + len(HEADLINE_BEGIN)] + "\n" + (headline + "\n" if headline else "") + readme[end:]
