"""The statistics the reproduction states its claims with, against scipy and hand-worked values."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from mocolab.analysis.stats import holm, interval, paired


def test_interval_is_the_t_interval_of_the_mean():
    xs = [0.84, 0.86, 0.85, 0.88, 0.83]
    iv = interval(xs)
    lo, hi = stats.t.interval(0.95, len(xs) - 1, loc=sum(xs) / len(xs), scale=stats.sem(xs))
    assert (iv.n, iv.low, iv.high) == (5, pytest.approx(lo), pytest.approx(hi))
    assert iv.std == pytest.approx(stats.tstd(xs))
    one = interval([0.5, math.nan])  # NaN (a diverged trial's accuracy) is not a value
    assert one.n == 1 and one.mean == 0.5 and math.isnan(one.low)
    assert interval([]).n == 0


def test_paired_uses_the_seeds_both_arms_have_and_matches_scipy():
    a = {0: 0.80, 1: 0.82, 2: 0.81, 3: 0.85}
    b = {0: 0.78, 1: 0.80, 2: 0.80, 4: 0.99}  # seed 3 and 4: one arm only
    c = paired(a, b, ("a", "b"))
    res = stats.ttest_rel([0.80, 0.82, 0.81], [0.78, 0.80, 0.80])
    assert c.n == 3 and c.t == pytest.approx(res.statistic) and c.p == pytest.approx(res.pvalue)
    assert c.diff.mean == pytest.approx((0.02 + 0.02 + 0.01) / 3)
    same = paired({0: 0.5, 1: 0.6}, {0: 0.4, 1: 0.5}, ("a", "b"))  # every seed +0.1: no spread
    assert same.p == 0.0 and same.t == math.inf
    assert math.isnan(paired({0: 0.5}, {0: 0.4}, ("a", "b")).p)  # one seed is no test


def test_holm_steps_down_and_keeps_the_order_of_the_family():
    family = [paired({0: 0.1, 1: 0.2, 2: 0.3}, {0: 0.0, 1: 0.0, 2: 0.0}, (f"a{i}", "b")) for i in range(3)]
    family = [family[0].__class__(**{**family[0].__dict__, "p": p}) for p in (0.01, 0.04, 0.03)]
    adjusted = [c.p_holm for c in holm(family)]
    assert adjusted == pytest.approx([0.03, 0.06, 0.06])  # 3*0.01; max(2*0.03, .); max(1*0.04, 0.06)
    assert [c.verdict() for c in holm(family)] == ["a0 > b", "no difference", "no difference"]


def test_a_studys_closing_tests_pair_each_arm_with_the_reference_by_seed_holm_corrected_as_one_family():
    import pandas as pd

    from mocolab.analysis import against_reference

    # K = 256 is 0.5 points below 16384 in every seed, with seed-to-seed spread far larger than that: only a
    # paired test sees it; 4096 differs by nothing
    base = {0: 0.80, 1: 0.85, 2: 0.90}
    rows = [{"params.queue.size": k, "params.run.seed": s, "status": "finished", "linear_top1": v + shift}
            for k, shift in ((256, -0.005 + 0.0001), (4096, 0.0), (16384, 0.0)) for s, v in base.items()]
    rows[0]["linear_top1"] -= 0.0002  # not all differences alike
    lines = against_reference(pd.DataFrame(rows), "queue.size", lambda ks: max(ks))
    assert "each against 16384" in lines[0] and "Holm-corrected as one family of 2" in lines[0]
    expected = holm([paired({s: 100 * r["linear_top1"] for s, r in enumerate(rows[0:3])},
                            {s: 100 * r["linear_top1"] for s, r in enumerate(rows[6:9])}, ("256", "16384"))])
    line = next(x for x in lines if x.strip().startswith("256 − 16384"))
    assert "256 < 16384" in line and f"{expected[0].diff.mean:+.2f}" in line
    assert "4096 − 16384" in lines[2] and "no significant difference" in lines[2]
    one_seed = pd.DataFrame([r for r in rows if r["params.run.seed"] == 0])
    assert against_reference(one_seed, "queue.size", max) == [
        "Paired t-tests across seeds need two seeds or more of an arm (--seeds 2); none here."]


def test_the_upper_bound_slope_and_contrasts_are_scipys_one_sided_bound_regression_and_one_sample_test():
    from mocolab.analysis.stats import contrast, order_weights, slope_weights, upper_bound

    diffs = [0.001, -0.002, 0.0005, 0.0015, -0.001]
    iv = interval(diffs)
    assert upper_bound(iv) == pytest.approx(iv.mean + stats.t.ppf(0.95, 4) * stats.sem(diffs))
    assert math.isnan(upper_bound(interval([0.1])))
    xs = [8.0, 10.0, 12.0, 14.0]
    ys = [0.80, 0.83, 0.81, 0.86]
    assert sum(w * y for w, y in zip(slope_weights(xs), ys)) == pytest.approx(stats.linregress(xs, ys).slope)
    assert order_weights(3) == [-1.0, 0.0, 1.0] and order_weights(4) == [-0.75, -0.25, 0.25, 0.75]
    arms = [{0: 0.80, 1: 0.81, 2: 0.79, 3: 0.5}, {0: 0.82, 1: 0.84, 2: 0.80}, {0: 0.85, 1: 0.85, 2: 0.83}]
    c = contrast(arms, [-1.0, 0.0, 1.0], "order")
    values = [0.05, 0.04, 0.04]  # seed 3: one arm only, left out
    assert c.n == 3 and c.diff.mean == pytest.approx(sum(values) / 3)
    assert c.p == pytest.approx(stats.ttest_1samp(values, 0.0).pvalue)
    # two arms with weights (1, -1): the paired test
    two = contrast(arms[2:] + arms[:1], [1.0, -1.0], "pair")
    assert two.p == pytest.approx(paired(arms[2], arms[0], ("a", "b")).p)
    with pytest.raises(ValueError, match="xs"):
        slope_weights([1.0, 1.0])
