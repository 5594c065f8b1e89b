"""The reproduction's plan beyond momentum: arms of any config field or a script's named settings, their
command lines, their export, and the generic section of the document (tables, Holm, the not-run line)."""

from __future__ import annotations

import math
import statistics

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from mocolab.analysis.stats import holm, paired
from mocolab.repro.document import _pretext_curves, not_run, study_section, write
from mocolab.repro.judging import judge_study
from mocolab.repro.export import EXPERIMENTS, _order, arm_of
from mocolab.repro.plan import SAME_CONFIG, STUDIES, study


def test_the_momentum_studies_keep_their_command_lines_so_a_running_study_resumes():
    tail = ["--seeds", "5"]
    for name, preset in (("momentum-cpu-quick", "cpu-quick"), ("momentum-cpu-full", "cpu-full")):
        assert study(name).command("bf16", 1) == [
            "experiments/momentum_ablation.py", "--preset", preset, "--momenta", "0,0.9,0.99,0.999,0.9999", *tail,
            "--name", name, "--workers-per-trial", "0", "--set", "run.precision=bf16", "--set", "run.threads=1"]
    assert study("momentum-cpu-quick").baseline_overrides("fp32") == ["run.precision=fp32"]


def test_every_new_study_runs_the_arms_its_script_makes_and_is_found_by_the_exporter():
    from mocolab.tune.studies.negatives import settings
    from mocolab.tune.studies.queue import queue_sizes
    from mocolab.tune.studies.vit import RECIPES

    names = [s.name for s in STUDIES]
    assert names[:2] == ["momentum-cpu-quick", "momentum-cpu-full"] and len(set(names)) == len(names)
    assert all(s.script in EXPERIMENTS for s in STUDIES)
    q = study("queue-cpu-quick")
    assert list(q.values) == queue_sizes("cpu-quick", {}) and q.values[0] == 256 and q.reference == "16384"
    assert q.command("bf16", 1)[-1] == "--grid" and "--momenta" not in q.command("bf16", 1)
    assert set(study("bn-cpu-quick").arms) == {"plain", "groups", "split"}
    assert study("bn-cpu-quick").command("bf16", 1)[-2:] == ["--what", "bn"]
    ranks = study("bn-ranks-cpu-quick")
    assert set(ranks.arms) == {"plain", "groups", "split", "shuffle"} and ranks.reference == "shuffle"
    line = ranks.command("bf16", 1)
    assert line[line.index("--workers-per-trial") + 1] == "2" and line[-2:] == ["--what", "bn"]
    neg = study("negatives-cpu-full")
    assert list(neg.arms) == list(settings([0.999])) and neg.command("bf16", 1)[-2:] == ["--momenta", "0.999"]
    bank = study("bank-30ep-cpu-full")  # one arm: the bank, every trial of the momentum script at one m
    line = bank.command("bf16", 1)
    assert bank.arms == ("memory_bank",) and line[-2:] == ["--momenta", "0.999"]
    assert {"moco.negatives=memory_bank", "optim.epochs=30"} <= set(bank.baseline_overrides("bf16"))
    assert arm_of(bank, pd.Series({"label": "m=0.999 seed=2", "params.moco.negatives": "memory_bank"})) == "memory_bank"
    versions = study("versions-vit-quick")
    assert list(versions.arms) == list(RECIPES) and "model.backbone=convnet" in versions.baseline_overrides("bf16")
    assert [(b.study, b.arm) for b in bank.borrow] == [("negatives-cpu-full", bank.reference)]
    twins = [{arm for _, arm in group} | {(name, arm) for name, arm in group} for group in SAME_CONFIG]
    for s in STUDIES:  # every borrowed arm is one its study plans; the reference is this study's or a borrowed one
        assert all(b.arm in study(b.study).arms for b in s.borrow), s.name
        # an arm borrowed under another study's name for it trains that arm's config (a test checks the configs)
        assert all(any((b.study, b.arm) in t and b.name in t for t in twins) for b in s.borrow if b.name), s.name
        assert not {b.here for b in s.borrow} & set(s.arms), s.name  # a borrowed arm would double one of its own
        assert not (s.by == "moco.m" and s.borrow), s.name  # the momentum section has no line for borrowed runs
        assert s.reference == "" and (s.by == "moco.m" or len(s.arms) == 1) or s.reference in (
            *s.arms, *(b.here for b in s.borrow)), s.name


def test_an_arm_is_the_field_value_as_text_or_the_label_less_its_seed_and_the_csv_keeps_the_plan_order():
    bn, neg, q = study("bn-cpu-quick"), study("negatives-cpu-full"), study("queue-cpu-quick")
    assert arm_of(bn, pd.Series({"label": "bn=plain seed=2", "params.moco.bn": "plain"})) == "plain"
    assert arm_of(q, pd.Series({"label": "K=4096 seed=0", "params.queue.size": 4096.0})) == "4096"
    assert arm_of(neg, pd.Series({"label": "queue random m=0.999 seed=1"})) == "queue random m=0.999"
    col = pd.Series(["split", "random-init", "plain", "raw-pixels", "groups"], name="arm")
    ranks = _order(col, {a: i for i, a in enumerate(bn.arms)})
    assert list(col[ranks.sort_values().index]) == ["raw-pixels", "random-init", "plain", "groups", "split"]


def _frame(arms: dict[str, list[float]], pretext: dict[str, float] | None = None) -> pd.DataFrame:
    rows = []
    for arm, linears in arms.items():
        for seed, lin in enumerate(linears):
            rows.append({"study": "bn-cpu-quick", "arm": arm, "seed": seed, "status": "finished",
                         "linear_top1": lin, "knn_top1": lin - 0.1, "final_loss": 7.0,
                         "pretext_acc": (pretext or {}).get(arm, 0.1) + 0.01 * seed * (2 if arm == "split" else 1)})
    for seed in range(3):
        rows.append({"study": "bn-cpu-quick", "arm": "random-init", "seed": seed, "status": "finished",
                     "linear_top1": 0.84 + 0.001 * seed, "knn_top1": 0.73})
    rows.append({"study": "bn-cpu-quick", "arm": "raw-pixels", "seed": math.nan, "status": "finished",
                 "linear_top1": 0.83, "knn_top1": 0.72})
    frame = pd.DataFrame(rows)
    for col in ("commit", "dirty", "precision", "torch", "device", "data"):
        frame[col] = {"precision": "bf16", "dirty": "false"}.get(col, "x")
    return frame


def test_the_generic_section_tables_every_arm_beside_the_baselines_and_holm_corrects_its_tests(tmp_path):
    s = study("bn-cpu-quick")
    arms = {"plain": [0.80, 0.805, 0.79], "groups": [0.85, 0.86, 0.858], "split": [0.87, 0.8752, 0.8722]}
    frame = _frame(arms, pretext={"plain": 0.95, "groups": 0.9, "split": 0.1})
    text, figure = study_section(s, frame, tmp_path, "figures")
    assert figure.stat().st_size > 10_000 and f"![{s.title}](figures/{figure.name})" in text
    mean, sd = 100 * statistics.mean(arms["split"]), 100 * statistics.stdev(arms["split"])
    assert f"| split (reference) | 3 | {mean:.2f} ± {sd:.2f} [" in text
    assert "| random-init | 3 | " in text and "| raw-pixels | 1 | 83.00 (1 seed) | — |" in text
    # one family per claim: unshuffled below shuffled on linear top-1, unshuffled above it on pretext accuracy;
    # the baseline checks (every arm against its random-init start) a family of their own
    _, judged, baselines, _ = judge_study(s, frame, s.steps())
    by = lambda arm, metric: {i: v for i, v in enumerate(frame[frame["arm"] == arm][metric])}  # noqa: E731
    worse, cheats = judged
    assert [pair for pair, _ in worse[1]] == [("split", "plain"), ("split", "groups")]
    assert [c.metric for c, _ in judged] == ["linear_top1", "pretext_acc"]
    expected = holm([paired(by(a, "linear_top1"), by(b, "linear_top1"), (a, b)) for a, b in (("split", "plain"),
                                                                                           ("split", "groups"))])
    assert [j.comparison.p_holm for _, j in worse[1]] == [c.p_holm for c in expected]
    assert [pair for pair, _ in cheats[1]] == [("plain", "split"), ("groups", "split")]
    assert [pair for pair, _ in baselines[0][1]] == [(a, "random-init") for a in ("plain", "groups", "split")]
    assert all(j.family_size == 3 for _, j in baselines[0][1])
    assert "| split > plain (linear top-1) | unshuffled batch norm is worse than shuffled (of 2) | 3 |" in text
    assert "| plain > split (pretext accuracy) |" in text
    claim = next(line for line in text.splitlines() if line.startswith("- *unshuffled batch norm is worse"))
    assert "`split` > `plain`: **reproduced**" in claim and "one Holm family of 2" in claim
    assert "The paper gives no accuracy for the unshuffled model." in text
    # with the trials' curves, the second panel is pretext accuracy over training, one line per arm
    history = pd.DataFrame([{"study": s.name, "arm": arm, "seed": seed, "metric": "step_pretext_acc", "step": step,
                             "value": 0.5 + 0.01 * step * (arm != "split")}
                            for arm in arms for seed in range(3) for step in (10, 20, 30)])
    _, drawn = study_section(s, frame, tmp_path / "curves", "figures", history)
    assert drawn.stat().st_size > 10_000 and drawn.read_bytes() != figure.read_bytes()
    fig, ax = plt.subplots()
    _pretext_curves(ax, history, list(arms))
    assert [line.get_label() for line in ax.get_lines()] == ["plain (3 seeds)", "groups (3 seeds)", "split (3 seeds)"]
    assert list(ax.get_lines()[0].get_xdata()) == [10, 20, 30] and "per step" in ax.get_ylabel()
    assert list(ax.get_lines()[2].get_ydata()) == [50.0, 50.0, 50.0]
    plt.close(fig)
    # a study whose reference has not run yet states it, and tests nothing against it
    text, _ = study_section(s, frame[frame["arm"] != "split"], tmp_path, "figures")
    assert "the reference arm `split` has no finished run yet" in text and "**not yet tested**" in text


def test_a_queue_study_draws_k_on_a_log_axis_and_a_study_without_csv_gets_its_command(tmp_path):
    q = study("queue-cpu-quick")
    frame = _frame({str(k): [0.85 + 0.001 * i, 0.851 + 0.001 * i, 0.849 + 0.001 * i] for i, k in enumerate(q.values)})
    text, figure = study_section(q, frame, tmp_path, "figures")
    assert figure.is_file() and "| 256 | 3 |" in text and "| 16384 (reference) | 3 |" in text
    assert "60.6" in text  # the paper's number where it has one
    results = tmp_path / "results"
    results.mkdir()
    frame.assign(study=q.name).to_csv(results / f"{q.name}.csv", index=False)
    out = write(results, tmp_path / "REPRODUCTION.md", tmp_path / "figures")
    doc = (tmp_path / "REPRODUCTION.md").read_text()
    assert out.headline == "" and len(out.figures) == 1
    assert f"## {q.title}\n\nPreset `cpu-quick`" in doc
    for other in STUDIES:
        if other.name != q.name:
            assert not_run(other) in doc and f"Not run yet: `mocolab repro --study {other.name}`." in doc


def test_a_study_set_against_another_studys_arm_reads_that_arm_from_its_csv_and_pairs_it_by_seed(tmp_path):
    bank, neg = study("bank-30ep-cpu-full"), study("negatives-cpu-full")
    results = tmp_path / "results"
    results.mkdir()
    _frame({"memory_bank": [0.85, 0.853, 0.848]}).assign(study=bank.name).to_csv(results / f"{bank.name}.csv",
                                                                                  index=False)
    other = _frame({"queue fifo m=0.999": [0.872, 0.874, 0.8755], "in batch": [0.88, 0.89, 0.885]})
    other.assign(study=neg.name).to_csv(results / f"{neg.name}.csv", index=False)
    write(results, tmp_path / "REPRODUCTION.md", tmp_path / "figures")
    doc = (tmp_path / "REPRODUCTION.md").read_text()
    section = doc[doc.index(f"## {bank.title}"):]
    section = section[:section.index("\n## ")]
    assert "| memory_bank | 3 |" in section and "| queue fifo m=0.999 (reference) | 3 |" in section
    assert "in batch" not in section  # only the reference arm is borrowed
    assert "read from other studies, with their settings (their sections): `queue fifo m=0.999` " \
           "(`negatives-cpu-full`)" in section
    # paired by seed: (85.0 − 87.2 + 85.3 − 87.4 + 84.8 − 87.55) / 3
    assert "| queue fifo m=0.999 > memory_bank (linear top-1) | the memory bank is below MoCo's FIFO queue, even " \
           "trained three times as long (of 1) | 3 | +2.35 [" in section
    claim = next(line for line in section.splitlines() if line.startswith("- *the memory bank is below"))
    assert "`queue fifo m=0.999` > `memory_bank`: **reproduced**" in claim


def test_the_queue_study_at_cpu_full_runs_its_four_sizes_as_a_grid_and_bad_sizes_are_refused_by_the_configs_rule():
    import argparse

    from mocolab.tune.studies.queue import chosen_sizes

    q = study("queue-cpu-full")
    line = q.command("bf16", 1)
    assert q.preset == "cpu-full" and q.seeds == 5 and q.reference == "16384"
    assert line[line.index("--sizes") + 1] == "256,1024,4096,16384" and "--grid" in line

    def args(sizes, grid=True):
        return argparse.Namespace(preset="cpu-full", sizes=sizes, grid=grid)

    assert chosen_sizes(args("256, 4096"), {}) == [256, 4096]
    for bad, said in [("256,1000", "multiple of the global batch"), ("256,x", "'x' is not a whole number"),
                      (",", "at least one"), ("65536", "below the training-set size")]:
        with pytest.raises(ValueError, match=said):
            chosen_sizes(args(bad), {})
    with pytest.raises(ValueError, match="give --grid too"):
        chosen_sizes(args("256", grid=False), {})


def test_the_studies_planned_before_their_runs_launch_exactly_their_arms_and_judge_only_planned_pairs():
    """The control, the staleness pair and the re-runs with the new instruments: their command lines, parsed by
    their scripts as `mocolab repro` launches them, make one trial per arm and seed and no other, every arm with
    the config its name says; each of their claims compares arms the study itself runs (none borrowed), and the
    budget can test it."""
    from mocolab.config.flags import parse_checked
    from mocolab.repro.preregistration import rules
    from mocolab.tune.studies import negatives
    from mocolab.tune.study import seeds_of

    expect = {"control-cpu-full": {"batch keys m=0.999": {"moco.negatives": "batch_keys", "moco.m": 0.999},
                                   "queue fifo symmetric m=0.999": {"moco.negatives": "queue", "moco.m": 0.999,
                                                                    "queue.policy": "fifo", "moco.symmetric": True},
                                   "in batch": {"moco.negatives": "in_batch"}},
              "staleness-cpu-full": {f"queue {p} m={m}": {"moco.negatives": "queue", "queue.policy": p,
                                                          "moco.m": float(m)}
                                     for m in ("0.99", "0.999") for p in ("fifo", "random")}}
    for name, arms in expect.items():
        s = study(name)
        assert set(s.arms) == set(arms) and not s.borrow and s.seeds == 5 and s.preset == "cpu-full"
        line = s.command("bf16", 1)
        args = parse_checked(negatives.parser(), line[1:])
        sweep, _ = negatives.plan(args, seeds_of(args))
        made = {(t.label.rsplit(" seed=", 1)[0], t.overrides["run.seed"]) for t in sweep.trials}
        assert made == {(a, seed) for a in s.arms for seed in range(5)}
        assert len(sweep.trials) == 5 * len(arms)
        for t in sweep.trials:
            arm = t.label.rsplit(" seed=", 1)[0]
            assert {k: v for k, v in t.overrides.items() if k != "run.seed"} == arms[arm], arm
        planned = rules(s)
        pairs = [p for c in planned["claims"] for p in c["pairs"]]
        assert len(pairs) == 2 and all(p["testable"] for p in pairs), name
        assert all(p["a"] in s.arms and p["b"] in s.arms for p in pairs), name
    for name, by, arms in (("bn-probes-cpu-full", "moco.bn", ("plain", "groups", "split", "shuffle")),
                           ("momentum-probes-cpu-full", "moco.m", ("0.9", "0.99", "0.999"))):
        s = study(name)
        assert (s.by, s.arms, s.seeds) == (by, arms, 5) and not s.borrow
        assert rules(s)["secondary_metrics"] == ["knn20_top1", "linear_top1_1pct", "linear_top1_10pct"]
    bad = parse_checked(negatives.parser(), ["--momenta", "0.999", "--settings", "queue random m=0.99"])
    with pytest.raises(ValueError, match="--settings: .*queue random m=0.99.* allowed: in batch"):
        negatives.plan(bad, [0])


def test_every_study_script_runs_its_grid_seed_by_seed_so_a_study_stopped_part_way_pairs_across_its_arms():
    from mocolab.config.flags import parse_checked
    from mocolab.tune.studies import augmentation, momentum, negatives, queue, vit
    from mocolab.tune.study import seeds_of

    for mod, argv in [(momentum, []), (queue, ["--grid", "--sizes", "128,256"]), (augmentation, ["--what", "bn"]),
                      (negatives, ["--momenta", "0.999"]), (vit, ["--compare-versions"])]:
        args = parse_checked(mod.parser(), [*argv, "--seeds", "3", "--preset", "smoke"])
        sweep, _ = mod.plan(args, seeds_of(args))
        seeds = [int(t.label.rsplit("seed=", 1)[1]) for t in sweep.trials]
        assert seeds == sorted(seeds) and len(set(seeds)) == 3, (mod.__name__, seeds)


def test_a_section_names_the_uncommitted_files_its_dirty_runs_were_made_with(tmp_path):
    s = study("bn-cpu-quick")
    frame = _frame({"plain": [0.80, 0.805, 0.79], "split": [0.87, 0.8752, 0.8722]})
    text, _ = study_section(s, frame, tmp_path, "figures")
    assert "uncommitted" not in text  # a clean checkout: no line
    frame.loc[:2, "dirty"] = "true"
    frame.loc[:1, "changed"] = "docs/REPRODUCTION.md, README.md"
    frame.loc[2, "changed"] = "docs/REPRODUCTION.md"
    frame.loc[3, "dirty"] = "true"  # dirty before the changed files were tagged
    text, _ = study_section(s, frame, tmp_path, "figures")
    assert f"- 4 of {len(frame)} runs were made from a checkout with uncommitted changes " \
           "(`mocolab.source.git.dirty`); the files changed, with the runs made so: `docs/REPRODUCTION.md` (3), " \
           "`README.md` (2); not recorded for 1 run(s), made before the changed files were tagged" in text
    frame.loc[2, "changed"] = ", ".join(f"f{i}.py" for i in range(20)) + " and 3 more"  # the tag's cut at 20
    text, _ = study_section(s, frame, tmp_path, "figures")
    assert "`f9.py` (1), and 3 more file(s) unnamed;" in text and "more`" not in text
