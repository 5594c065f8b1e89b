"""The statistics behind every claim the reproduction makes: intervals per arm, paired tests across seeds.

Arms of a study share seeds (seed s of every arm starts from the same encoder and sees the same batches), so
two arms are compared by the per-seed differences (a paired t-test), not as two independent samples; a
study that makes several comparisons corrects their p-values together (Holm, which controls the family-wise
error without assuming independence).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from scipy import stats
from scipy.optimize import brentq


@dataclass(frozen=True)
class Interval:
    """Mean, sample standard deviation and the two-sided 95 % t-interval of the mean over ``n`` values."""

    n: int
    mean: float
    std: float
    low: float
    high: float


def interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """The t-interval of the mean (std and bounds are NaN with fewer than two values)."""
    xs = [float(v) for v in values if not math.isnan(float(v))]
    n = len(xs)
    if n == 0:
        return Interval(0, math.nan, math.nan, math.nan, math.nan)
    mean = sum(xs) / n
    if n < 2:
        return Interval(1, mean, math.nan, math.nan, math.nan)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * std / math.sqrt(n)
    return Interval(n, mean, std, mean - half, mean + half)


@dataclass(frozen=True)
class Comparison:
    """``a`` against ``b`` over the seeds both have: mean of (a − b), its interval, the paired t-test."""

    a: str
    b: str
    n: int
    diff: Interval
    t: float
    p: float
    p_holm: float = math.nan

    def verdict(self, alpha: float = 0.05) -> str:
        """'a > b', 'a < b' or 'no difference' at ``alpha`` after Holm's correction ('not tested' below 2 seeds)."""
        if math.isnan(self.p_holm):
            return "not tested (fewer than 2 seeds)"
        if self.p_holm >= alpha:
            return "no difference"
        return f"{self.a} > {self.b}" if self.diff.mean > 0 else f"{self.a} < {self.b}"


def paired(a: Mapping[int, float], b: Mapping[int, float], names: tuple[str, str]) -> Comparison:
    """Paired t-test of two arms given as {seed: value}; seeds missing from either arm are left out."""
    seeds = sorted(s for s in a if s in b and not math.isnan(a[s]) and not math.isnan(b[s]))
    diffs = [a[s] - b[s] for s in seeds]
    d = interval(diffs)
    if len(seeds) < 2:
        return Comparison(names[0], names[1], len(seeds), d, math.nan, math.nan)
    if d.std == 0:  # identical differences: the t statistic is infinite unless they are all zero
        return Comparison(names[0], names[1], len(seeds), d, math.inf if d.mean else 0.0, 0.0 if d.mean else 1.0)
    res = stats.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds])
    return Comparison(names[0], names[1], len(seeds), d, float(res.statistic), float(res.pvalue))


def holm(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """The same comparisons with ``p_holm`` set: Holm's step-down adjustment over the family (NaN p-values,
    from too few seeds, stay NaN and do not count toward the family's size)."""
    tested = sorted((c.p, i) for i, c in enumerate(comparisons) if not math.isnan(c.p))
    m, running, adjusted = len(tested), 0.0, {}
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return [replace(c, p_holm=adjusted.get(i, math.nan)) for i, c in enumerate(comparisons)]


def fmt_p(p: float) -> str:
    if math.isnan(p):
        return "—"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def beyond_p(diff: Interval, bound: float, *, above: bool) -> float:
    """One-sided p-value of the null "the mean difference is ≥ ``bound``" (``above=False``) or "≤ ``bound``"
    (``above=True``) from the paired differences' interval: small when the data exclude that side.

    An equivalence (TOST) or non-inferiority test is one or two of these at a margin fixed in advance; it is
    what turns "no significant difference" into "no difference as large as the margin" (or fails to).
    """
    if diff.n < 2 or math.isnan(diff.std):
        return math.nan
    if diff.std == 0:  # identical differences: the side is excluded exactly or not at all
        return 0.0 if (diff.mean > bound if above else diff.mean < bound) else 1.0
    t = (diff.mean - bound) / (diff.std / math.sqrt(diff.n))
    return float(stats.t.sf(t, diff.n - 1) if above else stats.t.cdf(t, diff.n - 1))


def equivalence_p(diff: Interval, margin: float) -> float:
    """TOST: the larger of the two one-sided p-values of "|mean difference| ≥ ``margin``"."""
    return max(beyond_p(diff, -margin, above=True), beyond_p(diff, margin, above=False))


def detectable(std: float, n: int, alpha: float, power: float = 0.8) -> float:
    """The smallest true mean difference a two-sided paired t-test at level ``alpha`` over ``n`` seeds finds with
    probability ``power``, given the differences' standard deviation ``std`` (the noncentral t, not the normal
    approximation, which flatters 3 to 5 seeds). NaN below two seeds; 0 where the differences do not vary."""
    if n < 2 or math.isnan(std):
        return math.nan
    if std == 0:
        return 0.0
    df = n - 1
    crit = float(stats.t.ppf(1 - alpha / 2, df))

    def shortfall(effect: float) -> float:
        nc = effect / (std / math.sqrt(n))
        wrong_side = float(stats.nct.cdf(-crit, df, nc))  # NaN far out in the tail, where it is 0
        return float(stats.nct.sf(crit, df, nc)) + (0.0 if math.isnan(wrong_side) else wrong_side) - power

    high = std
    while shortfall(high) < 0:
        high *= 2
    return float(brentq(shortfall, 0.0, high, xtol=1e-9 * std))


def upper_bound(diff: Interval, level: float = 0.95) -> float:
    """The one-sided ``level`` upper confidence bound of the mean difference: the largest effect the seeds leave
    standing, what a "not reproduced" is set beside the paper's effect with (NaN below two seeds)."""
    if diff.n < 2 or math.isnan(diff.std):
        return math.nan
    return diff.mean + float(stats.t.ppf(level, diff.n - 1)) * diff.std / math.sqrt(diff.n)


def slope_weights(xs: Sequence[float]) -> list[float]:
    """The least-squares slope of y on x as a linear contrast: slope = sum(w_i * y_i), so a per-seed slope is one
    number per seed and the seeds' slopes take the t-interval a paired difference does."""
    mean = sum(xs) / len(xs)
    sxx = sum((x - mean) ** 2 for x in xs)
    if not sxx > 0:
        raise ValueError(f"xs: {list(xs)} needs two different values for a slope")
    return [(x - mean) / sxx for x in xs]


def order_weights(n: int) -> list[float]:
    """A linear contrast over ``n`` ordered arms (centred ranks), scaled so its positive weights sum to 1: with
    three arms it is the last minus the first, so it reads in the metric's points and takes the metric's margin."""
    if n < 2:
        raise ValueError(f"n: {n}; an order needs at least two arms")
    ranks = [i - (n - 1) / 2 for i in range(n)]
    top = sum(r for r in ranks if r > 0)
    return [r / top for r in ranks]


def contrast(arms: Sequence[Mapping[int, float]], weights: Sequence[float], name: str) -> Comparison:
    """The per-seed value of sum(w_i * arm_i) over the seeds every arm has, tested against 0 (one-sample t-test,
    which for two arms with weights (1, -1) is the paired test): a trend across several arms as one test."""
    if len(arms) != len(weights):
        raise ValueError("weights: one per arm")
    seeds = sorted(s for s in arms[0] if all(s in a and not math.isnan(a[s]) for a in arms))
    values = [sum(w * a[s] for w, a in zip(weights, arms)) for s in seeds]
    d = interval(values)
    if len(seeds) < 2:
        return Comparison(name, "0", len(seeds), d, math.nan, math.nan)
    if d.std == 0:
        return Comparison(name, "0", len(seeds), d, math.inf if d.mean else 0.0, 0.0 if d.mean else 1.0)
    res = stats.ttest_1samp(values, 0.0)
    return Comparison(name, "0", len(seeds), d, float(res.statistic), float(res.pvalue))
