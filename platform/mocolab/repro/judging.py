"""A study's CSV rows judged by the stated rules (repro/claims.py): each paper claim's family of paired tests,
its verdicts, the budget and "learning is plain" checks, and the tables the document prints for them."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import pandas as pd

from mocolab.analysis.stats import Comparison, contrast, fmt_p, order_weights, paired, slope_weights, upper_bound
from mocolab.analysis.verdicts import (BELOW_MARGIN, EQUAL, FAILS, GREATER, INCONCLUSIVE, NOT_REPRODUCED,
                                       NOT_TESTABLE, NOT_YET, REPRODUCED, REVERSED, Judged, judge)
from mocolab.repro.claims import (ALPHA, BASELINE_CHECK, GROUPS, HALF_LIVES, LEARNED, MARGINS, ORDER, PLAIN_BARS,
                                  PLAIN_KNN, PLAIN_LINEAR, POWER, RANDOM_INIT, SECONDARY_METRICS, SHARED_HALF_LIVES,
                                  SLOPE, Claim, Contrast, paper_claims)
from mocolab.repro.plan import Study
from mocolab.repro.preregistration import PLAN_COLUMN, carries, in_study

METRIC_WORD = {"linear_top1": "linear top-1", "knn_top1": "kNN top-1", "pretext_acc": "pretext accuracy",
               "knn20_top1": "kNN k = 20 top-1", "linear_top1_1pct": "linear top-1 on 1 % of the labels",
               "linear_top1_10pct": "linear top-1 on 10 % of the labels"}
KIND_WORD = {GREATER: ">", EQUAL: "≈", FAILS: "no better than"}


def by_seed(frame: pd.DataFrame, arm: str, metric: str) -> dict[int, float]:
    """{seed: value} of an arm's finished rows (one per seed)."""
    rows = frame[(frame["arm"] == arm) & (frame["status"] == "finished")].drop_duplicates("seed")
    return {int(s): float(v) for s, v in zip(rows["seed"], rows[metric]) if not math.isnan(float(v))}


@dataclass(frozen=True)
class Plain:
    """Whether the study's budget clears "learning is plain": True, False, or None before any seed is in."""

    met: bool | None
    line: str


def plain_arm(study: Study) -> str:
    """The arm the study's budget reads its bar from where that is one of this study's own (else its reference,
    read only until the budget's named arm has run)."""
    bar = PLAIN_BARS.get(study.bar_budget)
    return bar[1] if bar and bar[0] == study.name else study.reference


def learning_is_plain(study: Study, frame: pd.DataFrame, source: str = "") -> Plain:
    """The bar of repro/claims.py, per seed of the arm ``study``'s budget names, read from ``frame`` (that arm's
    study's rows). ``source``: how the line names where the bar is read from, where not from its named arm."""
    bar = PLAIN_BARS.get(study.bar_budget)
    arm = plain_arm(study)
    knn, linear = by_seed(frame, arm, "knn_top1"), by_seed(frame, arm, "linear_top1")
    init = by_seed(frame, RANDOM_INIT, "knn_top1")
    pixels = frame.loc[frame["arm"] == "raw-pixels", "linear_top1"]
    seeds = [s for s in knn if s in init]
    where = source or (f"`{study.bar_budget}`'s one bar, read from `{bar[0]}`'s `{arm}` for every study at this "
                       "budget" if bar and bar[0] == study.name else f"read from this study's `{arm}`")
    rule = (f"{where}: it beats the random-init encoder of its seed by ≥ {100 * PLAIN_KNN:.0f} kNN points "
            f"and the raw-pixel linear probe by ≥ {100 * PLAIN_LINEAR:.0f} linear points, in every seed")
    if not seeds or not len(pixels):
        return Plain(None, f"- *Learning is plain at this budget* ({rule}): **not yet measured** — no finished "
                           f"seed of `{arm}` beside its baselines; every verdict below is provisional.")
    knn_margin = [knn[s] - init[s] for s in seeds]
    linear_margin = [linear[s] - float(pixels.mean()) for s in seeds]
    met = sum(k >= PLAIN_KNN and lin >= PLAIN_LINEAR for k, lin in zip(knn_margin, linear_margin))
    ok = met == len(seeds)
    verdict = "**met**" if ok else "**not met**: this study's verdicts are provisional"
    if len(seeds) < study.seeds:
        verdict += f" (so far: {len(seeds)} of {study.seeds} planned seeds finished)"
    return Plain(ok, f"- *Learning is plain at this budget* ({rule}): {verdict} — {met} of {len(seeds)} seeds; "
                     f"kNN margin over random-init {100 * min(knn_margin):+.2f} to {100 * max(knn_margin):+.2f} "
                     f"points, linear margin over raw pixels {100 * min(linear_margin):+.2f} to "
                     f"{100 * max(linear_margin):+.2f} points.")


def budget_bar(study: Study, bars: Mapping[str, tuple[Study, pd.DataFrame]], frame: pd.DataFrame) -> Plain:
    """The study's bar: its budget's, measured once on the named arm's study (``bars``: budget -> that study and
    its rows, where it has run), else read from this study's own reference until that arm has run."""
    bar = PLAIN_BARS.get(study.bar_budget)
    if bar and study.bar_budget in bars:
        owner, rows = bars[study.bar_budget]
        if by_seed(rows, bar[1], "knn_top1"):
            return learning_is_plain(owner, rows)
    named = f"`{bar[0]}`'s `{bar[1]}`" if bar else "none"
    return learning_is_plain(study, frame, f"read from this study's `{study.reference}`, since this budget's named "
                                           f"bar arm ({named}) has no finished run yet")


def judge_claim(claim: Claim, study: Study, frame: pd.DataFrame, steps: int) -> list[tuple[tuple[str, str], Judged]]:
    """The claim's comparisons this study makes (both arms planned here), judged as one family."""
    pairs = [(a, b) for a, b in claim.pairs if in_study(study, a) and in_study(study, b)]
    comps = [paired(by_seed(frame, a, claim.metric), by_seed(frame, b, claim.metric), (a, b)) for a, b in pairs]
    testable = [steps >= claim.steps(pair) for pair in pairs]
    return list(zip(pairs, judge(comps, claim.kind, claim.margin, alpha=ALPHA, power=POWER, testable=testable)))


def judge_secondary(claims: Sequence[tuple[Claim, list[tuple[tuple[str, str], Judged]]]], study: Study,
                    frame: pd.DataFrame, steps: int) -> list[tuple[Claim, list[tuple[tuple[str, str], Judged]]]]:
    """Each linear-probe claim's comparisons again on every secondary metric the runs logged (repro/claims.py's
    SECONDARY_METRICS): one Holm family per claim and metric, by the claim's own rule at the metric's margin.
    They stand beside the claim's verdict and never decide it."""
    out = []
    for claim, _ in claims:
        if claim.metric != "linear_top1":
            continue
        for metric in SECONDARY_METRICS:
            if metric not in frame or not frame[metric].notna().any():
                continue
            twin = replace(claim, metric=metric)
            rows = judge_claim(twin, study, frame, steps)
            if any(j.comparison.n for _, j in rows):
                out.append((twin, rows))
    return out


def secondary_table(judged: Sequence[tuple[Claim, list[tuple[tuple[str, str], Judged]]]], steps: int,
                    plain: Plain, *, planned: int = 0) -> list[str]:
    """The secondary metrics' rows: each comparison, its test, its detectable effect and what its rule would
    read (marked secondary: the claim's verdict is its primary metric's)."""
    if not judged:
        return []
    out = [f"Secondary metrics ({', '.join(METRIC_WORD[m] for m in SECONDARY_METRICS)}): the same comparisons, "
           "each metric a Holm family per claim, at the metric's margin; they never decide a verdict.", "",
           f"| comparison | metric | seeds | Δ points [95 %] | p (Holm) | no-effect p (Holm) | detectable at "
           f"{100 * POWER:.0f} % power | reads (secondary) |", "|---|---|---|---|---|---|---|---|"]
    for claim, rows in judged:
        for (a, b), j in rows:
            c = j.comparison
            out.append(f"| {a} {KIND_WORD[claim.kind]} {b} | {METRIC_WORD[claim.metric]} | {c.n} | "
                       f"{diff_points(c)} | {fmt_p(c.p_holm)} | {fmt_p(j.p_equivalence)} | {_pts(j.detectable)} | "
                       f"{verdict_text(j, plain, control=claim.control, planned=planned)} |")
    return out


@dataclass(frozen=True)
class JudgedContrast:
    """A contrast over the study's planned arms, judged: its arms, weights, margin and verdict."""

    contrast: Contrast
    arms: tuple[str, ...]
    weights: tuple[float, ...]
    margin: float
    judged: Judged


def contrast_weights(c: Contrast, arms: Sequence[str]) -> list[float]:
    if c.shape == SLOPE:
        return slope_weights([math.log2(float(a)) for a in arms])
    if c.shape == ORDER:
        return order_weights(len(arms))
    low = [a for a in arms if a in c.low]
    return [-1 / len(low) if a in c.low else 1 / (len(arms) - len(low)) for a in arms]


def judge_contrasts(study: Study, frame: pd.DataFrame, steps: int) -> list[JudgedContrast]:
    """The paper's contrasts over three or more of this study's planned arms (both groups present for GROUPS),
    each its own family."""
    out = []
    for c in paper_claims(study.name, study.by, study.script).contrasts:
        arms = tuple(a for a in c.arms if in_study(study, a))
        low = [a for a in arms if a in c.low]
        if len(arms) < 3 or (c.shape == GROUPS and not 0 < len(low) < len(arms)):
            continue
        weights = contrast_weights(c, arms)
        comp = contrast([by_seed(frame, a, c.metric) for a in arms], weights, c.shape)
        margin = c.margin(arms)
        (j,) = judge([comp], GREATER, margin, alpha=ALPHA, power=POWER, testable=[steps >= c.steps(arms)])
        out.append(JudgedContrast(c, arms, tuple(weights), margin, j))
    return out


def baseline_claim(study: Study, frame: pd.DataFrame) -> Claim:
    """Every trained arm of the study against the random-init encoder: the baseline checks' own family."""
    arms = [a for a in frame["arm"].astype(str).unique() if a not in (RANDOM_INIT, "raw-pixels")]
    order = {a: i for i, a in enumerate(study.arms)}
    arms.sort(key=lambda a: (order.get(a, len(order)), a))
    return Claim(BASELINE_CHECK.words, tuple((a, RANDOM_INIT) for a in arms), m=None)


def _pts(x: float) -> str:
    return "—" if math.isnan(x) else f"{100 * x:.2f}"


def diff_points(c: Comparison) -> str:
    """A paired difference (fractions) in points with its 95 % interval, as every table of the page prints it."""
    if c.n == 0:
        return "—"
    if c.n == 1:
        return f"{100 * c.diff.mean:+.2f} (1 seed)"
    return f"{100 * c.diff.mean:+.2f} [{100 * c.diff.low:+.2f}, {100 * c.diff.high:+.2f}]"


def _budget(needed: float, steps: int) -> str:
    if not needed:
        return "—"
    return f"{steps:,} {'≥' if steps >= needed else '<'} {needed:,.0f}"


# what a verdict means in the baseline checks, where the "claim" is that the arm's encoder beats its start
BASELINE_WORDS = {REPRODUCED: "above its start", REVERSED: "below its start", BELOW_MARGIN: "above its start, by less "
                  "than the margin", NOT_REPRODUCED: "within the margin of its start", INCONCLUSIVE: INCONCLUSIVE}


# what a verdict means for a control (an EQUAL question, not a paper claim)
CONTROL_WORDS = {REPRODUCED: "alike (within the margin)", NOT_REPRODUCED: "different", INCONCLUSIVE: INCONCLUSIVE}


def bound_text(j: Judged, paper: float = math.nan, span: float | None = None, unit: str = "points") -> str:
    """A "not reproduced" verdict's one-sided 95 % upper bound of the effect in the paper's direction, in points
    and as a share of what there is to learn at the budget (``span``: supervised minus random-init, where the
    bound trained at it), beside the paper's own effect (ImageNet points)."""
    bound = upper_bound(j.comparison.diff)
    if math.isnan(bound):
        return ""
    scaled = (f", {100 * bound / span:.1f} % of the {100 * span:.2f} points from random-init to supervised here"
              if span and span > 0 else "")
    theirs = (f"; the paper's effect {paper:+.1f} ImageNet {unit}" if not math.isnan(paper) else
              "; the paper gives no number for it")
    return f"one-sided 95 % upper bound {100 * bound:+.2f} {unit}{scaled}{theirs}"


def verdict_text(j: Judged, plain: Plain, baseline: bool = False, control: bool = False, *,
                 paper: float = math.nan, span: float | None = None, unit: str = "points",
                 planned: int = 0) -> str:
    """The verdict's words and its notes. ``planned``: the seeds the study plans; a verdict judged on fewer says
    so ("interim"), since the seeds still to come can change it."""
    word = (BASELINE_WORDS.get(j.verdict, j.verdict) if baseline
            else CONTROL_WORDS.get(j.verdict, j.verdict) if control else j.verdict)
    if control and j.verdict == NOT_REPRODUCED:
        word += f": {j.comparison.a} {'higher' if j.comparison.diff.mean > 0 else 'lower'}"
    if j.verdict in (NOT_YET, NOT_TESTABLE):
        return f"**{word}**"
    notes = [] if plain.met else ["provisional"]
    if 0 < j.comparison.n < planned:
        notes.append(f"interim: {j.comparison.n} of {planned} seeds")
    if j.verdict == NOT_REPRODUCED and not (baseline or control) and (bound := bound_text(j, paper, span, unit)):
        notes.append(bound)
    return f"**{word}**" + (f" ({'; '.join(notes)})" if notes else "")


def _family(j: Judged) -> str:
    return f"of {j.family_size}" if j.family_size else "untested"


@dataclass(frozen=True)
class Registration:
    """Whether the runs a verdict judges carry the hash of the rules that judge it (``frame``'s PLAN_COLUMN)."""

    digest: str
    frame: pd.DataFrame

    def runs(self, arms: Sequence[str]) -> pd.DataFrame:
        rows = self.frame[self.frame["arm"].astype(str).isin(list(arms)) & (self.frame["status"] == "finished")]
        return rows.drop_duplicates(["arm", "seed"])

    def before(self, arms: Sequence[str]) -> bool:
        rows = self.runs(arms)
        tags = rows[PLAN_COLUMN] if PLAN_COLUMN in rows else pd.Series([None] * len(rows), dtype=object)
        return bool(len(rows)) and all(carries(t, self.digest) for t in tags)

    def cell(self, arms: Sequence[str]) -> str:
        return "before the runs" if self.before(arms) else "*post hoc*"


def _judged(j: Judged) -> bool:
    return j.verdict not in (NOT_YET, NOT_TESTABLE)


def claim_table(judged: list[tuple[Claim, list[tuple[tuple[str, str], Judged]]]], steps: int, plain: Plain,
                baseline: bool = False, *, contrasts: Sequence[JudgedContrast] = (), span: float | None = None,
                registration: Registration | None = None, planned: int = 0) -> list[str]:
    """One row per comparison (and per contrast): its family, the test, the no-effect test, the detectable
    effect, the budget, the verdict and whether the runs it judges carry the hash of the rules that judge it."""
    if not any(rows for _, rows in judged) and not contrasts:
        return []
    head = ("| comparison | family | seeds | Δ points [95 %] | p (Holm) | no-effect p (Holm) | detectable at "
            f"{100 * POWER:.0f} % power | steps vs needed | verdict | rules |")
    out = [head, "|---|---|---|---|---|---|---|---|---|---|"]

    def rules(arms: Sequence[str], j: Judged) -> str:
        return registration.cell(arms) if registration is not None and _judged(j) else "—"

    for claim, rows in judged:
        for (a, b), j in rows:
            c = j.comparison
            family = "baseline checks" if baseline else claim.words
            text = verdict_text(j, plain, baseline, claim.control, paper=claim.paper_effect((a, b)), span=span,
                                planned=planned)
            out.append(f"| {a} {KIND_WORD[claim.kind]} {b} ({METRIC_WORD[claim.metric]}) | {family} "
                       f"({_family(j)}) | {c.n} | {diff_points(c)} | {fmt_p(c.p_holm)} | {fmt_p(j.p_equivalence)} | "
                       f"{_pts(j.detectable)} | {_budget(claim.steps((a, b)), steps)} | {text} | {rules((a, b), j)} |")
    for jc in contrasts:
        j, c = jc.judged, jc.judged.comparison
        text = verdict_text(j, plain, paper=jc.contrast.paper, span=span, unit=contrast_unit(jc.contrast),
                            planned=planned)
        out.append(f"| {contrast_name(jc)} ({METRIC_WORD[jc.contrast.metric]}) | {jc.contrast.words} (its own, "
                   f"{_family(j)}) | {c.n} | {diff_points(c)} | {fmt_p(c.p_holm)} | {fmt_p(j.p_equivalence)} | "
                   f"{_pts(j.detectable)} | {_budget(jc.contrast.steps(jc.arms), steps)} | {text} | "
                   f"{rules(jc.arms, j)} |")
    return out


def contrast_label(c: Contrast) -> str:
    return f"the {c.shape} contrast ({METRIC_WORD[c.metric]})"


def contrast_unit(c: Contrast) -> str:
    return "points a doubling" if c.shape == SLOPE else "points"


def contrast_name(jc: JudgedContrast) -> str:
    """``slope on log2 K over 256, 1024, 4096, 16384``, ``order 0.9 < 0.99 < 0.999``, ``{split, shuffle} −
    {plain, groups}``."""
    if jc.contrast.shape == SLOPE:
        return f"slope on log2 of {', '.join(jc.arms)}"
    if jc.contrast.shape == ORDER:
        return "order " + " < ".join(jc.arms)
    low = [a for a in jc.arms if a in jc.contrast.low]
    high = [a for a in jc.arms if a not in jc.contrast.low]
    return f"{{{', '.join(high)}}} − {{{', '.join(low)}}}"


def _margin(margin: float, unit: str) -> str:
    points = f"{100 * margin:.3g}"
    return f"{points} {unit if points != '1' else unit.replace('points', 'point')}"


def contrast_lines(contrasts: Sequence[JudgedContrast], plain: Plain, span: float | None = None, *,
                   planned: int = 0) -> list[str]:
    """One line per contrast: the primary test of its claim (the claim's pairwise comparisons are secondary)."""
    out = []
    for jc in contrasts:
        c, j = jc.contrast, jc.judged
        unit = contrast_unit(c)
        family = "its own family" if j.family_size else "outside this budget" if j.verdict == NOT_TESTABLE \
            else "not tested yet"
        out.append(f"- *{c.words}* ({METRIC_WORD[c.metric]}, the claim's primary test: a per-seed linear contrast "
                   f"over {', '.join(f'`{a}`' for a in jc.arms)}, margin {_margin(jc.margin, unit)}, {family}): "
                   f"{diff_points(j.comparison)} {unit}: "
                   f"{verdict_text(j, plain, paper=c.paper, span=span, unit=unit, planned=planned)}.")
    return out


def claim_lines(judged: list[tuple[Claim, list[tuple[tuple[str, str], Judged]]]], plain: Plain,
                elsewhere: Mapping[str, str] | None = None, span: float | None = None, *,
                planned: int = 0) -> list[str]:
    """One line per claim: its words, the paper's kind and margin, and each comparison's verdict; a claim
    not testable at this budget adds what another study at a budget that can test it found (``elsewhere``:
    claim words -> that study's words, ``tested_at``)."""
    out = []
    for claim, rows in judged:
        if not rows:
            continue
        parts = [f"`{a}` {KIND_WORD[claim.kind]} `{b}`: "
                 + verdict_text(j, plain, control=claim.control, paper=claim.paper_effect((a, b)), span=span,
                                planned=planned)
                 for (a, b), j in rows]
        size = max(j.family_size for _, j in rows)
        untestable = all(j.verdict == NOT_TESTABLE for _, j in rows)
        family = (f"one Holm family of {size}" if size else "outside this budget"
                  if untestable else "no comparison tested yet")
        points = f"{100 * claim.margin:g} point" + ("" if claim.margin == 0.01 else "s")
        words = f"Control (no paper claim): {claim.words}" if claim.control else claim.words
        there = (elsewhere or {}).get(claim.words) if untestable else None
        out.append(f"- *{words}* ({METRIC_WORD[claim.metric]}, margin {points}, {family}): "
                   + "; ".join(parts) + "." + (f" {there}" if there else ""))
    return out


def rules_line(study: Study, registration: Registration,
               judged: Sequence[tuple[Claim, list[tuple[tuple[str, str], Judged]]]],
               contrasts: Sequence[JudgedContrast] = ()) -> str:
    """Whether the study's verdicts follow rules fixed before their runs, read from the runs' tags: every run a
    verdict judges carries the hash of the study's rules, or the verdict is post hoc."""
    verdicts = [((a, b), f"`{a}` {KIND_WORD[claim.kind]} `{b}`") for claim, rows in judged for (a, b), j in rows
                if _judged(j)]
    verdicts += [(jc.arms, contrast_label(jc.contrast)) for jc in contrasts if _judged(jc.judged)]
    arms = sorted({a for group, _ in verdicts for a in group})
    runs = registration.runs(arms)
    tags = runs[PLAN_COLUMN] if PLAN_COLUMN in runs else pd.Series([None] * len(runs), dtype=object)
    carrying = sum(carries(t, registration.digest) for t in tags)
    late = [name for group, name in verdicts if not registration.before(group)]
    head = (f"- *Rules before runs* (this study's rules, `repro/preregistration.py`, hash `{registration.digest}`; "
            f"each run's hashes in the `{PLAN_COLUMN}` column of its CSV): ")
    if not verdicts:
        return head + "no verdict judged yet."
    if not late:
        return head + f"**before the runs** — all {len(runs)} runs these verdicts judge carry it."
    which = ("every verdict above is post hoc" if len(late) == len(verdicts) else
             "post hoc: " + ", ".join(late) + f"; the other {len(verdicts) - len(late)} before their runs")
    return head + f"**post hoc** — {carrying} of the {len(runs)} runs these verdicts judge carry it, so {which}."


def tested_at(study: Study, judged: list[tuple[Claim, list[tuple[tuple[str, str], Judged]]]], plain: Plain,
              steps: int) -> dict[str, str]:
    """{claim words: what this study's budget could test of it}, for the sections whose budget could not:
    ``At 3,638 steps (`momentum-long-cpu-full`): `0.999` > `0.99`: **not reproduced**.``"""
    out = {}
    for claim, rows in judged:
        rows = [(pair, j) for pair, j in rows if _judged(j)]
        if rows:
            out[claim.words] = (f"At {steps:,} steps (`{study.name}`): " + "; ".join(
                f"`{a}` {KIND_WORD[claim.kind]} `{b}`: "
                + verdict_text(j, plain, control=claim.control, paper=claim.paper_effect((a, b)),
                               planned=study.seeds)
                for (a, b), j in rows) + ".")
    return out


def judge_study(study: Study, frame: pd.DataFrame, steps: int, plain: Plain | None = None):
    """(the paper's text, the claims judged, the baseline checks judged, the "learning is plain" check);
    ``plain``: the study's budget's bar where measured elsewhere (``budget_bar``), else read from ``frame``."""
    paper = paper_claims(study.name, study.by, study.script)
    claims = [(c, judge_claim(c, study, frame, steps)) for c in paper.claims]
    base = baseline_claim(study, frame)
    baselines = [(base, judge_claim(base, study, frame, steps))]
    return paper, claims, baselines, plain or learning_is_plain(study, frame)


RULES = [
    "How a claim is judged (repro/claims.py and analysis/verdicts.py). Each paper claim is one family of paired "
    "tests across seeds (seed s of every arm starts from the same encoder and sees the same batches), "
    f"Holm-corrected within the family at α = {ALPHA}; the baseline checks (each arm against its random-init "
    "start) are a family of their own. For a claim that the paper orders (a > b):",
    "",
    f"- **{REPRODUCED}**: the paired test is significant in the paper's direction;",
    f"- **{BELOW_MARGIN}**: significant in the paper's direction, and the no-effect test below excludes the "
    "margin too: a real difference smaller than the smallest that counts, not the paper's effect;",
    f"- **{REVERSED}**: significant against it;",
    f"- **{NOT_REPRODUCED}**: a one-sided test (the no-effect test) excludes a difference of the margin or more "
    "in the paper's direction; the verdict prints the one-sided 95 % upper bound of the difference, in points "
    "and as a share of what there is to learn at its budget (random-init to supervised, where the supervised "
    "bound trained at that budget), beside the paper's own effect;",
    f"- **{INCONCLUSIVE}**: neither: the seeds could not tell (the *detectable* column is the smallest true "
    f"difference the test finds with {100 * POWER:.0f} % power at its family's strictest level).",
    "",
    f"A claim that two arms are alike (a ≈ b) is **{REPRODUCED}** when an equivalence test (TOST) excludes "
    f"differences of the margin either way, **{NOT_REPRODUCED}** when the paired test finds a difference, else "
    f"**{INCONCLUSIVE}**. A claim that training fails (a no better than b) is **{REPRODUCED}** when a one-sided "
    f"test excludes a gain of the margin over b, **{REVERSED}** when one shows a gain above it. Where the paper "
    "orders more than two arms, the claim's primary test is one per-seed linear contrast with its t-interval "
    "(K: the slope of accuracy on log2 K, its margin the metric's spread over the log2 range the arms span; m: "
    "the last of the paper's order minus the first; batch norm: the shuffled arms' mean minus the unshuffled), "
    "judged as a > b in a family of its own; the pairwise comparisons are secondary.",
    "",
    f"Margins: {100 * MARGINS['linear_top1']:g} linear top-1 point, a third of what there is to learn here (a trained "
    f"encoder's gain over its random-init start on the validation split at cpu-full, {100 * LEARNED:.1f} points: "
    f"`results/pilot/margin.csv`), and {100 * MARGINS['pretext_acc']:g} points of pretext accuracy. Budgets: a "
    f"claim about two momenta is **{NOT_TESTABLE}** when the run trains fewer than {HALF_LIVES} half-lives "
    f"(ln 0.5 / ln m steps) of the larger m: before that its key encoder still holds more than 3 % of its random "
    f"start; a claim whose arms share one key-encoder m is **{NOT_TESTABLE}** below {SHARED_HALF_LIVES} "
    "half-life of it, where the key encoder is more its random start than trained. *Learning is plain*: one bar "
    "per budget, read from one named arm (`repro/claims.py`'s `PLAIN_BARS`) and stated once, so identical runs "
    "get one answer in every study; a study whose budget does not clear it marks its verdicts provisional. A "
    "verdict judged on fewer seeds than its study plans says *interim: n of N seeds*: the seeds still to come "
    "can change it.",
    "",
    "Rules before runs, checked: each study's rules (its arms, claims, primary metrics, margins, the steps each "
    "comparison needs and whether the budget has them, the contrasts, the bar and its arm, the borrowed arms and "
    "the verdict rules above) are serialised by `repro/preregistration.py` and hashed; `mocolab repro` tags "
    "every run it launches with the hash of the plan it is made under, and the exported CSVs carry it (column "
    "`plan_hash`). A verdict all of whose runs carry the hash of the rules that judge it is *before the runs*; "
    "any other is labelled *post hoc* in its table and in its section's *Rules before runs* line. The table "
    "below (from the plan alone) gives each study's hash and which claims its budget can test.",
    "",
    "A study may read an arm another study ran, under the name its claims use; it reads that arm's run of seed "
    "s only where it was made on the kind of machine its own arms of seed s were made on, since another CPU "
    "trains the same config and seed otherwise (*The same config in more than one study*, at the end, shows "
    "both).",
]


def plan_table(studies: Sequence[Study], steps: Mapping[str, int], hashes: Mapping[str, str]) -> list[str]:
    """Each study's rules hash, its budget, and which of its comparisons the budget can test: the plan's own
    answer, before any result."""
    out = ["| study | rules hash | steps | bar of *learning is plain* | testable at this budget | not testable |",
           "|---|---|---|---|---|---|"]
    for study in studies:
        paper, n = paper_claims(study.name, study.by, study.script), steps[study.name]
        yes, no = [], []
        for claim in paper.claims:
            for a, b in claim.pairs:
                if in_study(study, a) and in_study(study, b):
                    (yes if n >= claim.steps((a, b)) else no).append(f"{a} {KIND_WORD[claim.kind]} {b}")
        for c in paper.contrasts:
            arms = tuple(a for a in c.arms if in_study(study, a))
            if len(arms) >= 3:
                (yes if n >= c.steps(arms) else no).append(contrast_label(c))
        bar = PLAIN_BARS.get(study.bar_budget)
        out.append(f"| {study.name} | `{hashes[study.name]}` | {n:,} | {study.bar_budget}: "
                   f"{f'`{bar[0]}` `{bar[1]}`' if bar else 'none'} | {', '.join(yes) or '—'} | "
                   f"{', '.join(no) or '—'} |")
    return out
