"""MoCo v3 with a ViT: the frozen patch projection and the base momentum; v1, v2 and v3 at one budget.

    python experiments/vit_ablation.py                       # patch projection trained|frozen x base m
    python experiments/vit_ablation.py --momenta 0.99 --seeds 3
    python experiments/vit_ablation.py --compare-versions    # v1, v2, v3 (convnet) and v3 (ViT) side by side
    mocolab study vit --preset smoke                      # the same, from an installed mocolab

MoCo v3 (Chen, Xie, He 2021) found ViT training unstable, with spikes in the
first layer's gradient that cost accuracy, and fixed it by never training the
random patch projection. Each trial logs that gradient's norm at every step
(``grad_norm_first_layer``, measured whether or not the projection trains), so
the report shows both the accuracy and the gradient the fix acts on.
"""

import argparse

from mocolab.tune import Trial
from mocolab.tune.study import make_sweep, momenta_of, study_main, study_parser

# --compare-versions: each version's recipe over the preset (vit-quick: its data, batch, epochs, evaluation).
_CONVNET = {"model.backbone": "convnet", "model.width": 32, "vit.patch_size": 0, "vit.depth": 0}
_QUEUE = {"moco.m": 0.999, "moco.m_schedule": "constant", "moco.bn": "split",
          "moco.bn_groups": 4, "optim.name": "sgd", "optim.lr": 0.06, "optim.scale_lr": False,
          "optim.warmup_epochs": 0, "optim.weight_decay": 5e-4, "model.hidden": 0}
RECIPES: dict[str, dict] = {
    # MoCo v1: linear head, tau 0.07, no blur; v2: MLP head, tau 0.2, blur (both: the preset's queue.size, SGD)
    "v1 convnet": {**_CONVNET, **_QUEUE, "moco.version": "v1", "model.head": "linear", "moco.tau": 0.07,
                   "augment.preset": "mocov1"},
    "v2 convnet": {**_CONVNET, **_QUEUE, "moco.version": "v2", "model.head": "mlp", "moco.tau": 0.2,
                   "augment.preset": "mocov2"},
    # v3 on a ResNet-style backbone: BN MLPs (2-layer projector), LARS, m 0.99 rising to 1
    "v3 convnet": {**_CONVNET, "moco.version": "v3", "model.head": "mlp-bn", "optim.name": "lars",
                   "optim.lr": 0.6, "optim.weight_decay": 1e-6},
    "v3 vit_tiny": {},  # the vit-quick recipe itself
}


def _is_frozen(value) -> bool:
    return str(value).lower() in ("true", "1")


def parser() -> argparse.ArgumentParser:
    """The study's flags, apart from main so that they are read (every number's range checked) without a run."""
    p = study_parser(__doc__.splitlines()[0], "patch")
    p.set_defaults(preset="vit-quick")
    p.add_argument("--momenta", default="0.9,0.99,0.999", help="comma-separated base momenta (default 0.9,0.99,0.999)")
    p.add_argument("--compare-versions", action="store_true",
                   help=f"instead: one trial per recipe {list(RECIPES)} at the preset's budget")
    return p


def main(argv: list[str] | None = None) -> int:
    return study_main(parser(), argv, plan)


def plan(args: argparse.Namespace, seeds: list[int]):
    momenta = momenta_of(args)
    if args.compare_versions:
        return _compare_versions(args, seeds)
    trials = [Trial(f"patch={'frozen' if f else 'trained'} m={m:g} seed={s}",
                    {"vit.freeze_patch_embed": f, "moco.m": m, "run.seed": s})
              for f in (False, True) for m in momenta for s in seeds]
    sweep = make_sweep(args, "vit-ablation", f"MoCo v3 ViT: patch projection trained|frozen x base m in {momenta}, "
                       f"seeds {seeds}, preset {args.preset}", trials)

    def report(out_dir, trials_df):
        from mocolab.analysis import fmt_mean_std
        from mocolab.tracking import Store, resolve_tracking_uri
        from mocolab.analysis.vit_plots import GRAD_FIRST, patch_momentum_table, vit_plot

        uri = resolve_tracking_uri(args.tracking_uri)  # the store the sweep wrote (cwd and env are unchanged)
        table = patch_momentum_table(trials_df)
        df = trials_df.assign(**{"params.setting": [
            f"patch={'frozen' if _is_frozen(f) else 'trained'} m={float(m):g}"
            for f, m in zip(trials_df["params.vit.freeze_patch_embed"], trials_df["params.moco.m"])]})
        store, curves, peaks = Store(uri), {}, {}
        for run_id, label, setting in zip(df["run_id"], df["label"], df["params.setting"]):
            pts = store.metric_history(run_id, GRAD_FIRST)
            curves[str(label)] = pts
            vals = sorted(v for _, v in pts[len(pts) // 2:])  # the second half: past the large gradients at init
            if vals:  # the largest step's gradient against the typical one: how spiky training was
                peaks.setdefault(setting, []).append((vals[-1], vals[len(vals) // 2]))
        table["grad_max"] = [max((p[0] for p in peaks.get(s, [])), default=float("nan")) for s in table["setting"]]
        table["grad_median"] = [sum(p[1] for p in peaks.get(s, [])) / max(1, len(peaks.get(s, [])))
                                if peaks.get(s) else float("nan") for s in table["setting"]]
        lines = [f"{'patch':>8} {'base m':>7} {'linear top-1 %':>16} {'kNN top-1 %':>16} {'final loss':>10} "
                 f"{'‖g₁‖ max':>9} {'‖g₁‖ median':>11} {'status':>10}"]
        for _, r in table.iterrows():
            lines.append(f"{r.patch:>8} {r['moco.m']:>7g} {fmt_mean_std(r.linear_top1_mean, r.linear_top1_std):>16} "
                         f"{fmt_mean_std(r.knn_top1_mean, r.knn_top1_std):>16} {r.final_loss:>10.3f} "
                         f"{r.grad_max:>9.3g} {r.grad_median:>11.3g} {r.status:>10}")
        lines.append("‖g₁‖: the patch projection's gradient norm per step (applied when trained, measured when "
                     "frozen); its max and median over the second half of the steps (the first steps' large "
                     "gradients at initialisation would hide any spike).")
        figure = vit_plot(table, curves, out_dir / "vit.png")
        return "\n".join(lines), figure, table

    return sweep, report


def _compare_versions(args: argparse.Namespace, seeds: list[int]):
    args.default_name = "versions"  # its own sweep: the ablation's name with other settings would be refused
    trials = [Trial(f"{name} seed={s}", {**overrides, "run.seed": s})  # seed by seed: stopped, whole seeds pair
              for s in seeds for name, overrides in RECIPES.items()]
    sweep = make_sweep(args, "vit-ablation", f"MoCo v1, v2, v3 (convnet) and v3 (ViT) at one budget, seeds {seeds}, "
                       f"preset {args.preset}", trials)

    def report(out_dir, trials_df):
        from mocolab.analysis import against_reference, bar_plot, fmt_mean_std, summarise

        df = trials_df.assign(**{"params.setting": [f"{v} {b}" for v, b in zip(trials_df["params.moco.version"],
                                                                                 trials_df["params.model.backbone"])]})
        table = summarise(df, "setting")
        pretext = df.groupby("params.setting")["pretext_acc"].mean()
        table["pretext_acc"] = [100 * pretext.get(s, float("nan")) for s in table["setting"]]
        lines = [f"{'recipe':>12} {'linear top-1 %':>16} {'kNN top-1 %':>16} {'pretext %':>9} {'status':>10}"]
        for _, r in table.iterrows():
            lines.append(f"{r.setting:>12} {fmt_mean_std(r.linear_top1_mean, r.linear_top1_std):>16} "
                         f"{fmt_mean_std(r.knn_top1_mean, r.knn_top1_std):>16} {r.pretext_acc:>9.1f} {r.status:>10}")
        lines.append("Pretext accuracy is not comparable across versions: v1/v2 pick the key among K + 1, "
                     "v3 among the global batch.")
        lines += against_reference(df, "setting", lambda values: "v2 convnet" if "v2 convnet" in values
                                   else values[0])
        figure = bar_plot(table, "setting", "MoCo v1, v2, v3 at one budget", out_dir / "versions.png")
        return "\n".join(lines), figure, table

    return sweep, report

