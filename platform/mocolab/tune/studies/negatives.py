"""Where negatives come from: in-batch, memory bank and MoCo's queue (FIFO and random replacement, across m).

    python experiments/negatives_ablation.py                          # 4 momenta: 7 trials
    python experiments/negatives_ablation.py --momenta 0.5,0.999 --seeds 2
    mocolab study negatives --preset smoke                      # the same, from an installed mocolab

MoCo's argument (He et al. 2020, section 3.2) in three parts: in-batch
negatives (SimCLR) are consistent but only 2B − 2; a memory bank of every
image gives many, but each was written when its image was last seen, by an
encoder up to an epoch of updates old; a queue written by a slowly moving key
encoder gives many consistent ones.  Every trial logs, per epoch, the age of
its stored negatives (mean, max and a histogram) and the key drift of a fixed
probe set of entries: the cosine between the embedding of an entry's image by
the encoder that wrote it and by the current one (1 = no drift), against the
entry's age.  With a FIFO queue the oldest key is K/(B·W) steps old; random
replacement keeps some keys far longer.  All trials share the preset's data,
batch, temperature, epochs and K (the bank draws queue.size negatives a step).

``--settings`` runs a named subset instead of the default four sources, from a
catalogue that also holds the controls that separate the key encoder from the
source of negatives: for each m of ``--momenta``, ``queue random m=<m>``,
``queue fifo symmetric m=<m>`` (the queue with the loss computed both ways) and
``batch keys m=<m>`` (the key encoder's keys of the global batch, no queue).
"""

import argparse
import re

from mocolab.tune import Trial
from mocolab.tune.study import make_sweep, momenta_of, study_main, study_parser

RANDOM_M = 0.999  # random replacement: at the paper's momentum, where FIFO's keys are consistent


def settings(momenta: list[float]) -> dict[str, dict]:
    """The trials' overrides by setting (what ``negatives_plots.negatives_setting`` names them): the default
    sources, the FIFO queue at each m and random replacement at the paper's m."""
    out: dict[str, dict] = {"in batch": {"moco.negatives": "in_batch"},
                            "memory bank": {"moco.negatives": "memory_bank"}}
    for m in momenta:
        out[f"queue fifo m={m:g}"] = _queue("fifo", m)
    out[f"queue random m={RANDOM_M:g}"] = _queue("random", RANDOM_M)
    return out


def catalogue(momenta: list[float]) -> dict[str, dict]:
    """Every setting ``--settings`` may name: the default ones, and per m random replacement, the symmetric
    queue and the global batch's keys from the key encoder (the control that keeps MoCo's key encoder and takes
    its negatives from the batch, as the in-batch arm does)."""
    out = settings(momenta)
    for m in momenta:
        out[f"queue random m={m:g}"] = _queue("random", m)
        out[f"queue fifo symmetric m={m:g}"] = {**_queue("fifo", m), "moco.symmetric": True}
        out[f"batch keys m={m:g}"] = {"moco.negatives": "batch_keys", "moco.m": m}
    return out


def _queue(policy: str, m: float) -> dict:
    return {"moco.negatives": "queue", "queue.policy": policy, "moco.m": m}


def chosen(args: argparse.Namespace, momenta: list[float]) -> dict[str, dict]:
    """The settings this sweep runs: ``--settings``'s, in its order, else the default ones."""
    if args.settings is None:
        return settings(momenta)
    names = [n.strip() for n in args.settings.split(",") if n.strip()]
    known = catalogue(momenta)
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        raise ValueError(f"--settings: {unknown or args.settings!r} not among the settings of --momenta "
                         f"{','.join(f'{m:g}' for m in momenta)}; allowed: {', '.join(known)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--settings: {args.settings!r} names a setting twice")
    return {n: known[n] for n in names}


def parser() -> argparse.ArgumentParser:
    """The study's flags, apart from main so that they are read (every number's range checked) without a run."""
    p = study_parser(__doc__.splitlines()[0], "negatives")
    p.add_argument("--momenta", default="0.5,0.9,0.99,0.999",
                   help="comma-separated key-encoder momenta for the FIFO queue (default 0.5,0.9,0.99,0.999)")
    p.add_argument("--settings", default=None, metavar="NAME,NAME",
                   help="run only these settings, comma-separated, e.g. 'queue fifo m=0.99,queue random m=0.99' "
                        "(the names the default run prints, and per m of --momenta: queue random m=<m>, "
                        "queue fifo symmetric m=<m>, batch keys m=<m>)")
    return p


def main(argv: list[str] | None = None) -> int:
    return study_main(parser(), argv, plan)


def plan(args: argparse.Namespace, seeds: list[int]):
    momenta = momenta_of(args)
    runs = chosen(args, momenta)
    trials = [Trial(f"{name} seed={s}", {**overrides, "run.seed": s})  # seed by seed: stopped, whole seeds pair
              for s in seeds for name, overrides in runs.items()]
    what = (f"{', '.join(runs)}" if args.settings is not None else
            f"in-batch, memory bank, queue FIFO (m in {momenta}) and random (m={RANDOM_M})")
    sweep = make_sweep(args, "negatives-ablation", f"Sources of negatives: {what}, seeds {seeds}, preset "
                       f"{args.preset}", trials)

    def report(out_dir, trials_df):
        from mocolab.analysis import against_reference, fmt_mean_std
        from mocolab.tracking import Store, resolve_tracking_uri
        from mocolab.analysis.negatives_plots import negatives_drift, negatives_plot

        table, drift, epoch = negatives_drift(Store(resolve_tracking_uri(args.tracking_uri)), trials_df)
        lines = [f"{'setting':>22} {'linear top-1 %':>16} {'kNN top-1 %':>16} {'age mean':>8} {'age max':>8} "
                 f"{'drift cos':>9} {'entry cos':>9} {'status':>10}"]
        for _, r in table.iterrows():
            lines.append(f"{r.setting:>22} {fmt_mean_std(r.linear_top1_mean, r.linear_top1_std):>16} "
                         f"{fmt_mean_std(r.knn_top1_mean, r.knn_top1_std):>16} {r.staleness_mean:>8.1f} "
                         f"{r.staleness_max:>8.0f} {r.drift_cos:>9.4f} {r.stored_cos:>9.4f} {r.status:>10}")
        lines.append(f"age: steps since a stored negative was written (mean, max; the last epoch). drift cos: mean "
                     f"over the probes at the end of epoch {epoch} (the middle of training: in the last epoch the "
                     f"cosine schedule has all but stopped every encoder) of the cosine between the writing and the "
                     f"current encoder's embedding of the entry's image (1 = consistent); entry cos: the stored entry "
                     f"itself against the current encoder's embedding (augmented view, training-mode BN, a bank's "
                     f"mixture; the last epoch). In-batch negatives are computed by this step's encoder: age 0, "
                     f"cosines 1 by construction.")
        for setting, (ages, cos) in sorted(drift.items()):
            if ages:
                old = [c for a, c in zip(ages, cos) if a >= sorted(ages)[len(ages) * 3 // 4]]
                young = [c for a, c in zip(ages, cos) if a <= sorted(ages)[len(ages) // 4]]
                lines.append(f"  {setting}: drift cos {sum(young) / len(young):.4f} for the youngest quarter of "
                             f"probes, {sum(old) / len(old):.4f} for the oldest (ages up to {max(ages):.0f} steps)")
        settings_df = trials_df.assign(**{"params.setting": [re.sub(r" seed=\d+$", "", str(label))
                                                             for label in trials_df["label"]]})
        fifo = f"queue fifo m={max(momenta):g}"  # MoCo's own source at the largest m
        lines += against_reference(settings_df, "setting", lambda values: fifo if fifo in values else values[0])
        figure = negatives_plot(table, drift, out_dir / "negatives.png", epoch)
        return "\n".join(lines), figure, table

    return sweep, report

