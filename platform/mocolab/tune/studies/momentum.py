"""Momentum ablation (MoCo paper, Table 1b): linear-probe accuracy against the key encoder's momentum m.

    python experiments/momentum_ablation.py --preset cpu-quick --seeds 2
    ray job submit --working-dir . -- python experiments/momentum_ablation.py --preset smoke
    mocolab study momentum --preset smoke                      # the same, from an installed mocolab
"""

import argparse
import sys

from mocolab.config.flags import parse_checked
from mocolab.tune import Trial
from mocolab.tune.study import make_sweep, momenta_of, run_study, seeds_of, study_parser

PAPER_TEXT = {0.0: "fail"}  # the paper's m = 0 did not train; values it did not run print as —


def parser() -> argparse.ArgumentParser:
    """The study's flags, apart from main so that they are read (every number's range checked) without a run."""
    p = study_parser(__doc__.splitlines()[0], "momentum")
    p.add_argument("--momenta", default="0,0.5,0.9,0.99,0.999,0.9999", help="comma-separated values of m")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_checked(parser(), argv)
        momenta = momenta_of(args)
        seeds = seeds_of(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    # seed by seed: a sweep stopped part way (--stop-after, Ctrl-C) holds whole seeds, every arm paired
    trials = [Trial(f"m={m:g} seed={s}", {"moco.m": m, "run.seed": s}) for s in seeds for m in momenta]
    sweep = make_sweep(args, "momentum-ablation", f"MoCo momentum ablation: m in {momenta}, seeds {seeds}, "
                       f"preset {args.preset}", trials)

    def report(out_dir, trials_df):
        from mocolab.analysis import fmt_mean_std, summarise, welch_t
        from mocolab.analysis.momentum_plots import PAPER_MOMENTUM, momentum_plot

        table = summarise(trials_df, "moco.m")
        table["paper"] = [PAPER_TEXT.get(m, PAPER_MOMENTUM.get(m)) for m in table["moco.m"]]
        lines = [f"{'m':>7} {'linear top-1 %':>16} {'kNN top-1 %':>16} {'final loss':>10} {'status':>10} "
                 f"{'half-life':>9} {'staleness':>9} {'paper':>6}"]
        for _, r in table.iterrows():
            lines.append(f"{r['moco.m']:>7g} {fmt_mean_std(r.linear_top1_mean, r.linear_top1_std):>16} "
                         f"{fmt_mean_std(r.knn_top1_mean, r.knn_top1_std):>16} {r.final_loss:>10.3f} "
                         f"{r.status:>10} {r.ema_half_life:>9.1f} {r.max_staleness:>9.0f} "
                         f"{'—' if r.paper is None else r.paper!s:>6}")
        by_m = {m: 100 * g.loc[g.status == 'finished', 'linear_top1'] for m, g in trials_df.groupby('params.moco.m')}
        test = welch_t(by_m.get(0.9, []), by_m.get(0.999, []))
        if test is not None:
            lines.append(f"Welch t-test, linear top-1 at m=0.9 vs m=0.999: t = {test[0]:.2f}, p = {test[1]:.3g}")
        figure = momentum_plot(table, PAPER_MOMENTUM, out_dir / "momentum.png")
        return "\n".join(lines), figure, table

    return run_study(sweep, report)

