"""Momentum ablation (MoCo paper, Table 1b): linear-probe accuracy against the key encoder's momentum m.

    python experiments/momentum_ablation.py --preset cpu-quick --seeds 2
    ray job submit --working-dir . -- python experiments/momentum_ablation.py --preset smoke
    mocolab study momentum --preset smoke                      # the same, from an installed mocolab

Its closing table reads as the reproduction does: each m beside the random-init encoder of the same seed (the
network its trials start from, untrained) and the raw pixels, and each m against the paper's m = 0.999 by paired
t-tests across seeds, Holm-corrected.
"""

import argparse
import sys

from mocolab.tune import Trial
from mocolab.tune.study import Sweep, make_sweep, momenta_of, study_main, study_parser

PAPER_TEXT = {0.0: "fail"}  # the paper's m = 0 did not train; values it did not run print as —


def parser() -> argparse.ArgumentParser:
    """The study's flags, apart from main so that they are read (every number's range checked) without a run."""
    p = study_parser(__doc__.splitlines()[0], "momentum")
    p.add_argument("--momenta", default="0,0.5,0.9,0.99,0.999,0.9999", help="comma-separated values of m")
    p.add_argument("--no-baselines", action="store_true",
                   help="leave out the random-init encoder and raw pixels the table shows beside the arms (measured "
                        "here after the sweep, on this process's device: seconds a seed at the CPU presets, long "
                        "for a GPU preset on a driver without one, where `mocolab baselines --name <sweep's name>` "
                        "can measure them elsewhere first: a study without this flag reads those)")
    return p


def main(argv: list[str] | None = None) -> int:
    return study_main(parser(), argv, plan)


def plan(args: argparse.Namespace, seeds: list[int]):
    momenta = momenta_of(args)
    # seed by seed: a sweep stopped part way (--stop-after, Ctrl-C) holds whole seeds, every arm paired
    trials = [Trial(f"m={m:g} seed={s}", {"moco.m": m, "run.seed": s}) for s in seeds for m in momenta]
    sweep = make_sweep(args, "momentum-ablation", f"MoCo momentum ablation: m in {momenta}, seeds {seeds}, "
                       f"preset {args.preset}", trials)

    def report(out_dir, trials_df):
        from mocolab.analysis.momentum_plots import PAPER_MOMENTUM, baseline_frame, momentum_plot, momentum_table

        seeds_run = sorted({int(s) for s in trials_df["params.run.seed"].dropna()})
        baselines, note = (([], "--no-baselines") if args.no_baselines
                           else random_init(sweep, seeds_run, args.tracking_uri))
        text, table = momentum_table(trials_df, baseline_frame(baselines), {**PAPER_MOMENTUM, **PAPER_TEXT}, note)
        figure = momentum_plot(table, PAPER_MOMENTUM, out_dir / "momentum.png", baseline_frame(baselines))
        return text, figure, table

    return sweep, report


def random_init(sweep: Sweep, seeds: list[int], tracking_uri: str | None) -> tuple[list, str]:
    """(the random-init encoder of each seed and the raw pixels, scored as the trials are; why none): measured
    once and logged as ``mocolab baselines`` does, in the set named as the sweep, so a resumed study, and the
    reproduction that measured them first, reads them back instead (seconds a seed)."""
    from mocolab.repro.baseline_runs import log_baselines

    overrides = [f"{k}={v}" for k, v in sweep.base_overrides.items()]  # the trials' --config and --set values
    try:
        return log_baselines(sweep.name, sweep.preset, overrides, seeds, tracking_uri=tracking_uri), ""
    except ValueError as err:  # a set of that name scored otherwise: the table goes on without it, saying why
        print(f"baselines: {err}", file=sys.stderr)
        return [], str(err)
