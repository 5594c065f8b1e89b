"""The reproduction's rules that a machine checks: the hash of each study's rules carried by its runs (post hoc
where not), a significant effect below the margin, one bar of "learning is plain" per budget, the budget rule
for arms that share a key encoder, and K judged as a slope, on synthetic CSVs. The slope's numbers are
recomputed here from the CSV with numpy and scipy alone."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from test_verdict_rules import _rows as study_rows
import pytest
from scipy import stats as sps

from mocolab.analysis.stats import paired
from mocolab.analysis.verdicts import (BELOW_MARGIN, GREATER, INCONCLUSIVE, NOT_REPRODUCED, NOT_TESTABLE,
                                       REPRODUCED, judge)
from mocolab.repro import claims
from mocolab.repro.document import write
from mocolab.repro.judging import judge_contrasts, judge_study
from mocolab.repro.plan import study
from mocolab.repro.preregistration import PLAN_COLUMN, canonical, carries, plan_tag, rules, rules_hash, tag_runs

NOISE = np.random.default_rng(7).standard_normal((8, 5))  # one fixed draw: the same CSVs every run
QUEUE = study("queue-cpu-full")
SIZES = ("256", "1024", "4096", "16384")


def _rows(name: str, arms: dict[str, dict[int, float]], tag: str | None = None) -> pd.DataFrame:
    """A study's CSV (test_verdict_rules's synthetic one, with the queue's K and m = 0.999's half-life on its
    arms' rows); every run carrying ``tag`` in its plan-hash column (None: no such column, as in a store made
    before the tag)."""
    frame = study_rows(name, arms)
    own = frame["arm"].isin(list(arms))
    frame.loc[own, "queue_size"], frame.loc[own, "ema_half_life"] = 16384, 692.8
    if tag is not None:
        frame[PLAN_COLUMN] = tag
    return frame


def _queue(per_doubling: float, sd: float, seeds: int = 5) -> dict[str, dict[int, float]]:
    """queue-cpu-full's four K, linear top-1 rising ``per_doubling`` a doubling of K, seed noise ``sd``."""
    return {k: {s: 0.87 + per_doubling * math.log2(int(k) / 256) + sd * NOISE[i, s] for s in range(seeds)}
            for i, k in enumerate(SIZES)}


def _section(doc: str, title: str) -> str:
    text = doc[doc.index(f"## {title}"):]
    return text[:text.index("\n## ")]


def _write(tmp_path, frames: dict[str, pd.DataFrame]) -> str:
    results = tmp_path / "results"
    results.mkdir(exist_ok=True)
    for name, frame in frames.items():
        frame.to_csv(results / f"{name}.csv", index=False)
    return write(results, tmp_path / "REPRODUCTION.md", tmp_path / "figures").markdown


def _line(text: str, start: str) -> str:
    return next(x for x in text.splitlines() if x.startswith(start))


def test_a_significant_difference_the_no_effect_test_shows_smaller_than_the_margin_reads_below_the_margin(tmp_path):
    base = {s: 0.85 + 0.002 * NOISE[0, s] for s in range(5)}
    small = paired({s: v + 0.004 + 0.0003 * NOISE[1, s] for s, v in base.items()}, base, ("a", "b"))
    large = paired({s: v + 0.03 + 0.0003 * NOISE[1, s] for s, v in base.items()}, base, ("a", "b"))
    (j,) = judge([small], GREATER, 0.01)
    assert j.comparison.p_holm < 0.05 and j.p_equivalence < 0.05 and j.verdict == BELOW_MARGIN
    assert judge([large], GREATER, 0.01)[0].verdict == REPRODUCED
    # in the document: 16384 over 4096 by 0.4 points, tight seeds: real, not the paper's effect
    arms = {k: {s: v + (0.004 if k == "16384" else 0.0) for s, v in by.items()} for k, by in _queue(0.0, 3e-4).items()}
    section = _section(_write(tmp_path, {QUEUE.name: _rows(QUEUE.name, arms)}), QUEUE.title)
    line = _line(section, "- *a larger dictionary is better")
    assert "`16384` > `4096`: **reproduced, below the margin**" in line
    assert ": **reproduced**" not in line  # not counted as the paper's effect anywhere on the line


def test_every_verdict_is_post_hoc_unless_each_run_it_judges_carries_the_hash_of_the_rules_that_judge_it(tmp_path):
    digest = rules_hash(QUEUE)
    arms = _queue(0.0, 5e-4)
    head = "- *Rules before runs* (this study's rules, `repro/preregistration.py`, hash "
    # runs from a store made before the tag: no column at all
    section = _section(_write(tmp_path, {QUEUE.name: _rows(QUEUE.name, arms)}), QUEUE.title)
    rules_line = _line(section, head)
    assert f"`{digest}`" in rules_line and "**post hoc** — 0 of the 25 runs" in rules_line
    assert "every verdict above is post hoc" in rules_line
    rows = [x for x in section.splitlines() if x.startswith("| 16384 > ") and "| a larger" in x]
    assert len(rows) == 3 and all(x.endswith("| *post hoc* |") for x in rows)
    # every run made under this study's rules (and another study's hash beside it, as a borrowed arm's runs carry)
    tagged = _rows(QUEUE.name, arms, tag=f"{digest} 0123456789ab")
    section = _section(_write(tmp_path, {QUEUE.name: tagged}), QUEUE.title)
    assert "**before the runs** — all 25 runs these verdicts judge carry it." in _line(section, head)
    rows = [x for x in section.splitlines() if x.startswith("| 16384 > ") and "| a larger" in x]
    assert len(rows) == 3 and all(x.endswith("| before the runs |") for x in rows)
    # one run of K = 256 made before: the verdicts that judge it are post hoc, the others are not
    tagged.loc[(tagged["arm"] == "256") & (tagged["seed"] == 3), PLAN_COLUMN] = math.nan
    section = _section(_write(tmp_path, {QUEUE.name: tagged}), QUEUE.title)
    line = _line(section, head)
    assert "**post hoc** — 24 of the 25 runs" in line
    assert line.endswith("post hoc: `16384` > `256`, `256` > `random-init`, the slope on log2 contrast (linear top-1); "
                         "the other 5 before their runs.")
    assert _line(section, "| 16384 > 256 (").endswith("| *post hoc* |")
    assert _line(section, "| 16384 > 1024 (").endswith("| before the runs |")


def test_a_run_carrying_another_plans_hash_is_post_hoc_and_any_change_to_a_rule_changes_the_hash(tmp_path, monkeypatch):
    digest = rules_hash(QUEUE)
    assert rules_hash(QUEUE) == digest and len(digest) == 12 and canonical(QUEUE) == canonical(QUEUE)
    assert rules_hash(study("queue-cpu-quick")) != digest  # another study, other rules
    monkeypatch.setitem(claims.MARGINS, "linear_top1", 0.02)  # the margin changed after the runs
    changed = rules_hash(QUEUE)
    monkeypatch.undo()
    assert changed != digest and rules_hash(QUEUE) == digest
    section = _section(_write(tmp_path, {QUEUE.name: _rows(QUEUE.name, _queue(0.0, 5e-4), tag=changed)}),
                       QUEUE.title)
    assert "**post hoc** — 0 of the 25 runs these verdicts judge carry it" in section
    assert not carries(changed, digest) and carries(f"x {digest}", digest) and not carries(math.nan, digest)
    # a run of a study another study borrows from carries both studies' hashes: both judge it
    lender, borrower = study("momentum-cpu-full"), study("symmetric-cpu-full")
    assert plan_tag(lender).split() == [rules_hash(lender), rules_hash(borrower)]


def test_the_plan_says_in_advance_which_claims_each_budget_can_test_v2_over_v1_at_117_steps_included(tmp_path):
    versions = study("versions-vit-quick")
    plan = rules(versions)
    (pair,) = plan["claims"][0]["pairs"]
    assert (pair["a"], pair["b"], pair["testable"], plan["steps"]) == ("v2 convnet", "v1 convnet", False, 117)
    assert round(pair["steps_needed"]) == 693  # one half-life of the key encoders' m = 0.999
    assert all(p["testable"] for c in rules(QUEUE)["claims"] for p in c["pairs"])  # 2,140 steps: K is testable
    arms = {"v1 convnet": {s: 0.80 for s in range(3)}, "v2 convnet": {s: 0.85 + 0.001 * s for s in range(3)},
            "v3 convnet": {s: 0.84 for s in range(3)}, "v3 vit_tiny": {s: 0.82 for s in range(3)}}
    section = _section(_write(tmp_path, {versions.name: _rows(versions.name, arms)}), versions.title)
    line = _line(section, "- *v2's recipe")
    assert "outside this budget" in line and "**not testable at this budget**" in line  # 5 points up: not read
    assert "| 117 < 693 |" in section


def test_one_bar_of_learning_is_plain_per_budget_read_from_its_named_arm_in_every_study(tmp_path):
    momentum = study("momentum-cpu-full")
    # K = 16,384 at +4.96 kNN points over its start in one seed (the per-study bar would fail it), m = 0.99 clear
    queue = _rows(QUEUE.name, _queue(0.0, 5e-4))
    queue.loc[(queue["arm"] == "16384") & (queue["seed"] == 0), "knn_top1"] = 0.70 + 0.0496
    alone = _section(_write(tmp_path, {QUEUE.name: queue}), QUEUE.title)
    line = _line(alone, "- *Learning is plain at this budget*")
    assert "read from this study's `16384`, since this budget's named bar arm (`momentum-cpu-full`'s `0.99`) has " \
           "no finished run yet" in line and "**not met**" in line
    arms = {"0.99": {s: 0.88 for s in range(5)}, "0.999": {s: 0.876 for s in range(5)}}
    doc = _write(tmp_path, {QUEUE.name: queue, momentum.name: _rows(momentum.name, arms)})
    lines = {s.title: _line(_section(doc, s.title), "- *Learning is plain at this budget*") for s in (QUEUE, momentum)}
    assert lines[QUEUE.title] == lines[momentum.title]  # stated once: the same words in both studies
    assert "(`cpu-full`'s one bar, read from `momentum-cpu-full`'s `0.99` for every study at this budget" in \
        lines[QUEUE.title] and "**met**" in lines[QUEUE.title]
    assert "(provisional)" not in _line(_section(doc, QUEUE.title), "- *a larger dictionary is better")


@pytest.mark.parametrize("per_doubling, sd, seeds, verdict", [
    (0.01, 0.002, 5, REPRODUCED),  # a point a doubling, tight seeds
    (0.0, 0.0005, 5, NOT_REPRODUCED),  # flat: the upper bound is far below the margin of a sixth of a point
    (0.001, 0.02, 3, INCONCLUSIVE),  # three noisy seeds cannot tell
])
def test_k_is_judged_as_a_slope_on_log2_k_recomputed_from_the_csv_alone(tmp_path, per_doubling, sd, seeds, verdict):
    arms = _queue(per_doubling, sd, seeds)
    frame = _rows(QUEUE.name, arms)
    (jc,) = judge_contrasts(QUEUE, frame, QUEUE.steps())
    assert jc.judged.verdict == verdict and jc.arms == SIZES
    assert jc.margin == pytest.approx(0.01 / 6)  # the point of margin spread over six doublings
    # the same slope, interval and test from the CSV with numpy and scipy alone
    x = np.log2([int(k) for k in SIZES])
    slopes = [np.polyfit(x, [arms[k][s] for k in SIZES], 1)[0] for s in range(seeds)]
    test = sps.ttest_1samp(slopes, 0.0)
    half = sps.t.ppf(0.975, seeds - 1) * sps.sem(slopes)
    upper = np.mean(slopes) + sps.t.ppf(0.95, seeds - 1) * sps.sem(slopes)
    c = jc.judged.comparison
    assert (c.diff.mean, c.diff.low, c.p) == (pytest.approx(np.mean(slopes)), pytest.approx(np.mean(slopes) - half),
                                              pytest.approx(test.pvalue))
    doc = _write(tmp_path, {QUEUE.name: frame})
    line = _line(_section(doc, QUEUE.title), "- *accuracy rises with log2 K")
    m = np.mean(slopes)
    mean = f"{100 * m:+.2f} [{100 * (m - half):+.2f}, {100 * (m + half):+.2f}]"
    assert f"{mean} points a doubling: **{verdict}**" in line
    row = _line(_section(doc, QUEUE.title), "| slope on log2 of 256, 1024, 4096, 16384 (linear top-1) |")
    assert f"| {seeds} | {mean} | " in row
    if verdict == NOT_REPRODUCED:
        assert f"one-sided 95 % upper bound {100 * upper:+.2f} points a doubling" in line
        assert "the paper's effect +0.4 ImageNet points a doubling" in line


def test_momentum_is_an_ordered_contrast_the_budget_rule_applies_to_and_batch_norm_a_contrast_of_groups():
    momentum, bn = study("momentum-cpu-full"), study("bn-cpu-full")
    arms = {"0.9": {s: 0.85 for s in range(5)}, "0.99": {s: 0.87 + 0.001 * s for s in range(5)},
            "0.999": {s: 0.88 + 0.0005 * s for s in range(5)}}
    (jc,) = judge_contrasts(momentum, _rows(momentum.name, arms), 2_140)
    assert jc.weights == (-1.0, 0.0, 1.0) and jc.judged.verdict == NOT_TESTABLE  # 0.999 needs 3,464 steps
    (jc,) = judge_contrasts(momentum, _rows(momentum.name, arms), 3_465)
    assert jc.judged.verdict == REPRODUCED and jc.judged.comparison.diff.mean == pytest.approx(0.031)
    bn_arms = {a: {s: 0.87 + 0.001 * s for s in range(5)} for a in ("plain", "groups", "split", "shuffle")}
    linear, pretext = judge_contrasts(bn, _rows(bn.name, bn_arms), bn.steps())
    assert linear.weights == (-0.5, -0.5, 0.5, 0.5) and pretext.weights == (0.5, 0.5, -0.5, -0.5)
    assert linear.judged.verdict == NOT_REPRODUCED  # equal arms: no shuffled gain of a point
    _, _, _, plain = judge_study(bn, _rows(bn.name, bn_arms), bn.steps())
    assert "read from this study's `shuffle`" in plain.line  # judged alone, without its budget's named arm


def test_mocolab_repro_tags_every_run_a_study_makes_and_the_export_writes_the_tag(tmp_path, monkeypatch):
    from mocolab.config import build_config
    from mocolab.repro.baseline_runs import EXPERIMENT, _log
    from mocolab.repro.export import export
    from mocolab.tracking import Store
    from mocolab.tracking.source import PLAN_ENV, PLAN_TAG, source_tags
    from mocolab.training.baselines import Baseline
    from conftest import mlflow_store

    monkeypatch.delenv(PLAN_ENV, raising=False)
    assert PLAN_TAG not in source_tags()
    monkeypatch.setenv(PLAN_ENV, "")  # restored after the test: tag_runs sets it for the process
    s = study("momentum-cpu-full")
    assert tag_runs(s) == plan_tag(s)
    assert source_tags()[PLAN_TAG] == plan_tag(s)
    store = Store(mlflow_store(tmp_path))
    exp_id = store.experiment_id(EXPERIMENT, create=True)
    _log(store, exp_id, s.name, build_config("smoke", {"run.seed": 0}), Baseline("random-init", 0, 0.74, 0.84))
    frame = pd.read_csv(export(s, store, tmp_path / "results"), dtype={PLAN_COLUMN: str})
    assert list(frame[PLAN_COLUMN]) == [plan_tag(s)] and carries(frame[PLAN_COLUMN][0], rules_hash(s))


def test_the_secondary_metrics_stand_beside_a_verdict_they_never_decide_and_queue_arms_show_their_key_ages(tmp_path):
    """The staleness study, synthetic: FIFO above random at m = 0.99 on the full probe (its verdict), the 1 % probe
    reversed and the k = 20 kNN absent from the runs (no rows for it); each arm's logged key ages beside the bound."""
    s = study("staleness-cpu-full")
    base = {s_: 0.87 + 0.001 * NOISE[0, s_] for s_ in range(5)}
    arms = {arm: {k: v + (0.02 if arm == "queue fifo m=0.99" else 0.0) + 0.0005 * NOISE[i + 1, k]
                  for k, v in base.items()} for i, arm in enumerate(s.arms)}
    frame = study_rows(s.name, arms)
    own = frame["arm"].isin(list(arms))
    fifo_99 = frame["arm"] == "queue fifo m=0.99"
    frame["linear_top1_1pct"] = np.where(own, 0.60 + np.where(fifo_99, -0.05, 0.0), np.nan)
    frame["linear_top1_1pct"] += 0.002 * np.resize(NOISE[5], len(frame))
    frame["max_staleness_bound"] = np.where(own, 64.0, np.nan)
    random = frame["arm"].str.startswith("queue random")
    frame["staleness_mean"] = np.where(own, np.where(random, 63.9, 32.5), np.nan)
    frame["staleness_max"] = np.where(own, np.where(random, 700.0, 64.0), np.nan)
    section = _section(_write(tmp_path, {s.name: frame}), s.title)
    claim = _line(section, "- *FIFO's young keys beat random replacement's old ones")
    assert "`queue fifo m=0.99` > `queue random m=0.99`: **reproduced**" in claim  # the full probe decides
    assert "Secondary metrics" in section and "k = 20" in section.split("Secondary metrics")[1].split("\n")[0]
    rows = [r for r in section.splitlines() if r.startswith("| queue fifo m=0.99 > queue random m=0.99 |")]
    assert len(rows) == 1 and "| linear top-1 on 1 % of the labels | 5 | -5.00" in rows[0]
    assert "**reversed**" in rows[0] and "kNN k = 20 top-1 |" not in section  # logged by none: no row
    assert "| queue random m=0.99 | 5 | 64 | 63.9 [63.9, 63.9] | 700 [700, 700] |" in section
    assert "| queue fifo m=0.999 | 5 | 64 | 32.5 [32.5, 32.5] | 64 [64, 64] |" in section
