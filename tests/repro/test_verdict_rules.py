"""The reproduction's verdict rules (repro/claims.py, analysis/verdicts.py) on synthetic results: each of the four
verdicts comes out where its rule says, the budget and "learning is plain" rules apply, and the rules' stated
numbers cannot change without this file changing too."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from mocolab.analysis.stats import beyond_p, detectable, equivalence_p, interval, paired
from mocolab.analysis.verdicts import (EQUAL, FAILS, GREATER, INCONCLUSIVE, NOT_REPRODUCED, NOT_TESTABLE, NOT_YET,
                                       REPRODUCED, REVERSED, judge)
from mocolab.repro import claims
from mocolab.repro.document import write
from mocolab.repro.judging import claim_lines, claim_table, judge_claim, judge_study
from mocolab.repro.plan import study

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]
NOISE = np.random.default_rng(0).standard_normal((4, 5))  # one fixed draw: the same CSVs every run


def test_the_rules_stated_before_the_runs_are_the_ones_applied():
    """Changing a rule is a change here too: the numbers the document states, and the pilot they come from."""
    assert (claims.ALPHA, claims.POWER, claims.HALF_LIVES) == (0.05, 0.8, 5)
    assert claims.MARGINS == {"linear_top1": 0.01, "pretext_acc": 0.05, "knn20_top1": 0.01,
                              "linear_top1_1pct": 0.01, "linear_top1_10pct": 0.01}
    assert claims.SECONDARY_METRICS == ("knn20_top1", "linear_top1_1pct", "linear_top1_10pct")
    assert (claims.PLAIN_MOMENTUM_ARM, claims.PLAIN_KNN, claims.PLAIN_LINEAR) == ("0.99", 0.05, 0.03)
    pilot = pd.read_csv(REPO / "results" / "pilot" / "margin.csv", comment="#")
    assert len(pilot) == 5 and pilot["learned"].mean() == pytest.approx(claims.LEARNED, abs=5e-5)
    assert claims.MARGINS["linear_top1"] == round(claims.LEARNED / 3, 2)  # a third of what there is to learn
    assert claims.steps_needed((0.99, 0.999)) == pytest.approx(5 * math.log(0.5) / math.log(0.999))
    assert round(claims.steps_needed((0.999, 0.9999))) == 34_656 and claims.steps_needed((0.0, 0.9)) < 35
    assert claims.half_life(0.0) == 0 and claims.half_life(1.0) == math.inf


def test_the_one_sided_equivalence_and_power_figures_are_the_textbook_ones():
    diffs = [0.001, -0.002, 0.0005, 0.0015, -0.001]
    iv = interval(diffs)
    se = iv.std / math.sqrt(5)
    assert beyond_p(iv, 0.01, above=False) == pytest.approx(sps.t.cdf((iv.mean - 0.01) / se, 4))
    assert beyond_p(iv, -0.01, above=True) == pytest.approx(sps.t.sf((iv.mean + 0.01) / se, 4))
    assert equivalence_p(iv, 0.01) == max(beyond_p(iv, -0.01, above=True), beyond_p(iv, 0.01, above=False))
    assert math.isnan(beyond_p(interval([0.1]), 0.01, above=False))
    # the detectable effect: a simulated paired t-test finds it 80 % of the time (noncentral t, not z)
    effect = detectable(1.0, 5, 0.05)
    rng = np.random.default_rng(1)
    x = rng.normal(effect, 1.0, (100_000, 5))
    t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(5))
    assert abs((np.abs(t) > sps.t.ppf(0.975, 4)).mean() - 0.8) < 0.01
    # three seeds in a family of nineteen: an effect of many standard deviations goes unseen
    assert detectable(1.0, 3, 0.05 / 19) > 10 * detectable(1.0, 5, 0.05) / 2 > 5
    assert detectable(0.0, 5, 0.05) == 0 and math.isnan(detectable(1.0, 1, 0.05))


def _seeded(mean: float, sd: float, row: int, n: int = 5) -> dict[int, float]:
    return {s: 0.85 + mean + sd * NOISE[row, s] for s in range(n)}


def _comparison(delta: float, sd: float, n: int = 5, row: int = 0):
    base = _seeded(0.0, 0.002, 3, n)
    return paired({s: base[s] + delta + sd * NOISE[row, s] for s in base}, base, ("a", "b"))


@pytest.mark.parametrize("kind, delta, sd, n, verdict", [
    (GREATER, +0.02, 0.002, 5, REPRODUCED),  # significant in the paper's direction
    (GREATER, -0.02, 0.002, 5, REVERSED),  # significant against it
    (GREATER, 0.0, 0.001, 5, NOT_REPRODUCED),  # no effect, and the seeds exclude one of a point
    (GREATER, 0.005, 0.03, 3, INCONCLUSIVE),  # too noisy to tell either way
    (EQUAL, 0.0, 0.001, 5, REPRODUCED),  # the equivalence test excludes a point either way
    (EQUAL, 0.03, 0.002, 5, NOT_REPRODUCED),  # a clear difference
    (EQUAL, 0.0, 0.03, 3, INCONCLUSIVE),
    (FAILS, -0.04, 0.005, 5, REPRODUCED),  # no better than its start: below it
    (FAILS, +0.03, 0.002, 5, REVERSED),  # it learned more than the margin
    (FAILS, 0.0, 0.04, 3, INCONCLUSIVE),
])
def test_each_kind_of_claim_comes_out_as_its_rule_says(kind, delta, sd, n, verdict):
    (j,) = judge([_comparison(delta, sd, n)], kind, 0.01)
    assert j.verdict == verdict, (j.comparison, j.p_equivalence)
    assert j.family_size == 1 and j.detectable > 0


@pytest.mark.parametrize("delta, sd, verdict", [
    (0.005, 0.001, REPRODUCED),  # above b, but by half the margin: no better than its start within the margin
    (0.0095, 0.002, INCONCLUSIVE),  # surely above b, not surely below the margin, nor above it
    (0.015, 0.001, REVERSED),  # surely above the margin, and below twice the margin
])
def test_a_training_fails_claim_is_judged_against_its_margin_on_both_sides(delta, sd, verdict):
    """"a is no better than b" is reproduced when a − b is shown below the margin (not below 0) and reversed
    when it is shown above the margin (not above 0): each side of the rule reads the margin itself."""
    c = _comparison(delta, sd)
    (j,) = judge([c], FAILS, 0.01)
    assert (j.verdict, j.kind, j.margin) == (verdict, FAILS, 0.01), (c.diff, j.p_equivalence)
    assert j.p_equivalence == pytest.approx(beyond_p(c.diff, 0.01, above=False))  # H0: a − b ≥ the margin
    assert beyond_p(c.diff, 0.0, above=True) < 0.05  # above b in every case: a margin of 0 would read "learned"


def _holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment, written out: the k-th smallest p times (m − k + 1), never below the one
    before it."""
    order = sorted(range(len(ps)), key=ps.__getitem__)
    out, running = [0.0] * len(ps), 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - k) * ps[i]))
        out[i] = running
    return out


def test_a_claim_s_equivalence_tests_are_one_holm_family_too():
    """Three alike comparisons, each equivalent on its own at 5 %: corrected together, two of them are not."""
    comps = [_comparison(0.002, 0.006, row=r) for r in range(3)]
    raw = [equivalence_p(c.diff, 0.01) for c in comps]
    assert all(p < 0.05 for p in raw) and all(judge([c], EQUAL, 0.01)[0].verdict == REPRODUCED for c in comps)
    family = judge(comps, EQUAL, 0.01)
    assert [j.p_equivalence for j in family] == pytest.approx(_holm(raw))
    assert [j.verdict for j in family] == [REPRODUCED, INCONCLUSIVE, INCONCLUSIVE]


def test_a_family_is_corrected_together_and_an_untestable_or_unrun_comparison_stays_out_of_it():
    comps = [_comparison(0.004, 0.003, row=0), _comparison(0.004, 0.003, row=1), _comparison(0.0, 0.0, n=1),
             _comparison(0.02, 0.002, row=2)]
    alone = judge(comps[:1], GREATER, 0.01)[0]
    family = judge(comps, GREATER, 0.01, testable=[True, True, True, False])
    assert [j.family_size for j in family] == [2, 2, 2, 2]
    assert family[0].comparison.p_holm >= alone.comparison.p_holm
    assert family[0].detectable > alone.detectable  # the stricter level of a larger family
    assert family[2].verdict == NOT_YET and family[3].verdict == NOT_TESTABLE
    # the detectable effect: at the family's level for its members, at the plain level for the others
    d = [c.diff.std for c in comps]
    assert family[0].detectable == pytest.approx(detectable(d[0], 5, 0.05 / 2, 0.8))
    assert family[3].detectable == pytest.approx(detectable(d[3], 5, 0.05, 0.8))
    assert judge(comps[:1], GREATER, 0.01, power=0.9)[0].detectable == pytest.approx(detectable(d[0], 5, 0.05, 0.9))
    (two,) = judge([_comparison(0.02, 0.002, n=2)], GREATER, 0.01)  # two seeds are a paired test already
    assert two.family_size == 1 and two.verdict != NOT_YET
    with pytest.raises(ValueError, match="margin"):
        judge(comps, GREATER, 0.0)
    with pytest.raises(ValueError, match="kind"):
        judge(comps, "bigger", 0.01)
    with pytest.raises(ValueError, match="^testable: one flag per comparison$"):
        judge(comps, GREATER, 0.01, testable=[True])


def _rows(name: str, arms: dict[str, dict[int, float]], pretext: float = 0.3) -> pd.DataFrame:
    rows = [{"study": name, "arm": arm, "seed": s, "status": "finished", "linear_top1": v, "knn_top1": v - 0.06,
             "final_loss": 7.0, "pretext_acc": pretext, "run_id": f"{arm}-{s}"} for arm, by in arms.items()
            for s, v in by.items()]
    rows += [{"study": name, "arm": "random-init", "seed": s, "status": "finished", "linear_top1": 0.847,
              "knn_top1": 0.70, "run_id": f"init-{s}"} for s in range(5)]
    rows.append({"study": name, "arm": "raw-pixels", "seed": math.nan, "status": "finished", "linear_top1": 0.838,
                 "knn_top1": 0.72, "run_id": "pixels"})
    frame = pd.DataFrame(rows)
    for col in ("commit", "dirty", "precision", "torch", "device", "data"):
        frame[col] = {"precision": "bf16", "dirty": "false"}.get(col, "x")
    return frame


def test_synthetic_csvs_come_out_reproduced_reversed_not_reproduced_and_inconclusive_in_the_document(tmp_path):
    q = study("queue-cpu-full")
    arms = {"16384": _seeded(0.030, 0.001, 0), "256": _seeded(0.010, 0.001, 1),  # 16384 > 256: reproduced
            "1024": _seeded(0.045, 0.001, 2),  # 16384 < 1024: reversed
            "4096": _seeded(0.030, 0.0004, 3)}  # the same as 16384 within a tenth of a point: not reproduced
    results = tmp_path / "results"
    results.mkdir()
    _rows(q.name, arms).to_csv(results / f"{q.name}.csv", index=False)
    doc = write(results, tmp_path / "REPRODUCTION.md", tmp_path / "figures").markdown
    line = next(x for x in doc.splitlines() if x.startswith("- *a larger dictionary is better"))
    assert "one Holm family of 3" in line
    assert "`16384` > `256`: **reproduced**" in line and "`16384` > `1024`: **reversed**" in line
    assert "`16384` > `4096`: **not reproduced**" in line
    assert "| 16384 > 256 (linear top-1) | a larger dictionary is better" in doc and "detectable at 80 % power" in doc
    assert "## How a claim is judged" in doc and "**inconclusive**" in doc  # the rules, stated on the page
    assert "Learning is plain at this budget" in doc and "**met**" in doc
    assert "Where this data set limits the claim: Fashion-MNIST has 10 classes" in doc
    # three noisy seeds cannot tell: inconclusive, and the page says so (no "not reproduced")
    noisy = {"16384": _seeded(0.030, 0.02, 0, n=3), "256": _seeded(0.025, 0.02, 1, n=3)}
    _, judged, _, _ = judge_study(q, _rows(q.name, noisy), q.steps())
    verdicts = {pair: j for pair, j in judged[0][1]}
    j = verdicts[("16384", "256")]
    assert j.verdict == INCONCLUSIVE and j.detectable > 0.01 and j.family_size == 1
    assert verdicts[("16384", "1024")].verdict == NOT_YET  # planned, not run: outside the family


def test_a_momentum_claim_needs_five_half_lives_of_the_larger_m_and_a_budget_below_the_bar_is_provisional():
    m = study("momentum-cpu-full")
    frame = _rows(m.name, {"0.99": _seeded(0.03, 0.001, 0), "0.999": _seeded(0.02, 0.001, 1)})
    claim = next(c for c in claims.MOMENTUM.claims if c.pairs == (("0.999", "0.99"),))
    ((_, short),) = judge_claim(claim, m, frame, 2_140)
    ((_, long),) = judge_claim(claim, m, frame, 3_465)
    assert short.verdict == NOT_TESTABLE and long.verdict == REVERSED
    # a budget where m = 0.99 is not 5 kNN points above its start: every verdict is provisional
    weak = frame.assign(knn_top1=frame["linear_top1"] - 0.14)
    _, _, _, plain = judge_study(m, weak, 3_465)
    assert plain.met is False and "provisional" in plain.line
    _, _, _, plain = judge_study(m, frame, 3_465)
    assert plain.met is True


def test_a_verdict_on_fewer_seeds_than_its_study_plans_is_marked_interim():
    m = study("momentum-cpu-full")
    claim = next(c for c in claims.MOMENTUM.claims if c.pairs == (("0.999", "0.99"),))
    for n in (3, m.seeds):
        frame = _rows(m.name, {"0.99": _seeded(0.03, 0.001, 0, n), "0.999": _seeded(0.02, 0.001, 1, n)})
        _, judged, _, plain = judge_study(m, frame, 3_465)
        (line,) = [x for x in claim_lines(judged, plain, planned=m.seeds) if x.startswith(f"- *{claim.words}")]
        assert "**reversed**" in line
        assert (f"interim: {n} of {m.seeds} seeds" in line) == (n < m.seeds)
        (row,) = [x for x in claim_table(judged, 3_465, plain, planned=m.seeds) if x.startswith("| 0.999 > 0.99 (")]
        assert (f"interim: {n} of {m.seeds} seeds" in row) == (n < m.seeds)


def test_a_momentum_claim_not_testable_at_one_budget_points_to_the_study_whose_budget_tested_it(tmp_path):
    short, long = study("momentum-cpu-full"), study("momentum-long-cpu-full")
    results = tmp_path / "results"
    results.mkdir()
    arms = {"0.9": _seeded(0.01, 0.001, 2), "0.99": _seeded(0.03, 0.001, 0), "0.999": _seeded(0.02, 0.001, 1)}

    def momentum_rows(name: str, arms: dict[str, dict[int, float]]) -> pd.DataFrame:
        return _rows(name, arms).assign(queue_size=4096, ema_half_life=math.nan)

    momentum_rows(short.name, arms).to_csv(results / f"{short.name}.csv", index=False)
    doc = write(results, tmp_path / "REPRODUCTION.md", tmp_path / "figures")
    line = next(x for x in doc.headline.splitlines() if x.startswith("- *m = 0.999 is better than 0.99"))
    assert line.endswith("**not testable at this budget**.")  # no longer study: nothing to point to
    momentum_rows(long.name, {a: arms[a] for a in ("0.99", "0.999")}).to_csv(results / f"{long.name}.csv", index=False)
    doc = write(results, tmp_path / "REPRODUCTION.md", tmp_path / "figures")
    lines = [x for x in doc.markdown.splitlines() if x.startswith("- *m = 0.999 is better than 0.99")]
    assert lines == [
        "- *m = 0.999 is better than 0.99* (linear top-1, margin 1 point, outside this budget): `0.999` > `0.99`: "
        "**not testable at this budget**. At 3,638 steps (`momentum-long-cpu-full`): `0.999` > `0.99`: **reversed**.",
        "- *m = 0.999 is better than 0.99* (linear top-1, margin 1 point, one Holm family of 1): `0.999` > `0.99`: "
        "**reversed**."]
    # README's headline: one line per claim, the ablation's, which points to the budget that tested it
    assert lines[0] in doc.headline and lines[1] not in doc.headline


def _symmetric_results(tmp_path, inbatch_device: str = "x"):
    """The control's own arm, momentum-cpu-full's m = 0.999 and the in-batch study: the symmetric loss within a
    tenth of a point of the queue arm, the in-batch arm 3 points lower; the in-batch runs made on ``inbatch_device``."""
    sym, full, inb = study("symmetric-cpu-full"), study("momentum-cpu-full"), study("inbatch-cpu-full")
    results = tmp_path / "results"
    results.mkdir()
    _rows(sym.name, {"queue fifo symmetric m=0.999": _seeded(0.030, 0.0004, 0)}).to_csv(
        results / f"{sym.name}.csv", index=False)
    _rows(full.name, {"0.999": _seeded(0.030, 0.0004, 1), "0.99": _seeded(0.2, 0.001, 3)}).assign(
        queue_size=16384, ema_half_life=693.0).to_csv(results / f"{full.name}.csv", index=False)
    _rows(inb.name, {"in batch": _seeded(0.0, 0.001, 2)}).assign(device=inbatch_device).to_csv(
        results / f"{inb.name}.csv", index=False)
    doc = write(results, tmp_path / "REPRODUCTION.md", tmp_path / "figures").markdown
    section = doc[doc.index(f"## {sym.title}"):]
    return section[:section.index("\n## ")]


def test_a_control_borrows_its_comparison_arms_under_its_names_and_reads_alike_different_or_inconclusive(tmp_path):
    sym = study("symmetric-cpu-full")
    assert [(b.study, b.arm, b.here) for b in sym.borrow] == [
        ("momentum-cpu-full", "0.999", "queue fifo m=0.999"), ("inbatch-cpu-full", "in batch", "in batch")]
    section = _symmetric_results(tmp_path)
    assert "read from other studies, with their settings (their sections): `queue fifo m=0.999` " \
           "(`momentum-cpu-full`'s `0.999`), `in batch` (`inbatch-cpu-full`)" in section
    assert "| queue fifo m=0.999 (reference) | 5 |" in section and "| in batch | 5 |" in section
    assert "| 0.99 |" not in section  # only the named arms are borrowed
    first = next(x for x in section.splitlines() if x.startswith("- *Control (no paper claim): the symmetric loss"))
    assert "**alike (within the margin)**" in first
    second = next(x for x in section.splitlines() if x.startswith("- *Control (no paper claim): what remains"))
    assert "**different: queue fifo symmetric m=0.999 higher**" in second


def test_a_borrowed_arm_made_on_another_kind_of_machine_is_left_out_and_the_section_says_so(tmp_path):
    section = _symmetric_results(tmp_path, inbatch_device="Intel(R) Xeon(R) Processor, 2 cores, AVX-512 BF16")
    assert "- `in batch`: 0 run(s) read from `inbatch-cpu-full`, described with this study's own above; 5 run(s) " \
           "made on `Intel(R) Xeon(R) Processor, 2 cores, AVX-512 BF16` left out (this study's runs were made on " \
           "`x`; a pair across machines is not a pair)" in section
    assert "- `queue fifo m=0.999`: 5 run(s) read from `momentum-cpu-full`'s `0.999`, described with this study's " \
           "own above" in section
    assert "| in batch |" not in section and "mixed" not in section
    second = next(x for x in section.splitlines() if x.startswith("- *Control (no paper claim): what remains"))
    assert "**alike" not in second and "**different" not in second


def test_a_borrowed_run_counts_only_on_the_machine_of_its_own_seed_not_on_any_of_the_study_s(tmp_path):
    """The control's own arm: seed 0 on `x`, seeds 1 to 4 on `y`. A borrowed run of seed 0 made on `y` is left out
    although `y` made some of this study's runs: seed 0 here was trained on `x`."""
    sym, full, inb = study("symmetric-cpu-full"), study("momentum-cpu-full"), study("inbatch-cpu-full")
    results = tmp_path / "results"
    results.mkdir()
    own = _rows(sym.name, {"queue fifo symmetric m=0.999": _seeded(0.030, 0.0004, 0)})
    own.loc[(own["arm"] == "queue fifo symmetric m=0.999") & (own["seed"] > 0), "device"] = "y"
    own.to_csv(results / f"{sym.name}.csv", index=False)
    _rows(full.name, {"0.999": _seeded(0.030, 0.0004, 1)}).assign(queue_size=16384, ema_half_life=693.0).to_csv(
        results / f"{full.name}.csv", index=False)  # every seed on `x`: only seed 0's counts
    _rows(inb.name, {"in batch": _seeded(0.0, 0.001, 2)}).assign(device="y").to_csv(
        results / f"{inb.name}.csv", index=False)  # every seed on `y`: all but seed 0's count
    doc = write(results, tmp_path / "REPRODUCTION.md", tmp_path / "figures").markdown
    section = doc[doc.index(f"## {sym.title}"):]
    lines = [x for x in section[:section.index("\n## ")].splitlines() if x.startswith(("- `in batch`: ",
                                                                                       "- `queue fifo m=0.999`: "))]
    assert [x.split(" left out")[0] for x in lines] == [
        "- `queue fifo m=0.999`: 1 run(s) read from `momentum-cpu-full`'s `0.999`, described with this study's own "
        "above; 4 run(s) made on `x`",
        "- `in batch`: 4 run(s) read from `inbatch-cpu-full`, described with this study's own above; 1 run(s) made "
        "on `y`"], lines


def test_the_supervised_bound_is_the_top_of_the_scale_of_the_sections_at_its_budget_only(tmp_path):
    sup, full, long = study("supervised-cpu-full"), study("momentum-cpu-full"), study("momentum-long-cpu-full")
    results = tmp_path / "results"
    results.mkdir()
    _rows(sup.name, {"supervised": {s: 0.917 for s in range(5)}}).to_csv(results / f"{sup.name}.csv", index=False)
    arms = {"0.99": {s: 0.882 for s in range(5)}, "0.999": {s: 0.877 for s in range(5)}}
    for s in (full, long):
        _rows(s.name, arms).assign(ema_half_life=69.0, queue_size=16384).to_csv(results / f"{s.name}.csv",
                                                                                 index=False)
    doc = write(results, tmp_path / "REPRODUCTION.md", tmp_path / "figures").markdown
    # random-init 84.70, best 88.20, labels 91.70: half the gap
    line = ("What there is to learn at this budget (linear top-1, means over seeds): the random-init encoder 84.70, "
            "the best arm (`0.99`) 88.20, the supervised bound 91.70 (`supervised-cpu-full`, 5 seeds")
    sections = {s.name: doc[doc.index(f"## {s.title}"):].split("\n## ")[0] for s in (sup, full, long)}
    assert line in sections[full.name] and "closes 50 % of the gap" in sections[full.name]
    assert line not in sections[long.name]  # 3,638 steps, not the bound's 2,140
    assert "What there is to learn" not in sections[sup.name] and "No paper claim: the scale." in sections[sup.name]


def test_the_same_config_in_two_studies_is_equal_to_the_last_digit_on_one_machine_and_shown_apart_on_two(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    twin = {"0.999": _seeded(0.02, 0.003, 1)}
    _rows("momentum-cpu-full", twin).assign(queue_size=16384, ema_half_life=693.0).to_csv(
        results / "momentum-cpu-full.csv", index=False)
    _rows("queue-cpu-full", {"16384": twin["0.999"]}).assign(queue_size=16384, ema_half_life=693.0).to_csv(
        results / "queue-cpu-full.csv", index=False)
    other = {s: v + 0.0032 for s, v in twin["0.999"].items() if s < 3}  # another CPU, three seeds
    _rows("negatives-cpu-full", {"queue fifo m=0.999": other}).assign(device="Intel(R) Xeon(R) Processor, 2").to_csv(
        results / "negatives-cpu-full.csv", index=False)
    doc = write(results, tmp_path / "REPRODUCTION.md", tmp_path / "figures").markdown
    part = doc[doc.index("## The same config in more than one study"):]
    assert "On one kind of machine the numbers are equal to the last digit in 5 of 5 seed(s); across machines " \
           "the linear top-1 differs by up to 0.32 points." in part
    assert "(Intel Xeon) |" in part and "| 4 |" in part
    # a twin that trains otherwise on the same machine is not called equal
    _rows("queue-cpu-full", {"16384": {s: v + 0.001 * (s == 2) for s, v in twin["0.999"].items()}}).assign(
        queue_size=16384, ema_half_life=693.0).to_csv(results / "queue-cpu-full.csv", index=False)
    doc = write(results, tmp_path / "REPRODUCTION.md", tmp_path / "figures").markdown
    assert "equal to the last digit in 4 of 5 seed(s); across machines the linear top-1 differs by up to 0.32 " \
           "points" in doc
    # twins on one machine 0.5 points apart in seed 0, the other CPU's run 0.25 from each: across is 0.25, not 0.5
    far = {s: v + 0.005 * (s == 0) for s, v in twin["0.999"].items()}
    _rows("queue-cpu-full", {"16384": far}).assign(queue_size=16384, ema_half_life=693.0).to_csv(
        results / "queue-cpu-full.csv", index=False)
    _rows("negatives-cpu-full", {"queue fifo m=0.999": {0: twin["0.999"][0] + 0.0025}}).assign(
        device="Intel(R) Xeon(R) Processor, 2").to_csv(results / "negatives-cpu-full.csv", index=False)
    doc = write(results, tmp_path / "REPRODUCTION.md", tmp_path / "figures").markdown
    assert "equal to the last digit in 4 of 5 seed(s); across machines the linear top-1 differs by up to 0.25 " \
           "points" in doc


def test_a_study_made_on_two_machines_is_comparable_where_each_seed_s_arms_ran_on_one(tmp_path):
    """A study of days spans sessions and their machines: seed 0 on one, seeds 1 to 4 on another, the baselines
    on the first. Every pair between arms is then taken on one machine; the seeds whose random-init encoder was
    measured on the other are named. A seed whose arms ran on two machines is mixed."""
    bn = study("bn-cpu-full")
    results = tmp_path / "results"
    results.mkdir()
    frame = _rows(bn.name, {arm: _seeded(0.02, 0.001, i) for i, arm in enumerate(("plain", "groups", "split",
                                                                                    "shuffle"))})
    later = ~frame["arm"].isin(("random-init", "raw-pixels")) & (frame["seed"] > 0)
    frame.loc[later, "device"] = "y"

    def section(rows: pd.DataFrame) -> str:
        rows.to_csv(results / f"{bn.name}.csv", index=False)
        doc = write(results, tmp_path / "REPRODUCTION.md", tmp_path / "figures").markdown
        text = doc[doc.index(f"## {bn.title}"):]
        return text[:text.index("\n## ")]

    line = next(x for x in section(frame).splitlines() if x.startswith("- device:"))
    assert line.startswith("- device: `x` (seed 0); `y` (seeds 1, 2, 3, 4) — each seed's arms on one machine, so "
                           "every paired difference between arms is taken on one machine; the random-init encoder "
                           "of seeds 1, 2, 3, 4 was measured on `x`"), line
    assert "mixed" not in line
    frame.loc[(frame["arm"] == "plain") & (frame["seed"] == 2), "device"] = "x"  # seed 2's arms on two machines
    line = next(x for x in section(frame).splitlines() if x.startswith("- device:"))
    assert line == "- device: `x`, `y` — **mixed: these runs are not comparable**"
