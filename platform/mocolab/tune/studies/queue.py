"""Queue-size ablation: accuracy against the number of negatives K (MoCo paper, Figure 3).

    python experiments/queue_ablation.py --preset cpu-quick --samples 6        # Optuna search + ASHA
    python experiments/queue_ablation.py --preset cpu-quick --grid --seeds 2    # every K
    python experiments/queue_ablation.py --preset cpu-full --grid --sizes 256,4096 --seeds 5   # chosen K
    mocolab study queue --preset smoke                      # the same, from an installed mocolab
"""

import argparse

from mocolab.config import build_config
from mocolab.data.roots import check_data
from mocolab.tune import Trial
from mocolab.tune.spec import with_validation_split
from mocolab.tune.study import comma_values, make_sweep, overrides_of, study_main, study_parser


def queue_sizes(preset: str, overrides: dict) -> list[int]:
    """Powers of two times the global batch, below half the training set (K well below N)."""
    cfg = check_data(build_config(preset, overrides))  # n: a folder of images is counted on disk
    b, n = cfg.optim.batch_size, cfg.train_size or 0
    return [b * 2 ** i for i in range(0, 20) if b * 2 ** i <= n // 2]


def chosen_sizes(args: argparse.Namespace, overrides: dict) -> list[int]:
    """``--sizes`` (with ``--grid``), each checked by the config's own rules, else every K of ``queue_sizes``."""
    if args.sizes is None:
        return queue_sizes(args.preset, overrides)
    if not args.grid:
        raise ValueError("--sizes: a grid's list; give --grid too (a search samples K itself)")
    sizes = comma_values("--sizes", args.sizes, int, "a whole number", "comma-separated queue sizes K",
                         "queue size K")
    for k in sizes:  # queue.size's own range, divisibility by the batch and bound by the training set
        check_data(build_config(args.preset, {**overrides, "queue.size": k}))
    return sizes


def parser() -> argparse.ArgumentParser:
    """The study's flags, apart from main so that they are read (every number's range checked) without a run."""
    p = study_parser(__doc__.splitlines()[0], "queue")
    p.add_argument("--grid", action="store_true", help="every queue size instead of a search")
    p.add_argument("--sizes", default=None, metavar="K,K,...",
                   help="the grid's queue sizes, comma-separated (default: every power of two times the global "
                        "batch up to half the training set); each is checked as queue.size is")
    p.add_argument("--samples", type=int, default=6, help="search mode: trials Optuna samples (default 6)")
    return p


def main(argv: list[str] | None = None) -> int:
    return study_main(parser(), argv, plan)


def plan(args: argparse.Namespace, seeds: list[int]):
    overrides = overrides_of(args)
    if not args.grid:  # a search selects by the validation split's kNN: hold one out
        overrides = with_validation_split(args.preset, overrides)
    sizes = chosen_sizes(args, overrides)
    if args.grid:
        # seed by seed: a study stopped part way has whole seeds, which pair across K
        trials = [Trial(f"K={k} seed={s}", {"queue.size": k, "run.seed": s}) for s in seeds for k in sizes]
        sweep = make_sweep(args, "queue-ablation", f"queue size grid K in {sizes}, seeds {seeds}", trials, overrides)
    else:
        sweep = make_sweep(args, "queue-ablation", f"Optuna search over K in {sizes} with ASHA on the kNN top-1 "
                           f"of {overrides['data.val_size']:,} held-out training images", [], overrides,
                           search="optuna", search_space={"queue.size": sizes}, scheduler="asha",
                           metric="val_knn_top1", mode="max", num_samples=args.samples, seeds=seeds)

    def report(out_dir, trials_df):
        from mocolab.analysis import against_reference, fmt_mean_std, line_plot, summarise

        table = summarise(trials_df, "queue.size")
        lines = [f"{'K':>7} {'trials':>6} {'seeds':>5} {'linear top-1 %':>16} {'kNN top-1 %':>16} {'staleness':>9} "
                 f"{'status':>10}"]
        for _, r in table.iterrows():
            lines.append(f"{int(r['queue.size']):>7} {r.trials:>6} {r.seeds:>5} "
                         f"{fmt_mean_std(r.linear_top1_mean, r.linear_top1_std):>16} "
                         f"{fmt_mean_std(r.knn_top1_mean, r.knn_top1_std):>16} {r.max_staleness:>9.0f} {r.status:>10}")
        if (table["repeats"] > 0).any():
            lines.append("A search may sample one K twice: repeats of a seed are one measurement (mean over "
                         "distinct seeds), not more seeds.")
        lines += against_reference(trials_df, "queue.size", lambda ks: max(ks, key=float))  # the largest K
        ok = table.dropna(subset=["knn_top1_mean"])
        figure = None
        if not ok.empty:
            figure = line_plot(ok, "queue.size", "queue size K (log scale)", "Queue-size ablation",
                               out_dir / "queue.png")
        return "\n".join(lines), figure, table

    return sweep, report

