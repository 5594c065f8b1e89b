"""The four verdicts a paper claim can get, each decided by a stated rule (whether the rule came before the runs
it judges is checked from the runs' tags: repro/preregistration.py).

A paired test that finds no significant difference says nothing by itself: with three seeds in a family of
nineteen it could miss an effect of several points.  So "not reproduced" needs evidence of absence: an
equivalence (one-sided) test at a margin stated in advance must exclude effects of that size in the paper's
direction.  Where neither test decides, the verdict is "inconclusive", and the comparison's detectable
effect (80 % power at its corrected level) says how large an effect the seeds could have found.

Each claim is one Holm family: its directional tests are corrected together, and so are its equivalence
tests; adding an arm to one claim changes no other claim's verdict.

A significant difference in the paper's direction whose no-effect test also excludes the margin is real but
smaller than the smallest effect that counts: it reads "reproduced, below the margin", not the paper's effect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from mocolab.analysis.stats import Comparison, beyond_p, detectable, equivalence_p, holm

REPRODUCED = "reproduced"
REVERSED = "reversed"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
NOT_YET = "not yet tested"
NOT_TESTABLE = "not testable at this budget"
BELOW_MARGIN = "reproduced, below the margin"  # significant, and smaller than the margin: not the paper's effect
VERDICTS = (REPRODUCED, REVERSED, NOT_REPRODUCED, INCONCLUSIVE)

# what the paper says of a against b, for each comparison of a claim
GREATER = "greater"  # a > b: the paper orders them
EQUAL = "equal"  # a ≈ b: the paper finds them alike
FAILS = "fails"  # a is no better than b (a trained encoder no better than its untrained start)
KINDS = (GREATER, EQUAL, FAILS)


@dataclass(frozen=True)
class Judged:
    """One comparison of a claim, judged: the paired test (``p_holm`` corrected within the claim's family),
    the equivalence test's p-value (corrected likewise), the smallest effect the seeds could detect with 80 %
    power at the family's strictest level, and the verdict."""

    comparison: Comparison
    kind: str
    margin: float
    p_equivalence: float
    detectable: float
    verdict: str
    family_size: int


def _equivalence(c: Comparison, kind: str, margin: float) -> float:
    """The p-value of the test that would show the paper's effect absent (or, for ``EQUAL``, the tie)."""
    if kind == GREATER:  # H0: a − b ≥ margin, the paper's direction at least as large as the margin
        return beyond_p(c.diff, margin, above=False)
    if kind == EQUAL:  # H0: |a − b| ≥ margin
        return equivalence_p(c.diff, margin)
    return beyond_p(c.diff, margin, above=False)  # FAILS: H0: a learned at least the margin over b


def _verdict(c: Comparison, kind: str, margin: float, p_equiv: float, p_learned: float, alpha: float) -> str:
    if kind == GREATER:
        if c.p_holm < alpha:
            return (BELOW_MARGIN if p_equiv < alpha else REPRODUCED) if c.diff.mean > 0 else REVERSED
        return NOT_REPRODUCED if p_equiv < alpha else INCONCLUSIVE
    if kind == EQUAL:
        if p_equiv < alpha:
            return REPRODUCED
        return NOT_REPRODUCED if c.p_holm < alpha else INCONCLUSIVE
    if p_equiv < alpha:  # FAILS: no more than the margin above b
        return REPRODUCED
    return REVERSED if p_learned < alpha else INCONCLUSIVE


def judge(comparisons: Sequence[Comparison], kind: str, margin: float, *, alpha: float = 0.05,
          power: float = 0.8, testable: Sequence[bool] | None = None) -> list[Judged]:
    """Judge one claim's comparisons (a − b, paired by seed) as one family, by the claim's ``kind``.

    ``testable``: per comparison, whether the budget can test it (a budget rule of the plan);
    one that cannot is reported but takes no part in the family.  A comparison with fewer than two seeds is
    "not yet tested" and likewise left out.
    """
    if kind not in KINDS:
        raise ValueError(f"kind: {kind!r}; one of {KINDS}")
    if not margin > 0:
        raise ValueError(f"margin: {margin!r} must be > 0 (a margin stated in advance)")
    ok = list(testable) if testable is not None else [True] * len(comparisons)
    if len(ok) != len(comparisons):
        raise ValueError("testable: one flag per comparison")
    members = [i for i, c in enumerate(comparisons) if ok[i] and c.n >= 2 and not math.isnan(c.p)]
    tested = holm([comparisons[i] for i in members])
    equiv = holm([_with_p(comparisons[i], _equivalence(comparisons[i], kind, margin)) for i in members])
    learned = holm([_with_p(comparisons[i], beyond_p(comparisons[i].diff, margin, above=True)) for i in members])
    size = len(members)
    out: list[Judged] = []
    for i, c in enumerate(comparisons):
        if i in members:
            k = members.index(i)
            c = tested[k]
            p_equiv, p_learned = equiv[k].p_holm, learned[k].p_holm
            verdict = _verdict(c, kind, margin, p_equiv, p_learned, alpha)
            mde = detectable(c.diff.std, c.n, alpha / size, power)
        else:
            p_equiv, mde = math.nan, detectable(c.diff.std, c.n, alpha, power)
            verdict = NOT_TESTABLE if not ok[i] else NOT_YET
        out.append(Judged(c, kind, margin, p_equiv, mde, verdict, size))
    return out


def _with_p(c: Comparison, p: float) -> Comparison:
    return replace(c, p=p, p_holm=math.nan)
