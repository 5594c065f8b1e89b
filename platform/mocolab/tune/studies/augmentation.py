"""Augmentation and batch-norm ablations: which views and which BN make the pretext task honest.

    python experiments/augmentation_ablation.py --preset cpu-quick                 # presets and BN modes
    python experiments/augmentation_ablation.py --what bn --workers-per-trial 2    # with cross-rank shuffle
    mocolab study augmentation --preset smoke                      # the same, from an installed mocolab

Without shuffling, BN lets a query find its key by the batch's statistics: the
pretext (instance-discrimination) accuracy runs near 100 % while kNN suffers.
"""

import argparse

from mocolab.config.choices import AUGMENT_PRESETS as PRESETS
from mocolab.tune import Trial
from mocolab.tune.study import make_sweep, overrides_of, study_main, study_parser


def parser() -> argparse.ArgumentParser:
    """The study's flags, apart from main so that they are read (every number's range checked) without a run."""
    p = study_parser(__doc__.splitlines()[0], "augmentation")
    p.add_argument("--what", choices=("augment", "bn", "both"), default="both")
    return p


def main(argv: list[str] | None = None) -> int:
    return study_main(parser(), argv, plan)


def plan(args: argparse.Namespace, seeds: list[int]):
    trials = []
    if args.what in ("augment", "both"):
        # seed by seed: a study stopped part way has whole seeds, which pair across the arms
        trials += [Trial(f"aug={a} seed={s}", {"augment.preset": a, "run.seed": s}) for s in seeds for a in PRESETS]
    if args.what in ("bn", "both"):
        # plain: one group, unshuffled; groups: split's groups, unshuffled; split: the groups, shuffled
        # the workers a trial gets: the flag, else a --set / --config run.num_workers, else one
        asked = overrides_of(args).get("run.num_workers", 1)
        workers = int(args.workers_per_trial if args.workers_per_trial is not None else asked)
        modes = ["split", "groups", "plain"] + (["shuffle"] if workers >= 2 else [])
        if "shuffle" not in modes:
            print("note: bn=shuffle needs --workers-per-trial >= 2; running split, groups and plain only")
        trials += [Trial(f"bn={b} seed={s}", {"moco.bn": b, "run.seed": s}) for s in seeds for b in modes]
    sweep = make_sweep(args, "augmentation-ablation", f"augmentation presets and BN modes ({args.what}), "
                       f"seeds {seeds}", trials)

    def report(out_dir, trials_df):
        from mocolab.analysis import against_reference, bar_plot, fmt_mean_std, summarise

        trials_df = trials_df.assign(**{"params.setting": [
            f"bn={b}" if str(lbl).startswith("bn=") else f"aug={a}"
            for lbl, a, b in zip(trials_df["label"], trials_df["params.augment.preset"], trials_df["params.moco.bn"])]})
        table = summarise(trials_df, "setting")
        pretext = trials_df.groupby("params.setting")["pretext_acc"].mean()
        table["pretext_acc"] = [100 * pretext.get(s, float("nan")) for s in table["setting"]]
        lines = [f"{'setting':>14} {'linear top-1 %':>16} {'kNN top-1 %':>16} {'pretext %':>9} {'status':>10}"]
        for _, r in table.iterrows():
            lines.append(f"{r.setting:>14} {fmt_mean_std(r.linear_top1_mean, r.linear_top1_std):>16} "
                         f"{fmt_mean_std(r.knn_top1_mean, r.knn_top1_std):>16} {r.pretext_acc:>9.1f} {r.status:>10}")
        # each group against the paper's setting: the cross-rank shuffle where it ran (else split), aug+ (mocov2)
        for prefix, refs in (("bn=", ("bn=shuffle", "bn=split")), ("aug=", ("aug=mocov2",))):
            group = trials_df[trials_df["params.setting"].str.startswith(prefix)]
            present = set(group["params.setting"])
            ref = next((r for r in refs if r in present), None)
            if ref is not None and len(present) > 1:
                lines += against_reference(group, "setting", lambda _values, ref=ref: ref)
        figure = bar_plot(table, "setting", "Augmentation and batch-norm ablations",
                          out_dir / "augmentation.png")
        return "\n".join(lines), figure, table

    return sweep, report

