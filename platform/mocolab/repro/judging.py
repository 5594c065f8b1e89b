"""A study's CSV rows judged by the stated rules (repro/claims.py): each paper claim's family of paired tests,
its verdicts, the budget and "learning is plain" checks, and the tables the document prints for them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import pandas as pd

from mocolab.analysis.stats import Comparison, fmt_p, paired
from mocolab.analysis.verdicts import (EQUAL, FAILS, GREATER, INCONCLUSIVE, NOT_REPRODUCED, NOT_TESTABLE, NOT_YET,
                                       REPRODUCED, REVERSED, Judged, judge)
from mocolab.repro.claims import (ALPHA, BASELINE_CHECK, HALF_LIVES, LEARNED, MARGINS, PLAIN_KNN, PLAIN_LINEAR,
                                  PLAIN_MOMENTUM_ARM, POWER, RANDOM_INIT, Claim, paper_claims, steps_needed)
from mocolab.repro.plan import Study

METRIC_WORD = {"linear_top1": "linear top-1", "knn_top1": "kNN top-1", "pretext_acc": "pretext accuracy"}
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
    return PLAIN_MOMENTUM_ARM if study.by == "moco.m" else study.reference


def learning_is_plain(study: Study, frame: pd.DataFrame) -> Plain:
    """The bar of repro/claims.py, per seed of the study's plain arm."""
    arm = plain_arm(study)
    knn, linear = by_seed(frame, arm, "knn_top1"), by_seed(frame, arm, "linear_top1")
    init = by_seed(frame, RANDOM_INIT, "knn_top1")
    pixels = frame.loc[frame["arm"] == "raw-pixels", "linear_top1"]
    seeds = [s for s in knn if s in init]
    rule = (f"the bar: `{arm}` beats the random-init encoder of its seed by ≥ {100 * PLAIN_KNN:.0f} kNN points "
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


def _in_study(study: Study, arm: str) -> bool:
    return arm in study.arms or arm in (study.reference, *(b.here for b in study.borrow)) or arm == RANDOM_INIT


def judge_claim(claim: Claim, study: Study, frame: pd.DataFrame, steps: int) -> list[tuple[tuple[str, str], Judged]]:
    """The claim's comparisons this study makes (both arms planned here), judged as one family."""
    pairs = [(a, b) for a, b in claim.pairs if _in_study(study, a) and _in_study(study, b)]
    comps = [paired(by_seed(frame, a, claim.metric), by_seed(frame, b, claim.metric), (a, b)) for a, b in pairs]
    testable = [not claim.momenta or steps >= steps_needed((float(a), float(b))) for a, b in pairs]
    return list(zip(pairs, judge(comps, claim.kind, claim.margin, alpha=ALPHA, power=POWER, testable=testable)))


def baseline_claim(study: Study, frame: pd.DataFrame) -> Claim:
    """Every trained arm of the study against the random-init encoder: the baseline checks' own family."""
    arms = [a for a in frame["arm"].astype(str).unique() if a not in (RANDOM_INIT, "raw-pixels")]
    order = {a: i for i, a in enumerate(study.arms)}
    arms.sort(key=lambda a: (order.get(a, len(order)), a))
    return Claim(BASELINE_CHECK.words, tuple((a, RANDOM_INIT) for a in arms))


def _pts(x: float) -> str:
    return "—" if math.isnan(x) else f"{100 * x:.2f}"


def diff_points(c: Comparison) -> str:
    """A paired difference (fractions) in points with its 95 % interval, as every table of the page prints it."""
    if c.n == 0:
        return "—"
    if c.n == 1:
        return f"{100 * c.diff.mean:+.2f} (1 seed)"
    return f"{100 * c.diff.mean:+.2f} [{100 * c.diff.low:+.2f}, {100 * c.diff.high:+.2f}]"


def _budget(claim: Claim, pair: tuple[str, str], steps: int) -> str:
    if not claim.momenta:
        return "—"
    needed = steps_needed(tuple(float(a) for a in pair))
    return f"{steps:,} {'≥' if steps >= needed else '<'} {needed:,.0f}"


# what a verdict means in the baseline checks, where the "claim" is that the arm's encoder beats its start
BASELINE_WORDS = {REPRODUCED: "above its start", REVERSED: "below its start",
                  NOT_REPRODUCED: "within the margin of its start", INCONCLUSIVE: INCONCLUSIVE}


# what a verdict means for a control (an EQUAL question, not a paper claim)
CONTROL_WORDS = {REPRODUCED: "alike (within the margin)", NOT_REPRODUCED: "different", INCONCLUSIVE: INCONCLUSIVE}


def verdict_text(j: Judged, plain: Plain, baseline: bool = False, control: bool = False) -> str:
    word = (BASELINE_WORDS.get(j.verdict, j.verdict) if baseline
            else CONTROL_WORDS.get(j.verdict, j.verdict) if control else j.verdict)
    if control and j.verdict == NOT_REPRODUCED:
        word += f": {j.comparison.a} {'higher' if j.comparison.diff.mean > 0 else 'lower'}"
    if j.verdict in (NOT_YET, NOT_TESTABLE):
        return f"**{word}**"
    return f"**{word}**" + ("" if plain.met else " (provisional)")


def _family(j: Judged) -> str:
    return f"of {j.family_size}" if j.family_size else "untested"


def claim_table(judged: list[tuple[Claim, list[tuple[tuple[str, str], Judged]]]], steps: int, plain: Plain,
                baseline: bool = False) -> list[str]:
    """One row per comparison: its family, the paired test, the no-effect test, the detectable effect, the
    budget and the verdict."""
    if not any(rows for _, rows in judged):
        return []
    head = ("| comparison | family | seeds | Δ points [95 %] | p (Holm) | no-effect p (Holm) | detectable at "
            f"{100 * POWER:.0f} % power | steps vs {HALF_LIVES} half-lives | verdict |")
    out = [head, "|---|---|---|---|---|---|---|---|---|"]
    for claim, rows in judged:
        for (a, b), j in rows:
            c = j.comparison
            family = "baseline checks" if baseline else claim.words
            out.append(f"| {a} {KIND_WORD[claim.kind]} {b} ({METRIC_WORD[claim.metric]}) | {family} "
                       f"({_family(j)}) | {c.n} | {diff_points(c)} | {fmt_p(c.p_holm)} | {fmt_p(j.p_equivalence)} | "
                       f"{_pts(j.detectable)} | {_budget(claim, (a, b), steps)} | "
                       f"{verdict_text(j, plain, baseline, claim.control)} |")
    return out


def claim_lines(judged: list[tuple[Claim, list[tuple[tuple[str, str], Judged]]]], plain: Plain,
                elsewhere: Mapping[str, str] | None = None) -> list[str]:
    """One line per claim: its words, the paper's kind and margin, and each comparison's verdict; a claim
    not testable at this budget adds what another study at a budget that can test it found (``elsewhere``:
    claim words -> that study's words, ``tested_at``)."""
    out = []
    for claim, rows in judged:
        if not rows:
            continue
        parts = [f"`{a}` {KIND_WORD[claim.kind]} `{b}`: {verdict_text(j, plain, control=claim.control)}"
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


def tested_at(study: Study, judged: list[tuple[Claim, list[tuple[tuple[str, str], Judged]]]], plain: Plain,
              steps: int) -> dict[str, str]:
    """{claim words: what this study's budget could test of it}, for the sections whose budget could not:
    ``At 3,638 steps (`momentum-long-cpu-full`): `0.999` > `0.99`: **not reproduced**.``"""
    out = {}
    for claim, rows in judged:
        rows = [(pair, j) for pair, j in rows if j.verdict not in (NOT_TESTABLE, NOT_YET)]
        if rows:
            out[claim.words] = (f"At {steps:,} steps (`{study.name}`): " + "; ".join(
                f"`{a}` {KIND_WORD[claim.kind]} `{b}`: {verdict_text(j, plain, control=claim.control)}"
                for (a, b), j in rows) + ".")
    return out


def judge_study(study: Study, frame: pd.DataFrame, steps: int):
    """(the paper's text, the claims judged, the baseline checks judged, the "learning is plain" check)."""
    paper = paper_claims(study.name, study.by, study.script)
    claims = [(c, judge_claim(c, study, frame, steps)) for c in paper.claims]
    base = baseline_claim(study, frame)
    baselines = [(base, judge_claim(base, study, frame, steps))]
    return paper, claims, baselines, learning_is_plain(study, frame)


RULES = [
    "How a claim is judged (repro/claims.py and analysis/verdicts.py, written before the runs they judge). "
    "Each paper claim is one family of paired tests across seeds (seed s of every arm starts from the same "
    f"encoder and sees the same batches), Holm-corrected within the family at α = {ALPHA}; the baseline checks "
    "(each arm against its random-init start) are a family of their own. For a claim that the paper orders "
    "(a > b):",
    "",
    f"- **{REPRODUCED}**: the paired test is significant in the paper's direction;",
    f"- **{REVERSED}**: significant against it;",
    f"- **{NOT_REPRODUCED}**: a one-sided test (the no-effect test) excludes a difference of the margin or more "
    "in the paper's direction;",
    f"- **{INCONCLUSIVE}**: neither: the seeds could not tell (the *detectable* column is the smallest true "
    f"difference the test finds with {100 * POWER:.0f} % power at its family's strictest level).",
    "",
    f"A claim that two arms are alike (a ≈ b) is **{REPRODUCED}** when an equivalence test (TOST) excludes "
    f"differences of the margin either way, **{NOT_REPRODUCED}** when the paired test finds a difference, else "
    f"**{INCONCLUSIVE}**. A claim that training fails (a no better than b) is **{REPRODUCED}** when a one-sided "
    f"test excludes a gain of the margin over b, **{REVERSED}** when one shows a gain above it.",
    "",
    f"Margins: {100 * MARGINS['linear_top1']:g} linear top-1 point, a third of what there is to learn here (a trained "
    f"encoder's gain over its random-init start on the validation split at cpu-full, {100 * LEARNED:.1f} points: "
    f"`results/pilot/margin.csv`), and {100 * MARGINS['pretext_acc']:g} points of pretext accuracy. A claim about "
    f"two momenta is **{NOT_TESTABLE}** when the run trains fewer than {HALF_LIVES} half-lives (ln 0.5 / ln m "
    f"steps) of the larger m: before that its key encoder still holds more than 3 % of its random start. A study "
    "whose budget does not clear *learning is plain* marks its verdicts provisional. These rules were written "
    "after `momentum-cpu-full` had run (and a `momentum-cpu-quick` whose runs the store no longer holds) and "
    "before the queue, batch-norm and long-momentum studies at cpu-full and the `momentum-cpu-quick` shown here; "
    "the `momentum-cpu-full` verdicts are re-judged by them.",
    "",
    "A study may read an arm another study ran, under the name its claims use; it reads that arm's run of seed "
    "s only where it was made on the kind of machine its own arms of seed s were made on, since another CPU "
    "trains the same config and seed otherwise (*The same config in more than one study*, at the end, shows "
    "both).",
]
