"""run.step_metrics_every's default keeps a chart's worth of points per series, whatever the run's length; a
value given is used as given."""

from __future__ import annotations

import pytest

from mocolab.training.step_metrics import STEP_POINTS, step_metrics_interval


@pytest.mark.parametrize("total", [1, 4, 250, 251, 256, 6420, 1_000_000])
def test_the_default_keeps_at_most_a_charts_worth_of_points_and_every_step_of_a_short_run(total):
    every = step_metrics_interval(0, total)
    kept = total // every
    assert 1 <= kept <= STEP_POINTS
    if total <= STEP_POINTS:
        assert every == 1
    else:  # the smallest interval that fits: one step less would keep too many
        assert kept >= STEP_POINTS // 2 and total // (every - 1) > STEP_POINTS


@pytest.mark.parametrize("given", [1, 10, 50])
def test_a_given_interval_is_used_as_given(given):
    assert step_metrics_interval(given, 1_000_000) == given


def test_a_negative_interval_is_refused_by_name():
    with pytest.raises(ValueError, match="run.step_metrics_every"):
        step_metrics_interval(-1, 100)
